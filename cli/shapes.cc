#include "cli/shapes.h"

#include <algorithm>
#include <set>

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

}  // namespace patchstore::cli
