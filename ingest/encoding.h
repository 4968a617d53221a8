// patchstore/ingest/encoding.h — which dtype and layout each field's records
// get (ingest-private; store/FORMAT.md "Encodings" and "Tiled records").
//
// The one place an ingest decides a record's dtype: the user's --encoding
// specs become an EncodingPlan, and RecordDType(plan.For(field), source,
// norm) gives the dtype of a record of that field. The decode (images:
// decode.cc ToCHW; HDF5: ingest_hdf5.cc ReadVolume) then writes either
// normalised float32/float16 values or the raw source values (uint8, uint16,
// int16: StoresRawSource), never both pipelines.
//
//   float32  (default) normalised float32, as before encodings existed.
//   compact  the smallest type that holds the source exactly: uint8 for 8-bit
//            sources, uint16 for 16-bit, int16 for int8/int16, float16 for a
//            float16 source kept unnormalised (norm none, no clamp), float32
//            for everything else (float32/64 and 32/64-bit integers).
//   float16  normalised float32 rounded to nearest binary16 (ties to even):
//            relative error <= 2^-11 for |v| in [2^-14, 65504], absolute error
//            <= 2^-25 below 2^-14, |v| >= 65520 becomes +-inf, NaN stays NaN.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "patchstore/store/format.h"
#include "patchstore/store/status.h"

namespace patchstore {

enum class FieldEncoding : uint8_t { kFloat32, kCompact, kFloat16 };

const char* FieldEncodingName(FieldEncoding e);

struct EncodingPlan {
  FieldEncoding default_encoding = FieldEncoding::kFloat32;
  std::map<std::string, FieldEncoding> per_field;
  FieldEncoding For(const std::string& field) const {
    auto it = per_field.find(field);
    return it == per_field.end() ? default_encoding : it->second;
  }
};

// Parses --encoding specs: "float32" | "compact" (every field) or
// "FIELD=float32|compact|float16" (one field; later specs win). "float16"
// alone is refused (give it per field: it loses precision). Errors name the
// bad spec and what is accepted.
Result<EncodingPlan> ParseEncodings(const std::vector<std::string>& specs);

// InvalidArgument naming the first per-field spec whose field is not in
// `fields` (what: "the input" / "no --group").
Status CheckEncodingFields(const EncodingPlan& plan, const std::vector<std::string>& fields);

// The dtype of a record of a field encoded `e` whose source is `source`,
// normalised by `norm`.
DType RecordDType(FieldEncoding e, SourceType source, const Normalization& norm);

// The tile edge of `--layout tiles` when --tile-size is not given, for a new
// store (a resumed one keeps its own: StoredTile). A window of a store larger
// than RAM is read as one contiguous range per tile row of each field, and a
// disk that serves random reads at a nearly fixed rate per request delivers a
// window sooner in fewer, larger ranges: 64-pixel tiles rather than 32 for
// windows of 256x256 and larger. The cost is bytes read beyond the window,
// at most (1+T/h)(1+T/w) of its bytes, which grows as windows shrink: for
// windows of 128x128 and smaller --tile-size 32 is the better choice
// (docs/guide/larger-than-ram.md; the measurements:
// bench/results/scale_windows.md).
inline constexpr uint32_t kDefaultTileSize = 64;

// The layout options: "rows" (tile 0) or "tiles" (tile_size, checked with
// ValidTileSize; 0: kDefaultTileSize). Returns the tile edge of every CHW
// record, or an error naming the option.
Result<uint16_t> ParseLayout(const std::string& layout, uint32_t tile_size);

// The tile edge of the store's CHW fields (0: none, or rows): what a resumed
// `--layout tiles` ingest without --tile-size keeps.
uint16_t StoredTile(const StoreMeta& meta);

// "rows" or "tiles 32".
std::string LayoutName(uint16_t tile);

// Round-to-nearest-even float32 -> binary16.
Float16 ToFloat16(float v);

// True when every element of a payload is 0 once normalised as readers see it
// (raw-source dtypes through header.norm), tile padding included (zeros).
bool AllZeroAfterNorm(const RecordHeader& header, const void* payload);

// A store being resumed must have been filled with the same encoding and
// layout: each of the store's fields (meta) is checked against what `plan`
// and `tile` would write for it (its recorded source type and norm). An
// InvalidArgument that names the store, the field, both settings and what to
// do; OK for a new store.
Status CheckResumeEncoding(const StoreMeta& meta, const std::string& store, const EncodingPlan& plan, uint16_t tile);

}  // namespace patchstore
