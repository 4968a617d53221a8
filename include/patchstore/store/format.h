// patchstore/store/format.h — the bytes of a record and of the store metadata.
//
// This header is the executable form of store/FORMAT.md. It knows bytes, not
// images: a record is a fixed 112-byte header followed by a payload of one
// element type (float32 for every record ingest writes today; see dtype.h).
// Everything here is pure (no LMDB, no I/O) so it can be unit-tested and
// fuzzed on arbitrary bytes.
//
// Thread-safety: all functions are reentrant.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "patchstore/store/dtype.h"
#include "patchstore/store/status.h"

namespace patchstore {

// Version of the record header (bytes 4..5 of every record).
inline constexpr uint16_t kFormatVersion = 1;
// Version of the store as a whole (`patchstore_format` in the metadata).
// 2 added the `index` database of sample summaries (see FORMAT.md); a store
// of version 1 is refused by readers with a message naming `patchstore
// upgrade`, and upgraded in place by the writer.
inline constexpr uint16_t kStoreFormatVersion = 2;
inline constexpr uint16_t kOldestUpgradableStoreFormat = 1;
inline constexpr size_t kRecordHeaderSize = 112;
// Every record value is at least this long (zero padding after the payload)
// so that LMDB stores it on its own overflow pages, whose data start at a
// fixed offset from a page boundary; this is what makes payloads aligned.
inline constexpr size_t kMinRecordSize = 4096;
// Payload pointers are guaranteed (and checked) to be aligned to this.
inline constexpr size_t kPayloadAlignment = 16;
inline constexpr int kMaxRank = 4;
// Hard limit on one record's payload, checked before any allocation:
// 2^36 bytes = 64 GiB.
inline constexpr uint64_t kMaxPayloadBytes = uint64_t{1} << 36;
// Tiled records (FORMAT.md "Tiled records"): the tile edge T is a multiple
// of 8 in [kMinTileSize, kMaxTileSize], so every tile starts 64-byte aligned.
inline constexpr uint32_t kMinTileSize = 8;
inline constexpr uint32_t kMaxTileSize = 4096;
// 0 (rows) or a valid tile edge.
constexpr bool ValidTileSize(uint32_t t) { return t == 0 || (t >= kMinTileSize && t <= kMaxTileSize && t % 8 == 0); }

// DType, DTypeSize, DTypeName and VisitDType: see dtype.h.

enum class Layout : uint8_t {
  kCHW = 1,  // an image: channels, height, width
  kSHW = 2,  // a volume: slices, height, width
  kSAT = 3,  // a summed-area table of a mask: (planes, H+1, W+1) uint32
  // Mask block counts (auxiliary records only): a summed-area table of the
  // valid pixels of a 1-channel image mask per B x B block,
  // (1, ceil(H/B)+1, ceil(W/B)+1) uint32; B is the field's mask_blocks.
  kBlocks = 4,
};

// The type a value had in its source file, before conversion to float32.
enum class SourceType : uint8_t {
  kUnknown = 0,
  kUInt8 = 1,
  kUInt16 = 2,
  kFloat16 = 3,
  kFloat32 = 4,
  kInt16 = 5,
  kFloat64 = 6,
  kInt8 = 7,
  kUInt32 = 8,
  kInt32 = 9,
  kInt64 = 10,
  kUInt64 = 11,
};
const char* SourceTypeName(SourceType t);
// True for the integer source types (8 to 64 bits, signed or not).
bool IsIntegerSource(SourceType t);
// The largest value of an integer source type that normalisations scale by
// (the `maxval` below): 255 for uint8, 65535 for uint16; 0 for every other
// type (no "symmetric"/"unit" for them, and values written back as floats).
double SourceMaxValue(SourceType t);

// How source values were mapped to stored float32 values. With `maxval` the
// largest value of the source integer type (255, 65535):
//   kNone:      v = x
//   kSymmetric: v = float(x) / maxval * 2 - 1     (float32 arithmetic, as
//               `img.astype(np.float32) / 255 * 2 - 1` computes it)
//   kUnit:      v = float(x) / maxval
//   kAffine:    v = float(x) * scale + offset
//   kBinary:    v = (x != 0) ? 1 : 0               (masks)
//   kRange:     v = (x - mid) / half in double arithmetic, rounded to
//               float32, with lo = scale, hi = offset, mid = (lo + hi) / 2,
//               half = (hi - lo) / 2: [lo, hi] onto [-1, 1], exactly -1, 0
//               and 1 at lo, mid and hi ("range:LO,HI", always clamped to
//               [-1, 1])
// then, when `clamp` is set, v = min(max(v, clamp_lo), clamp_hi).
enum class NormKind : uint8_t { kNone = 0, kSymmetric = 1, kUnit = 2, kAffine = 3, kBinary = 4, kRange = 5 };
const char* NormKindName(NormKind k);

struct Normalization {
  NormKind kind = NormKind::kNone;
  double scale = 1.0;   // kAffine: multiplier; kSymmetric/kUnit: maxval; kRange: LO
  double offset = 0.0;  // kAffine: offset; kRange: HI
  bool clamp = false;
  double clamp_lo = 0.0;
  double clamp_hi = 0.0;

  // Applies the mapping to one source value (as double) in float32.
  float Apply(double x) const;
  // The inverse of Apply: the source value (in double, not rounded) that a
  // stored value v came from, for a source whose largest value is `maxval`
  // (SourceMaxValue; kBinary maps non-zero back to maxval, kAffine with a
  // zero scale to 0). A clamp is not undone. Used by export (values written
  // back to PNG) and montage (tiles shown in source units).
  double Invert(float v, double maxval) const;
  // "none", "symmetric/255", "unit/65535", "affine(s,o)", "binary",
  // each optionally followed by " clamp[lo,hi]".
  std::string ToString() const;
  bool operator==(const Normalization& o) const;
};

// Integer record dtypes (uint8, uint16, int16: compact encodings) hold the
// values of the source file unchanged, and readers apply the record's
// normalisation when they convert to float32 (Normalization::Apply, so the
// result is bit-identical to a float32 record of the same source). Float
// dtypes (float32, float16) hold values already normalised at ingest; their
// normalisation only records how. (FORMAT.md "Encodings".)
constexpr bool StoresRawSource(DType d) { return d == DType::kUInt8 || d == DType::kUInt16 || d == DType::kInt16; }

// The tile grid of a tiled (C,H,W) record: tiles of T x T pixels in
// row-major tile order, each holding its C planes one after the other
// ([c][row][col], T*T elements per plane); edge tiles are padded with zeros
// to T x T. Element (c, y, x) lives at ElementOffset(c, y, x).
struct TileGrid {
  int64_t C = 0, H = 0, W = 0, T = 0;
  int64_t tiles_y() const { return (H + T - 1) / T; }
  int64_t tiles_x() const { return (W + T - 1) / T; }
  int64_t plane_elements() const { return T * T; }
  int64_t tile_elements() const { return C * T * T; }
  int64_t elements() const { return tiles_y() * tiles_x() * tile_elements(); }
  // Element offset of the first element of tile (ty, tx).
  int64_t TileOffset(int64_t ty, int64_t tx) const { return (ty * tiles_x() + tx) * tile_elements(); }
  int64_t ElementOffset(int64_t c, int64_t y, int64_t x) const {
    return TileOffset(y / T, x / T) + c * T * T + (y % T) * T + (x % T);
  }
};

// The decoded, validated header of one record.
struct RecordHeader {
  uint16_t version = kFormatVersion;
  DType dtype = DType::kFloat32;
  Layout layout = Layout::kCHW;
  SourceType source_type = SourceType::kUnknown;
  uint8_t rank = 3;
  std::array<uint64_t, kMaxRank> shape{};  // dims beyond rank are 0
  // 0: the payload is row-major in `shape` order. T > 0: a tiled (C,H,W)
  // record (layout CHW, rank 3), payload laid out as TileGrid{C,H,W,T}.
  uint16_t tile = 0;
  uint64_t payload_bytes = 0;  // elements() (or the tile grid's) * DTypeSize(dtype)
  uint64_t body_bytes = 0;     // payload + zero padding
  Normalization norm;
  uint64_t body_checksum = 0;  // XXH3-64 of the body

  uint64_t elements() const;  // product(shape): the logical elements
  bool tiled() const { return tile != 0; }
  // REQUIRES: tiled().
  TileGrid grid() const {
    return TileGrid{static_cast<int64_t>(shape[0]), static_cast<int64_t>(shape[1]), static_cast<int64_t>(shape[2]),
                    tile};
  }
  // Byte length of the whole record value: header + body.
  uint64_t record_bytes() const { return kRecordHeaderSize + body_bytes; }
};

// Returns the body size (payload + padding) for a payload of `payload_bytes`
// so that the record is at least kMinRecordSize long and a multiple of 16.
uint64_t BodyBytesFor(uint64_t payload_bytes);

// Fills `header.payload_bytes` and `header.body_bytes` from shape, dtype and
// tile and checks the limits (a tiled record must be CHW of rank 3 with a
// valid tile edge). Call before EncodeRecordHeader.
Status FinalizeHeader(RecordHeader* header);

// Writes the 112-byte header (with its own checksum) to `out`.
// REQUIRES: FinalizeHeader(header) succeeded and body_checksum is set.
void EncodeRecordHeader(const RecordHeader& header, uint8_t* out);

// Parses and validates a record value of `size` bytes at `data`. Trusts
// nothing: checks magic, version, header checksum, dtype, rank, every
// dimension, size arithmetic against overflow and that header + body equals
// `size` exactly. Does not check the body checksum (see VerifyRecordBody),
// so it is O(1). Returns Corruption on any mismatch.
Result<RecordHeader> ParseRecordHeader(const void* data, size_t size);

// Recomputes the body checksum and checks that the padding is zero.
Status VerifyRecordBody(const RecordHeader& header, const void* record_data);

// XXH3-64 of `size` bytes.
uint64_t Checksum64(const void* data, size_t size);

// Rearranges a row-major (C,H,W) array of `elem_size`-byte elements at `src`
// into the tile layout of `grid` at `dst` (grid.elements() * elem_size bytes,
// padding written as zeros), and back. Pure byte moves: any dtype.
void TileCHW(const void* src, size_t elem_size, const TileGrid& grid, void* dst);
void UntileCHW(const void* src, size_t elem_size, const TileGrid& grid, void* dst);

// ---------------------------------------------------------------------------
// Keys.

// records: 8-byte big-endian sample index then 2-byte big-endian field index.
inline constexpr size_t kRecordKeySize = 10;
std::array<uint8_t, kRecordKeySize> RecordKey(uint64_t sample, uint16_t field);
bool DecodeRecordKey(const void* data, size_t size, uint64_t* sample, uint16_t* field);
// ids: 8-byte big-endian sample index.
std::array<uint8_t, 8> IndexKey(uint64_t sample);
bool DecodeIndexKey(const void* data, size_t size, uint64_t* sample);

// ids values: the id bytes followed by 8 bytes, the little-endian XXH3-64 of
// (8-byte index key || id), so that a damaged id is detected.
std::string EncodeIdValue(uint64_t sample, std::string_view id);
// Returns the id (a view into `data`) or Corruption.
Result<std::string_view> DecodeIdValue(uint64_t sample, const void* data, size_t size);

// Field slots at or above this index hold auxiliary records of field
// `slot - kAuxFieldBase`: its summed-area tables (has_sat, format 1) or its
// mask block counts (mask_blocks), never both.
inline constexpr uint16_t kAuxFieldBase = 0x8000;

// Mask block counts (FORMAT.md "Mask block counts"). The block edge B the
// writer gives new 1-channel image mask fields; valid edges are 8..4096.
inline constexpr uint32_t kDefaultMaskBlock = 32;
constexpr bool ValidMaskBlock(uint32_t b) { return b >= 8 && b <= 4096; }
// The header of the block-count record of a mask record `mask` (1-channel
// CHW) with block edge `b`, finalized. InvalidArgument when the mask is not
// a 1-channel image record or has 2^32 or more pixels.
Result<RecordHeader> MaskBlocksHeader(const RecordHeader& mask, uint32_t b);
// Fills `out` (MaskBlocksHeader(mask, b)'s (by+1) x (bx+1) entries): entry
// (j, i) = the valid values (as CountValid counts them) of the mask's
// [0, min(jB, H)) x [0, min(iB, W)) pixels. `payload` is the mask's payload.
void ComputeMaskBlocks(const RecordHeader& mask, const void* payload, uint32_t b, uint32_t* out);

// ---------------------------------------------------------------------------
// Store metadata: the record "store" in the `meta` database, UTF-8 text of
// `key=value` lines (see FORMAT.md).

struct FieldMeta {
  std::string name;
  uint32_t channels = 0;  // C for images; 1 for volume fields
  Layout layout = Layout::kCHW;
  // The element type of every record of the field ("field.N.dtype"; absent
  // in stores written before it existed, which hold float32). Readers refuse
  // a record whose header says otherwise.
  DType dtype = DType::kFloat32;
  // The tile edge of every record of the field ("field.N.tile"; absent or 0:
  // rows).
  uint16_t tile = 0;
  SourceType source_type = SourceType::kUnknown;
  Normalization norm;
  std::string channel_names;  // comma-separated, e.g. "R,G,B" or "Z"
  bool is_mask = false;
  bool has_sat = false;  // summed-area table records exist
  // Block edge B of the mask block-count records that every record of this
  // field has ("field.N.mask_blocks"; absent or 0: none). Only for
  // 1-channel CHW mask fields without has_sat. The writer gives new such
  // fields kDefaultMaskBlock, or the edge set here (8..4096).
  uint16_t mask_blocks = 0;
  std::string source_format;  // "png", "exr", "hdf5", ...
};

struct StoreMeta {
  uint16_t format_version = kStoreFormatVersion;
  std::string tool_version;
  std::string kind = "frames";  // "frames" (images) or "volumes"
  bool sealed = false;
  uint64_t sample_count = 0;
  std::vector<FieldMeta> fields;
  // Free-form ingest settings, e.g. {"command": "...", "mask_valid": "nonzero"}.
  std::map<std::string, std::string> attributes;

  // Index of the field named `name`, or -1.
  int FieldIndex(std::string_view name) const;
  std::string Encode() const;
  static Result<StoreMeta> Decode(std::string_view text);
};

// ---------------------------------------------------------------------------
// Sample summaries: the values of the `index` database (one per sample, key
// IndexKey(sample)). They let readers answer everything that is not a pixel
// read — shapes, byte totals, which samples hold a mask pixel — without
// touching a record, i.e. without reading the store from disk.

struct RecordSummary {
  bool present = false;  // the sample has a record for this field
  DType dtype = DType::kFloat32;
  Layout layout = Layout::kCHW;
  uint8_t rank = 0;
  std::array<uint64_t, kMaxRank> shape{};
  uint16_t tile = 0;             // as in the record header
  bool has_valid_count = false;  // set for mask fields
  uint64_t valid_count = 0;      // non-zero, non-NaN values of a mask record

  uint64_t payload_bytes() const;  // the record's payload bytes (tile padding included)
  bool operator==(const RecordSummary& o) const;
};

struct SampleSummary {
  std::vector<RecordSummary> fields;  // in metadata field order
};

// Summary of a finalized header (valid count unset).
RecordSummary SummaryOf(const RecordHeader& header);
// Counts the values of a float32 mask payload that are non-zero and not NaN.
uint64_t CountValid(const float* data, uint64_t n);
// The valid values of a record as readers see them: of its logical elements
// (not tile padding), after its normalisation for raw-source dtypes
// (StoresRawSource), i.e. exactly the count of the float32 record of the
// same source. `payload` is the record's payload.
uint64_t CountValid(const RecordHeader& header, const void* payload);
// The same for `n` elements of type `dtype` at `data` (IsValidMaskValue).
// REQUIRES: dtype is a known DType.
uint64_t CountValid(DType dtype, const void* data, uint64_t n);
// The summary of a record (header at `record`, payload after it): SummaryOf
// plus, for a record of a mask field, its valid count. The writer, the
// upgrade and verify all derive entries with this one function.
RecordSummary SummarizeRecord(const RecordHeader& header, const void* record, bool is_mask);

// Encodes a summary with a checksum over (IndexKey(sample) || bytes), so a
// damaged or misplaced value is detected.
std::string EncodeSampleSummary(uint64_t sample, const SampleSummary& summary);
// Decodes and validates (checksum, enums, rank, dimension limits).
Result<SampleSummary> DecodeSampleSummary(uint64_t sample, const void* data, size_t size);

// The sealed index: every id and summary of a sealed store in one value
// (meta key "sealed_index"), so that opening a store that is not in the page
// cache is one contiguous read instead of a B-tree walk of scattered pages.
//   blob := "PSIX" u32le version=1 u64le count
//           { u32le id_len id u32le summary_len summary }*count
//           u64le xxh3_64(all before)
// Summaries are EncodeSampleSummary(index, ...) of index 0..count-1.
struct SealedIndexEntry {
  std::string_view id;       // into the blob
  std::string_view summary;  // encoded; into the blob
};
void AppendSealedIndexEntry(std::string* blob, std::string_view id, std::string_view summary);
// Starts a blob for `count` entries; finish with FinishSealedIndex.
std::string BeginSealedIndex(uint64_t count);
void FinishSealedIndex(std::string* blob);
// Checks magic, version, lengths and the checksum; entries point into `data`.
Result<std::vector<SealedIndexEntry>> DecodeSealedIndex(const void* data, size_t size);

// The input order of a shard (meta key "input_order", FORMAT.md "Shards"):
// for each sample in index order, its position in the whole input of the
// ingest (all shards' samples), so a reader of the shard set can number the
// samples as one ingest of that input did.
//   blob := "PSIO" u32le version=1 u64le count u64le ordinal{count}
//           u64le xxh3_64(all before)
std::string EncodeInputOrder(const std::vector<uint64_t>& ordinals);
// Checks magic, version, length and the checksum.
Result<std::vector<uint64_t>> DecodeInputOrder(const void* data, size_t size);

// ---------------------------------------------------------------------------
// Volume geometry (FORMAT.md "Volume geometry"): where the voxels of a volume
// lie in the patient, for volumes ingested from NIfTI, MetaImage, NRRD or
// DICOM. Just numbers: this room knows no imaging library.
//
// The (S, H, W) records of a volume are read as an image whose index axes are
// (x, y, z) = (W, H, S): element [s, h, w] lies at the physical point
//   origin + direction * diag(spacing) * (w, h, s)
// in millimetres, in ITK's patient coordinates LPS (x towards the patient's
// Left, y Posterior, z Superior). This is ITK's and SimpleITK's convention
// (sitk.GetArrayFromImage gives the (S, H, W) array of such an image).
struct VolumeGeometry {
  std::array<double, 3> spacing{1, 1, 1};                      // mm along x (W), y (H), z (S)
  std::array<double, 3> origin{0, 0, 0};                       // LPS mm of element [0, 0, 0]
  std::array<double, 9> direction{1, 0, 0, 0, 1, 0, 0, 0, 1};  // row-major 3x3; column c: axis c in LPS
  int16_t qform_code = -1, sform_code = -1;                    // NIfTI sources: their codes; -1 otherwise
  uint16_t flags = 0;                                          // kGeometry* bits: what ingest did
  // The source image's own grid as read (before --orient / --spacing), in
  // its index order (i, j, k): its voxel size and its number of voxels.
  std::array<double, 3> source_spacing{1, 1, 1};
  std::array<uint64_t, 3> source_size{0, 0, 0};

  // The 4x4 affine (row-major) from (w, h, s, 1) to LPS millimetres.
  std::array<double, 16> AffineLPS() const;
  // The same to RAS millimetres (nibabel's and NIfTI's convention): the
  // first two rows of AffineLPS negated. It equals nibabel's `img.affine`
  // of the volume exported as NIfTI.
  std::array<double, 16> AffineRAS() const;
  bool operator==(const VolumeGeometry& o) const;
};
inline constexpr uint16_t kGeometryReoriented = 1;  // --orient permuted/flipped the source axes
inline constexpr uint16_t kGeometryResampled = 2;   // --spacing resampled the source grid
inline constexpr size_t kVolumeGeometrySize = 192;  // encoded bytes, checksum included

// OK when every number is finite, spacings are positive and the direction's
// columns are unit vectors at right angles (within 1e-4); else
// InvalidArgument naming what is wrong ("spacing (1, 0, 2): not positive").
Status CheckVolumeGeometry(const VolumeGeometry& g);

// Encodes a geometry with a checksum over (IndexKey(sample) || bytes), so a
// damaged or misplaced value is detected; decoding checks magic, version,
// length, checksum and CheckVolumeGeometry.
std::string EncodeVolumeGeometry(uint64_t sample, const VolumeGeometry& g);
Result<VolumeGeometry> DecodeVolumeGeometry(uint64_t sample, const void* data, size_t size);

// Parses a normalisation spec as the command line takes it:
//   "none" | "symmetric" | "unit" | "binary" | "affine:SCALE,OFFSET"
// optionally followed by "+clamp:LO,HI" ("clamp:LO,HI" alone means none+clamp),
// or "range:LO,HI" (LO < HI; [LO, HI] onto [-1, 1], clamped; no +clamp).
// `maxval` fills scale for symmetric/unit.
Result<Normalization> ParseNormalization(std::string_view spec, double maxval);

// Refuses (InvalidArgument: "normalisation 'SPEC' maps ...", naming the
// values and what they become) a normalisation that, applied in float32 as
// Normalization::Apply does, gives a value that is not finite or maps
// distinct source values to one float32 value the clamp does not ask for:
//   * integer sources of at most 16 bits: every value of the type is checked
//     (each result finite, neighbours kept apart);
//   * 32/64-bit integer and float16 sources: the type's extremes (results
//     finite, not one value for the whole type: float32 already rounds
//     32-bit integers above 2^24, so neighbours are not compared);
//   * float32/float64 sources: a transform that maps every value to one
//     (CheckNormalizationOn checks each image's own range at ingest).
// `spec` is the user's text, shown in the message. kNone without a clamp
// and kBinary always pass.
Status CheckNormalizationFor(const Normalization& n, SourceType source, std::string_view spec);

// The same checks for source values in [lo, hi] (every integer between them
// when `every_step`; the results at lo and hi finite when `check_finite`);
// `values` names one of them in the message ("uint8 value", "float32 value
// of this file").
Status CheckNormalizationOn(const Normalization& n, double lo, double hi, bool every_step, std::string_view spec,
                            const std::string& values, bool check_finite = true);

}  // namespace patchstore
