// ingest/volume_convert.cc — the value checks of volume_convert.h.
#include "ingest/volume_convert.h"

#include <cstdio>

namespace patchstore {
namespace {

std::string ShowDouble(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

}  // namespace

Status VolumeValueCheck::AddFloatRange(double lo, double hi) {
  if (norm_.kind == NormKind::kNone && !norm_.clamp) {
    // No normalisation: float64 values beyond float32 become +-inf, as
    // NumPy's astype(float32) makes them; said, not refused (the user asked
    // for no transform, and NaN/inf are data elsewhere too).
    for (double x : {lo, hi})
      if (!std::isfinite(norm_.Apply(x)) && !beyond_) {
        beyond_ = true;
        warnings_.push_back(describe_ + ": its " + SourceTypeName(source_) + " value " + ShowDouble(x) +
                            " is beyond float32 (largest 3.40282347e+38), which records hold, and is stored as " +
                            (x < 0 ? "-inf" : "inf") +
                            " (as NumPy's astype(float32)); map the field into float32 with --norm FIELD=range:LO,HI "
                            "(computed in float64; the other normalisations take the value as float32 first)");
      }
    return Status::OK();
  }
  return CheckNormalizationOn(norm_, lo, hi, false, norm_spec_,
                              std::string(SourceTypeName(source_)) + " value of this " + noun_);
}

std::vector<std::string> VolumeValueCheck::Finish() {
  std::vector<std::string> out = std::move(warnings_);
  warnings_.clear();
  if (largest_ > (uint64_t{1} << 24))
    out.push_back(describe_ + ": " + SourceTypeName(source_) + " values up to " + std::to_string(largest_) +
                  " exceed 2^24 = 16777216 and are rounded to the nearest float32 (e.g. 16777217 is stored as "
                  "16777216)");
  return out;
}

}  // namespace patchstore
