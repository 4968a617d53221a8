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
    for (int64_t y = 0; y < H; ++y) {
      uint32_t row = 0;
      uint32_t* out = s + (y + 1) * stride;
      const uint32_t* above = s + y * stride;
      out[0] = 0;
      for (int64_t x = 0; x < W; ++x) {
        const float v = m[y * W + x];
        row += (v != 0.0f && !std::isnan(v)) ? 1u : 0u;
        out[x + 1] = above[x + 1] + row;
      }
    }
  }
}

}  // namespace patchstore
