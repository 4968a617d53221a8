// Slices of volume stores: SliceIndex, SliceStack, CopySliceStack and the
// crop/flip/rot90 transform against a NumPy-semantics reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "patchstore/reader/volume.h"
#include "patchstore/store/store.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::TempDir;

struct Vol {
  std::string id;
  int64_t S, H, W;
};

// The value stored at (volume v, field f, slice s, row y, column x).
float Value(size_t v, int f, int64_t s, int64_t y, int64_t x) {
  return static_cast<float>(v * 1000000 + f * 100000 + s * 1000 + y * 31 + x) * 0.5f;
}

Status WriteVolumeStore(const std::string& path, const std::vector<Vol>& vols, int nfields = 2,
                        const std::string& kind = "volumes") {
  testing::StoreSpec spec;
  spec.kind = kind;
  for (int f = 0; f < nfields; ++f) {
    // A frame store's field has C channels; its records are (C, H, W).
    spec.fields.push_back(testing::StoreField{f == 0   ? "MR"
                                              : f == 1 ? "CT"
                                                       : "F" + std::to_string(f),
                                              kind == "volumes" ? 1 : static_cast<int>(vols.at(0).S)});
  }
  for (const Vol& d : vols) spec.ids.push_back(d.id);
  spec.shape = [&](uint64_t v, int) { return std::array<int64_t, 3>{vols[v].S, vols[v].H, vols[v].W}; };
  spec.value = [](uint64_t v, int f, int64_t s, int64_t y, int64_t x) -> double { return Value(v, f, s, y, x); };
  spec.batch = vols.size();
  return testing::WriteStore(path, spec);
}

// A plain 2D array and NumPy's operations on it, written from NumPy's own
// definitions (numpy/lib/function_base.py flip, numpy/lib/twodim_base.py
// rot90) — independent of the affine map in reader/volume.cc.
struct Array2 {
  int64_t h = 0, w = 0;
  std::vector<float> a;
  float at(int64_t i, int64_t j) const { return a[i * w + j]; }
};

Array2 Crop(const Array2& m, int64_t y, int64_t x, int64_t h, int64_t w) {
  Array2 o{h, w, std::vector<float>(h * w)};
  for (int64_t i = 0; i < h; ++i)
    for (int64_t j = 0; j < w; ++j) o.a[i * w + j] = m.at(y + i, x + j);
  return o;
}
Array2 Flip(const Array2& m, int axis) {  // np.flip(m, axis)
  Array2 o = m;
  for (int64_t i = 0; i < m.h; ++i)
    for (int64_t j = 0; j < m.w; ++j) o.a[i * m.w + j] = axis == 0 ? m.at(m.h - 1 - i, j) : m.at(i, m.w - 1 - j);
  return o;
}
Array2 Transpose(const Array2& m) {
  Array2 o{m.w, m.h, std::vector<float>(m.a.size())};
  for (int64_t i = 0; i < o.h; ++i)
    for (int64_t j = 0; j < o.w; ++j) o.a[i * o.w + j] = m.at(j, i);
  return o;
}
Array2 Rot90(const Array2& m, int k) {  // np.rot90(m, k, axes=(0, 1))
  k = ((k % 4) + 4) % 4;
  if (k == 0) return m;
  if (k == 2) return Flip(Flip(m, 0), 1);
  if (k == 1) return Transpose(Flip(m, 1));
  return Flip(Transpose(m), 1);
}
Array2 Reference(const Array2& m, const SliceTransform& t) {
  Array2 o = (t.height || t.width) ? Crop(m, t.y, t.x, t.height, t.width) : m;
  if (t.flip_v) o = Flip(o, 0);
  if (t.flip_h) o = Flip(o, 1);
  return Rot90(o, t.rot90);
}

class VolumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    vols_ = {{"p1", 5, 7, 9}, {"p2", 3, 4, 6}, {"p3", 1, 7, 9}, {"p4", 8, 16, 20}};
    path_ = dir_ / "v.ps";
    Status st = WriteVolumeStore(path_, vols_);
    ASSERT_TRUE(st.ok()) << st.ToString();
    auto r = Reader::Open(path_);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    reader_ = *r;
  }
  TempDir dir_;
  std::string path_;
  std::vector<Vol> vols_;
  std::shared_ptr<Reader> reader_;
};

TEST_F(VolumeTest, SliceIndexEnumeratesEveryVolumeSlicePair) {
  auto ix = SliceIndex::Build(*reader_);
  ASSERT_TRUE(ix.ok()) << ix.status().ToString();
  EXPECT_EQ(ix->size(), 5u + 3 + 1 + 8);
  EXPECT_EQ(ix->volume_count(), 4u);
  uint64_t i = 0;
  for (size_t v = 0; v < vols_.size(); ++v) {
    EXPECT_EQ(ix->first(v), i);
    EXPECT_EQ(ix->depth(v), vols_[v].S);
    EXPECT_EQ(ix->height(v), vols_[v].H);
    EXPECT_EQ(ix->width(v), vols_[v].W);
    for (int64_t s = 0; s < vols_[v].S; ++s, ++i) {
      SliceRef r = (*ix)[i];
      EXPECT_EQ(r.sample, v);
      EXPECT_EQ(r.slice, s);
      EXPECT_EQ(r.depth, vols_[v].S);
    }
  }
  EXPECT_EQ(ix->first(4), ix->size());
  EXPECT_EQ(ix->At(ix->size()).status().code(), Code::kOutOfRange);
  EXPECT_EQ(ix->At(3)->slice, 3);
}

TEST_F(VolumeTest, SliceIndexOfASubsetKeepsItsOrder) {
  auto ix = SliceIndex::Build(*reader_, {3, 1});
  ASSERT_TRUE(ix.ok());
  EXPECT_EQ(ix->size(), 11u);
  EXPECT_EQ((*ix)[0].sample, 3u);
  EXPECT_EQ((*ix)[8].sample, 1u);
  EXPECT_EQ((*ix)[8].slice, 0);
  EXPECT_EQ(SliceIndex::Build(*reader_, {1, 1}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(SliceIndex::Build(*reader_, {9}).status().code(), Code::kOutOfRange);
  auto empty = SliceIndex::Build(*reader_, {});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->size(), 0u);
}

TEST_F(VolumeTest, VolumesGivingItemsAreThoseWithSlicesNoSmallerThanTheCrop) {
  // p1 5x7x9, p2 3x4x6, p3 1x7x9, p4 8x16x20 (S x H x W), indexed in the order p4, p2, p1, p3.
  auto ix = SliceIndex::Build(*reader_, {3, 1, 0, 2});
  ASSERT_TRUE(ix.ok());
  EXPECT_TRUE(ix->GivesItems(0, 0, 0));
  EXPECT_TRUE(ix->GivesItems(1, 4, 6));   // the crop may equal the slices
  EXPECT_FALSE(ix->GivesItems(1, 5, 6));  // one row too many
  EXPECT_FALSE(ix->GivesItems(1, 4, 7));  // one column too many
  VolumeSelection all = SelectVolumesGivingItems(*reader_, *ix, 0, 0);
  EXPECT_EQ(all.kept, (std::vector<uint64_t>{3, 1, 0, 2}));
  EXPECT_TRUE(all.skipped.empty() && all.skipped_text.empty());
  VolumeSelection crop = SelectVolumesGivingItems(*reader_, *ix, 7, 8);
  EXPECT_EQ(crop.kept, (std::vector<uint64_t>{3, 0, 2}));
  EXPECT_EQ(crop.skipped, (std::vector<uint64_t>{1}));
  EXPECT_EQ(crop.skipped_text, "'p2' (4x6 slices)");
  VolumeSelection big = SelectVolumesGivingItems(*reader_, *ix, 16, 20);
  EXPECT_EQ(big.kept, (std::vector<uint64_t>{3}));
  EXPECT_EQ(big.skipped_text, "'p2' (4x6 slices), 'p1' (7x9 slices), 'p3' (7x9 slices)");
  VolumeSelection none = SelectVolumesGivingItems(*reader_, *ix, 17, 20);
  EXPECT_TRUE(none.kept.empty());
  EXPECT_EQ(none.skipped.size(), 4u);
  EXPECT_EQ(none.skipped_text, "'p4' (16x20 slices), 'p2' (4x6 slices), 'p1' (7x9 slices), 'p3' (7x9 slices)");
}

TEST(VolumeStore, SliceIndexRefusesFrameStores) {
  TempDir dir;
  ASSERT_TRUE(WriteVolumeStore(dir / "f.ps", {{"a", 3, 4, 5}}, 1, "frames").ok());
  auto r = Reader::Open(dir / "f.ps");
  ASSERT_TRUE(r.ok());
  auto ix = SliceIndex::Build(**r);
  EXPECT_EQ(ix.status().code(), Code::kInvalidArgument);
  EXPECT_NE(ix.status().message().find("not volumes"), std::string::npos);
  EXPECT_EQ(Volume(**r, 0, 0).status().code(), Code::kInvalidArgument);
}

TEST(VolumeStore, SliceIndexRefusesFieldsOfDifferentShapes) {
  TempDir dir;
  testing::StoreSpec spec;
  spec.kind = "volumes";
  spec.fields = {testing::StoreField{"MR"}, testing::StoreField{"CT"}};
  spec.ids = {"bad"};
  spec.shape = [](uint64_t, int f) { return std::array<int64_t, 3>{f == 0 ? 3 : 2, 4, 5}; };
  spec.value = [](uint64_t, int f, int64_t, int64_t, int64_t) { return f == 0 ? 1.0 : 2.0; };
  spec.seal = false;
  ASSERT_TRUE(testing::WriteStore(dir / "m.ps", spec).ok());
  auto r = Reader::Open(dir / "m.ps");
  ASSERT_TRUE(r.ok());
  auto ix = SliceIndex::Build(**r);
  EXPECT_EQ(ix.status().code(), Code::kInvalidArgument);
  EXPECT_NE(ix.status().message().find("'bad' field 'CT'"), std::string::npos) << ix.status().message();
}

TEST_F(VolumeTest, VolumeIsTheWholeRecord) {
  auto v = Volume(*reader_, 3, 1);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->rank, 3);
  EXPECT_EQ(v->shape[0], 8);
  EXPECT_EQ(v->shape[1], 16);
  EXPECT_EQ(v->shape[2], 20);
  EXPECT_TRUE(v->contiguous());
  EXPECT_EQ(v->data_as<float>()[(5 * 16 + 3) * 20 + 7], Value(3, 1, 5, 3, 7));
}

TEST_F(VolumeTest, SliceStackInsideIsAZeroCopyView) {
  auto vol = Volume(*reader_, 0, 0);
  auto st = SliceStack(*reader_, 0, 0, 2, 2);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->shape[0], 5);
  EXPECT_EQ(st->shape[1], 7);
  EXPECT_EQ(st->shape[2], 9);
  EXPECT_TRUE(st->contiguous());
  EXPECT_EQ(st->data, vol->data);  // slices 0..4 of the map
  auto one = SliceStack(*reader_, 0, 0, 3, 0);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->shape[0], 1);
  EXPECT_EQ(one->data, vol->data_as<float>() + 3 * 7 * 9);
  EXPECT_EQ(one->owner, vol->owner);
}

TEST_F(VolumeTest, SliceStackReplicatesTheEndSlices) {
  auto vol = Volume(*reader_, 0, 1);
  const int64_t H = 7, W = 9;
  for (int64_t slice : {0, 1, 4}) {
    auto st = SliceStack(*reader_, 0, 1, slice, 2);
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->shape[0], 5);
    EXPECT_TRUE(st->contiguous());
    for (int64_t d = 0; d < 5; ++d) {
      const int64_t s = std::min<int64_t>(std::max<int64_t>(slice - 2 + d, 0), 4);
      for (int64_t y = 0; y < H; ++y)
        for (int64_t x = 0; x < W; ++x) ASSERT_EQ(st->data_as<float>()[(d * H + y) * W + x], Value(0, 1, s, y, x));
    }
    if (slice != 2) {
      EXPECT_NE(st->owner, vol->owner);  // an owned copy
    }
  }
}

TEST_F(VolumeTest, ContextLargerThanTheVolume) {
  // p3 has a single slice: every stack entry is that slice.
  auto st = SliceStack(*reader_, 2, 0, 0, 4);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->shape[0], 9);
  for (int64_t d = 0; d < 9; ++d) EXPECT_EQ(st->data_as<float>()[d * 63 + 10], Value(2, 0, 0, 1, 1));
  // p2 (3 slices), context 5, slice 1: 0,0,0,0,0,1,2,2,2,2,2.
  std::vector<float> buf(11 * 4 * 6);
  ASSERT_TRUE(CopySliceStack(*reader_, 1, 0, 1, 5, {}, buf.data()).ok());
  const int expect[11] = {0, 0, 0, 0, 0, 1, 2, 2, 2, 2, 2};
  for (int d = 0; d < 11; ++d) EXPECT_EQ(buf[d * 24 + 7], Value(1, 0, expect[d], 1, 1)) << d;
}

TEST_F(VolumeTest, BadArgumentsAreErrors) {
  EXPECT_EQ(SliceStack(*reader_, 0, 0, 5, 0).status().code(), Code::kOutOfRange);
  EXPECT_EQ(SliceStack(*reader_, 0, 0, -1, 0).status().code(), Code::kOutOfRange);
  EXPECT_EQ(SliceStack(*reader_, 0, 0, 0, -1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(SliceStack(*reader_, 9, 0, 0, 0).status().code(), Code::kOutOfRange);
  EXPECT_EQ(SliceStack(*reader_, 0, 5, 0, 0).status().code(), Code::kNotFound);
  std::vector<float> buf(1000);
  SliceTransform t;
  t.y = 2;
  t.x = 2;
  t.height = 6;
  t.width = 6;  // rows 2..7 of 7: outside
  Status st = CopySliceStack(*reader_, 0, 0, 0, 0, t, buf.data());
  EXPECT_EQ(st.code(), Code::kOutOfRange);
  EXPECT_NE(st.message().find("'p1' field 'MR'"), std::string::npos) << st.message();
  t.height = 0;
  EXPECT_EQ(CopySliceStack(*reader_, 0, 0, 0, 0, t, buf.data()).code(), Code::kInvalidArgument);
  SliceTransform offset_only;
  offset_only.y = 1;
  EXPECT_EQ(CopySliceStack(*reader_, 0, 0, 0, 0, offset_only, buf.data()).code(), Code::kInvalidArgument);
}

// Every combination of flips and rotations, with and without crops, equals
// the NumPy reference, for every slice of the stack.
TEST_F(VolumeTest, TransformEqualsNumPyForAllFlipsRotationsAndCrops) {
  const uint64_t sample = 3;  // 8 x 16 x 20
  const int64_t H = 16, W = 20, context = 1;
  struct Crop {
    int64_t y, x, h, w;
  };
  const Crop crops[] = {{0, 0, 0, 0},   {0, 0, 16, 20}, {3, 5, 8, 8},  {0, 0, 1, 1},
                        {15, 19, 1, 1}, {2, 1, 13, 6},  {8, 0, 8, 20}, {0, 11, 16, 9}};
  int checked = 0;
  for (const Crop& c : crops)
    for (int fv = 0; fv < 2; ++fv)
      for (int fh = 0; fh < 2; ++fh)
        for (int k = -1; k < 5; ++k) {
          SliceTransform t;
          t.y = c.y;
          t.x = c.x;
          t.height = c.h;
          t.width = c.w;
          t.flip_v = fv;
          t.flip_h = fh;
          t.rot90 = k;
          const auto [oh, ow] = t.OutputSize(H, W);
          for (int64_t slice : {0, 4, 7}) {
            std::vector<float> out((2 * context + 1) * oh * ow, NAN);
            Status st = CopySliceStack(*reader_, sample, 1, slice, context, t, out.data());
            ASSERT_TRUE(st.ok()) << st.ToString();
            for (int64_t d = 0; d <= 2 * context; ++d) {
              const int64_t s = std::min<int64_t>(std::max<int64_t>(slice - context + d, 0), 7);
              Array2 plane{H, W, std::vector<float>(H * W)};
              for (int64_t y = 0; y < H; ++y)
                for (int64_t x = 0; x < W; ++x) plane.a[y * W + x] = Value(sample, 1, s, y, x);
              Array2 ref = Reference(plane, t);
              ASSERT_EQ(ref.h, oh);
              ASSERT_EQ(ref.w, ow);
              for (int64_t i = 0; i < oh * ow; ++i)
                ASSERT_EQ(out[d * oh * ow + i], ref.a[i])
                    << "crop " << c.y << "," << c.x << "," << c.h << "," << c.w << " flip_v " << fv << " flip_h " << fh
                    << " rot90 " << k << " slice " << slice << " d " << d << " at " << i;
            }
            ++checked;
          }
        }
  EXPECT_EQ(checked, 8 * 2 * 2 * 6 * 3);
}

TEST(TransformPlane, LargeTilesAndRowStride) {
  // A 70 x 45 window inside a 70 x 50 buffer (rows 50 floats apart): tiles of
  // the rotated copy do not divide the plane evenly.
  const int64_t H = 70, W = 45, stride = 50;
  std::vector<float> src(H * stride);
  std::mt19937 rng(7);
  for (float& v : src) v = static_cast<float>(rng() % 100000);
  Array2 plane{H, W, std::vector<float>(H * W)};
  for (int64_t y = 0; y < H; ++y)
    for (int64_t x = 0; x < W; ++x) plane.a[y * W + x] = src[y * stride + x];
  for (int k = 0; k < 4; ++k)
    for (int f = 0; f < 4; ++f) {
      SliceTransform t;
      t.rot90 = k;
      t.flip_v = f & 1;
      t.flip_h = f & 2;
      t.y = 3;
      t.x = 4;
      t.height = 66;
      t.width = 37;
      std::vector<float> out(66 * 37);
      ASSERT_TRUE(TransformPlane(src.data(), H, W, stride, t, out.data()).ok());
      Array2 ref = Reference(plane, t);
      ASSERT_EQ(out, ref.a) << "rot90 " << k << " flips " << f;
    }
}

TEST_F(VolumeTest, CopySliceStacksMatchesSingleCopiesOnAnyThreadCount) {
  std::vector<SliceStackRequest> reqs;
  std::mt19937 rng(3);
  for (int i = 0; i < 37; ++i) {
    SliceStackRequest r;
    r.sample = (i % 2) ? 0 : 3;
    r.field = i % 2;
    r.slice = static_cast<int64_t>(rng() % (r.sample == 0 ? 5 : 8));
    r.transform.height = r.transform.width = 6;
    r.transform.y = static_cast<int64_t>(rng() % 2);
    r.transform.x = static_cast<int64_t>(rng() % 3);
    r.transform.flip_h = rng() % 2;
    r.transform.rot90 = static_cast<int>(rng() % 4);
    reqs.push_back(r);
  }
  const int64_t item = 5 * 6 * 6;
  std::vector<float> single(reqs.size() * item);
  for (size_t i = 0; i < reqs.size(); ++i)
    ASSERT_TRUE(CopySliceStack(*reader_, reqs[i].sample, reqs[i].field, reqs[i].slice, 2, reqs[i].transform,
                               single.data() + i * item)
                    .ok());
  for (int threads : {1, 3, 8}) {
    std::vector<float> batch(reqs.size() * item, -1);
    ASSERT_TRUE(CopySliceStacks(*reader_, reqs, 2, batch.data(), threads).ok());
    EXPECT_EQ(batch, single) << threads;
  }
  reqs[5].transform.width = 5;
  std::vector<float> batch(reqs.size() * item);
  EXPECT_EQ(CopySliceStacks(*reader_, reqs, 2, batch.data()).code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace patchstore

namespace patchstore {
namespace {

// SliceDataset's draws (patchstore._volumes.draw_transforms calls this):
// pinned values, so a given (seed, epoch, item) keeps its crop, flips and
// turn across versions. These equal the NumPy implementation they replaced.
TEST(DrawSliceTransform, PinnedDrawsAndTheirRules) {
  const int64_t want[4][7] = {{0, 21, 64, 32, 0, 0, 1},
                              {13, 17, 64, 32, 0, 1, 2},
                              {1, 39, 64, 32, 1, 1, 0},
                              {29, 19, 64, 32, 0, 0, 0}};
  for (uint64_t i = 0; i < 4; ++i) {
    const SliceTransform t = DrawSliceTransform(3, 1, i, 100, 90, 64, 32, SliceFlip::kIndependent, true);
    EXPECT_EQ(t.y, want[i][0]) << i;
    EXPECT_EQ(t.x, want[i][1]) << i;
    EXPECT_EQ(t.height, 64);
    EXPECT_EQ(t.width, 32);
    EXPECT_EQ(t.flip_v, want[i][4] != 0) << i;
    EXPECT_EQ(t.flip_h, want[i][5] != 0) << i;
    EXPECT_EQ(t.rot90, want[i][6]) << i;
  }
  int both = 0, turns[4] = {0, 0, 0, 0};
  for (uint64_t i = 0; i < 4000; ++i) {
    const SliceTransform t = DrawSliceTransform(9, 0, i, 50, 40, 50, 40, SliceFlip::kBoth, true);
    EXPECT_EQ(t.flip_v, t.flip_h);  // flip=True: both axes or none (a 180 degree turn)
    EXPECT_EQ(t.y, 0);              // a crop as large as the plane has one place
    EXPECT_EQ(t.x, 0);
    both += t.flip_v;
    ++turns[t.rot90];
    const SliceTransform none = DrawSliceTransform(9, 0, i, 50, 40, 0, 0, SliceFlip::kNone, false);
    EXPECT_TRUE(none.identity());
  }
  EXPECT_NEAR(both, 2000, 200);
  EXPECT_NEAR(turns[0], 2000, 200);  // probability 1/2 of no turn, then k uniform in 1..3
  for (int k = 1; k < 4; ++k) EXPECT_NEAR(turns[k], 667, 120) << k;
}

}  // namespace
}  // namespace patchstore
