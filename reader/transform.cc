#include "patchstore/reader/transform.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

namespace patchstore {
namespace {

// The output plane as an affine map into the source window: the element
// (i, j) of the output is src[origin + i * si + j * sj].
struct PlaneMap {
  int64_t oh = 0, ow = 0;
  int64_t origin = 0, si = 0, sj = 0;
};

// For an h x w window at the start of `src` (rows row_stride apart).
PlaneMap MapPlane(int64_t h, int64_t w, int64_t row_stride, Transform t) {
  // (r, c) in the flipped window as r0 + ri*i + rj*j, c0 + ci*i + cj*j; the
  // cases are np.rot90's definitions for k = 0..3.
  int64_t r0 = 0, ri = 0, rj = 0, c0 = 0, ci = 0, cj = 0;
  PlaneMap m;
  switch (t.rot & 3) {
    case 0:
      ri = 1;
      cj = 1;
      m.oh = h;
      m.ow = w;
      break;  // (i, j)
    case 1:
      rj = 1;
      c0 = w - 1;
      ci = -1;
      m.oh = w;
      m.ow = h;
      break;  // (j, w-1-i)
    case 2:
      r0 = h - 1;
      ri = -1;
      c0 = w - 1;
      cj = -1;
      m.oh = h;
      m.ow = w;
      break;  // (h-1-i, w-1-j)
    default:
      r0 = h - 1;
      rj = -1;
      ci = 1;
      m.oh = w;
      m.ow = h;
      break;  // (h-1-j, i)
  }
  // Flips act on the window before the rotation: r -> h-1-r.
  if (t.flip_v()) {
    r0 = h - 1 - r0;
    ri = -ri;
    rj = -rj;
  }
  if (t.flip_h()) {
    c0 = w - 1 - c0;
    ci = -ci;
    cj = -cj;
  }
  m.origin = r0 * row_stride + c0;
  m.si = ri * row_stride + ci;
  m.sj = rj * row_stride + cj;
  return m;
}

#if defined(__SSE2__)
inline __m128 Reverse4(__m128 v) { return _mm_shuffle_ps(v, v, _MM_SHUFFLE(0, 1, 2, 3)); }
#endif

// One element into the output type O: float32 through ConvertElement (the
// field's table), or the stored element itself (O == T: stored output).
template <typename O, typename T>
inline O Put(T v, const ValueTable* lut) {
  if constexpr (std::is_same_v<O, T>) {
    return v;
  } else {
    static_assert(std::is_same_v<O, float>, "output is float32 or the stored type");
    return ConvertElement(v, lut);
  }
}

// Row d[j] = p[j] for j in [0, n).
template <typename T, typename O>
inline void CopyRow(const T* p, int64_t n, O* d, const ValueTable* lut) {
  if constexpr (std::is_same_v<O, T>) {
    std::memcpy(d, p, static_cast<size_t>(n) * sizeof(T));
  } else {
    ConvertRun(p, n, d, lut);
  }
}

// Mirrored row: d[j] = p[-j] for j in [0, n).
template <typename T, typename O>
inline void CopyReversed(const T* p, int64_t n, O* d, const ValueTable* lut) {
  // From the end, so the source is read at ascending addresses.
  int64_t j = n;
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float> && std::is_same_v<O, float>)
    for (; j >= 4; j -= 4) _mm_storeu_ps(d + j - 4, Reverse4(_mm_loadu_ps(p - j + 1)));
#endif
  for (; j > 0; --j) d[j - 1] = Put<O>(p[-(j - 1)], lut);
}

// Output rows [i0, i0+in) x columns [j0, j0+jn) of a transposed map
// (|si| == 1: an output column is a source row).
template <typename O>
inline void TransposeTile(const O* base, const PlaneMap& m, int64_t i0, int64_t in, int64_t j0, int64_t jn, O* dst) {
  int64_t i = 0;
#if defined(__SSE2__)
  if constexpr (std::is_same_v<O, float>) {
    // 4x4 blocks: four contiguous source runs, one SSE transpose, four stores.
    for (; i + 4 <= in; i += 4) {
      int64_t j = 0;
      for (; j + 4 <= jn; j += 4) {
        const float* p = base + (i0 + i) * m.si + (j0 + j) * m.sj;
        __m128 r0, r1, r2, r3;
        if (m.si == 1) {
          r0 = _mm_loadu_ps(p);
          r1 = _mm_loadu_ps(p + m.sj);
          r2 = _mm_loadu_ps(p + 2 * m.sj);
          r3 = _mm_loadu_ps(p + 3 * m.sj);
        } else {
          r0 = Reverse4(_mm_loadu_ps(p - 3));
          r1 = Reverse4(_mm_loadu_ps(p + m.sj - 3));
          r2 = Reverse4(_mm_loadu_ps(p + 2 * m.sj - 3));
          r3 = Reverse4(_mm_loadu_ps(p + 3 * m.sj - 3));
        }
        _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
        float* d = dst + (i0 + i) * m.ow + j0 + j;
        _mm_storeu_ps(d, r0);
        _mm_storeu_ps(d + m.ow, r1);
        _mm_storeu_ps(d + 2 * m.ow, r2);
        _mm_storeu_ps(d + 3 * m.ow, r3);
      }
      for (; j < jn; ++j)
        for (int64_t k = 0; k < 4; ++k) dst[(i0 + i + k) * m.ow + j0 + j] = base[(i0 + i + k) * m.si + (j0 + j) * m.sj];
    }
  }
#endif
  for (; i < in; ++i) {
    const O* p = base + (i0 + i) * m.si + j0 * m.sj;
    O* d = dst + (i0 + i) * m.ow + j0;
    for (int64_t j = 0; j < jn; ++j) d[j] = p[j * m.sj];
  }
}

// Rows stay rows (|sj| == 1): copies or mirrored copies, rows visited so
// that the source (the memory map, usually not in cache) is read at
// ascending addresses, which the hardware prefetchers follow.
template <typename T, typename O>
void ApplyRows(const T* src, const PlaneMap& m, O* dst, const ValueTable* lut) {
  const T* base = src + m.origin;
  for (int64_t k = 0; k < m.oh; ++k) {
    const int64_t i = m.si > 0 ? k : m.oh - 1 - k;
    if (m.sj == 1) CopyRow(base + i * m.si, m.ow, dst + i * m.ow, lut);
    else CopyReversed(base + i * m.si, m.ow, dst + i * m.ow, lut);
  }
}

// Transposed (odd turns): source rows become output columns. Tiles of 32
// source rows x 32 columns; bands of source rows in address order. The
// source is the staged window, in cache.
template <typename O>
void ApplyTransposed(const O* src, const PlaneMap& m, O* dst) {
  const O* base = src + m.origin;
  constexpr int64_t kTile = 32;
  const int64_t nj = (m.ow + kTile - 1) / kTile, ni = (m.oh + kTile - 1) / kTile;
  for (int64_t tj = 0; tj < nj; ++tj) {
    const int64_t j0 = (m.sj > 0 ? tj : nj - 1 - tj) * kTile;
    for (int64_t ti = 0; ti < ni; ++ti) {
      const int64_t i0 = (m.si > 0 ? ti : ni - 1 - ti) * kTile;
      TransposeTile(base, m, i0, std::min(kTile, m.oh - i0), j0, std::min(kTile, m.ow - j0), dst);
    }
  }
}

// The kernel for both outputs: O = float (converted) or O = T (as stored).
template <typename T, typename O>
void CopyTransformedTo(const T* plane, int64_t row_stride, int64_t y, int64_t x, int64_t height, int64_t width,
                       Transform t, O* dst, const ValueTable* lut) {
  const T* window = plane + y * row_stride + x;
  const PlaneMap m = MapPlane(height, width, row_stride, t);
  if (m.sj == 1 || m.sj == -1) {
    ApplyRows(window, m, dst, lut);
    return;
  }
  // Transposing straight out of the map reads 32 rows at a time, a pattern
  // the hardware prefetchers follow badly (measured 2-3x slower than a
  // copy); so odd turns first copy the window (converted to the output
  // type) into a per-thread buffer with sequential reads and transpose from
  // cache.
  thread_local std::vector<O> stage;
  const size_t n = static_cast<size_t>(height * width);
  if (stage.size() < n) stage.resize(n);
  if (row_stride == width) {
    CopyRow(window, height * width, stage.data(), lut);
  } else {
    for (int64_t r = 0; r < height; ++r) CopyRow(window + r * row_stride, width, stage.data() + r * width, lut);
  }
  const PlaneMap staged = MapPlane(height, width, width, t);
  if (staged.sj == 1 || staged.sj == -1) ApplyRows(stage.data(), staged, dst, nullptr);  // width 1: a column is a row
  else ApplyTransposed(stage.data(), staged, dst);
}

}  // namespace

template <typename T>
void CopyTransformed(const T* plane, int64_t row_stride, int64_t y, int64_t x, int64_t height, int64_t width,
                     Transform t, float* dst, const ValueTable* lut) {
  CopyTransformedTo<T, float>(plane, row_stride, y, x, height, width, t, dst, lut);
}

template <typename T>
void CopyTransformedStored(const T* plane, int64_t row_stride, int64_t y, int64_t x, int64_t height, int64_t width,
                           Transform t, T* dst) {
  CopyTransformedTo<T, T>(plane, row_stride, y, x, height, width, t, dst, nullptr);
}

// One instantiation per element type of store/dtype.h.
#define PATCHSTORE_COPY_TRANSFORMED_(e, code, T, name, fmt)                                                  \
  template void CopyTransformed<T>(const T*, int64_t, int64_t, int64_t, int64_t, int64_t, Transform, float*, \
                                   const ValueTable*);
PATCHSTORE_FOR_EACH_DTYPE(PATCHSTORE_COPY_TRANSFORMED_)
#undef PATCHSTORE_COPY_TRANSFORMED_
#define PATCHSTORE_COPY_TRANSFORMED_STORED_(e, code, T, name, fmt) \
  template void CopyTransformedStored<T>(const T*, int64_t, int64_t, int64_t, int64_t, int64_t, Transform, T*);
PATCHSTORE_FOR_EACH_DTYPE(PATCHSTORE_COPY_TRANSFORMED_STORED_)
#undef PATCHSTORE_COPY_TRANSFORMED_STORED_

}  // namespace patchstore
