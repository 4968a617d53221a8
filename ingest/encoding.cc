#include "ingest/encoding.h"

#include <cmath>
#include <cstring>

#include "patchstore/store/dtype.h"

namespace patchstore {
namespace {

Result<FieldEncoding> ParseOne(const std::string& name, const std::string& spec, bool per_field) {
  if (name == "float32") return FieldEncoding::kFloat32;
  if (name == "compact") return FieldEncoding::kCompact;
  if (name == "float16") {
    if (per_field) return FieldEncoding::kFloat16;
    return Status::InvalidArgument("--encoding '" + spec +
                                   "': float16 loses precision, so it is given per field: --encoding FIELD=float16");
  }
  return Status::InvalidArgument("--encoding '" + spec + "': unknown encoding '" + name +
                                 "' (float32, compact, or FIELD=float32|compact|float16)");
}

}  // namespace

const char* FieldEncodingName(FieldEncoding e) {
  switch (e) {
    case FieldEncoding::kFloat32: return "float32";
    case FieldEncoding::kCompact: return "compact";
    case FieldEncoding::kFloat16: return "float16";
  }
  return "unknown";
}

Result<EncodingPlan> ParseEncodings(const std::vector<std::string>& specs) {
  EncodingPlan plan;
  for (const std::string& spec : specs) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos) {
      PS_ASSIGN_OR_RETURN(plan.default_encoding, ParseOne(spec, spec, false));
      continue;
    }
    const std::string field = spec.substr(0, eq);
    if (field.empty())
      return Status::InvalidArgument("--encoding '" + spec + "': no field name before '=' (FIELD=ENCODING)");
    PS_ASSIGN_OR_RETURN(plan.per_field[field], ParseOne(spec.substr(eq + 1), spec, true));
  }
  return plan;
}

Status CheckEncodingFields(const EncodingPlan& plan, const std::vector<std::string>& fields) {
  for (const auto& [f, e] : plan.per_field) {
    bool found = false;
    for (const std::string& g : fields) found = found || g == f;
    if (!found) {
      std::string have;
      for (const std::string& g : fields) have += (have.empty() ? "" : ", ") + g;
      return Status::InvalidArgument("ingest: --encoding names field '" + f + "', which the input does not have (" +
                                     "fields: " + have + ")");
    }
  }
  return Status::OK();
}

DType RecordDType(FieldEncoding e, SourceType source, const Normalization& norm) {
  switch (e) {
    case FieldEncoding::kFloat32: return DType::kFloat32;
    case FieldEncoding::kFloat16: return DType::kFloat16;
    case FieldEncoding::kCompact:
      switch (source) {
        case SourceType::kUInt8: return DType::kUInt8;
        case SourceType::kUInt16: return DType::kUInt16;
        case SourceType::kInt8:
        case SourceType::kInt16: return DType::kInt16;
        case SourceType::kFloat16:
          // Float records hold normalised values: exact only when the
          // normalisation is the identity.
          return norm.kind == NormKind::kNone && !norm.clamp ? DType::kFloat16 : DType::kFloat32;
        default: return DType::kFloat32;
      }
  }
  return DType::kFloat32;
}

Result<uint16_t> ParseLayout(const std::string& layout, uint32_t tile_size) {
  if (layout == "rows") return uint16_t{0};
  if (layout != "tiles") return Status::InvalidArgument("ingest: --layout must be rows or tiles, got '" + layout + "'");
  if (tile_size == 0) tile_size = kDefaultTileSize;
  if (!ValidTileSize(tile_size))
    return Status::InvalidArgument("ingest: --tile-size must be a multiple of 8 in " + std::to_string(kMinTileSize) +
                                   ".." + std::to_string(kMaxTileSize) + ", got " + std::to_string(tile_size));
  return static_cast<uint16_t>(tile_size);
}

uint16_t StoredTile(const StoreMeta& meta) {
  for (const FieldMeta& f : meta.fields)
    if (f.layout == Layout::kCHW && f.tile != 0) return f.tile;
  return 0;
}

std::string LayoutName(uint16_t tile) { return tile == 0 ? "rows" : "tiles " + std::to_string(tile); }

Float16 ToFloat16(float v) {
  uint32_t x;
  std::memcpy(&x, &v, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  Float16 h;
  if (exp == 0xff) {  // inf or NaN (NaN stays a quiet NaN, keeping the top payload bits)
    h.bits = static_cast<uint16_t>(sign | 0x7c00u | (mant ? (0x200u | (mant >> 13)) : 0u));
    return h;
  }
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) {  // too large: infinity
    h.bits = static_cast<uint16_t>(sign | 0x7c00u);
    return h;
  }
  if (e <= 0) {
    // Subnormal half (or zero): value = m * 2^-24 with m = round(|v| * 2^24).
    if (e < -10) {  // below half the smallest subnormal: rounds to zero
      h.bits = sign;
      return h;
    }
    mant |= 0x800000u;         // implicit bit
    const int shift = 14 - e;  // 14..24
    const uint32_t half = 1u << (shift - 1);
    uint32_t m = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1);
    if (rest > half || (rest == half && (m & 1u))) ++m;
    h.bits = static_cast<uint16_t>(sign | m);  // m may carry into the exponent: still correct
    return h;
  }
  uint32_t m = mant >> 13;
  const uint32_t rest = mant & 0x1fffu;
  uint32_t bits = (static_cast<uint32_t>(e) << 10) | m;
  if (rest > 0x1000u || (rest == 0x1000u && (m & 1u))) ++bits;  // may carry to the exponent, or to infinity
  h.bits = static_cast<uint16_t>(sign | bits);
  return h;
}

bool AllZeroAfterNorm(const RecordHeader& h, const void* payload) {
  const uint64_t n = h.payload_bytes / DTypeSize(h.dtype);
  return VisitDType(h.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = static_cast<const T*>(payload);
    if constexpr (std::is_arithmetic_v<T>) {
      if (StoresRawSource(h.dtype)) {
        for (uint64_t i = 0; i < n; ++i)
          if (h.norm.Apply(static_cast<double>(p[i])) != 0) return false;
        return true;
      }
    }
    for (uint64_t i = 0; i < n; ++i)
      if (!(ToFloat32(p[i]) == 0)) return false;
    return true;
  });
}

Status CheckResumeEncoding(const StoreMeta& meta, const std::string& store, const EncodingPlan& plan, uint16_t tile) {
  for (const FieldMeta& f : meta.fields) {
    const uint16_t want_tile = f.layout == Layout::kCHW ? tile : 0;
    if (f.tile != want_tile)
      return Status::InvalidArgument(
          "ingest into '" + store + "': field '" + f.name + "' is stored in " +
          (f.tile ? std::to_string(f.tile) + "-pixel tiles (--layout tiles --tile-size " + std::to_string(f.tile) + ")"
                  : std::string("rows (--layout rows)")) +
          " but this ingest asks for " +
          (want_tile ? std::to_string(want_tile) + "-pixel tiles (--layout tiles --tile-size " +
                           std::to_string(want_tile) + ")"
                     : std::string("rows (--layout rows)")) +
          "; a store keeps the layout of its first ingest: resume with the same options or ingest into a new store");
    const FieldEncoding e = plan.For(f.name);
    const DType want = RecordDType(e, f.source_type, f.norm);
    if (f.dtype != want)
      return Status::InvalidArgument(
          "ingest into '" + store + "': field '" + f.name + "' is stored as " + DTypeName(f.dtype) +
          " but this ingest's --encoding (" + FieldEncodingName(e) + " for '" + f.name + "') would store it as " +
          DTypeName(want) +
          "; a store keeps the encoding of its first ingest: resume with the same --encoding "
          "or ingest into a new store");
  }
  return Status::OK();
}

}  // namespace patchstore
