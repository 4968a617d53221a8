// patchstore/ingest/ingest_hdf5.h — 3D volumes from HDF5 files into a store.
//
// Input: one or more HDF5 files, each holding one group per modality (e.g.
// MR, CT, MASK) and in each group one 3D dataset per patient, e.g.
//   /MR/patient001  int16 (H, W, S)  gzip-chunked
//   /CT/patient001  int16 (H, W, S)
//   /MASK/patient001 uint8 (H, W, S)
// Every dataset name present in ALL named groups of a file becomes one
// sample (a "volume"); every group becomes a field.
//
// Per-patient files: a file in which every --group path names a 3D dataset
// (not a group), e.g. /MR, /CT, /MASK at the root, is ONE volume whose id is
// the file stem ("data/sub-07.h5" -> "sub-07", under every `ids` scheme).
// Each file is judged on its own, so one ingest may mix both layouts. A file
// whose paths are partly groups and partly datasets, or where one is missing
// or is something else, is an error (a file-level failure under skip_errors)
// that lists the names at the file's root with their kinds and shapes and
// describes the two layouts accepted.
//
// Output: a store of kind "volumes". Each (volume, field) is ONE contiguous
// record (float32, or the dtype --encoding gives) of layout kSHW, shape (S, H, W): the slice axis first, so
// any slice and any stack of neighbouring slices is a contiguous zero-copy
// view (see reader/volume.h). The slice axis of the source is --slice-axis
// (default -1, the last one, for (H, W, S) sources); the two other axes
// keep their order and become (H, W). The store attribute "slice_axis"
// records it (0, 1 or 2) so that export can put the axis back.
//
// Sample ids (group layout): the dataset name ("patient001") when one file is given; with
// several files "<file stem>/<dataset name>" ("train/patient001"), so ids
// stay unique across files. `ids` overrides: "stem" always prefixes, "name"
// never does (duplicate names across files are then errors). Two input files
// with the same stem are refused under the prefixing schemes.
//
// Values: converted to float32 unchanged by default (a CT keeps its
// Hounsfield units; float64 is rounded to nearest, as NumPy's astype does).
// Any integer (8..64 bit, either sign, any byte order), float16/32/64 and
// integer-based enum (h5py's bool) source type is accepted and recorded as
// the record's SourceType. Per-field normalisation on request with
// norm[FIELD] = "none | unit | symmetric | binary | affine:SCALE,OFFSET",
// optionally "+clamp:LO,HI", or "range:LO,HI" ([LO,HI] onto [-1,1], clamped) (see ParseNormalization; unit and
// symmetric need a uint8 or uint16 source). A field listed in mask_fields is marked is_mask and stored binary ({0,1})
// unless norm says otherwise; a group merely NAMED "MASK" is not special: its values (labels) are kept as they are
// unless --mask is given.
//
// Streaming: each record is written straight into the space LMDB reserves
// for it (RecordInput::fill), reading the source in hyperslabs that follow
// its chunk layout: slabs of whole chunks along the slice axis (at most
// slab_bytes of source data, more only when one chunk row is larger), each
// chunk decompressed exactly once, transposed into (S, H, W) while being
// converted. Memory stays bounded by one slab plus the HDF5 chunk cache plus
// what the LMDB write transaction holds (the float32 records of the samples
// in one commit: LMDB keeps a dirty copy of each record until commit).
//
// Errors name the file, the group and the dataset:
//   * a dataset present in some groups but missing from another,
//   * datasets whose shapes differ across groups,
//   * a rank other than 3, an empty dataset, a non-numeric type (string,
//     compound, ...), a filter the library cannot decode (e.g. lzf without
//     its plugin), an unreadable or malformed file or chunk.
// HDF5 external links, datasets with external raw storage and virtual
// datasets can make the library open arbitrary other files; they are refused
// unless allow_external is set. Soft links inside the file are followed.
// HDF5's own error printing is silenced; its error stack becomes the cause
// in the Status message.
//
// Guarantees as for images: one writer commits batches, so a volume is
// either entirely in the store or absent; on the first bad volume the ingest
// stops (default) with everything before it committed, or with skip_errors
// records the failure (report TSV: id, file, message; an unreadable file or
// a missing group is one line with an empty id) and goes on. Running the
// same ingest again resumes: volumes whose id is present are skipped. A
// finished ingest without failures seals the store.
//
// Thread-safety: HDF5 (Debian's serial build) is not thread-safe, so all
// HDF5 work in this process is serialised by one internal lock: concurrent
// calls from several threads are safe but run one after the other. Another
// library in the same process that uses the same libhdf5 (not h5py's wheels,
// which bundle their own) must not call it while an ingest runs. The
// progress and cancel callbacks run on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "patchstore/ingest/ingest.h"
#include "patchstore/store/status.h"

namespace patchstore {

struct Hdf5IngestOptions {
  std::vector<std::string> files;  // input .h5 files, ingested in this order
  std::string store;               // destination directory (created if missing)

  // Groups to read, each "PATH" or "PATH=FIELD": "MR", "/data/MR=mr".
  // The field is named after the group path (leading '/' removed) unless
  // renamed. At least one; the first defines nothing special.
  std::vector<std::string> groups;

  // The source axis that indexes slices: 0, 1, 2 or negative from the end.
  int slice_axis = -1;

  std::string ids = "auto";  // "auto" | "stem" | "name" (see above)
  // Ids across files: a volume whose dataset name is already in the store
  // (or in this ingest) under another file prefix ("a/patient001" next to
  // "b/patient001": the same patient listed twice, or on both sides of a
  // split by id) is a warning in IngestSummary::warnings, or with
  // strict_ids an InvalidArgument before anything is written. With ids
  // "name" (or per-patient files), an id that two files give is an error for
  // the second file's volume (skipped with skip_errors), or with strict_ids
  // an InvalidArgument naming both files before anything is written.
  bool strict_ids = false;

  // Fields stored as masks: is_mask and, unless `norm` says otherwise, {0,1}.
  std::vector<std::string> mask_fields;
  // Per-field normalisation spec (see ParseNormalization). Default "none".
  std::map<std::string, std::string> norm;

  // Follow external links and read external/virtual storage.
  bool allow_external = false;

  // Record dtype per field, as --encoding: "float32" (default) or "compact"
  // for every field, "FIELD=float32|compact|float16" for one. compact keeps
  // uint8 / uint16 datasets as they are, int8 / int16 as int16, float16 ones
  // with norm none as float16, others float32 (ingest/encoding.h).
  std::vector<std::string> encoding;
  // Only "rows": volume slices are read whole, each one contiguous range of
  // its (S,H,W) record, so tiles would not help; "tiles" is refused with a
  // message saying so. tile_size as for images (unused).
  std::string layout = "rows";
  uint32_t tile_size = 0;

  bool skip_errors = false;                    // --on-error skip
  std::string report_path;                     // failures as TSV; default <store>/ingest-errors.tsv
  uint64_t batch_bytes = uint64_t{256} << 20;  // commit after this many float32 bytes
  // Source bytes read per hyperslab (rounded to whole chunk rows along the
  // slice axis, at least one row). 16 MiB measured fastest on 512x512x300
  // int16 gzip (h5py's default chunks, 32x32x38): larger slabs only add
  // memory and cache misses in the transposition.
  uint64_t slab_bytes = uint64_t{16} << 20;
  // HDF5 chunk cache per dataset (H5Pset_chunk_cache). Slab reads cover
  // whole chunks, so each chunk is decompressed once whatever this is.
  uint64_t chunk_cache_bytes = uint64_t{4} << 20;
  bool durable = true;       // fsync each commit
  std::string command_line;  // recorded in the metadata
  // Shard I of N (shard_count 0: everything), as ImageIngestOptions: only
  // volumes whose id has ShardOfId(id, N) == I. Ids are assigned (and
  // checked across files) over all the input first, so every shard names a
  // volume as a single ingest would; a file that cannot be read fails every
  // shard (its volumes are unknown).
  uint32_t shard_index = 0, shard_count = 0;
  ProgressCallback progress;  // called on the calling thread; done/total count volumes
  // Polled between volumes; returning true stops the ingest with everything
  // committed so far kept (Status code kAborted). E.g. a Ctrl-C flag.
  std::function<bool()> cancelled;
};

// Runs an HDF5 volume ingest. Returns the summary (samples_* count
// volumes; a file that cannot be read counts as one failure) or the first
// error (stop mode), whose message names file, group and dataset.
Result<IngestSummary> IngestHdf5(const Hdf5IngestOptions& options);

// Export of volume stores (Export() in ingest.h dispatches here for stores of
// kind "volumes"):
//   * format "png" (default): OUTDIR/<id>/<field>/<slice:04>.png, one 8-bit
//     gray PNG per slice, window [LO,HI] -> [0,255] (window_lo/hi when
//     has_window, else the finite min..max of that volume).
//   * format "h5": one file OUTDIR/volumes.h5 mirroring the source: one group
//     per field (named after the source group recorded at ingest, e.g.
//     "/MR", else the field name) and in it one float32 dataset per id (an id
//     "train/patient001" becomes the subgroup "train" and the dataset
//     "patient001"; unsafe parts are percent-encoded as SafeRelativePath
//     does). Values are the stored float32 values, bit-exact. Axis order:
//     axis_order "source" (default) moves the slice axis back where it was in
//     the source (the "slice_axis" store attribute), "shw" writes (S, H, W).
//     Each dataset carries the attributes "normalisation" and "source_type";
//     the file root carries "slice_axis" and "axis_order".

}  // namespace patchstore
