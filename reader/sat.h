// patchstore/reader/sat.h — summed-area tables of mask validity.
//
// A summed-area table (integral image) S of a mask plane M (H x W) has
// (H+1) x (W+1) uint32 entries, S[y][x] = number of valid pixels in
// M[0:y, 0:x], so the valid count of any window is four lookups:
//   count(y, x, h, w) = S[y+h][x+w] - S[y][x+w] - S[y+h][x] + S[y][x].
// A pixel is valid when its stored value is non-zero and not NaN.
// Ingest stores one table per mask record as an auxiliary record (layout SAT,
// see store/FORMAT.md); readers of older stores compute it on demand.
//
// Thread-safety: the functions are reentrant; SatView is an immutable value.
#pragma once

#include <cstdint>
#include <memory>

namespace patchstore {

// Fills `sat` ((H+1) x (W+1) entries per plane) for `planes` mask planes of
// H x W float32 values each. REQUIRES: H * W < 2^32.
void ComputeSat(const float* mask, int64_t planes, int64_t H, int64_t W, uint32_t* sat);

// A read-only view of the tables of one record: `planes` tables of
// (H+1) x (W+1) entries, row-major. `owner` keeps `data` alive.
struct SatView {
  const uint32_t* data = nullptr;
  int64_t planes = 0, H = 0, W = 0;  // of the mask, not the table
  std::shared_ptr<const void> owner;

  // Valid pixels in window [y, y+h) x [x, x+w) of `plane`.
  // REQUIRES: the window lies inside the mask.
  uint64_t Count(int64_t plane, int64_t y, int64_t x, int64_t h, int64_t w) const {
    const uint32_t* s = data + plane * (H + 1) * (W + 1);
    const int64_t stride = W + 1;
    return static_cast<uint64_t>(s[(y + h) * stride + x + w]) - s[y * stride + x + w] -
           s[(y + h) * stride + x] + s[y * stride + x];
  }
};

}  // namespace patchstore
