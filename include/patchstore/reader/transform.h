// patchstore/reader/transform.h — the one flip/rot90 transform, its copy
// kernel, and the one counter-based generator of every sampler.
//
// Everything that serves training data (the window sampler, reader/sampler.h;
// the slice datasets, reader/volume.h; montage and export --boxes, which show
// what they serve) draws with the generator below and copies with
// CopyTransformed, so "the same windows for any worker count" and "montage
// shows what the loader serves" rest on one implementation:
//
//   using namespace patchstore;
//   const uint64_t key = splitmix::Key(seed, epoch, item, /*tag=*/0x57494e44);
//   const uint64_t aug = splitmix::Mix(key ^ 3);   // one draw per purpose
//   Transform t;
//   t.flip = aug & 3;                                // each flip with p = 1/2
//   t.rot = (aug >> 2) & 3;                          // 0..3 quarter turns
//   // a 64 x 48 window at (y, x) of a plane whose rows are `stride` floats
//   // apart, flipped then turned, into 48 x 64 floats (odd turn):
//   CopyTransformed(plane, stride, y, x, 64, 48, t, dst);
//
// Thread-safety: everything here is a pure function (the kernel keeps one
// per-thread staging buffer for odd turns).
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "patchstore/reader/tensor_view.h"
#include "patchstore/store/dtype.h"

namespace patchstore {

// ---------------------------------------------------------------------------
// The counter-based generator: SplitMix64's finaliser applied to a chain of
// coordinates, so every draw is a pure function of (seed, epoch, item, ...)
// and no state is carried between draws, threads or processes. Changing any
// function here changes every sampled sequence: the determinism tests
// (tests/reader/sampler_test.cc, volume_test.cc) pin their values.
namespace splitmix {

// SplitMix64's output function: a strong 64-bit mix.
constexpr uint64_t Mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The key of a tuple of coordinates: Mix(...Mix(Mix(a) ^ b) ... ^ last).
constexpr uint64_t Key(uint64_t a) { return Mix(a); }
template <typename... Rest>
constexpr uint64_t Key(uint64_t a, uint64_t b, Rest... rest) {
  return Key(Mix(a) ^ b, static_cast<uint64_t>(rest)...);
}

// A uniform integer in [0, n) from a 64-bit hash h: Lemire's multiply-shift
// on all 64 bits (bias below 2^-32 for any n used by the samplers).
inline uint64_t Below(uint64_t h, uint64_t n) { return static_cast<uint64_t>((static_cast<__uint128_t>(h) * n) >> 64); }

// The same on the high 32 bits only, ((h >> 32) * n) >> 32, for n < 2^32:
// the slice datasets' draw (kept for their pinned sequences).
constexpr uint64_t Below32(uint64_t h, uint64_t n) { return ((h >> 32) * n) >> 32; }

// A uniform double in [0, 1) from the top 53 bits of h.
constexpr double Unit(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

// Shuffles values[0, n) in place (Fisher-Yates) with swap positions
// Below(Key(seed, epoch, salt, i), i): the one epoch order of every sampler
// (PatchSampler: salt 'PERM'; the resumable datasets' EpochBatchSampler:
// salt 'EBS1'). The same (seed, epoch, salt, n) gives the same order on every
// machine and in every process.
template <typename T>
void Shuffle(T* values, uint64_t n, uint64_t seed, uint64_t epoch, uint64_t salt) {
  for (uint64_t i = n; i > 1; --i) {
    const uint64_t j = Below(Key(seed, epoch, salt, i, 0), i);
    T t = values[i - 1];
    values[i - 1] = values[j];
    values[j] = t;
  }
}

}  // namespace splitmix

// ---------------------------------------------------------------------------
// Flips then quarter turns of a 2D plane (rows, columns), as NumPy writes it:
//   if flip & kFlipV: a = np.flip(a, axis=-2)      (upside down)
//   if flip & kFlipH: a = np.flip(a, axis=-1)      (mirror left-right)
//   a = np.rot90(a, rot, axes=(-2, -1))            (counter-clockwise for 1)
// The window sampler's Window is one (with its position); the slice API's
// SliceTransform (crop + flip_v/flip_h/rot90) converts to one.
struct Transform {
  static constexpr uint8_t kFlipV = 1;  // bit 0: rows reversed
  static constexpr uint8_t kFlipH = 2;  // bit 1: columns reversed
  uint8_t flip = 0;
  uint8_t rot = 0;  // quarter turns, 0..3 (np.rot90 direction)

  // rot90 is taken modulo 4 (so -1 == 3).
  static Transform Of(bool flip_v, bool flip_h, int rot90) {
    Transform t;
    t.flip = static_cast<uint8_t>((flip_v ? kFlipV : 0) | (flip_h ? kFlipH : 0));
    t.rot = static_cast<uint8_t>(((rot90 % 4) + 4) % 4);
    return t;
  }
  bool flip_v() const { return (flip & kFlipV) != 0; }
  bool flip_h() const { return (flip & kFlipH) != 0; }
  bool identity() const { return flip == 0 && rot % 4 == 0; }
  // The output (rows, columns) of an h x w input: swapped by odd turns.
  std::pair<int64_t, int64_t> OutputSize(int64_t h, int64_t w) const {
    return rot % 2 ? std::make_pair(w, h) : std::make_pair(h, w);
  }
};

// One stored element as the float32 a reader returns. `lut` is the field's
// ValueTable for raw-source records (reader/tensor_view.h; built with
// Normalization::Apply, see MakeValueTable in reader/reader.h), or null:
// then a plain ToFloat32 (float16, or integers that hold already-normalised
// values).
template <typename T>
inline float ConvertElement(T v, const ValueTable* lut) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, int16_t>) {
    return lut ? lut->values[static_cast<int32_t>(v) + 32768] : ToFloat32(v);
  } else if constexpr (std::is_integral_v<T> && sizeof(T) <= 2) {
    return lut ? lut->values[v] : ToFloat32(v);
  } else {
    return ToFloat32(v);
  }
}

// n elements from `src` into float32 at `dst`: ConvertElement of each, with
// the table's rule (ValueTable::Rule, equal to its values by construction)
// chosen once per run so that the loop vectorises; a memcpy for float32.
template <typename T>
inline void ConvertRun(const T* src, int64_t n, float* dst, const ValueTable* lut) {
  if constexpr (std::is_same_v<T, float>) {
    __builtin_memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  } else if constexpr (std::is_integral_v<T> && sizeof(T) <= 2) {
    if (lut == nullptr) {
      for (int64_t j = 0; j < n; ++j) dst[j] = ToFloat32(src[j]);
      return;
    }
    switch (lut->rule) {
      case ValueTable::Rule::kAffine: {
        const float div = lut->div, mul = lut->mul, add = lut->add;
        if (lut->clamp) {
          const float lo = lut->lo, hi = lut->hi;
          for (int64_t j = 0; j < n; ++j) {
            float v = static_cast<float>(src[j]) / div * mul + add;
            v = v < lo ? lo : v;
            dst[j] = v > hi ? hi : v;
          }
        } else {
          for (int64_t j = 0; j < n; ++j) dst[j] = static_cast<float>(src[j]) / div * mul + add;
        }
        return;
      }
      case ValueTable::Rule::kNonZero:
        for (int64_t j = 0; j < n; ++j) dst[j] = src[j] != 0 ? 1.0f : 0.0f;
        return;
      case ValueTable::Rule::kLookup: break;
    }
    const float* values = lut->values;
    if constexpr (std::is_same_v<T, int16_t>) values += 32768;
    for (int64_t j = 0; j < n; ++j) dst[j] = values[src[j]];
  } else {
    for (int64_t j = 0; j < n; ++j) dst[j] = ToFloat32(src[j]);
  }
}

// The one copy kernel. Copies the window rows [y, y+height) x columns
// [x, x+width) of a plane of T whose rows are `row_stride` elements apart,
// applies `t` (flips, then turns), and writes t.OutputSize(height, width)
// contiguous float32 values to `dst`. Row copies (memcpy, mirrored SSE rows)
// when rows stay rows; odd turns stage the window in a per-thread buffer
// (sequential reads of the source) and transpose it from cache in blocks.
// REQUIRES: height, width > 0, the window inside the plane, t.rot < 4, dst
// not overlapping the plane. Elements are converted with
// ConvertElement(v, lut) (a memcpy for float32). Instantiated for every
// element type of store/dtype.h.
template <typename T>
void CopyTransformed(const T* plane, int64_t row_stride, int64_t y, int64_t x, int64_t height, int64_t width,
                     Transform t, float* dst, const ValueTable* lut = nullptr);

#define PATCHSTORE_COPY_TRANSFORMED_(e, code, T, name, fmt)                                                         \
  extern template void CopyTransformed<T>(const T*, int64_t, int64_t, int64_t, int64_t, int64_t, Transform, float*, \
                                          const ValueTable*);
PATCHSTORE_FOR_EACH_DTYPE(PATCHSTORE_COPY_TRANSFORMED_)
#undef PATCHSTORE_COPY_TRANSFORMED_

// The same window and transform with the elements copied as stored (T to
// T, no conversion): what a stored-dtype gather writes (Output::kStored in
// reader/reader.h). ConvertElement(dst[i], lut) of its output equals
// CopyTransformed's output element for element, bit for bit.
template <typename T>
void CopyTransformedStored(const T* plane, int64_t row_stride, int64_t y, int64_t x, int64_t height, int64_t width,
                           Transform t, T* dst);

#define PATCHSTORE_COPY_TRANSFORMED_STORED_(e, code, T, name, fmt) \
  extern template void CopyTransformedStored<T>(const T*, int64_t, int64_t, int64_t, int64_t, int64_t, Transform, T*);
PATCHSTORE_FOR_EACH_DTYPE(PATCHSTORE_COPY_TRANSFORMED_STORED_)
#undef PATCHSTORE_COPY_TRANSFORMED_STORED_

}  // namespace patchstore
