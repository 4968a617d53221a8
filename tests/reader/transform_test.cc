// The one transform kernel and the one counter-based generator
// (reader/transform.h), checked against definitions written out here.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "patchstore/reader/transform.h"

namespace patchstore {
namespace {

// out = np.rot90(flip(window), rot) by the definitions: element (i, j) of
// the output read from the flipped window f, where
//   k=0: out[i][j] = f[i][j]        k=1: out[i][j] = f[j][w-1-i]
//   k=2: out[i][j] = f[h-1-i][w-1-j] k=3: out[i][j] = f[h-1-j][i]
std::vector<float> Reference(const std::vector<float>& plane, int64_t stride, int64_t y, int64_t x, int64_t h,
                             int64_t w, Transform t) {
  auto f = [&](int64_t r, int64_t c) {
    if (t.flip_v()) r = h - 1 - r;
    if (t.flip_h()) c = w - 1 - c;
    return plane[static_cast<size_t>((y + r) * stride + x + c)];
  };
  const auto out = t.OutputSize(h, w);
  std::vector<float> o(static_cast<size_t>(out.first * out.second));
  for (int64_t i = 0; i < out.first; ++i)
    for (int64_t j = 0; j < out.second; ++j) {
      float v;
      switch (t.rot) {
        case 0: v = f(i, j); break;
        case 1: v = f(j, w - 1 - i); break;
        case 2: v = f(h - 1 - i, w - 1 - j); break;
        default: v = f(h - 1 - j, i); break;
      }
      o[static_cast<size_t>(i * out.second + j)] = v;
    }
  return o;
}

TEST(Transform, OfTakesTurnsModuloFourAndNamesTheBits) {
  const Transform t = Transform::Of(true, false, -1);
  EXPECT_EQ(t.flip, Transform::kFlipV);
  EXPECT_EQ(t.rot, 3);
  EXPECT_TRUE(t.flip_v());
  EXPECT_FALSE(t.flip_h());
  EXPECT_EQ(Transform::Of(false, true, 6).flip, Transform::kFlipH);
  EXPECT_EQ(Transform::Of(false, true, 6).rot, 2);
  EXPECT_TRUE(Transform{}.identity());
  EXPECT_EQ(Transform::Of(false, false, 1).OutputSize(3, 5), std::make_pair(int64_t{5}, int64_t{3}));
  EXPECT_EQ(Transform::Of(false, false, 2).OutputSize(3, 5), std::make_pair(int64_t{3}, int64_t{5}));
}

// Every flip and turn, windows from 1x1 to larger than the 32x32 tiles and
// the 4x4 SSE blocks (ragged edges), at offsets in a strided plane; the
// values outside the window are distinct, so reading one shows.
TEST(CopyTransformed, EveryFlipAndTurnMatchesTheDefinition) {
  const int64_t H = 83, W = 77, stride = 80;
  std::vector<float> plane(static_cast<size_t>(H * stride));
  for (size_t i = 0; i < plane.size(); ++i) plane[i] = static_cast<float>(i) * 0.5f - 7.0f;
  struct Win {
    int64_t y, x, h, w;
  };
  const Win wins[] = {{0, 0, 1, 1}, {5, 3, 1, 9},    {2, 7, 9, 1},     {1, 2, 4, 4},  {3, 1, 7, 5},
                      {0, 0, H, W}, {10, 9, 37, 33}, {40, 30, 32, 32}, {4, 6, 64, 70}};
  for (const Win& win : wins)
    for (int flip = 0; flip < 4; ++flip)
      for (int rot = 0; rot < 4; ++rot) {
        const Transform t{static_cast<uint8_t>(flip), static_cast<uint8_t>(rot)};
        const std::vector<float> want = Reference(plane, stride, win.y, win.x, win.h, win.w, t);
        std::vector<float> got(want.size() + 1, -1.0f);  // one guard value past the end
        CopyTransformed(plane.data(), stride, win.y, win.x, win.h, win.w, t, got.data());
        ASSERT_EQ(got.back(), -1.0f) << "wrote past the output";
        got.pop_back();
        ASSERT_EQ(got, want) << win.y << "," << win.x << " " << win.h << "x" << win.w << " flip " << flip << " rot "
                             << rot;
      }
}

// A contiguous window (row stride == width) takes the one-memcpy staging
// path for odd turns: same values.
TEST(CopyTransformed, ContiguousPlaneOddTurns) {
  const int64_t h = 6, w = 10;
  std::vector<float> plane(static_cast<size_t>(h * w));
  for (size_t i = 0; i < plane.size(); ++i) plane[i] = static_cast<float>(i);
  for (int rot : {1, 3}) {
    const Transform t{Transform::kFlipH, static_cast<uint8_t>(rot)};
    std::vector<float> got(plane.size());
    CopyTransformed(plane.data(), w, 0, 0, h, w, t, got.data());
    EXPECT_EQ(got, Reference(plane, w, 0, 0, h, w, t)) << rot;
  }
}

// The stored-dtype kernel (CopyTransformedStored) moves the same elements
// as the float kernel, unconverted: for uint8 (values wrap, so a wrong
// element shows), int16 and float16 planes, every flip and turn of windows
// across the 32x32 tiles, against the same definition; nothing is written
// past the output.
template <typename T>
void ExpectStoredMatchesDefinition(T (*make)(size_t), float (*as_float)(T)) {
  const int64_t H = 71, W = 69, stride = 70;
  std::vector<T> plane(static_cast<size_t>(H * stride));
  std::vector<float> index(plane.size());
  for (size_t i = 0; i < plane.size(); ++i) {
    plane[i] = make(i);
    index[i] = static_cast<float>(i);
  }
  const int64_t wins[][4] = {{0, 0, 1, 1}, {3, 2, 1, 7}, {1, 4, 5, 1}, {2, 3, 9, 9}, {0, 0, H, W}, {6, 5, 40, 33}};
  for (const auto& win : wins)
    for (int flip = 0; flip < 4; ++flip)
      for (int rot = 0; rot < 4; ++rot) {
        const Transform t{static_cast<uint8_t>(flip), static_cast<uint8_t>(rot)};
        // The definition gives the source index of every output element.
        const std::vector<float> from = Reference(index, stride, win[0], win[1], win[2], win[3], t);
        std::vector<T> got(from.size() + 1, make(12345));
        const T guard = got.back();
        CopyTransformedStored(plane.data(), stride, win[0], win[1], win[2], win[3], t, got.data());
        ASSERT_EQ(as_float(got.back()), as_float(guard)) << "wrote past the output";
        for (size_t i = 0; i < from.size(); ++i)
          ASSERT_EQ(as_float(got[i]), as_float(plane[static_cast<size_t>(from[i])]))
              << win[2] << "x" << win[3] << " flip " << flip << " rot " << rot << " element " << i;
      }
}

TEST(CopyTransformedStored, EveryFlipAndTurnMovesTheStoredElements) {
  ExpectStoredMatchesDefinition<uint8_t>([](size_t i) { return static_cast<uint8_t>(i * 7 + 3); },
                                         [](uint8_t v) { return static_cast<float>(v); });
  ExpectStoredMatchesDefinition<int16_t>([](size_t i) { return static_cast<int16_t>(i * 40503u - 32768); },
                                         [](int16_t v) { return static_cast<float>(v); });
  ExpectStoredMatchesDefinition<Float16>([](size_t i) { return Float16{static_cast<uint16_t>(i * 13 % 0x7c00)}; },
                                         [](Float16 v) { return ToFloat32(v); });
}

// Pinned values: SplitMix64's output function (the reference generator's
// first outputs for state 0 are Mix(0), Mix(0x9e37...) ...), the key chain
// and the two ways to draw below n. Changing any of these changes every
// sampled sequence.
TEST(SplitMix, PinnedValues) {
  EXPECT_EQ(splitmix::Mix(0), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(splitmix::Mix(0x9e3779b97f4a7c15ULL), 0x6e789e6aa1b965f4ULL);
  const uint64_t a = 3, b = 1, c = 7, d = 0x534C4943;
  EXPECT_EQ(splitmix::Key(a), splitmix::Mix(a));
  EXPECT_EQ(splitmix::Key(a, b, c, d), splitmix::Mix(splitmix::Mix(splitmix::Mix(splitmix::Mix(a) ^ b) ^ c) ^ d));
  static_assert(splitmix::Key(1, 2) == splitmix::Mix(splitmix::Mix(1) ^ 2), "constexpr key");
  EXPECT_EQ(splitmix::Below(~uint64_t{0}, 10), 9u);
  EXPECT_EQ(splitmix::Below(uint64_t{1} << 63, 10), 5u);
  EXPECT_EQ(splitmix::Below32(uint64_t{1} << 63, 3), 1u);
  EXPECT_EQ(splitmix::Below32(0xffffffffULL, 1000), 0u);  // only the high half counts
  EXPECT_EQ(splitmix::Unit(0), 0.0);
  EXPECT_EQ(splitmix::Unit(~uint64_t{0}), 1.0 - 0x1.0p-53);
  // Below is uniform enough: 6 buckets of 60,000 draws within 2%.
  std::vector<int> count(6);
  for (uint64_t i = 0; i < 60000; ++i) ++count[splitmix::Below(splitmix::Key(9, i), 6)];
  for (int n : count) EXPECT_NEAR(n, 10000, 200);
}

}  // namespace
}  // namespace patchstore
