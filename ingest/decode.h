// ingest/decode.h — decoding one file into pixels (ingest-private).
//
// Images go through OpenCV (PNG, JPEG, TIFF, ...), OpenEXR files through the
// OpenEXR library (never through OpenCV's EXR reader). The result is an
// interleaved H x W x C cv::Mat in RGB(A) channel order.
#pragma once

#include <opencv2/core.hpp>

#include <cstdint>
#include <string>

#include "patchstore/store/format.h"
#include "patchstore/store/status.h"

namespace patchstore {

struct DecodedImage {
  cv::Mat pixels;             // H x W, C channels: CV_8U, CV_16U or CV_32F
  SourceType source_type = SourceType::kUnknown;
  std::string format;         // "png", "jpeg", "tiff", "exr", ...
  std::string channel_names;  // "R,G,B", "Y", "Z", ...
  int height() const { return pixels.rows; }
  int width() const { return pixels.cols; }
  int channels() const { return pixels.channels(); }
};

// Decodes `path`. `channel` selects one EXR channel by name ("" = all).
// Declared sizes above `max_pixels` (width x height x channels) are refused
// before any pixel memory is allocated. Errors name the file and the cause.
Result<DecodedImage> DecodeFile(const std::string& path, const std::string& channel, uint64_t max_pixels);

// The range [lo, hi] of the finite values among `n` floats, widened to
// [lo, lo+1] when it is empty or a single value: a display window.
void FiniteRange(const float* data, int64_t n, double* lo, double* hi);

// Writes the image as a (C,H,W) float32 array at `dst` applying `norm`.
void ToCHWFloat(const DecodedImage& image, const Normalization& norm, float* dst);

// Writes the image as a row-major (C,H,W) array of `dtype` at `dst` (the
// record dtype RecordDType chose, ingest/encoding.h): float32 / float16 hold
// the values normalised by `norm`; uint8 / uint16 / int16 hold the source
// values unchanged (REQUIRES: they fit, which RecordDType guarantees for the
// image's source type).
void ToCHW(const DecodedImage& image, const Normalization& norm, DType dtype, void* dst);

}  // namespace patchstore
