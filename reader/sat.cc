#include "patchstore/reader/sat.h"

#include <cmath>
#include <cstring>

namespace patchstore {

void ComputeSat(const float* mask, int64_t planes, int64_t H, int64_t W, uint32_t* sat) {
  const int64_t stride = W + 1;
  for (int64_t p = 0; p < planes; ++p) {
    const float* m = mask + p * H * W;
    uint32_t* s = sat + p * (H + 1) * stride;
    std::memset(s, 0, sizeof(uint32_t) * stride);
    for (int64_t y = 0; y < H; ++y) SatRow(m + y * W, W, s + y * stride, s + (y + 1) * stride);
  }
}

}  // namespace patchstore
