// ingest/volume_convert.h — source voxels into (S, H, W) records
// (ingest-private). One conversion for every volume source (HDF5 slabs, ITK
// images): the same arithmetic gives the same stored bits whatever the
// container, and the same checks (ValueCheck, checks.h) say the same about
// values float32 records do not hold.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ingest/checks.h"
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

// Checks a slab of ns*H*W source values (contiguous at `src`) with `check`,
// then converts it as ConvertSlab does: the one path of every volume source.
template <typename T>
Status CheckAndConvertSlab(ValueCheck* check, const void* src, int64_t ns, int64_t H, int64_t W, int64_t sk, int64_t sh,
                           int64_t sw, const Normalization& norm, DType dtype, void* dst) {
  PS_RETURN_IF_ERROR(check->Add(static_cast<const T*>(src), static_cast<uint64_t>(ns * H * W)));
  ConvertSlab<T>(src, ns, H, W, sk, sh, sw, norm, dtype, dst);
  return Status::OK();
}

}  // namespace patchstore
