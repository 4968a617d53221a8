// ingest/volume_decode.h — one medical volume decoded in an isolated
// process (ingest-private; no ITK type appears here).
//
// `ingest volumes` decodes each file (or DICOM series) with ITK inside a
// DecodePool child (ingest/decode_pool.h): a hostile header, a truncated
// stream or an allocation bomb takes down the child, not the ingest. The
// parent sends a VolumeRequest and gets back a VolumeReply; the voxels lie in
// the slot's shared buffer, in ITK's buffer order (index i fastest, then j,
// then k), in the type `VolumeReply::type`.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "patchstore/store/format.h"
#include "patchstore/store/status.h"

namespace patchstore {

// A grid in ITK's terms: index axes (i, j, k), LPS millimetres.
struct VolumeGrid {
  std::array<uint64_t, 3> size{0, 0, 0};  // voxels along i, j, k
  std::array<double, 3> spacing{1, 1, 1};
  std::array<double, 3> origin{0, 0, 0};
  std::array<double, 9> direction{1, 0, 0, 0, 1, 0, 0, 0, 1};  // row-major; column c: axis c
};

// "" when the grids are the same (sizes equal; spacing, origin and
// direction within ITK's default tolerances, 1e-6 of the spacing and 1e-6
// for direction cosines, plus the precision of a float32 header: 2.4e-7 of
// the value); else what differs, e.g. "spacing (1, 1, 3) vs (1, 1, 2.5)
// (mm)", origins and directions in LPS.
std::string GridDifference(const VolumeGrid& a, const VolumeGrid& b);
// "(1, 1, 2.5)".
std::string FormatTriple(const std::array<double, 3>& v);

// Element types of decoded voxels.
enum class VoxelType : uint8_t { kUInt8, kInt8, kUInt16, kInt16, kUInt32, kInt32, kFloat32, kFloat64, kInt64, kUInt64 };
size_t VoxelSize(VoxelType t);
SourceType VoxelSource(VoxelType t);

struct VolumeRequest {
  std::string path;           // a file, or a folder holding a DICOM series
  std::string series;         // DICOM: the SeriesInstanceUID (or series number) to read; "" = the only one
  int64_t volume_index = -1;  // 4-D images: the volume to take; -1 refuses them
  std::string orient;         // "" or three letters ("RAS", "LPS"): reorient first (exact: permute and flip)
  bool resample = false;      // resample to `spacing` (the grid keeps its origin and direction)
  std::array<double, 3> spacing{0, 0, 0};
  bool to_reference = false;  // resample onto `reference` (the first field's grid)
  VolumeGrid reference;
  bool nearest = false;  // nearest-neighbour interpolation (masks, labels); else linear, to float32
  uint64_t max_voxels = 0;
};

struct VolumeReply {
  Status status;
  VolumeGrid grid;    // of the voxels delivered (after --orient / --spacing)
  VolumeGrid source;  // as the file declares it
  VoxelType type = VoxelType::kFloat32;
  std::string format;  // "nifti", "metaimage", "nrrd", "dicom"
  int qform_code = -1, sform_code = -1;
  uint16_t flags = 0;  // kGeometryReoriented | kGeometryResampled
  std::vector<std::string> warnings;
  uint64_t bytes = 0;  // of voxels in the shared buffer
};

std::string EncodeVolumeRequest(const VolumeRequest& r);
Result<VolumeRequest> DecodeVolumeRequest(const std::string& bytes);
std::string EncodeVolumeReply(const VolumeReply& r);
Result<VolumeReply> DecodeVolumeReply(const std::string& bytes);

// The job a DecodePool child runs for `ingest volumes` (ingest/itk/): decodes
// the request, reads the volume into `shared` and returns the encoded reply.
// Null when patchstore was built without ITK.
using VolumeDecodeFn = std::string (*)(const std::string& request, uint8_t* shared, size_t shared_size);
VolumeDecodeFn ItkVolumeDecoder();

// Writes a (S, H, W) float32 volume with its geometry (x = W, y = H, z = S)
// as NIfTI (.nii / .nii.gz) or MetaImage (.mha) through ITK, by the name's
// extension. Unsupported when built without ITK.
Status WriteVolumeFile(const std::string& path, const float* data, const std::array<uint64_t, 3>& shw,
                       const VolumeGeometry& geometry);

}  // namespace patchstore
