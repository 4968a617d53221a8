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
// Mask block counts (MaskBlocksView) are the same table over B x B blocks
// instead of pixels, stored by the writer for every record of a 1-channel
// image mask (store/FORMAT.md "Mask block counts"): a few kilobytes that
// bound the valid count of any window without reading the mask.
//
// Thread-safety: the functions are reentrant; SatView and MaskBlocksView are
// immutable values.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

namespace patchstore {

// Fills `sat` ((H+1) x (W+1) entries per plane) for `planes` mask planes of
// H x W float32 values each. REQUIRES: H * W < 2^32.
void ComputeSat(const float* mask, int64_t planes, int64_t H, int64_t W, uint32_t* sat);

// One row of such a table: `out` (W + 1 entries) from the table row above
// it and the mask row `m` (W values); ComputeSat row by row.
inline void SatRow(const float* m, int64_t W, const uint32_t* above, uint32_t* out) {
  uint32_t row = 0;
  out[0] = 0;
  for (int64_t x = 0; x < W; ++x) {
    const float v = m[x];
    row += (v != 0.0f && v == v) ? 1u : 0u;  // non-zero and not NaN
    out[x + 1] = above[x + 1] + row;
  }
}

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
    return static_cast<uint64_t>(s[(y + h) * stride + x + w]) - s[y * stride + x + w] - s[(y + h) * stride + x] +
           s[y * stride + x];
  }
};

// A read-only view of one mask record's block counts: a summed-area table
// of (by+1) x (bx+1) entries over the mask's B x B blocks (edge blocks are
// cut at H and W). `owner` keeps `data` alive.
struct MaskBlocksView {
  const uint32_t* data = nullptr;
  int64_t B = 0, H = 0, W = 0;  // block edge; the mask's height and width
  int64_t by = 0, bx = 0;       // blocks down and across: ceil(H/B), ceil(W/B)
  std::shared_ptr<const void> owner;

  // Bounds of the valid pixels of window [y, y+h) x [x, x+w): `lo` counts
  // the blocks wholly inside it, `hi` the blocks it meets, so
  // lo <= count <= hi. REQUIRES: the window lies inside the mask.
  void Bounds(int64_t y, int64_t x, int64_t h, int64_t w, uint64_t* lo, uint64_t* hi) const {
    // Block j spans rows [jB, min((j+1)B, H)).
    auto inner_end = [this](int64_t end, int64_t size, int64_t n) { return end >= size ? n : end / B; };
    const int64_t j0 = (y + B - 1) / B, j1 = inner_end(y + h, H, by);
    const int64_t i0 = (x + B - 1) / B, i1 = inner_end(x + w, W, bx);
    *lo = (j0 < j1 && i0 < i1) ? Sum(j0, i0, j1, i1) : 0;
    *hi = Sum(y / B, x / B, std::min(by, (y + h + B - 1) / B), std::min(bx, (x + w + B - 1) / B));
  }
  // Valid pixels of blocks [j0, j1) x [i0, i1).
  uint64_t Sum(int64_t j0, int64_t i0, int64_t j1, int64_t i1) const {
    const int64_t s = bx + 1;
    return static_cast<uint32_t>(data[j1 * s + i1] - data[j0 * s + i1] - data[j1 * s + i0] + data[j0 * s + i0]);
  }
};

}  // namespace patchstore
