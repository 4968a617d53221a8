// The request and reply of an isolated volume decode (ingest/volume_decode.h):
// length-prefixed key/value pairs, so the two sides agree on names, not on
// positions.
#include "ingest/volume_decode.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

namespace patchstore {
namespace {

void Put(std::string* out, const std::string& key, const std::string& value) {
  for (const std::string* s : {&key, &value}) {
    const uint64_t n = s->size();
    out->append(reinterpret_cast<const char*>(&n), 8);
    out->append(*s);
  }
}

Result<std::map<std::string, std::string>> Parse(const std::string& bytes) {
  std::map<std::string, std::string> kv;
  size_t pos = 0;
  auto take = [&](std::string* s) {
    uint64_t n = 0;
    if (bytes.size() - pos < 8) return false;
    std::memcpy(&n, bytes.data() + pos, 8);
    pos += 8;
    if (bytes.size() - pos < n) return false;
    s->assign(bytes, pos, n);
    pos += n;
    return true;
  };
  while (pos < bytes.size()) {
    std::string k, v;
    if (!take(&k) || !take(&v)) return Status::Internal("malformed volume decoder message");
    kv[k] = v;
  }
  return kv;
}

std::string Num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

template <size_t N>
std::string Nums(const std::array<double, N>& v) {
  std::string s;
  for (size_t i = 0; i < N; ++i) s += (i ? " " : "") + Num(v[i]);
  return s;
}

template <size_t N>
bool ParseNums(const std::string& s, std::array<double, N>* out) {
  const char* p = s.c_str();
  for (size_t i = 0; i < N; ++i) {
    char* end = nullptr;
    (*out)[i] = std::strtod(p, &end);
    if (end == p) return false;
    p = end;
  }
  return true;
}

void PutGrid(std::string* out, const std::string& prefix, const VolumeGrid& g) {
  Put(out, prefix + ".size",
      std::to_string(g.size[0]) + " " + std::to_string(g.size[1]) + " " + std::to_string(g.size[2]));
  Put(out, prefix + ".spacing", Nums(g.spacing));
  Put(out, prefix + ".origin", Nums(g.origin));
  Put(out, prefix + ".direction", Nums(g.direction));
}

bool GetGrid(const std::map<std::string, std::string>& kv, const std::string& prefix, VolumeGrid* g) {
  auto at = [&](const std::string& k) -> const std::string* {
    auto it = kv.find(prefix + "." + k);
    return it == kv.end() ? nullptr : &it->second;
  };
  const std::string* size = at("size");
  if (!size || !at("spacing") || !at("origin") || !at("direction")) return false;
  unsigned long long a = 0, b = 0, c = 0;
  if (std::sscanf(size->c_str(), "%llu %llu %llu", &a, &b, &c) != 3) return false;
  g->size = {a, b, c};
  return ParseNums(*at("spacing"), &g->spacing) && ParseNums(*at("origin"), &g->origin) &&
         ParseNums(*at("direction"), &g->direction);
}

std::string Get(const std::map<std::string, std::string>& kv, const std::string& key) {
  auto it = kv.find(key);
  return it == kv.end() ? std::string() : it->second;
}

}  // namespace

std::string FormatTriple(const std::array<double, 3>& v) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "(%g, %g, %g)", v[0], v[1], v[2]);
  return buf;
}

namespace {
// "(x, y, z)" with the digits that tell two nearby doubles apart.
std::string FormatTriplePrecise(const std::array<double, 3>& v) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "(%.9g, %.9g, %.9g)", v[0], v[1], v[2]);
  return buf;
}
}  // namespace

std::string GridDifference(const VolumeGrid& a, const VolumeGrid& b) {
  if (a.size != b.size)
    return "size " + std::to_string(a.size[0]) + "x" + std::to_string(a.size[1]) + "x" + std::to_string(a.size[2]) +
           " vs " + std::to_string(b.size[0]) + "x" + std::to_string(b.size[1]) + "x" + std::to_string(b.size[2]);
  // Beyond ITK's tolerances, values that agree to the precision of a header
  // written in float32 (NIfTI's: 2^-23 of the value, twice for two writers)
  // are the same grid.
  auto f32 = [](double x, double y) { return 2.4e-7 * std::max(std::fabs(x), std::fabs(y)); };
  for (int i = 0; i < 3; ++i)
    if (std::fabs(a.spacing[i] - b.spacing[i]) > 1e-6 * std::fabs(a.spacing[i]) + f32(a.spacing[i], b.spacing[i]))
      return "spacing " + FormatTriplePrecise(a.spacing) + " vs " + FormatTriplePrecise(b.spacing) + " (mm)";
  for (int i = 0; i < 3; ++i)
    if (std::fabs(a.origin[i] - b.origin[i]) > 1e-6 * std::fabs(a.spacing[i]) + f32(a.origin[i], b.origin[i]) + 1e-9)
      return "origin " + FormatTriplePrecise(a.origin) + " vs " + FormatTriplePrecise(b.origin) + " (LPS, mm)";
  for (int i = 0; i < 9; ++i)
    if (std::fabs(a.direction[i] - b.direction[i]) > 1e-6) {
      std::string da, db;
      for (int k = 0; k < 9; ++k) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%s%.9g", k ? (k % 3 ? ", " : "; ") : "", a.direction[k]);
        da += buf;
        std::snprintf(buf, sizeof buf, "%s%.9g", k ? (k % 3 ? ", " : "; ") : "", b.direction[k]);
        db += buf;
      }
      return "direction [" + da + "] vs [" + db + "] (LPS)";
    }
  return "";
}

size_t VoxelSize(VoxelType t) {
  switch (t) {
    case VoxelType::kUInt8:
    case VoxelType::kInt8: return 1;
    case VoxelType::kUInt16:
    case VoxelType::kInt16: return 2;
    case VoxelType::kUInt32:
    case VoxelType::kInt32:
    case VoxelType::kFloat32: return 4;
    case VoxelType::kFloat64:
    case VoxelType::kInt64:
    case VoxelType::kUInt64: return 8;
  }
  return 0;
}

SourceType VoxelSource(VoxelType t) {
  switch (t) {
    case VoxelType::kUInt8: return SourceType::kUInt8;
    case VoxelType::kInt8: return SourceType::kInt8;
    case VoxelType::kUInt16: return SourceType::kUInt16;
    case VoxelType::kInt16: return SourceType::kInt16;
    case VoxelType::kUInt32: return SourceType::kUInt32;
    case VoxelType::kInt32: return SourceType::kInt32;
    case VoxelType::kFloat32: return SourceType::kFloat32;
    case VoxelType::kFloat64: return SourceType::kFloat64;
    case VoxelType::kInt64: return SourceType::kInt64;
    case VoxelType::kUInt64: return SourceType::kUInt64;
  }
  return SourceType::kUnknown;
}

std::string EncodeVolumeRequest(const VolumeRequest& r) {
  std::string out;
  Put(&out, "path", r.path);
  Put(&out, "series", r.series);
  Put(&out, "volume_index", std::to_string(r.volume_index));
  Put(&out, "orient", r.orient);
  Put(&out, "resample", r.resample ? "1" : "0");
  Put(&out, "spacing", Nums(r.spacing));
  Put(&out, "to_reference", r.to_reference ? "1" : "0");
  PutGrid(&out, "reference", r.reference);
  Put(&out, "nearest", r.nearest ? "1" : "0");
  Put(&out, "max_voxels", std::to_string(r.max_voxels));
  return out;
}

Result<VolumeRequest> DecodeVolumeRequest(const std::string& bytes) {
  PS_ASSIGN_OR_RETURN(auto kv, Parse(bytes));
  VolumeRequest r;
  r.path = Get(kv, "path");
  r.series = Get(kv, "series");
  r.volume_index = std::strtoll(Get(kv, "volume_index").c_str(), nullptr, 10);
  r.orient = Get(kv, "orient");
  r.resample = Get(kv, "resample") == "1";
  r.to_reference = Get(kv, "to_reference") == "1";
  r.nearest = Get(kv, "nearest") == "1";
  r.max_voxels = std::strtoull(Get(kv, "max_voxels").c_str(), nullptr, 10);
  if (!ParseNums(Get(kv, "spacing"), &r.spacing) || !GetGrid(kv, "reference", &r.reference))
    return Status::Internal("malformed volume decoder request");
  return r;
}

std::string EncodeVolumeReply(const VolumeReply& r) {
  std::string out;
  Put(&out, "code", std::to_string(static_cast<int>(r.status.code())));
  Put(&out, "message", r.status.message());
  if (!r.status.ok()) return out;
  PutGrid(&out, "grid", r.grid);
  PutGrid(&out, "source", r.source);
  Put(&out, "type", std::to_string(static_cast<int>(r.type)));
  Put(&out, "format", r.format);
  Put(&out, "qform", std::to_string(r.qform_code));
  Put(&out, "sform", std::to_string(r.sform_code));
  Put(&out, "flags", std::to_string(r.flags));
  Put(&out, "bytes", std::to_string(r.bytes));
  for (size_t i = 0; i < r.warnings.size(); ++i) Put(&out, "warning." + std::to_string(1000 + i), r.warnings[i]);
  return out;
}

Result<VolumeReply> DecodeVolumeReply(const std::string& bytes) {
  PS_ASSIGN_OR_RETURN(auto kv, Parse(bytes));
  VolumeReply r;
  const auto code = static_cast<Code>(std::strtol(Get(kv, "code").c_str(), nullptr, 10));
  if (code != Code::kOk) {
    r.status = Status(code, Get(kv, "message"));
    return r;
  }
  if (!GetGrid(kv, "grid", &r.grid) || !GetGrid(kv, "source", &r.source))
    return Status::Internal("malformed volume decoder reply");
  const long type = std::strtol(Get(kv, "type").c_str(), nullptr, 10);
  if (type < 0 || type > static_cast<long>(VoxelType::kUInt64))
    return Status::Internal("malformed volume decoder reply (voxel type)");
  r.type = static_cast<VoxelType>(type);
  r.format = Get(kv, "format");
  r.qform_code = static_cast<int>(std::strtol(Get(kv, "qform").c_str(), nullptr, 10));
  r.sform_code = static_cast<int>(std::strtol(Get(kv, "sform").c_str(), nullptr, 10));
  r.flags = static_cast<uint16_t>(std::strtoul(Get(kv, "flags").c_str(), nullptr, 10));
  r.bytes = std::strtoull(Get(kv, "bytes").c_str(), nullptr, 10);
  for (const auto& [k, v] : kv)
    if (k.rfind("warning.", 0) == 0) r.warnings.push_back(v);
  return r;
}

#ifndef PATCHSTORE_HAVE_ITK
VolumeDecodeFn ItkVolumeDecoder() { return nullptr; }

Status WriteVolumeFile(const std::string& path, const float*, const std::array<uint64_t, 3>&, const VolumeGeometry&) {
  return Status::Unsupported("writing '" + path +
                             "': this patchstore was built without ITK, which NIfTI and MetaImage export need "
                             "(install libinsighttoolkit5-dev and build again)");
}
#endif

}  // namespace patchstore
