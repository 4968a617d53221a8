// patchstore/ingest/ingest_volumes.h — medical volumes in their own formats
// (NIfTI, MetaImage, NRRD, DICOM series) through ITK, with their geometry.
//
// Input: one sample per patient, each field (MR, CT, MASK) one file or one
// DICOM folder, found as `ingest images` finds them: a root folder and path
// templates ({"MR", "{patient}/mr.nii.gz"}; a template may name a folder,
// for a DICOM series), or a CSV manifest `id,<field>,...` whose cells are
// paths relative to the manifest's folder. Formats, by the name:
//   * NIfTI-1/2: .nii, .nii.gz, .hdr/.img
//   * MetaImage: .mha, .mhd (+ its raw file)
//   * NRRD: .nrrd, .nhdr (+ its data file)
//   * DICOM: a folder holding one series (several series: refused, naming
//     each, unless `series` picks one by SeriesInstanceUID or number);
//     slices must be evenly spaced (a missing slice is refused, naming the
//     files on either side of the gap).
// Voxels of any scalar integer or float type (64-bit integers are read as
// float64); vector/RGB images, 2-D images and 4-D images are refused (a 4-D
// image with `volume_index` gives that volume).
//
// Geometry: ITK reads each volume with its spacing, origin and direction
// (LPS millimetres). Optional preprocessing, done once here with ITK's
// filters and recorded in the store:
//   * orient = "RAS", "LPS", ... (three letters, one of each pair R/L, A/P,
//     S/I: the direction each image axis i, j, k points to, as nibabel's
//     aff2axcodes names it): an exact permutation and flip of the axes
//     (itk::OrientImageFilter).
//   * spacing = {X, Y, Z} (mm along i, j, k after orient): resampled
//     (itk::ResampleImageFilter) onto a grid with the same origin and
//     direction and round(size * spacing / X) voxels per axis; linear
//     interpolation (values become float32) except for fields in
//     mask_fields or given "nearest" in `interpolation` (values and their
//     type kept). The other fields of a patient are resampled onto the first
//     field's new grid, so fields on different grids end on one grid.
// Without `spacing`, the fields of a patient must be on one grid (size,
// spacing, origin, direction); a difference is an error naming it.
//
// Slices: `slice_axis` ("axial", "coronal" or "sagittal") picks the image
// axis closest to that anatomical direction (S-I, A-P, L-R) from each
// volume's direction matrix; the volume's (S, H, W) records take that axis
// as S, and H, W are the two other axes in ITK's array order (of k, j, i:
// slowest first). So a volume stored slices-first by its writer is sliced
// by anatomy, never by array position. With orient "LPS" and axial slices,
// rows run from anterior to posterior and columns from the patient's right
// to left (radiological display).
//
// Output: a store of kind "volumes", each (volume, field) one (S, H, W)
// record as ingest_hdf5.h describes (values unchanged by default; norm,
// mask_fields, encoding as for HDF5), and per volume its geometry
// (store/format.h VolumeGeometry: the stored (S, H, W) grid as an image of
// index (W, H, S)), read back by Reader::Geometry. Store attributes record
// what was asked: volume.slice_axis, volume.orient, volume.spacing.
//
// Decoding runs in isolated child processes (one per thread), each with a
// memory limit and a per-volume timeout: a hostile header, a truncated
// stream or a crashing decoder fails that volume only. Headers declaring
// more than max_voxels voxels are refused before any voxel memory is
// allocated.
//
// Guarantees as for images: volumes are committed in input order in
// batches (a volume is entirely in the store or absent); the first bad
// volume stops the ingest (everything before it kept) or, with skip_errors,
// goes into the failure report (TSV: id, file, message) and the ingest goes
// on; running it again resumes (ids present are skipped; the options that
// shape the records must be the same); --shard I/N as for images; a
// finished ingest without failures seals the store.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "patchstore/ingest/ingest.h"
#include "patchstore/store/status.h"

namespace patchstore {

struct VolumeIngestOptions {
  std::string store;  // destination directory (created if missing)

  // Form 1: a CSV manifest `id,<field>,...` (paths relative to its folder).
  std::string manifest;
  // Form 2: a root folder and one path template per field (files or DICOM
  // folders); the first field's matches define the volumes, ids join the
  // placeholder values with '/'.
  std::string root;
  std::vector<std::pair<std::string, std::string>> field_templates;

  std::string slice_axis = "axial";  // "axial" | "coronal" | "sagittal"
  std::string orient;                // "" keeps the source axes; else e.g. "RAS", "LPS"
  std::vector<double> spacing;       // empty: keep; else 3 positive numbers (mm along i, j, k)
  // Per field "nearest" or "linear" (resampling with `spacing`); default:
  // nearest for mask_fields, linear for the others.
  std::map<std::string, std::string> interpolation;
  std::string series;         // DICOM folders with several series: which (UID or series number)
  int64_t volume_index = -1;  // 4-D images: the volume to take (-1: refuse 4-D images); 3-D images ignore it

  std::vector<std::string> mask_fields;        // is_mask, stored {0,1} unless norm says otherwise
  std::map<std::string, std::string> norm;     // per field (ParseNormalization); default "none"
  std::vector<std::string> encoding;           // as Hdf5IngestOptions::encoding
  int threads = 0;                             // decoder processes; 0 = all cores
  bool skip_errors = false;                    // --on-error skip
  std::string report_path;                     // failures as TSV; default <store>/ingest-errors.tsv
  uint64_t batch_bytes = uint64_t{256} << 20;  // commit after this many record bytes
  bool durable = true;                         // fsync each commit
  uint64_t max_voxels = uint64_t{1} << 29;     // per volume (of the header, and after resampling)
  double decode_timeout_s = 600;               // per volume and field
  uint64_t decode_memory_bytes = 0;            // per decoder process; 0: 8 GiB
  std::string command_line;                    // recorded in the metadata
  uint32_t shard_index = 0, shard_count = 0;   // as ImageIngestOptions
  ProgressCallback progress;                   // called on the calling thread; done/total count volumes
  std::function<bool()> cancelled;             // polled between volumes (Status kAborted)
};

// Whether this build reads volumes through ITK (else IngestVolumes returns
// Unsupported saying so).
bool VolumeIngestAvailable();

// Runs the ingest. Errors name the volume, the field, the file and the cause.
Result<IngestSummary> IngestVolumes(const VolumeIngestOptions& options);

}  // namespace patchstore
