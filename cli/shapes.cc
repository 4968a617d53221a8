#include "cli/shapes.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <set>
#include <type_traits>

namespace patchstore::cli {
namespace {

// Shapes come from the store's sample index: no record is read, so `info`
// and `ls --json` stay cheap on a store that is not in the page cache.
std::vector<uint64_t> ShapeOf(const RecordSummary& h) {
  return std::vector<uint64_t>(h.shape.begin(), h.shape.begin() + h.rank);
}

std::string JoinDims(const std::vector<uint64_t>& d, const char* sep) {
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) s += (i ? sep : "") + std::to_string(d[i]);
  return s;
}

}  // namespace

ShapeRange FieldShapeRange(const Reader& reader, int field) {
  ShapeRange r;
  std::set<std::vector<uint64_t>> seen;
  for (uint64_t s = 0; s < reader.size(); ++s) {
    auto h = reader.Summary(s, field);
    if (!h.ok()) continue;
    const std::vector<uint64_t> d = ShapeOf(*h);
    if (r.min.empty()) {
      r.min = r.max = d;
    } else if (d.size() == r.min.size()) {
      for (size_t i = 0; i < d.size(); ++i) {
        r.min[i] = std::min(r.min[i], d[i]);
        r.max[i] = std::max(r.max[i], d[i]);
      }
    }
    seen.insert(d);
  }
  r.distinct = seen.size();
  return r;
}

std::string ShapeRangeText(const ShapeRange& r, bool volumes) {
  if (r.min.empty()) return "-";
  static const char* kVolume[] = {"S", "H", "W"};
  static const char* kImage[] = {"C", "H", "W"};
  std::string s;
  for (size_t i = 0; i < r.min.size(); ++i) {
    const std::string name = r.min.size() == 3 ? (volumes ? kVolume : kImage)[i] : "d" + std::to_string(i);
    s += (i ? " " : "") + name + "=" + std::to_string(r.min[i]);
    if (r.max[i] != r.min[i]) s += ".." + std::to_string(r.max[i]);
  }
  return s + " (" + std::to_string(r.distinct) + " shapes)";
}

std::string ShapeRangeJson(const ShapeRange& r) {
  if (r.min.empty()) return "null";
  return "{\"min\": [" + JoinDims(r.min, ", ") + "], \"max\": [" + JoinDims(r.max, ", ") +
         "], \"distinct\": " + std::to_string(r.distinct) + "}";
}

std::string SampleShapesJson(const Reader& reader, uint64_t sample, std::string (*json_string)(std::string_view)) {
  std::string s = "{";
  for (int f = 0; f < reader.field_count(); ++f) {
    auto h = reader.Summary(sample, f);
    s += (f ? ", " : "") + json_string(reader.field(f).name) + ": " +
         (h.ok() ? "[" + JoinDims(ShapeOf(*h), ", ") + "]" : std::string("null"));
  }
  return s + "}";
}

std::string SampleShapesText(const Reader& reader, uint64_t sample) {
  std::string s;
  for (int f = 0; f < reader.field_count(); ++f) {
    auto h = reader.Summary(sample, f);
    s += (f ? ", " : "") + reader.field(f).name + " " + (h.ok() ? JoinDims(ShapeOf(*h), "x") : std::string("?"));
  }
  return s;
}

namespace {

std::string Exact(double v) {
  if (v != v || v - v != 0) return "null";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

template <typename T, size_t N>
std::string ExactList(const std::array<T, N>& v) {
  std::string s = "[";
  for (size_t i = 0; i < N; ++i) {
    if constexpr (std::is_floating_point_v<T>) s += (i ? ", " : "") + Exact(v[i]);
    else s += (i ? ", " : "") + std::to_string(v[i]);
  }
  return s + "]";
}

}  // namespace

std::string AxisCodes(const VolumeGeometry& g) {
  std::string out;
  for (int c = 0; c < 3; ++c) {
    int best = 0;
    for (int r = 1; r < 3; ++r)
      if (std::fabs(g.direction[r * 3 + c]) > std::fabs(g.direction[best * 3 + c])) best = r;
    const bool positive = g.direction[best * 3 + c] > 0;
    out += positive ? "LPS"[best] : "RAI"[best];
  }
  return out;
}

std::string SampleGeometryJson(const Reader& reader, uint64_t sample) {
  auto g = reader.Geometry(sample);
  if (!g.ok() || !g->has_value()) return "null";
  const VolumeGeometry& v = **g;
  return "{\"spacing\": " + ExactList(v.spacing) + ", \"origin\": " + ExactList(v.origin) +
         ", \"direction\": " + ExactList(v.direction) + ", \"affine_lps\": " + ExactList(v.AffineLPS()) +
         ", \"affine_ras\": " + ExactList(v.AffineRAS()) + ", \"axes\": \"" + AxisCodes(v) +
         "\", \"qform_code\": " + std::to_string(v.qform_code) + ", \"sform_code\": " + std::to_string(v.sform_code) +
         ", \"reoriented\": " + ((v.flags & kGeometryReoriented) ? "true" : "false") +
         ", \"resampled\": " + ((v.flags & kGeometryResampled) ? "true" : "false") +
         ", \"source_spacing\": " + ExactList(v.source_spacing) + ", \"source_size\": " + ExactList(v.source_size) +
         "}";
}

std::string SampleGeometryText(const Reader& reader, uint64_t sample) {
  auto g = reader.Geometry(sample);
  if (!g.ok()) return "geometry unreadable: " + g.status().message();
  if (!g->has_value()) return "";
  const VolumeGeometry& v = **g;
  char buf[512];
  std::snprintf(buf, sizeof buf, "spacing %gx%gx%g mm, origin (%g, %g, %g), axes %s (W,H,S)", v.spacing[0],
                v.spacing[1], v.spacing[2], v.origin[0], v.origin[1], v.origin[2], AxisCodes(v).c_str());
  std::string s = buf;
  if (v.qform_code >= 0 || v.sform_code >= 0)
    s += ", qform " + std::to_string(v.qform_code) + " sform " + std::to_string(v.sform_code);
  if (v.flags & kGeometryReoriented) s += ", reoriented";
  if (v.flags & kGeometryResampled) {
    std::snprintf(buf, sizeof buf, ", resampled from %gx%gx%g mm", v.source_spacing[0], v.source_spacing[1],
                  v.source_spacing[2]);
    s += buf;
  }
  return s;
}

}  // namespace patchstore::cli
