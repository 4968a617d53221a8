// Golden windows: the exact windows (sample ids, y, x, flips, quarter turns)
// and slices the loaders serve for a fixed store, seed and epoch, pinned as
// literals.
//
// IF A TEST HERE FAILS, THE SERVED DATA CHANGED: every user's windows for a
// given seed are different, and every saved loader state (state_dict) now
// resumes onto other windows than the ones it was saved with. Update the
// literals only for a deliberate change of the draws, and note it in
// CHANGELOG.md. The layout (rows or tiles) must never change them.
//
// The stores are built from integer formulas (no random generator), so the
// literals depend only on the sampling code. To see the new values, run the
// failing test: gtest prints the served list beside the pinned one.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "patchstore/reader/sampler.h"
#include "patchstore/reader/slice_sampler.h"
#include "patchstore/reader/volume.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::StoreField;
using testing::StoreSpec;
using testing::TempDir;

constexpr int64_t kH = 20, kW = 24;

// Mask pixel (y, x) of sample s: diagonal stripes, a different density per
// sample; sample 2 has none (skipped by mask-aware draws) and sample 5 only
// a 3 x 3 block (few windows qualify).
double MaskValue(uint64_t s, int64_t y, int64_t x) {
  if (s == 2) return 0;
  if (s == 5) return (y >= 12 && y < 15 && x >= 3 && x < 6) ? 1 : 0;
  return (y * 3 + x * 5 + static_cast<int64_t>(s) * 7) % 11 < static_cast<int64_t>(s % 3) + 1 ? 1 : 0;
}

// 7 frames of 20 x 24, "img" (2 channels, SyntheticValue) and "mask", in rows
// or in 8-pixel tiles.
std::string FrameStore(const TempDir& dir, uint16_t tile) {
  StoreSpec spec;
  spec.fields = {StoreField{"img", 2}, StoreField{"mask", 1, /*mask=*/true}};
  for (StoreField& f : spec.fields) f.tile = tile;
  spec.ids = testing::NumberedIds(7);
  spec.height = kH;
  spec.width = kW;
  spec.value = [](uint64_t s, int f, int64_t c, int64_t y, int64_t x) {
    return f == 1 ? MaskValue(s, y, x) : testing::SyntheticValue(s, f, c, y, x);
  };
  const std::string path = dir / (tile ? "tiles.ps" : "rows.ps");
  EXPECT_TRUE(testing::WriteStore(path, spec).ok());
  return path;
}

// "id y,x" per window, with " f<flip>r<rot>" when transformed and " -" when
// drawn from the non-qualifying set; windows separated by "; ".
std::string Str(const Reader& reader, const std::vector<Window>& windows) {
  std::string out;
  for (const Window& w : windows) {
    if (!out.empty()) out += "; ";
    out += std::string(reader.id(w.sample)) + " " + std::to_string(w.y) + "," + std::to_string(w.x);
    if (w.flip || w.rot) out += " f" + std::to_string(w.flip) + "r" + std::to_string(w.rot);
    if (!w.positive) out += " -";
  }
  return out;
}

class GoldenWindows : public ::testing::TestWithParam<uint16_t> {
 protected:
  void SetUp() override { reader_ = Reader::Open(FrameStore(dir_, GetParam())).value(); }
  std::unique_ptr<PatchSampler> Make(SamplerOptions o) {
    o.fields = {"img", "mask"};
    auto s = PatchSampler::Create(reader_, o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  // The n windows a PatchSampler serves from the start of `epoch` (what
  // Gather copies).
  std::string Served(PatchSampler& s, uint64_t epoch, int64_t n) {
    std::vector<std::vector<float>> bufs;
    std::vector<float*> outs;
    for (int64_t c : s.channels()) {
      bufs.emplace_back(static_cast<size_t>(n * c * s.height() * s.width()));
      outs.push_back(bufs.back().data());
    }
    std::vector<Window> windows;
    Status st = s.Gather(epoch, 0, n, outs, &windows);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return Str(*reader_, windows);
  }
  TempDir dir_;
  std::shared_ptr<Reader> reader_;
};

// Served windows changed? That invalidates users' saved states: update only
// deliberately, and note it in CHANGELOG.md (see the top of this file).
TEST_P(GoldenWindows, UniformTwoEpochs) {
  SamplerOptions o;
  o.patch_size = 8;
  o.patches_per_sample = 2;
  o.seed = 7;
  auto s = Make(o);
  EXPECT_EQ(s->windows_per_epoch(), 14u);
  EXPECT_EQ(Served(*s, 0, 14), "s/1 12,1; s/1 1,0; s/2 6,1; s/2 12,14; s/5 5,11; s/5 6,1; s/0 0,10; s/0 7,8; s/6 4,10; "
                               "s/6 12,0; s/3 7,2; s/3 3,15; s/4 9,0; s/4 10,2");
  EXPECT_EQ(Served(*s, 1, 14),
            "s/0 9,11; s/0 9,6; s/2 3,13; s/2 10,5; s/5 0,13; s/5 9,5; s/6 11,15; s/6 1,4; s/1 4,10; "
            "s/1 3,16; s/3 9,9; s/3 7,6; s/4 9,16; s/4 7,11");
}

// Served windows changed? That invalidates users' saved states: update only
// deliberately, and note it in CHANGELOG.md (see the top of this file).
TEST_P(GoldenWindows, RequireMinValidRectangles) {
  SamplerOptions o;
  o.patch_h = 6;
  o.patch_w = 8;
  o.patches_per_sample = 2;
  o.require = "mask";
  o.min_valid = 4;
  o.seed = 3;
  auto s = Make(o);
  EXPECT_EQ(s->skipped_ids(), std::vector<std::string>{"s/2"});
  EXPECT_EQ(Served(*s, 0, 12), "s/3 10,3; s/3 12,10; s/1 6,3; s/1 2,14; s/5 8,1; s/5 13,4; s/4 13,1; s/4 4,8; s/0 0,2; "
                               "s/0 4,6; s/6 5,9; s/6 2,10");
  EXPECT_EQ(Served(*s, 1, 12), "s/1 1,10; s/1 12,4; s/0 1,8; s/0 11,11; s/3 2,11; s/3 3,9; s/4 5,4; s/4 1,7; s/5 9,0; "
                               "s/5 11,4; s/6 9,12; s/6 13,3");
}

// Served windows changed? That invalidates users' saved states: update only
// deliberately, and note it in CHANGELOG.md (see the top of this file).
TEST_P(GoldenWindows, RequirePositiveFraction) {
  SamplerOptions o;
  o.patch_size = 5;
  o.patches_per_sample = 2;
  o.require = "mask";
  o.positive_fraction = 0.5;
  o.seed = 11;
  auto s = Make(o);
  EXPECT_EQ(Served(*s, 0, 12), "s/1 7,3; s/1 4,8; s/4 9,16; s/4 6,10; s/2 14,2 -; s/2 11,2 -; s/3 1,3; s/3 2,14; "
                               "s/5 9,2; s/5 2,13 -; s/6 5,2; s/6 0,13");
}

// Served windows changed? That invalidates users' saved states: update only
// deliberately, and note it in CHANGELOG.md (see the top of this file).
TEST_P(GoldenWindows, FlipsAndQuarterTurnsWithTheirPixels) {
  SamplerOptions o;
  o.patch_size = 8;
  o.patches_per_sample = 2;
  o.flip = true;
  o.rot90 = true;
  o.require = "mask";
  o.seed = 5;
  auto s = Make(o);
  EXPECT_EQ(Served(*s, 0, 12), "s/4 6,10 f1r2; s/4 11,4 f2r0; s/5 5,4 f1r3; s/5 8,3; s/6 4,15 f3r3; s/6 3,7 f1r0; "
                               "s/3 1,2 f1r3; s/3 1,1 f3r1; s/1 5,2 f0r1; s/1 4,10 f3r0; s/0 4,7 f2r2; s/0 6,9");
  // The corner pixel (0, 0) of channel 1 of each gathered window names the
  // source pixel it came from (SyntheticValue): the transform is applied.
  const int64_t n = 12, P = 8;
  std::vector<float> img(n * 2 * P * P), mask(n * P * P);
  ASSERT_TRUE(s->Gather(0, 0, n, {img.data(), mask.data()}).ok());
  std::string corners;
  for (int64_t i = 0; i < n; ++i) corners += std::to_string(static_cast<int64_t>(img[(i * 2 + 1) * P * P])) + " ";
  EXPECT_EQ(corners, "4010617 4011111 5010504 5010803 6010422 6011007 3010102 3010801 1010509 1011117 11107 10609 ");
}

// Served windows changed? That invalidates users' saved states: update only
// deliberately, and note it in CHANGELOG.md (see the top of this file).
TEST_P(GoldenWindows, RankOfWorldSize) {
  SamplerOptions o;
  o.patch_size = 8;
  o.patches_per_sample = 1;
  o.require = "mask";
  o.seed = 2;
  o.world_size = 4;
  std::string all;
  for (int rank = 0; rank < 4; ++rank) {
    o.rank = rank;
    auto s = Make(o);
    all += "rank " + std::to_string(rank) + ": " + Served(*s, 0, 2) + "\n";
  }
  EXPECT_EQ(all, "rank 0: s/4 0,5; s/3 7,11\nrank 1: s/6 6,1; s/0 7,2\nrank 2: s/5 7,5; s/4 11,9\n"
                 "rank 3: s/1 4,16; s/6 0,8\n");
}

// Served windows changed? That invalidates users' saved states: update only
// deliberately, and note it in CHANGELOG.md (see the top of this file).
TEST_P(GoldenWindows, SubsetOfIds) {
  SamplerOptions o;
  o.patch_size = 8;
  o.patches_per_sample = 3;
  o.seed = 9;
  o.ids = {"s/4", "s/1", "s/6"};
  auto s = Make(o);
  EXPECT_EQ(Served(*s, 0, 9), "s/4 12,7; s/4 8,6; s/4 2,5; s/6 4,16; s/6 0,8; s/6 12,13; s/1 3,6; s/1 6,11; s/1 11,0");
  EXPECT_EQ(Served(*s, 1, 9), "s/4 5,14; s/4 9,4; s/4 2,4; s/6 8,16; s/6 3,4; s/6 7,13; s/1 6,16; s/1 12,2; s/1 8,4");
}

// Served windows changed? That invalidates users' saved states: update only
// deliberately, and note it in CHANGELOG.md (see the top of this file).
TEST_P(GoldenWindows, PatchDatasetItemOrder) {
  SamplerOptions o;
  o.patch_size = 8;
  o.patches_per_sample = 2;
  o.require = "mask";
  o.min_valid = 2;
  o.seed = 4;
  auto s = Make(o);
  EXPECT_EQ(Str(*reader_, s->ServedWindows(LoaderKind::kPatchDataset, 0, 0, 12).value()),
            "s/0 5,2; s/0 0,5; s/1 2,5; s/1 5,9; s/3 7,4; s/3 0,11; s/4 9,11; s/4 4,1; s/5 9,4; "
            "s/5 8,4; s/6 1,10; s/6 1,5");
  EXPECT_EQ(Str(*reader_, s->ServedWindows(LoaderKind::kPatchDataset, 1, 0, 12).value()),
            "s/0 3,1; s/0 7,15; s/1 4,6; s/1 0,5; s/3 3,11; s/3 8,16; s/4 4,9; s/4 10,8; s/5 12,4; "
            "s/5 9,1; s/6 3,4; s/6 2,9");
  // Item i, window j is WindowOfSample(eligible_list()[i], j).
  EXPECT_EQ(Str(*reader_, {s->WindowOfSample(0, 6, 1).value()}), "s/6 1,5");
}

INSTANTIATE_TEST_SUITE_P(Layouts, GoldenWindows, ::testing::Values(uint16_t{0}, uint16_t{8}),
                         [](const ::testing::TestParamInfo<uint16_t>& info) {
                           return info.param ? std::string("Tiles8") : std::string("Rows");
                         });

// Volumes of 10 x 12 slices with 5, 3 and 4 slices, and one of 6 x 7
// slices that an 8 x 8 crop leaves out; "MR" and "CT", SyntheticValue.
std::shared_ptr<Reader> VolumeStore(const TempDir& dir) {
  StoreSpec spec;
  spec.kind = "volumes";
  spec.fields = {StoreField{"MR"}, StoreField{"CT"}};
  spec.ids = {"p0", "p1", "small", "p3"};
  spec.shape = [](uint64_t s, int) -> std::array<int64_t, 3> {
    const int64_t depth[4] = {5, 3, 2, 4};
    return {depth[s], s == 2 ? 6 : 10, s == 2 ? 7 : 12};
  };
  EXPECT_TRUE(testing::WriteStore(dir / "v.ps", spec).ok());
  return Reader::Open(dir / "v.ps").value();
}

// "id slice: y,x fv fh r" per item, as SliceDataset draws them (the
// slice sampler with these options; the items' slices are their own
// without require).
std::string Items(const std::shared_ptr<Reader>& reader, const SliceOptions& options, uint64_t epoch) {
  auto sampler = SliceSampler::Create(reader, options).value();
  std::string out;
  for (uint64_t i = 0; i < sampler->size(); ++i) {
    const SliceItem it = sampler->Item(epoch, i).value();
    const SliceTransform& t = it.transform;
    if (!out.empty()) out += "; ";
    out += std::string(reader->id(it.ref.sample)) + " " + std::to_string(it.ref.slice) + ": ";
    out += std::to_string(t.y) + "," + std::to_string(t.x) + " ";
    out += std::to_string(t.flip_v) + std::to_string(t.flip_h) + std::to_string(t.rot90);
  }
  return out;
}

// Served slices changed? That invalidates users' saved states: update only
// deliberately, and note it in CHANGELOG.md (see the top of this file).
TEST(GoldenSlices, ItemsWithCropFlipsAndTurns) {
  TempDir dir;
  auto reader = VolumeStore(dir);
  SliceOptions s;
  s.fields = {"MR", "CT"};
  s.seed = 13;
  s.crop = {8, 8};
  s.flip = SliceFlip::kIndependent;
  s.rot90 = true;
  auto sampler = SliceSampler::Create(reader, s).value();
  EXPECT_EQ(sampler->skipped(), std::vector<uint64_t>{2});  // "small" gives no 8x8 crop
  ASSERT_EQ(sampler->size(), 12u);
  EXPECT_EQ(Items(reader, s, 0), "p0 0: 0,4 110; p0 1: 1,0 110; p0 2: 0,0 100; p0 3: 2,2 113; p0 4: 1,0 001; "
                                 "p1 0: 2,2 011; p1 1: 1,2 010; p1 2: 0,2 000; p3 0: 2,1 112; p3 1: 2,1 012; "
                                 "p3 2: 2,4 100; p3 3: 2,1 112");
  EXPECT_EQ(Items(reader, s, 1), "p0 0: 1,3 112; p0 1: 2,4 112; p0 2: 1,0 103; p0 3: 2,3 002; p0 4: 0,3 102; "
                                 "p1 0: 2,4 002; p1 1: 0,0 013; p1 2: 1,0 110; p3 0: 1,4 102; p3 1: 2,4 010; "
                                 "p3 2: 2,0 003; p3 3: 1,4 112");
  s.flip = SliceFlip::kBoth;
  s.rot90 = false;
  s.crop = {6, 9};
  EXPECT_EQ(Items(reader, s, 0), "p0 0: 1,3 110; p0 1: 3,0 110; p0 2: 0,0 110; p0 3: 3,1 110; p0 4: 3,0 000; "
                                 "p1 0: 4,1 000; p1 1: 3,1 000; p1 2: 0,2 000; p3 0: 3,1 110; p3 1: 4,0 000; "
                                 "p3 2: 4,3 110; p3 3: 3,1 110");
}

// Served slice stacks changed? That invalidates users' saved states: update
// only deliberately, and note it in CHANGELOG.md (see the top of this file).
TEST(GoldenSlices, StacksWithContextCropAndFlips) {
  TempDir dir;
  auto reader = VolumeStore(dir);
  SliceOptions s;
  s.fields = {"MR", "CT"};
  s.samples = {0, 1, 3};
  s.context.all = 2;
  s.seed = 21;
  s.crop = {4, 4};
  s.flip = SliceFlip::kIndependent;
  s.rot90 = true;
  const int ct = reader->FieldIndex("CT").value();
  // Per item, the corner pixel (0, 0) of each slice of its stack of context
  // 2: SyntheticValue names the volume, the slice (ends replicated) and the
  // source pixel.
  auto sampler = SliceSampler::Create(reader, s).value();
  ASSERT_EQ(sampler->context(1), 2);
  std::string corners;
  for (uint64_t i = 0; i < sampler->size(); ++i) {
    const SliceItem it = sampler->Item(0, i).value();
    std::vector<float> dst(5 * it.out_h * it.out_w);
    ASSERT_TRUE(CopySliceStack(*reader, it.ref.sample, ct, it.ref.slice, 2, it.transform, dst.data()).ok());
    for (int k = 0; k < 5; ++k)
      corners += std::to_string(static_cast<int64_t>(dst[k * it.out_h * it.out_w])) + (k < 4 ? " " : "; ");
  }
  EXPECT_EQ(corners, "200704 200704 200704 210704 220704; 200708 200708 210708 220708 230708; "
                     "200407 210407 220407 230407 240407; 210205 220205 230205 240205 240205; "
                     "220606 230606 240606 240606 240606; 1200103 1200103 1200103 1210103 1220103; "
                     "1200911 1200911 1210911 1220911 1220911; 1200405 1210405 1220405 1220405 1220405; "
                     "3200104 3200104 3200104 3210104 3220104; 3200601 3200601 3210601 3220601 3230601; "
                     "3200410 3210410 3220410 3230410 3230410; 3210205 3220205 3230205 3230205 3230205; ");
}

// Volumes p0 (5 slices), p1 (3), p3 (4) of 10 x 12 with MR, CT
// (SyntheticValue) and a MASK from a formula: slices with k % 3 == 2 empty,
// the others a band whose width grows with the slice.
std::shared_ptr<Reader> MaskedVolumeStore(const TempDir& dir) {
  StoreSpec spec;
  spec.kind = "volumes";
  spec.fields = {StoreField{"MR"}, StoreField{"CT"}, StoreField{"MASK", 1, /*mask=*/true}};
  spec.ids = {"p0", "p1", "p3"};
  spec.shape = [](uint64_t s, int) -> std::array<int64_t, 3> {
    const int64_t depth[3] = {5, 3, 4};
    return {depth[s], 10, 12};
  };
  spec.value = [](uint64_t s, int f, int64_t k, int64_t y, int64_t x) -> double {
    if (f != 2) return testing::SyntheticValue(s, f, k, y, x);
    if (k % 3 == 2) return 0;
    return (y * 3 + x * 5 + static_cast<int64_t>(s) * 7) % 13 < k + 2 + static_cast<int64_t>(s) ? 1 : 0;
  };
  EXPECT_TRUE(testing::WriteStore(dir / "m.ps", spec).ok());
  return Reader::Open(dir / "m.ps").value();
}

// "id slice: y,x fv fh r", then " -" for a draw from the windows that do not qualify.
std::string MaskItems(const std::shared_ptr<Reader>& reader, const SliceOptions& options, uint64_t epoch) {
  auto sampler = SliceSampler::Create(reader, options).value();
  std::string out;
  for (uint64_t i = 0; i < sampler->size(); ++i) {
    const SliceItem it = sampler->Item(epoch, i).value();
    const SliceTransform& t = it.transform;
    if (!out.empty()) out += "; ";
    out += std::string(reader->id(it.ref.sample)) + " " + std::to_string(it.ref.slice) + ": ";
    out += std::to_string(t.y) + "," + std::to_string(t.x) + " ";
    out += std::to_string(t.flip_v) + std::to_string(t.flip_h) + std::to_string(t.rot90);
    if (!it.positive) out += " -";
  }
  return out;
}

// Served mask-aware slices changed? That invalidates users' saved states:
// update only deliberately, and note it in CHANGELOG.md (see the top of
// this file).
TEST(GoldenSlices, MaskAwareItems) {
  TempDir dir;
  auto reader = MaskedVolumeStore(dir);
  SliceOptions s;
  s.fields = {"MR", "CT"};
  s.seed = 17;
  s.crop = {6, 6};
  s.flip = SliceFlip::kIndependent;
  s.require = "MASK";
  s.min_valid = 12;
  // min_valid: the qualifying slices only (k % 3 == 2 is empty), each crop holding >= 12 mask voxels.
  EXPECT_EQ(MaskItems(reader, s, 0),
            "p0 3: 3,3 100; p0 4: 2,6 010; p1 1: 2,0 100; p3 0: 0,5 110; p3 1: 4,0 010; p3 3: 4,5 010");
  EXPECT_EQ(MaskItems(reader, s, 1),
            "p0 3: 2,5 110; p0 4: 4,5 010; p1 1: 1,1 000; p3 0: 4,0 010; p3 1: 0,5 100; p3 3: 0,1 100");
  // positive_fraction: every slice; the draws of the kind its slice lacks take another of the volume.
  s.positive_fraction = 0.5;
  EXPECT_EQ(MaskItems(reader, s, 0), "p0 0: 3,3 100 -; p0 1: 2,6 010 -; p0 4: 2,4 100; p0 1: 3,0 110 -; p0 4: 4,0 010; "
                                     "p1 0: 4,5 010 -; p1 1: 1,6 110; p1 1: 1,1 000; p3 0: 1,2 100; p3 0: 1,0 010 -; "
                                     "p3 2: 0,0 010 -; p3 3: 3,5 000");
  // Whole slices: the slice is the window.
  s.crop = {0, 0};
  s.min_valid = 40;
  s.positive_fraction = -1;
  EXPECT_EQ(MaskItems(reader, s, 0), "p0 3: 0,0 100; p0 4: 0,0 010; p3 1: 0,0 100; p3 3: 0,0 110");
}

}  // namespace
}  // namespace patchstore
