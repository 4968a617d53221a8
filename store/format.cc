#include "patchstore/store/format.h"
#include "store/numbers.h"
#include "store/shard.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace patchstore {
namespace {

constexpr uint8_t kMagic[4] = {'P', 'S', 'R', '1'};
constexpr size_t kHeaderChecksumOffset = kRecordHeaderSize - 8;

void PutU16(uint8_t* p, uint16_t v) {
  p[0] = v & 0xff;
  p[1] = v >> 8;
}
void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutF64(uint8_t* p, double d) {
  uint64_t v;
  std::memcpy(&v, &d, 8);
  PutU64(p, v);
}
uint16_t GetU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
double GetF64(const uint8_t* p) {
  uint64_t v = GetU64(p);
  double d;
  std::memcpy(&d, &v, 8);
  return d;
}

// Layouts of fields and sample summaries; record headers also take kBlocks
// (auxiliary records only).
bool ValidLayout(uint8_t v) { return v >= 1 && v <= 3; }
bool ValidRecordLayout(uint8_t v) { return v >= 1 && v <= 4; }
bool ValidNorm(uint8_t v) { return v <= 5; }
bool ValidSource(uint8_t v) { return v <= 11; }

// %.17g: the text store metadata has always held (it reads back exactly).
std::string FormatDouble(double d) { return FormatG(d, 17); }

// The shortest text that reads back as `v` (float32).
std::string ShowFloat(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string t;
  for (int p = 1; p <= 9; ++p) {
    t = FormatG(v, p);
    float back = 0;
    if (ParseFloat(t, &back) && back == v) break;
  }
  return t;
}

// A source value as the message shows it: integers in full, float32 values
// as float32, others as the shortest double text.
std::string ShowSource(double x) {
  if (x == std::floor(x) && std::fabs(x) < 1e19) return FormatG(x, 20);
  if (static_cast<double>(static_cast<float>(x)) == x) return ShowFloat(static_cast<float>(x));
  std::string t;
  for (int p = 1; p <= 17; ++p) {
    t = FormatG(x, p);
    double back = 0;
    if (ParseDouble(t, &back) && back == x) break;
  }
  return t;
}

}  // namespace

bool IsIntegerSource(SourceType t) {
  switch (t) {
    case SourceType::kUInt8:
    case SourceType::kInt8:
    case SourceType::kUInt16:
    case SourceType::kInt16:
    case SourceType::kUInt32:
    case SourceType::kInt32:
    case SourceType::kUInt64:
    case SourceType::kInt64: return true;
    default: return false;
  }
}

double SourceMaxValue(SourceType t) {
  switch (t) {
    case SourceType::kUInt8: return 255.0;
    case SourceType::kUInt16: return 65535.0;
    default: return 0.0;
  }
}

const char* SourceTypeName(SourceType t) {
  switch (t) {
    case SourceType::kUnknown: return "unknown";
    case SourceType::kUInt8: return "uint8";
    case SourceType::kUInt16: return "uint16";
    case SourceType::kFloat16: return "float16";
    case SourceType::kFloat32: return "float32";
    case SourceType::kInt16: return "int16";
    case SourceType::kFloat64: return "float64";
    case SourceType::kInt8: return "int8";
    case SourceType::kUInt32: return "uint32";
    case SourceType::kInt32: return "int32";
    case SourceType::kInt64: return "int64";
    case SourceType::kUInt64: return "uint64";
  }
  return "unknown";
}

const char* NormKindName(NormKind k) {
  switch (k) {
    case NormKind::kNone: return "none";
    case NormKind::kSymmetric: return "symmetric";
    case NormKind::kUnit: return "unit";
    case NormKind::kAffine: return "affine";
    case NormKind::kBinary: return "binary";
    case NormKind::kRange: return "range";
  }
  return "unknown";
}

float Normalization::Apply(double x) const {
  float v;
  switch (kind) {
    case NormKind::kNone: v = static_cast<float>(x); break;
    case NormKind::kSymmetric: v = static_cast<float>(x) / static_cast<float>(scale) * 2.0f - 1.0f; break;
    case NormKind::kUnit: v = static_cast<float>(x) / static_cast<float>(scale); break;
    case NormKind::kAffine: v = static_cast<float>(x) * static_cast<float>(scale) + static_cast<float>(offset); break;
    case NormKind::kBinary: v = x != 0 ? 1.0f : 0.0f; break;
    case NormKind::kRange: {
      // (x - mid) / half: exact at lo (-half / half), mid (0) and hi.
      // Halved first: HI - LO may exceed the double range when both are
      // finite (range:-1e308,1e308); otherwise the same bits.
      const double mid = scale / 2 + offset / 2, half = offset / 2 - scale / 2;
      v = static_cast<float>((x - mid) / half);
      break;
    }
    default: v = static_cast<float>(x);
  }
  if (clamp) {
    // NaN stays NaN: comparisons with NaN are false.
    if (v < static_cast<float>(clamp_lo)) v = static_cast<float>(clamp_lo);
    if (v > static_cast<float>(clamp_hi)) v = static_cast<float>(clamp_hi);
  }
  return v;
}

double Normalization::Invert(float v, double maxval) const {
  const double x = static_cast<double>(v);
  switch (kind) {
    case NormKind::kNone: return x;
    case NormKind::kSymmetric: return (x + 1.0) / 2.0 * scale;
    case NormKind::kUnit: return x * scale;
    case NormKind::kAffine: return scale != 0 ? (x - offset) / scale : 0.0;
    case NormKind::kBinary: return v != 0 ? maxval : 0.0;
    case NormKind::kRange: return (scale / 2 + offset / 2) + x * (offset / 2 - scale / 2);
  }
  return x;
}

std::string Normalization::ToString() const {
  std::string s;
  switch (kind) {
    case NormKind::kNone: s = "none"; break;
    case NormKind::kSymmetric: s = "symmetric/" + FormatDouble(scale); break;
    case NormKind::kUnit: s = "unit/" + FormatDouble(scale); break;
    case NormKind::kAffine: s = "affine(" + FormatDouble(scale) + "," + FormatDouble(offset) + ")"; break;
    case NormKind::kBinary: s = "binary"; break;
    case NormKind::kRange: s = "range[" + FormatDouble(scale) + "," + FormatDouble(offset) + "]"; break;
  }
  if (clamp) s += " clamp[" + FormatDouble(clamp_lo) + "," + FormatDouble(clamp_hi) + "]";
  return s;
}

bool Normalization::operator==(const Normalization& o) const {
  return kind == o.kind && scale == o.scale && offset == o.offset && clamp == o.clamp &&
         (!clamp || (clamp_lo == o.clamp_lo && clamp_hi == o.clamp_hi));
}

uint64_t RecordHeader::elements() const {
  uint64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

uint64_t BodyBytesFor(uint64_t payload_bytes) {
  uint64_t body = (payload_bytes + 15) & ~uint64_t{15};
  const uint64_t min_body = kMinRecordSize - kRecordHeaderSize;
  return std::max(body, min_body);
}

Status FinalizeHeader(RecordHeader* h) {
  if (h->rank < 1 || h->rank > kMaxRank) return Status::InvalidArgument("record rank must be 1..4");
  const size_t es = DTypeSize(h->dtype);
  if (es == 0) return Status::InvalidArgument("unknown record dtype");
  uint64_t bytes = es;
  for (int i = 0; i < kMaxRank; ++i) {
    if (i >= h->rank) {
      h->shape[i] = 0;
      continue;
    }
    if (h->shape[i] == 0) return Status::InvalidArgument("record has a zero dimension");
    if (h->shape[i] > kMaxPayloadBytes || bytes > kMaxPayloadBytes / h->shape[i])
      return Status::InvalidArgument("record larger than the 64 GiB limit");
    bytes *= h->shape[i];
  }
  if (!ValidTileSize(h->tile)) return Status::InvalidArgument("tile edge must be 0 or a multiple of 8 in 8..4096");
  if (h->tiled()) {
    if (h->layout != Layout::kCHW || h->rank != 3)
      return Status::InvalidArgument("only (C,H,W) image records can be tiled");
    const TileGrid g = h->grid();
    const uint64_t ty = static_cast<uint64_t>(g.tiles_y()), tx = static_cast<uint64_t>(g.tiles_x());
    const uint64_t tile_bytes = es * h->shape[0] * h->tile * h->tile;
    if (tile_bytes > kMaxPayloadBytes || ty * tx > kMaxPayloadBytes / tile_bytes)
      return Status::InvalidArgument("record larger than the 64 GiB limit");
    bytes = ty * tx * tile_bytes;
  }
  h->payload_bytes = bytes;
  h->body_bytes = BodyBytesFor(bytes);
  return Status::OK();
}

void EncodeRecordHeader(const RecordHeader& h, uint8_t* out) {
  std::memset(out, 0, kRecordHeaderSize);
  std::memcpy(out, kMagic, 4);
  PutU16(out + 4, h.version);
  PutU16(out + 6, static_cast<uint16_t>(kRecordHeaderSize));
  out[8] = static_cast<uint8_t>(h.dtype);
  out[9] = h.rank;
  out[10] = static_cast<uint8_t>(h.layout);
  out[11] = static_cast<uint8_t>(h.norm.kind);
  out[12] = static_cast<uint8_t>(h.source_type);
  out[13] = h.norm.clamp ? 1 : 0;  // flags
  PutU16(out + 14, h.tile);
  for (int i = 0; i < kMaxRank; ++i) PutU64(out + 16 + 8 * i, h.shape[i]);
  PutU64(out + 48, h.payload_bytes);
  PutU64(out + 56, h.body_bytes);
  PutF64(out + 64, h.norm.scale);
  PutF64(out + 72, h.norm.offset);
  PutF64(out + 80, h.norm.clamp ? h.norm.clamp_lo : 0.0);
  PutF64(out + 88, h.norm.clamp ? h.norm.clamp_hi : 0.0);
  PutU64(out + 96, h.body_checksum);
  PutU64(out + kHeaderChecksumOffset, Checksum64(out, kHeaderChecksumOffset));
}

Result<RecordHeader> ParseRecordHeader(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (data == nullptr || size < kRecordHeaderSize)
    return Status::Corruption("record of " + std::to_string(size) + " bytes is shorter than its header");
  if (std::memcmp(p, kMagic, 4) != 0) return Status::Corruption("bad record magic");
  if (GetU64(p + kHeaderChecksumOffset) != Checksum64(p, kHeaderChecksumOffset))
    return Status::Corruption("record header checksum mismatch");
  RecordHeader h;
  h.version = GetU16(p + 4);
  if (h.version != kFormatVersion)
    return Status::Corruption("unsupported record format version " + std::to_string(h.version));
  if (GetU16(p + 6) != kRecordHeaderSize) return Status::Corruption("bad record header size");
  if (DTypeSize(static_cast<DType>(p[8])) == 0) return Status::Corruption("bad record dtype");
  h.dtype = static_cast<DType>(p[8]);
  h.rank = p[9];
  if (h.rank < 1 || h.rank > kMaxRank) return Status::Corruption("bad record rank");
  if (!ValidRecordLayout(p[10])) return Status::Corruption("bad record layout");
  h.layout = static_cast<Layout>(p[10]);
  if (!ValidNorm(p[11])) return Status::Corruption("bad record normalisation");
  h.norm.kind = static_cast<NormKind>(p[11]);
  if (!ValidSource(p[12])) return Status::Corruption("bad record source type");
  h.source_type = static_cast<SourceType>(p[12]);
  if (p[13] > 1) return Status::Corruption("bad record flags");
  h.norm.clamp = p[13] == 1;
  h.tile = GetU16(p + 14);
  if (!ValidTileSize(h.tile)) return Status::Corruption("bad record tile size " + std::to_string(h.tile));
  uint64_t bytes = DTypeSize(h.dtype);
  for (int i = 0; i < kMaxRank; ++i) {
    h.shape[i] = GetU64(p + 16 + 8 * i);
    if (i >= h.rank) {
      if (h.shape[i] != 0) return Status::Corruption("bad record shape");
      continue;
    }
    if (h.shape[i] == 0 || h.shape[i] > kMaxPayloadBytes || bytes > kMaxPayloadBytes / h.shape[i])
      return Status::Corruption("bad record shape");
    bytes *= h.shape[i];
  }
  if (h.tiled()) {
    if (h.layout != Layout::kCHW || h.rank != 3) return Status::Corruption("tiled record that is not (C,H,W)");
    const uint64_t tile_bytes = DTypeSize(h.dtype) * h.shape[0] * h.tile * h.tile;  // < 2^36 * 2^24: no overflow
    const TileGrid g = h.grid();
    const uint64_t tiles = static_cast<uint64_t>(g.tiles_y()) * static_cast<uint64_t>(g.tiles_x());
    if (tile_bytes > kMaxPayloadBytes || tiles > kMaxPayloadBytes / tile_bytes)
      return Status::Corruption("bad record shape");
    bytes = tiles * tile_bytes;
  }
  h.payload_bytes = GetU64(p + 48);
  h.body_bytes = GetU64(p + 56);
  if (h.payload_bytes != bytes) return Status::Corruption("record payload size disagrees with its shape");
  if (h.body_bytes != BodyBytesFor(bytes)) return Status::Corruption("bad record body size");
  if (h.body_bytes != size - kRecordHeaderSize)
    return Status::Corruption("record length " + std::to_string(size) + " disagrees with its header (" +
                              std::to_string(kRecordHeaderSize + h.body_bytes) + ")");
  h.norm.scale = GetF64(p + 64);
  h.norm.offset = GetF64(p + 72);
  h.norm.clamp_lo = GetF64(p + 80);
  h.norm.clamp_hi = GetF64(p + 88);
  h.body_checksum = GetU64(p + 96);
  for (size_t i = 104; i < kHeaderChecksumOffset; ++i)
    if (p[i] != 0) return Status::Corruption("bad record reserved bytes");
  return h;
}

Status VerifyRecordBody(const RecordHeader& h, const void* record_data) {
  const auto* body = static_cast<const uint8_t*>(record_data) + kRecordHeaderSize;
  if (Checksum64(body, h.body_bytes) != h.body_checksum) return Status::Corruption("record checksum mismatch");
  for (uint64_t i = h.payload_bytes; i < h.body_bytes; ++i)
    if (body[i] != 0) return Status::Corruption("record padding is not zero");
  return Status::OK();
}

uint64_t Checksum64(const void* data, size_t size) { return XXH3_64bits(data, size); }

namespace {
// Calls fn(tile_byte_offset_of_row, row_major_byte_offset, bytes) for every
// row segment of every plane of every tile: the one walk of the tile grid.
template <class Fn>
void ForEachTileRow(size_t es, const TileGrid& g, Fn fn) {
  for (int64_t ty = 0; ty < g.tiles_y(); ++ty)
    for (int64_t tx = 0; tx < g.tiles_x(); ++tx) {
      const int64_t y0 = ty * g.T, x0 = tx * g.T;
      const int64_t rows = std::min(g.T, g.H - y0), cols = std::min(g.T, g.W - x0);
      for (int64_t c = 0; c < g.C; ++c)
        for (int64_t r = 0; r < rows; ++r)
          fn(static_cast<size_t>(g.TileOffset(ty, tx) + c * g.T * g.T + r * g.T) * es,
             static_cast<size_t>((c * g.H + y0 + r) * g.W + x0) * es, static_cast<size_t>(cols) * es);
    }
}
}  // namespace

void TileCHW(const void* src, size_t es, const TileGrid& g, void* dst) {
  std::memset(dst, 0, static_cast<size_t>(g.elements()) * es);
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  ForEachTileRow(es, g, [&](size_t tile_off, size_t row_off, size_t n) { std::memcpy(d + tile_off, s + row_off, n); });
}

void UntileCHW(const void* src, size_t es, const TileGrid& g, void* dst) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  ForEachTileRow(es, g, [&](size_t tile_off, size_t row_off, size_t n) { std::memcpy(d + row_off, s + tile_off, n); });
}

std::array<uint8_t, kRecordKeySize> RecordKey(uint64_t sample, uint16_t field) {
  std::array<uint8_t, kRecordKeySize> k{};
  for (int i = 0; i < 8; ++i) k[i] = static_cast<uint8_t>(sample >> (56 - 8 * i));
  k[8] = static_cast<uint8_t>(field >> 8);
  k[9] = static_cast<uint8_t>(field);
  return k;
}

bool DecodeRecordKey(const void* data, size_t size, uint64_t* sample, uint16_t* field) {
  if (size != kRecordKeySize) return false;
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t s = 0;
  for (int i = 0; i < 8; ++i) s = (s << 8) | p[i];
  *sample = s;
  *field = static_cast<uint16_t>((p[8] << 8) | p[9]);
  return true;
}

std::array<uint8_t, 8> IndexKey(uint64_t sample) {
  std::array<uint8_t, 8> k{};
  for (int i = 0; i < 8; ++i) k[i] = static_cast<uint8_t>(sample >> (56 - 8 * i));
  return k;
}

bool DecodeIndexKey(const void* data, size_t size, uint64_t* sample) {
  if (size != 8) return false;
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t s = 0;
  for (int i = 0; i < 8; ++i) s = (s << 8) | p[i];
  *sample = s;
  return true;
}

std::string EncodeIdValue(uint64_t sample, std::string_view id) {
  std::string v(id);
  auto key = IndexKey(sample);
  std::string hashed(reinterpret_cast<const char*>(key.data()), key.size());
  hashed.append(id.data(), id.size());
  uint64_t h = Checksum64(hashed.data(), hashed.size());
  for (int i = 0; i < 8; ++i) v.push_back(static_cast<char>(h >> (8 * i)));
  return v;
}

Result<std::string_view> DecodeIdValue(uint64_t sample, const void* data, size_t size) {
  if (size < 8) return Status::Corruption("sample id entry shorter than its checksum");
  std::string_view id(static_cast<const char*>(data), size - 8);
  std::string expect = EncodeIdValue(sample, id);
  if (std::memcmp(expect.data() + id.size(), static_cast<const char*>(data) + id.size(), 8) != 0)
    return Status::Corruption("sample id entry #" + std::to_string(sample) + " checksum mismatch");
  return id;
}

// ---------------------------------------------------------------------------
// Metadata text.

namespace {

// Values are escaped so that any byte survives a line-based format:
// '\\' -> "\\\\", '\n' -> "\\n", '\r' -> "\\r", '=' stays (split at the first).
std::string Escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else out += c;
  }
  return out;
}

std::string Unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      char n = s[++i];
      out += n == 'n' ? '\n' : n == 'r' ? '\r' : n;
    } else {
      out += s[i];
    }
  }
  return out;
}

bool ParseU64(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

}  // namespace

int StoreMeta::FieldIndex(std::string_view name) const {
  for (size_t i = 0; i < fields.size(); ++i)
    if (fields[i].name == name) return static_cast<int>(i);
  return -1;
}

std::string StoreMeta::Encode() const {
  // Plain appends (no stream: its numbers would follow the global locale).
  std::string text;
  auto line = [&text](std::string_view key, const std::string& value) {
    text.append(key).append("=").append(value).append("\n");
  };
  line("patchstore_format", std::to_string(format_version));
  line("tool_version", Escape(tool_version));
  line("kind", Escape(kind));
  line("sealed", sealed ? "1" : "0");
  line("sample_count", std::to_string(sample_count));
  line("field_count", std::to_string(fields.size()));
  for (size_t i = 0; i < fields.size(); ++i) {
    const FieldMeta& f = fields[i];
    const std::string p = "field." + std::to_string(i) + ".";
    line(p + "name", Escape(f.name));
    line(p + "channels", std::to_string(f.channels));
    line(p + "layout", std::to_string(static_cast<int>(f.layout)));
    line(p + "dtype", std::to_string(static_cast<int>(f.dtype)));
    if (f.tile != 0) line(p + "tile", std::to_string(f.tile));
    line(p + "source_type", std::to_string(static_cast<int>(f.source_type)));
    line(p + "norm.kind", std::to_string(static_cast<int>(f.norm.kind)));
    line(p + "norm.scale", FormatDouble(f.norm.scale));
    line(p + "norm.offset", FormatDouble(f.norm.offset));
    line(p + "norm.clamp", f.norm.clamp ? "1" : "0");
    line(p + "norm.clamp_lo", FormatDouble(f.norm.clamp_lo));
    line(p + "norm.clamp_hi", FormatDouble(f.norm.clamp_hi));
    line(p + "channel_names", Escape(f.channel_names));
    line(p + "is_mask", f.is_mask ? "1" : "0");
    line(p + "has_sat", f.has_sat ? "1" : "0");
    if (f.mask_blocks != 0) line(p + "mask_blocks", std::to_string(f.mask_blocks));
    line(p + "source_format", Escape(f.source_format));
  }
  for (const auto& [k, v] : attributes) line("attr." + Escape(k), Escape(v));
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(Checksum64(text.data(), text.size())));
  return text + "checksum=" + hex + "\n";
}

// ---------------------------------------------------------------------------
// Sample summaries

namespace {
constexpr uint8_t kSummaryVersion = 1;
constexpr size_t kSummaryEntrySize = 48;
constexpr uint8_t kSummaryPresent = 1, kSummaryHasValid = 2;

uint64_t SummaryChecksum(uint64_t sample, const uint8_t* bytes, size_t n) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  auto key = IndexKey(sample);
  XXH3_64bits_update(st, key.data(), key.size());
  XXH3_64bits_update(st, bytes, n);
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}
}  // namespace

uint64_t RecordSummary::payload_bytes() const {
  if (!present || rank == 0) return 0;
  uint64_t n = DTypeSize(dtype);
  if (tile != 0 && rank == 3) {
    const TileGrid g{static_cast<int64_t>(shape[0]), static_cast<int64_t>(shape[1]), static_cast<int64_t>(shape[2]),
                     tile};
    return n * static_cast<uint64_t>(g.elements());
  }
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

bool RecordSummary::operator==(const RecordSummary& o) const {
  return present == o.present && dtype == o.dtype && layout == o.layout && rank == o.rank && shape == o.shape &&
         tile == o.tile && has_valid_count == o.has_valid_count && valid_count == o.valid_count;
}

RecordSummary SummaryOf(const RecordHeader& h) {
  RecordSummary r;
  r.present = true;
  r.dtype = h.dtype;
  r.layout = h.layout;
  r.rank = h.rank;
  r.shape = h.shape;
  r.tile = h.tile;
  return r;
}

RecordSummary SummarizeRecord(const RecordHeader& h, const void* record, bool is_mask) {
  RecordSummary r = SummaryOf(h);
  if (is_mask) {
    r.has_valid_count = true;
    r.valid_count = CountValid(h, static_cast<const uint8_t*>(record) + kRecordHeaderSize);
  }
  return r;
}

uint64_t CountValid(DType dtype, const void* data, uint64_t n) {
  return VisitDType(dtype, [&](auto tag) -> uint64_t {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float>) {
      return CountValid(static_cast<const float*>(data), n);
    } else {
      const T* p = static_cast<const T*>(data);
      uint64_t c = 0;
      for (uint64_t i = 0; i < n; ++i) c += IsValidMaskValue(p[i]);
      return c;
    }
  });
}

namespace {

// Which stored values of a record are valid mask values as readers see them:
// raw-source dtypes after the record's normalisation (IsValidMaskValue).
// 8/16-bit integers decide through a table, one entry per value.
template <typename T>
class Validity {
 public:
  explicit Validity(const RecordHeader& h) : h_(h) {
    if constexpr (std::is_integral_v<T> && sizeof(T) <= 2) {
      table_.resize(size_t{1} << (8 * sizeof(T)));
      for (size_t i = 0; i < table_.size(); ++i) {
        T v;
        const auto u = static_cast<std::make_unsigned_t<T>>(i);
        std::memcpy(&v, &u, sizeof v);
        table_[i] = Valid(v);
      }
    }
  }
  // Valid values among p[0..n).
  uint64_t CountRun(const T* p, uint64_t n) const {
    if constexpr (std::is_same_v<T, float>) {
      if (!(StoresRawSource(h_.dtype))) return CountValid(p, n);
    }
    uint64_t c = 0;
    if constexpr (std::is_integral_v<T> && sizeof(T) <= 2) {
      for (uint64_t i = 0; i < n; ++i) c += table_[static_cast<std::make_unsigned_t<T>>(p[i])];
    } else {
      for (uint64_t i = 0; i < n; ++i) c += Valid(p[i]);
    }
    return c;
  }

 private:
  bool Valid(T v) const {
    if constexpr (std::is_integral_v<T>) {
      if (StoresRawSource(h_.dtype) && h_.norm.kind != NormKind::kNone)
        return IsValidMaskValue(h_.norm.Apply(static_cast<double>(v)));
    }
    return IsValidMaskValue(v);
  }
  const RecordHeader& h_;
  std::vector<uint8_t> table_;
};

}  // namespace

uint64_t CountValid(const RecordHeader& h, const void* payload) {
  return VisitDType(h.dtype, [&](auto tag) -> uint64_t {
    using T = typename decltype(tag)::type;
    const Validity<T> validity(h);
    const T* data = static_cast<const T*>(payload);
    if (!h.tiled()) return validity.CountRun(data, h.elements());
    uint64_t c = 0;
    ForEachTileRow(sizeof(T), h.grid(), [&](size_t tile_off, size_t, size_t n) {
      c += validity.CountRun(data + tile_off / sizeof(T), n / sizeof(T));
    });
    return c;
  });
}

Result<RecordHeader> MaskBlocksHeader(const RecordHeader& mask, uint32_t b) {
  if (mask.layout != Layout::kCHW || mask.rank != 3 || mask.shape[0] != 1)
    return Status::InvalidArgument("mask block counts need a 1-channel image record");
  if (!ValidMaskBlock(b)) return Status::InvalidArgument("mask block edge must be in 8..4096");
  const uint64_t H = mask.shape[1], W = mask.shape[2];
  if (H > ((uint64_t{1} << 32) - 1) / W)
    return Status::InvalidArgument("mask of 2^32 pixels or more has no block counts");
  RecordHeader h;
  h.dtype = DType::kUInt32;
  h.layout = Layout::kBlocks;
  h.rank = 3;
  h.shape = {1, (H + b - 1) / b + 1, (W + b - 1) / b + 1, 0};
  PS_RETURN_IF_ERROR(FinalizeHeader(&h));
  return h;
}

void ComputeMaskBlocks(const RecordHeader& h, const void* payload, uint32_t b, uint32_t* out) {
  const int64_t H = static_cast<int64_t>(h.shape[1]), W = static_cast<int64_t>(h.shape[2]);
  const int64_t B = b, by = (H + B - 1) / B, bx = (W + B - 1) / B, stride = bx + 1;
  std::vector<uint32_t> counts(static_cast<size_t>(by * bx), 0);  // per block
  VisitDType(h.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Validity<T> validity(h);
    const T* data = static_cast<const T*>(payload);
    const TileGrid g = h.tiled() ? h.grid() : TileGrid{};
    for (int64_t y = 0; y < H; ++y) {
      uint32_t* row = counts.data() + (y / B) * bx;
      // Segments of the row that lie in one block and (tiled) one tile.
      for (int64_t x = 0; x < W;) {
        int64_t end = std::min(W, (x / B + 1) * B);
        const T* p;
        if (h.tiled()) {
          end = std::min(end, (x / g.T + 1) * g.T);
          p = data + g.ElementOffset(0, y, x);
        } else {
          p = data + y * W + x;
        }
        row[x / B] += static_cast<uint32_t>(validity.CountRun(p, static_cast<uint64_t>(end - x)));
        x = end;
      }
    }
  });
  // Integrate: out(j, i) = sum of counts over blocks [0, j) x [0, i).
  for (int64_t i = 0; i <= bx; ++i) out[i] = 0;
  for (int64_t j = 1; j <= by; ++j) {
    uint32_t run = 0;
    out[j * stride] = 0;
    for (int64_t i = 1; i <= bx; ++i) {
      run += counts[(j - 1) * bx + (i - 1)];
      out[j * stride + i] = out[(j - 1) * stride + i] + run;
    }
  }
}

uint64_t CountValid(const float* data, uint64_t n) {
  uint64_t c = 0;
  // v == v is false for NaN; v != 0 is false for +-0.
  for (uint64_t i = 0; i < n; ++i) c += (data[i] != 0.0f && data[i] == data[i]);
  return c;
}

std::string EncodeSampleSummary(uint64_t sample, const SampleSummary& summary) {
  const size_t n = summary.fields.size();
  std::string out(3 + n * kSummaryEntrySize + 8, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  p[0] = kSummaryVersion;
  PutU16(p + 1, static_cast<uint16_t>(n));
  for (size_t i = 0; i < n; ++i) {
    const RecordSummary& r = summary.fields[i];
    uint8_t* e = p + 3 + i * kSummaryEntrySize;
    if (r.present) {
      e[0] = kSummaryPresent | (r.has_valid_count ? kSummaryHasValid : 0);
      e[1] = static_cast<uint8_t>(r.dtype);
      e[2] = static_cast<uint8_t>(r.layout);
      e[3] = r.rank;
      PutU16(e + 4, r.tile);
      for (int d = 0; d < kMaxRank; ++d) PutU64(e + 8 + 8 * d, r.shape[d]);
      PutU64(e + 40, r.has_valid_count ? r.valid_count : 0);
    }
  }
  const size_t body = 3 + n * kSummaryEntrySize;
  PutU64(p + body, SummaryChecksum(sample, p, body));
  return out;
}

Result<SampleSummary> DecodeSampleSummary(uint64_t sample, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (data == nullptr || size < 3 + 8) return Status::Corruption("sample summary too short");
  if (p[0] != kSummaryVersion) return Status::Corruption("unknown sample summary version " + std::to_string(p[0]));
  const size_t n = GetU16(p + 1);
  const size_t body = 3 + n * kSummaryEntrySize;
  if (size != body + 8) return Status::Corruption("sample summary has the wrong length");
  if (GetU64(p + body) != SummaryChecksum(sample, p, body))
    return Status::Corruption("sample summary checksum mismatch");
  SampleSummary s;
  s.fields.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* e = p + 3 + i * kSummaryEntrySize;
    RecordSummary& r = s.fields[i];
    if ((e[0] & kSummaryPresent) == 0) continue;
    if (e[0] & ~(kSummaryPresent | kSummaryHasValid)) return Status::Corruption("bad sample summary flags");
    if (DTypeSize(static_cast<DType>(e[1])) == 0) return Status::Corruption("bad sample summary dtype");
    if (!ValidLayout(e[2])) return Status::Corruption("bad sample summary layout");
    if (e[3] < 1 || e[3] > kMaxRank) return Status::Corruption("bad sample summary rank");
    r.present = true;
    r.has_valid_count = (e[0] & kSummaryHasValid) != 0;
    r.dtype = static_cast<DType>(e[1]);
    r.layout = static_cast<Layout>(e[2]);
    r.rank = e[3];
    r.tile = GetU16(e + 4);
    if (!ValidTileSize(r.tile) || (r.tile != 0 && (r.layout != Layout::kCHW || r.rank != 3)))
      return Status::Corruption("bad sample summary tile size");
    uint64_t bytes = DTypeSize(r.dtype);
    for (int d = 0; d < kMaxRank; ++d) {
      r.shape[d] = GetU64(e + 8 + 8 * d);
      if (d >= r.rank) {
        if (r.shape[d] != 0) return Status::Corruption("bad sample summary shape");
        continue;
      }
      if (r.shape[d] == 0 || r.shape[d] > kMaxPayloadBytes / bytes)
        return Status::Corruption("bad sample summary shape");
      bytes *= r.shape[d];
    }
    r.valid_count = GetU64(e + 40);
    if (r.valid_count > bytes / DTypeSize(r.dtype)) return Status::Corruption("bad sample summary valid count");
  }
  return s;
}

namespace {
void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t GetU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
constexpr char kSealedMagic[4] = {'P', 'S', 'I', 'X'};
}  // namespace

std::string BeginSealedIndex(uint64_t count) {
  std::string b(16, '\0');
  auto* p = reinterpret_cast<uint8_t*>(b.data());
  std::memcpy(p, kSealedMagic, 4);
  PutU32(p + 4, 1);
  PutU64(p + 8, count);
  return b;
}

void AppendSealedIndexEntry(std::string* blob, std::string_view id, std::string_view summary) {
  uint8_t len[4];
  PutU32(len, static_cast<uint32_t>(id.size()));
  blob->append(reinterpret_cast<const char*>(len), 4);
  blob->append(id);
  PutU32(len, static_cast<uint32_t>(summary.size()));
  blob->append(reinterpret_cast<const char*>(len), 4);
  blob->append(summary);
}

void FinishSealedIndex(std::string* blob) {
  uint8_t sum[8];
  PutU64(sum, Checksum64(blob->data(), blob->size()));
  blob->append(reinterpret_cast<const char*>(sum), 8);
}

Result<std::vector<SealedIndexEntry>> DecodeSealedIndex(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (data == nullptr || size < 16 + 8 || std::memcmp(p, kSealedMagic, 4) != 0)
    return Status::Corruption("sealed index: bad header");
  if (GetU32(p + 4) != 1) return Status::Corruption("sealed index: unknown version " + std::to_string(GetU32(p + 4)));
  if (GetU64(p + size - 8) != Checksum64(p, size - 8)) return Status::Corruption("sealed index: checksum mismatch");
  const uint64_t count = GetU64(p + 8);
  const size_t end = size - 8;
  // Each entry takes at least 8 bytes (two lengths): bounds the count, and
  // so the allocation, by the blob's own size.
  if (count > (end - 16) / 8) return Status::Corruption("sealed index: bad count");
  std::vector<SealedIndexEntry> out;
  out.reserve(static_cast<size_t>(count));
  size_t at = 16;
  for (uint64_t i = 0; i < count; ++i) {
    SealedIndexEntry e;
    for (std::string_view* field : {&e.id, &e.summary}) {
      if (end - at < 4) return Status::Corruption("sealed index: truncated");
      const uint32_t n = GetU32(p + at);
      at += 4;
      if (end - at < n) return Status::Corruption("sealed index: truncated");
      *field = std::string_view(reinterpret_cast<const char*>(p + at), n);
      at += n;
    }
    out.push_back(e);
  }
  if (at != end) return Status::Corruption("sealed index: trailing bytes");
  return out;
}

Result<StoreMeta> StoreMeta::Decode(std::string_view text) {
  // The last line is "checksum=<16 hex digits>" over everything before it.
  {
    const size_t line = text.size() >= 27 ? text.size() - 26 : std::string_view::npos;
    if (line == std::string_view::npos || text.substr(line, 9) != "checksum=" || text.back() != '\n' ||
        (line > 0 && text[line - 1] != '\n'))
      return Status::Corruption("store metadata: missing checksum line");
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(Checksum64(text.data(), line)));
    if (text.substr(line + 9, 16) != std::string_view(hex, 16))
      return Status::Corruption("store metadata: checksum mismatch");
    text = text.substr(0, line);
  }
  std::map<std::string, std::string> kv;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.empty()) continue;
    size_t eq = line.find('=');
    if (eq == std::string_view::npos) return Status::Corruption("store metadata: line without '='");
    kv[std::string(line.substr(0, eq))] = Unescape(line.substr(eq + 1));
  }
  auto need = [&](const std::string& k) -> Result<std::string> {
    auto it = kv.find(k);
    if (it == kv.end()) return Status::Corruption("store metadata: missing '" + k + "'");
    return it->second;
  };
  auto need_u64 = [&](const std::string& k, uint64_t max) -> Result<uint64_t> {
    PS_ASSIGN_OR_RETURN(std::string s, need(k));
    uint64_t v;
    if (!ParseU64(s, &v) || v > max) return Status::Corruption("store metadata: bad '" + k + "'");
    return v;
  };
  auto need_f64 = [&](const std::string& k) -> Result<double> {
    PS_ASSIGN_OR_RETURN(std::string s, need(k));
    double v;
    if (!ParseDouble(s, &v)) return Status::Corruption("store metadata: bad '" + k + "'");
    return v;
  };
  StoreMeta m;
  PS_ASSIGN_OR_RETURN(uint64_t fv, need_u64("patchstore_format", 0xffff));
  if (fv < kOldestUpgradableStoreFormat || fv > kStoreFormatVersion)
    return Status::Corruption("unsupported store format version " + std::to_string(fv) + " (this patchstore reads " +
                              std::to_string(kStoreFormatVersion) + ")");
  m.format_version = static_cast<uint16_t>(fv);
  PS_ASSIGN_OR_RETURN(m.tool_version, need("tool_version"));
  PS_ASSIGN_OR_RETURN(m.kind, need("kind"));
  if (m.kind != "frames" && m.kind != "volumes")
    return Status::Corruption("store metadata: unknown kind '" + m.kind + "'");
  PS_ASSIGN_OR_RETURN(uint64_t sealed, need_u64("sealed", 1));
  m.sealed = sealed == 1;
  PS_ASSIGN_OR_RETURN(m.sample_count, need_u64("sample_count", std::numeric_limits<uint64_t>::max()));
  PS_ASSIGN_OR_RETURN(uint64_t nf, need_u64("field_count", kAuxFieldBase - 1));
  for (uint64_t i = 0; i < nf; ++i) {
    const std::string p = "field." + std::to_string(i) + ".";
    FieldMeta f;
    PS_ASSIGN_OR_RETURN(f.name, need(p + "name"));
    if (f.name.empty()) return Status::Corruption("store metadata: empty field name");
    for (const FieldMeta& g : m.fields)
      if (g.name == f.name) return Status::Corruption("store metadata: duplicate field '" + f.name + "'");
    PS_ASSIGN_OR_RETURN(uint64_t ch, need_u64(p + "channels", 1 << 16));
    f.channels = static_cast<uint32_t>(ch);
    PS_ASSIGN_OR_RETURN(uint64_t lay, need_u64(p + "layout", 255));
    if (!ValidLayout(static_cast<uint8_t>(lay))) return Status::Corruption("store metadata: bad layout");
    f.layout = static_cast<Layout>(lay);
    // Absent in stores written before the field dtype existed: float32.
    if (kv.count(p + "dtype")) {
      PS_ASSIGN_OR_RETURN(uint64_t dt, need_u64(p + "dtype", 255));
      if (!IsKnownDType(static_cast<uint8_t>(dt)))
        return Status::Corruption("store metadata: field '" + f.name + "' has unknown dtype " + std::to_string(dt));
      f.dtype = static_cast<DType>(dt);
    }
    if (kv.count(p + "tile")) {
      PS_ASSIGN_OR_RETURN(uint64_t t, need_u64(p + "tile", kMaxTileSize));
      if (!ValidTileSize(static_cast<uint32_t>(t)) || (t != 0 && f.layout != Layout::kCHW))
        return Status::Corruption("store metadata: field '" + f.name + "' has a bad tile size " + std::to_string(t));
      f.tile = static_cast<uint16_t>(t);
    }
    PS_ASSIGN_OR_RETURN(uint64_t st, need_u64(p + "source_type", 255));
    if (!ValidSource(static_cast<uint8_t>(st))) return Status::Corruption("store metadata: bad source type");
    f.source_type = static_cast<SourceType>(st);
    PS_ASSIGN_OR_RETURN(uint64_t nk, need_u64(p + "norm.kind", 255));
    if (!ValidNorm(static_cast<uint8_t>(nk))) return Status::Corruption("store metadata: bad norm");
    f.norm.kind = static_cast<NormKind>(nk);
    PS_ASSIGN_OR_RETURN(f.norm.scale, need_f64(p + "norm.scale"));
    PS_ASSIGN_OR_RETURN(f.norm.offset, need_f64(p + "norm.offset"));
    PS_ASSIGN_OR_RETURN(uint64_t cl, need_u64(p + "norm.clamp", 1));
    f.norm.clamp = cl == 1;
    PS_ASSIGN_OR_RETURN(f.norm.clamp_lo, need_f64(p + "norm.clamp_lo"));
    PS_ASSIGN_OR_RETURN(f.norm.clamp_hi, need_f64(p + "norm.clamp_hi"));
    PS_ASSIGN_OR_RETURN(f.channel_names, need(p + "channel_names"));
    PS_ASSIGN_OR_RETURN(uint64_t im, need_u64(p + "is_mask", 1));
    f.is_mask = im == 1;
    PS_ASSIGN_OR_RETURN(uint64_t hs, need_u64(p + "has_sat", 1));
    f.has_sat = hs == 1;
    if (kv.count(p + "mask_blocks")) {
      PS_ASSIGN_OR_RETURN(uint64_t mb, need_u64(p + "mask_blocks", 4096));
      if (mb != 0 && (!ValidMaskBlock(static_cast<uint32_t>(mb)) || !f.is_mask || f.has_sat || f.channels != 1 ||
                      f.layout != Layout::kCHW))
        return Status::Corruption("store metadata: field '" + f.name + "' has a bad mask block edge " +
                                  std::to_string(mb));
      f.mask_blocks = static_cast<uint16_t>(mb);
    }
    PS_ASSIGN_OR_RETURN(f.source_format, need(p + "source_format"));
    m.fields.push_back(std::move(f));
  }
  for (const auto& [k, v] : kv)
    if (k.rfind("attr.", 0) == 0) m.attributes[k.substr(5)] = v;
  return m;
}

std::string EncodeInputOrder(const std::vector<uint64_t>& ordinals) {
  std::string out(4 + 4 + 8 + 8 * ordinals.size() + 8, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  std::memcpy(p, "PSIO", 4);
  PutU32(p + 4, 1);
  PutU64(p + 8, ordinals.size());
  for (size_t i = 0; i < ordinals.size(); ++i) PutU64(p + 16 + 8 * i, ordinals[i]);
  const size_t body = out.size() - 8;
  PutU64(p + body, Checksum64(p, body));
  return out;
}

Result<std::vector<uint64_t>> DecodeInputOrder(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (data == nullptr || size < 24 || std::memcmp(p, "PSIO", 4) != 0)
    return Status::Corruption("bad input order (magic or length)");
  if (GetU32(p + 4) != 1) return Status::Corruption("unknown input order version " + std::to_string(GetU32(p + 4)));
  const uint64_t n = GetU64(p + 8);
  if (n > (size - 24) / 8 || 24 + 8 * n != size) return Status::Corruption("input order has the wrong length");
  if (GetU64(p + size - 8) != Checksum64(p, size - 8)) return Status::Corruption("input order checksum mismatch");
  std::vector<uint64_t> out(n);
  for (uint64_t i = 0; i < n; ++i) out[i] = GetU64(p + 16 + 8 * i);
  return out;
}

// ---------------------------------------------------------------------------
// Volume geometry.

namespace {
constexpr uint8_t kGeometryMagic[4] = {'P', 'S', 'G', 'M'};
constexpr uint16_t kGeometryVersion = 1;

std::string FormatNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string Triple(const std::array<double, 3>& v) {
  return "(" + FormatNumber(v[0]) + ", " + FormatNumber(v[1]) + ", " + FormatNumber(v[2]) + ")";
}
}  // namespace

std::array<double, 16> VolumeGeometry::AffineLPS() const {
  std::array<double, 16> a{};
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) a[r * 4 + c] = direction[r * 3 + c] * spacing[c];
    a[r * 4 + 3] = origin[r];
  }
  a[15] = 1;
  return a;
}

std::array<double, 16> VolumeGeometry::AffineRAS() const {
  std::array<double, 16> a = AffineLPS();
  for (int c = 0; c < 4; ++c) {
    a[c] = -a[c] + 0.0;  // + 0.0: no negative zeros
    a[4 + c] = -a[4 + c] + 0.0;
  }
  return a;
}

bool VolumeGeometry::operator==(const VolumeGeometry& o) const {
  return spacing == o.spacing && origin == o.origin && direction == o.direction && qform_code == o.qform_code &&
         sform_code == o.sform_code && flags == o.flags && source_spacing == o.source_spacing &&
         source_size == o.source_size;
}

Status CheckVolumeGeometry(const VolumeGeometry& g) {
  for (double s : g.spacing)
    if (!std::isfinite(s) || !(s > 0))
      return Status::InvalidArgument("spacing " + Triple(g.spacing) + ": every voxel size must be a positive number");
  for (double o : g.origin)
    if (!std::isfinite(o)) return Status::InvalidArgument("origin " + Triple(g.origin) + ": not a finite point");
  for (double d : g.direction)
    if (!std::isfinite(d)) return Status::InvalidArgument("direction: not finite");
  for (int a = 0; a < 3; ++a)
    for (int b = a; b < 3; ++b) {
      double dot = 0;
      for (int r = 0; r < 3; ++r) dot += g.direction[r * 3 + a] * g.direction[r * 3 + b];
      const double want = a == b ? 1.0 : 0.0;
      if (std::fabs(dot - want) > 1e-4) {
        std::string m = "direction [";
        for (int i = 0; i < 9; ++i) m += (i ? (i % 3 ? ", " : "; ") : "") + FormatNumber(g.direction[i]);
        m += "] is not orthonormal: ";
        if (a == b) m += "axis " + std::to_string(a) + " has length " + FormatNumber(std::sqrt(dot));
        else m += "axes " + std::to_string(a) + " and " + std::to_string(b) + " have dot product " + FormatNumber(dot);
        return Status::InvalidArgument(m + " (a sheared or scaled grid)");
      }
    }
  for (double s : g.source_spacing)
    if (!std::isfinite(s))
      return Status::InvalidArgument("source spacing " + Triple(g.source_spacing) + ": not finite");
  return Status::OK();
}

std::string EncodeVolumeGeometry(uint64_t sample, const VolumeGeometry& g) {
  std::string out(8 + kVolumeGeometrySize, '\0');
  auto* k = reinterpret_cast<uint8_t*>(out.data());
  const auto key = IndexKey(sample);
  std::memcpy(k, key.data(), 8);
  uint8_t* p = k + 8;
  std::memcpy(p, kGeometryMagic, 4);
  PutU16(p + 4, kGeometryVersion);
  PutU16(p + 6, g.flags);
  PutU16(p + 8, static_cast<uint16_t>(g.qform_code));
  PutU16(p + 10, static_cast<uint16_t>(g.sform_code));
  for (int i = 0; i < 3; ++i) PutF64(p + 16 + 8 * i, g.spacing[i]);
  for (int i = 0; i < 3; ++i) PutF64(p + 40 + 8 * i, g.origin[i]);
  for (int i = 0; i < 9; ++i) PutF64(p + 64 + 8 * i, g.direction[i]);
  for (int i = 0; i < 3; ++i) PutF64(p + 136 + 8 * i, g.source_spacing[i]);
  for (int i = 0; i < 3; ++i) PutU64(p + 160 + 8 * i, g.source_size[i]);
  PutU64(p + 184, Checksum64(k, 8 + 184));
  return out.substr(8);
}

Result<VolumeGeometry> DecodeVolumeGeometry(uint64_t sample, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (data == nullptr || size != kVolumeGeometrySize || std::memcmp(p, kGeometryMagic, 4) != 0)
    return Status::Corruption("bad volume geometry (magic or length)");
  if (GetU16(p + 4) != kGeometryVersion)
    return Status::Corruption("unknown volume geometry version " + std::to_string(GetU16(p + 4)));
  uint8_t keyed[8 + kVolumeGeometrySize];
  const auto key = IndexKey(sample);
  std::memcpy(keyed, key.data(), 8);
  std::memcpy(keyed + 8, p, kVolumeGeometrySize);
  if (GetU64(p + 184) != Checksum64(keyed, 8 + 184)) return Status::Corruption("volume geometry checksum mismatch");
  VolumeGeometry g;
  g.flags = GetU16(p + 6);
  g.qform_code = static_cast<int16_t>(GetU16(p + 8));
  g.sform_code = static_cast<int16_t>(GetU16(p + 10));
  for (int i = 0; i < 3; ++i) g.spacing[i] = GetF64(p + 16 + 8 * i);
  for (int i = 0; i < 3; ++i) g.origin[i] = GetF64(p + 40 + 8 * i);
  for (int i = 0; i < 9; ++i) g.direction[i] = GetF64(p + 64 + 8 * i);
  for (int i = 0; i < 3; ++i) g.source_spacing[i] = GetF64(p + 136 + 8 * i);
  for (int i = 0; i < 3; ++i) g.source_size[i] = GetU64(p + 160 + 8 * i);
  Status st = CheckVolumeGeometry(g);
  if (!st.ok()) return Status::Corruption("volume geometry: " + st.message());
  return g;
}

uint32_t ShardOfId(std::string_view id, uint32_t count) {
  return static_cast<uint32_t>(XXH3_64bits(id.data(), id.size()) % count);
}

Status ShardOfStore(const StoreMeta& meta, uint32_t* index, uint32_t* count) {
  auto it = meta.attributes.find(kShardAttribute);
  if (it == meta.attributes.end()) {
    *index = *count = 0;
    return Status::OK();
  }
  Status st = ParseShardSpec(it->second, index, count);
  if (!st.ok())
    return Status::Corruption("store metadata: bad attr." + std::string(kShardAttribute) + " (" + st.message() + ")");
  return Status::OK();
}

Status ParseShardSpec(std::string_view text, uint32_t* index, uint32_t* count) {
  const std::string shown(text);
  if (text.empty())
    return Status::InvalidArgument("shard '' is empty (an unset shell variable, e.g. --shard \"$I/$N\" or "
                                   "--shard \"$SLURM_ARRAY_TASK_ID\"?): expected I/N, e.g. 0/4 for the first of 4 "
                                   "shards; leave --shard out to ingest everything");
  const size_t slash = text.find('/');
  uint64_t i = 0, n = 0;
  if (slash == std::string_view::npos || !ParseU64(text.substr(0, slash), &i) || !ParseU64(text.substr(slash + 1), &n))
    return Status::InvalidArgument("shard '" + shown + "': expected I/N, e.g. 0/4 for the first of 4 shards");
  if (n == 0 || n > kMaxShardCount)
    return Status::InvalidArgument("shard '" + shown + "': the shard count N must be 1.." +
                                   std::to_string(kMaxShardCount));
  if (i >= n)
    return Status::InvalidArgument("shard '" + shown + "': the shard index I must be 0.." + std::to_string(n - 1) +
                                   " (shards are numbered from 0)");
  *index = static_cast<uint32_t>(i);
  *count = static_cast<uint32_t>(n);
  return Status::OK();
}

Result<Normalization> ParseNormalization(std::string_view spec, double maxval) {
  Normalization n;
  std::string_view base = spec, clamp;
  // At "+clamp:", not at the first '+': numbers may be written 1.5e+305.
  size_t plus = spec.find("+clamp:");
  if (plus != std::string_view::npos) {
    base = spec.substr(0, plus);
    clamp = spec.substr(plus + 1);
  } else if (spec.rfind("clamp:", 0) == 0) {
    base = "none";
    clamp = spec;
  }
  auto two = [](std::string_view s, double* a, double* b) {
    size_t c = s.find(',');
    return c != std::string_view::npos && ParseDouble(s.substr(0, c), a) && ParseDouble(s.substr(c + 1), b);
  };
  if (base == "none") {
    n.kind = NormKind::kNone;
  } else if (base == "symmetric") {
    n.kind = NormKind::kSymmetric;
    n.scale = maxval;
  } else if (base == "unit") {
    n.kind = NormKind::kUnit;
    n.scale = maxval;
  } else if (base == "binary") {
    n.kind = NormKind::kBinary;
  } else if (base.rfind("affine:", 0) == 0) {
    n.kind = NormKind::kAffine;
    if (!two(base.substr(7), &n.scale, &n.offset) || !std::isfinite(n.scale) || !std::isfinite(n.offset))
      return Status::InvalidArgument("normalisation 'affine:SCALE,OFFSET' needs two finite numbers, got '" +
                                     std::string(spec) + "'");
    if (n.scale == 0)
      return Status::InvalidArgument("normalisation '" + std::string(spec) +
                                     "': SCALE 0 maps every value to OFFSET (the data would be lost)");
    // The transform runs in float32 (Normalization::Apply): its parameters
    // must be float32 numbers too.
    for (auto [name, v] : {std::pair<const char*, double>{"SCALE", n.scale}, {"OFFSET", n.offset}})
      if (!std::isfinite(static_cast<float>(v)))
        return Status::InvalidArgument("normalisation '" + std::string(spec) + "': " + name + " " + ShowSource(v) +
                                       " is beyond the float32 range (largest 3.4028235e+38) in which the "
                                       "transform runs: every result would be infinite or NaN");
    if (static_cast<float>(n.scale) == 0.0f)
      return Status::InvalidArgument("normalisation '" + std::string(spec) + "': SCALE " + ShowSource(n.scale) +
                                     " is 0 in float32 (smallest 1.4e-45), in which the transform runs: it maps "
                                     "every value to OFFSET (the data would be lost)");
  } else if (base.rfind("range:", 0) == 0) {
    n.kind = NormKind::kRange;
    if (!two(base.substr(6), &n.scale, &n.offset) || !std::isfinite(n.scale) || !std::isfinite(n.offset) ||
        !(n.scale < n.offset))
      return Status::InvalidArgument("normalisation 'range:LO,HI' needs two finite numbers with LO < HI, got '" +
                                     std::string(spec) + "'");
    // [LO, HI] wider than the double range (range:-1e308,1e308) is applied
    // halved (Apply); whether it still tells a source's values apart is
    // CheckNormalizationFor's question.
    if (!clamp.empty())
      return Status::InvalidArgument("normalisation '" + std::string(spec) +
                                     "': range:LO,HI already clamps to [-1, 1]; give no +clamp");
    n.clamp = true;
    n.clamp_lo = -1;
    n.clamp_hi = 1;
  } else {
    return Status::InvalidArgument("unknown normalisation '" + std::string(spec) +
                                   "' (expected none, symmetric, unit, binary, affine:SCALE,OFFSET or "
                                   "range:LO,HI, optionally +clamp:LO,HI)");
  }
  if (!clamp.empty()) {
    if (clamp.rfind("clamp:", 0) != 0 || !two(clamp.substr(6), &n.clamp_lo, &n.clamp_hi) || !(n.clamp_lo <= n.clamp_hi))
      return Status::InvalidArgument("clamp must read 'clamp:LO,HI' with LO <= HI, got '" + std::string(spec) + "'");
    n.clamp = true;
  }
  if ((n.kind == NormKind::kSymmetric || n.kind == NormKind::kUnit) && !(maxval > 0))
    return Status::InvalidArgument("normalisation '" + std::string(base) + "' needs an integer source");
  return n;
}

namespace {

// The extremes of a source type's finite values.
void SourceExtremes(SourceType t, double* lo, double* hi) {
  switch (t) {
    case SourceType::kUInt8:
      *lo = 0;
      *hi = 255;
      return;
    case SourceType::kInt8:
      *lo = -128;
      *hi = 127;
      return;
    case SourceType::kUInt16:
      *lo = 0;
      *hi = 65535;
      return;
    case SourceType::kInt16:
      *lo = -32768;
      *hi = 32767;
      return;
    case SourceType::kUInt32:
      *lo = 0;
      *hi = 4294967295.0;
      return;
    case SourceType::kInt32:
      *lo = -2147483648.0;
      *hi = 2147483647.0;
      return;
    case SourceType::kUInt64:
      *lo = 0;
      *hi = 18446744073709551615.0;
      return;
    case SourceType::kInt64:
      *lo = -9223372036854775808.0;
      *hi = 9223372036854775807.0;
      return;
    case SourceType::kFloat16:
      *lo = -65504;
      *hi = 65504;
      return;
    case SourceType::kFloat32:
      *lo = -std::numeric_limits<float>::max();
      *hi = std::numeric_limits<float>::max();
      return;
    default:
      *lo = -std::numeric_limits<double>::max();
      *hi = std::numeric_limits<double>::max();
      return;
  }
}

}  // namespace

Status CheckNormalizationOn(const Normalization& n, double lo, double hi, bool every_step, std::string_view spec,
                            const std::string& values, bool check_finite) {
  if (n.kind == NormKind::kNone && !n.clamp) return Status::OK();
  if (n.kind == NormKind::kBinary) return Status::OK();  // two values by design
  Normalization open = n;                                // the transform before its clamp
  open.clamp = false;
  auto inside = [&](float u) {
    return !n.clamp || (u >= static_cast<float>(n.clamp_lo) && u <= static_cast<float>(n.clamp_hi));
  };
  auto bad = [&](const std::string& what) {
    return Status::InvalidArgument("normalisation '" + std::string(spec) + "' " + what);
  };
  // Finite: every transform is monotone in x, so its extremes decide.
  for (double x : {lo, hi}) {
    if (!check_finite) break;
    const float v = n.Apply(x);
    if (!std::isfinite(v))
      return bad("maps " + ShowSource(x) + " (" + values + ") to " + ShowFloat(v) +
                 " (the float32 transform overflows)");
  }
  // Not constant over the values it is meant to keep apart (a clamp
  // collapses what lies outside it on purpose).
  const float ulo = open.Apply(lo), uhi = open.Apply(hi);
  if (lo < hi && ulo == uhi && inside(ulo))
    return bad("maps every " + values + " to " + ShowFloat(n.Apply(lo)) +
               " (float32 cannot tell them apart after the transform)");
  if (every_step) {
    // Integer sources of at most 16 bits: every pair of neighbours.
    float prev = open.Apply(lo);
    for (double x = lo + 1; x <= hi; x += 1) {
      const float u = open.Apply(x);
      if (u == prev && inside(u))
        return bad("maps " + ShowSource(x - 1) + " and " + ShowSource(x) + " (" + values + "s) both to " +
                   ShowFloat(n.Apply(x)) + " (float32 cannot tell them apart after the transform)");
      prev = u;
    }
  }
  return Status::OK();
}

Status CheckNormalizationFor(const Normalization& n, SourceType source, std::string_view spec) {
  double lo = 0, hi = 0;
  SourceExtremes(source, &lo, &hi);
  const bool small_int = IsIntegerSource(source) && hi - lo < 65536;
  // float32/float64 sources: the type's extremes are no real values (affine
  // with SCALE 2 overflows at them), so only a transform that maps the whole
  // type to one value is refused here; each image's range is checked at
  // ingest (CheckNormalizationOn).
  const bool bounded = IsIntegerSource(source) || source == SourceType::kFloat16;
  return CheckNormalizationOn(n, lo, hi, small_int, spec, std::string(SourceTypeName(source)) + " value", bounded);
}

}  // namespace patchstore
