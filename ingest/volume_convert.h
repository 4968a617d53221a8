// ingest/volume_convert.h — source voxels into (S, H, W) records
// (ingest-private). One conversion for every volume source (HDF5 slabs, ITK
// images): the same arithmetic gives the same stored bits whatever the
// container, and the same checks say the same about values float32 records
// do not hold.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "patchstore/store/dtype.h"
#include "patchstore/store/format.h"
#include "patchstore/store/status.h"

namespace patchstore {

// Writes a slab of `ns` slices into dst (ns, H, W). The source element of
// (slice k, row h, column w) is src[k*sk + h*sh + w*sw].
template <typename T, typename F, typename Out>
void ScatterSlab(const T* src, int64_t ns, int64_t H, int64_t W, int64_t sk, int64_t sh, int64_t sw, F conv, Out* dst) {
  if (sw == 1) {
    for (int64_t k = 0; k < ns; ++k)
      for (int64_t h = 0; h < H; ++h) {
        const T* s = src + k * sk + h * sh;
        Out* d = dst + (k * H + h) * W;
        for (int64_t w = 0; w < W; ++w) d[w] = conv(s[w]);
      }
    return;
  }
  // Columns are strided (the slice axis was last): transpose in blocks so
  // the block of source rows stays in cache while every slice takes its part.
  constexpr int64_t kBlock = 64;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t w0 = 0; w0 < W; w0 += kBlock) {
      const int64_t wn = std::min(kBlock, W - w0);
      for (int64_t k = 0; k < ns; ++k) {
        const T* s = src + h * sh + w0 * sw + k * sk;
        Out* d = dst + (k * H + h) * W + w0;
        for (int64_t w = 0; w < wn; ++w) d[w] = conv(s[w * sw]);
      }
    }
}

// Converts a slab into the record's dtype: float32 / float16 normalised,
// or (compact encodings, StoresRawSource) the source values unchanged.
template <typename T>
void ConvertSlab(const void* src, int64_t ns, int64_t H, int64_t W, int64_t sk, int64_t sh, int64_t sw,
                 const Normalization& norm, DType dtype, void* dst) {
  const T* s = static_cast<const T*>(src);
  const bool identity = norm.kind == NormKind::kNone && !norm.clamp;
  auto normalised = [&norm](T x) { return norm.Apply(static_cast<double>(x)); };
  auto plain = [](T x) { return static_cast<float>(x); };
  switch (dtype) {
    case DType::kFloat16:
      if (identity)
        ScatterSlab(
            s, ns, H, W, sk, sh, sw, [&](T x) { return ToFloat16(plain(x)); }, static_cast<Float16*>(dst));
      else
        ScatterSlab(
            s, ns, H, W, sk, sh, sw, [&](T x) { return ToFloat16(normalised(x)); }, static_cast<Float16*>(dst));
      return;
    case DType::kUInt8:
    case DType::kUInt16:
    case DType::kInt16:
      if constexpr (std::is_integral_v<T> && sizeof(T) <= 2) {
        // RecordDType chose a type that holds every value of T.
        if (dtype == DType::kUInt8)
          ScatterSlab(
              s, ns, H, W, sk, sh, sw, [](T x) { return static_cast<uint8_t>(x); }, static_cast<uint8_t*>(dst));
        else if (dtype == DType::kUInt16)
          ScatterSlab(
              s, ns, H, W, sk, sh, sw, [](T x) { return static_cast<uint16_t>(x); }, static_cast<uint16_t*>(dst));
        else
          ScatterSlab(
              s, ns, H, W, sk, sh, sw, [](T x) { return static_cast<int16_t>(x); }, static_cast<int16_t*>(dst));
      }
      return;
    default:
      if (identity) ScatterSlab(s, ns, H, W, sk, sh, sw, plain, static_cast<float*>(dst));
      else ScatterSlab(s, ns, H, W, sk, sh, sw, normalised, static_cast<float*>(dst));
  }
}

// The checks on a volume's source values before ConvertSlab stores them,
// shared by every volume source (HDF5 datasets, ITK volumes). Add() each
// block of values as read, then Finish() once:
//   * 32/64-bit integers: float32 rounds those above 2^24; noted once per
//     volume with the largest magnitude;
//   * float values under a normalisation, which runs in float32 (range: in
//     float64): their finite range must map to finite values (refused, as
//     for each float image's own range; the type's extremes say nothing for
//     float sources);
//   * float64 values beyond float32 with no normalisation: stored as +-inf
//     (as NumPy's astype(float32)), noted once per volume.
class VolumeValueCheck {
 public:
  // `describe` starts each warning (e.g. "dataset 'p1' in group 'MR' of
  // 'a.h5'"); `noun` names the volume in a refusal ("float64 value of this
  // dataset"); `norm_spec` is the --norm text as the user wrote it.
  VolumeValueCheck(std::string describe, std::string noun, SourceType source, const Normalization& norm,
                   std::string norm_spec)
      : describe_(std::move(describe)),
        noun_(std::move(noun)),
        source_(source),
        norm_(norm),
        norm_spec_(std::move(norm_spec)) {}

  // `n` values of T (the type the source was read in). A refusal is an
  // InvalidArgument without context ("normalisation 'affine:...' maps ...").
  template <typename T>
  Status Add(const T* x, uint64_t n) {
    if constexpr (std::is_integral_v<T> && sizeof(T) >= 4) {
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t a = x[i] < 0 ? uint64_t{0} - static_cast<uint64_t>(x[i]) : static_cast<uint64_t>(x[i]);
        largest_ = std::max(largest_, a);
      }
    } else if constexpr (std::is_floating_point_v<T>) {
      double lo = INFINITY, hi = -INFINITY;
      for (uint64_t i = 0; i < n; ++i)
        if (std::isfinite(x[i])) {
          lo = std::min(lo, static_cast<double>(x[i]));
          hi = std::max(hi, static_cast<double>(x[i]));
        }
      if (lo <= hi) return AddFloatRange(lo, hi);
    }
    return Status::OK();
  }

  // The warnings found (the values beyond float32, then the 2^24 rounding).
  std::vector<std::string> Finish();

 private:
  Status AddFloatRange(double lo, double hi);

  std::string describe_, noun_;
  SourceType source_;
  Normalization norm_;
  std::string norm_spec_;
  uint64_t largest_ = 0;  // of 32/64-bit integer values
  bool beyond_ = false;   // a float64 value beyond float32 was reported
  std::vector<std::string> warnings_;
};

// Checks a slab of ns*H*W source values (contiguous at `src`) with `check`,
// then converts it as ConvertSlab does: the one path of every volume source.
template <typename T>
Status CheckAndConvertSlab(VolumeValueCheck* check, const void* src, int64_t ns, int64_t H, int64_t W, int64_t sk,
                           int64_t sh, int64_t sw, const Normalization& norm, DType dtype, void* dst) {
  PS_RETURN_IF_ERROR(check->Add(static_cast<const T*>(src), static_cast<uint64_t>(ns * H * W)));
  ConvertSlab<T>(src, ns, H, W, sk, sh, sw, norm, dtype, dst);
  return Status::OK();
}

}  // namespace patchstore
