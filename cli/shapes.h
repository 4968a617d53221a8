// patchstore/cli/shapes.h — per-sample record shapes for `info` and `ls`.
//
// Computed from the record headers the Reader exposes (one header parse per
// record), so they need nothing from the store format beyond that.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "patchstore/reader/reader.h"

namespace patchstore::cli {

// The shapes of one field over all samples: the per-dimension minimum and
// maximum and the number of distinct shapes (0 when no record is readable).
struct ShapeRange {
  std::vector<uint64_t> min, max;
  uint64_t distinct = 0;
};
ShapeRange FieldShapeRange(const Reader& reader, int field);

// "S=5..9 H=40 W=40 (3 shapes)" for volumes, "C=3 H=720..1080 W=1280..1920
// (2 shapes)" for images: the text after `shape=varies` in `info`.
std::string ShapeRangeText(const ShapeRange& r, bool volumes);
// {"min": [5, 40, 40], "max": [9, 40, 40], "distinct": 3}
std::string ShapeRangeJson(const ShapeRange& r);

// One sample's shapes: {"MR": [5, 40, 40], ...} (null for an unreadable record).
std::string SampleShapesJson(const Reader& reader, uint64_t sample, std::string (*json_string)(std::string_view));
// "MR 5x40x40, CT 5x40x40" (a '?' for an unreadable record).
std::string SampleShapesText(const Reader& reader, uint64_t sample);

// One volume's geometry (Reader::Geometry) as JSON: {"spacing": [x, y, z],
// "origin": [...], "direction": [9 numbers, row-major], "affine_lps": [16],
// "affine_ras": [16], "axes": "LPS", "qform_code": 1, "sform_code": 1,
// "reoriented": false, "resampled": false, "source_spacing": [...],
// "source_size": [...]} with every number exact (shortest round trip);
// "null" when the sample has none.
std::string SampleGeometryJson(const Reader& reader, uint64_t sample);
// "spacing 0.9x0.9x2.5 mm, origin (-120, -90, 40), axes LPS (W,H,S), ..." or ""
// when the sample has none; "geometry unreadable: ..." for a damaged entry.
std::string SampleGeometryText(const Reader& reader, uint64_t sample);
// The three letters (nibabel's aff2axcodes) of the directions the stored
// axes W, H, S point to: "LPS" for ITK's identity direction.
std::string AxisCodes(const VolumeGeometry& g);

}  // namespace patchstore::cli
