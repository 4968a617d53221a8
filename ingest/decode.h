// ingest/decode.h — decoding one file into pixels (ingest-private).
//
// Images go through OpenCV (PNG, JPEG, BMP, ...), TIFF through libtiff
// (decode_tiff.cc: the samples as stored, never OpenCV's TIFF reader, which
// premultiplies alpha, scrambles planar 16-bit and reads CMYK as RGBA),
// OpenEXR files through the OpenEXR library (never through OpenCV's EXR
// reader; UINT channels above 2^24 are noted in `warnings`, luminance/chroma
// files (Y, RY, BY) are read as R,G,B[,A] half through Imf::RgbaInputFile,
// format "exr-yc"). The result is an interleaved H x W x C cv::Mat in RGB(A)
// channel order.
#pragma once

#include <opencv2/core.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "patchstore/store/format.h"
#include "patchstore/store/status.h"

namespace patchstore {

struct DecodedImage {
  cv::Mat pixels;  // H x W, C channels: CV_8U, CV_16U or CV_32F
  SourceType source_type = SourceType::kUnknown;
  std::string format;         // "png", "jpeg", "tiff", "exr", ...
  std::string channel_names;  // "R,G,B", "Y", "Z", ...
  // What went through but is not exact (32-bit integers above 2^24 rounded
  // to float32): one line each, naming the file. The ingest report lists them.
  std::vector<std::string> warnings;
  int height() const { return pixels.rows; }
  int width() const { return pixels.cols; }
  int channels() const { return pixels.channels(); }
};

// Decodes `path`. `channel` selects one EXR channel by name ("" = all).
// Declared sizes above `max_pixels` (width x height x channels) are refused
// before any pixel memory is allocated. Errors name the file and the cause.
Result<DecodedImage> DecodeFile(const std::string& path, const std::string& channel, uint64_t max_pixels);

// Refuses a JPEG whose header (read by libjpeg, decode_jpeg.cc) declares CMYK
// or YCCK: OpenCV turns its inks into RGB by a rule of its own, not exactly.
Status CheckJpegColorSpace(const std::string& path, const std::vector<uint8_t>& bytes);

// Decodes TIFF bytes read from `path` with libtiff (decode_tiff.cc): 8/16-bit
// unsigned samples as CV_8U/CV_16U, signed, 32-bit and float samples as
// CV_32F (source_type says which); strips or tiles, planar contiguous or
// separate, any compression and predictor libtiff knows; MinIsBlack ("Y"),
// RGB ("R,G,B") and palette images (expanded exactly through the 16-bit
// colour map to R,G,B uint16), extra samples after the colour ones ("A" for
// the first alpha, associated or not, stored as found; "S<i>" for others).
// Refused, naming the tag and value: CMYK, YCbCr, Lab and other photometric
// interpretations, MinIsWhite, bit depths other than 8/16/32 (16/32/64 for
// floats), complex samples, volumetric and multi-page files.
Result<DecodedImage> DecodeTiff(const std::string& path, const std::vector<uint8_t>& bytes, uint64_t max_pixels);

// The warning for 32-bit integer samples of `source` (int32/uint32) whose
// largest magnitude `largest` exceeds 2^24, which float32 rounds.
std::string Float32RoundingNote(const std::string& path, SourceType source, uint64_t largest);

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
