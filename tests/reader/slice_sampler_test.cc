// The slice sampler (reader/slice_sampler.h): its options table and checks,
// per-field context, and mask-aware slices and crops against a brute-force
// oracle written here (every window of every slice counted pixel by pixel).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "patchstore/reader/slice_sampler.h"
#include "patchstore/reader/volume.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::StoreField;
using testing::StoreSpec;
using testing::TempDir;

// A 0/1 mask voxel of volume s, slice k, row y, column x: a blob whose size
// changes with the slice, empty on every fourth slice, full on slice 1 of
// volume 2, empty everywhere in volume 3.
double MaskValue(uint64_t s, int64_t k, int64_t y, int64_t x) {
  if (s == 3 || k % 4 == 3) return 0;
  if (s == 2 && k == 1) return 1;
  const int64_t cy = 3 + (k * 5 + static_cast<int64_t>(s) * 3) % 9, cx = 2 + (k * 7 + static_cast<int64_t>(s)) % 11;
  const int64_t r = 1 + (k + static_cast<int64_t>(s)) % 4;
  return (y - cy) * (y - cy) + (x - cx) * (x - cx) <= r * r ? 1 : 0;
}

struct VolumeShape {
  int64_t S, H, W;
};
const VolumeShape kShapes[] = {{6, 14, 16}, {5, 14, 16}, {4, 14, 16}, {3, 14, 16}};

// Volumes "v0".."v3" with fields MR, CT (SyntheticValue) and MASK
// (MaskValue, or `mask` when given).
std::shared_ptr<Reader> MaskStore(const TempDir& dir,
                                  std::function<double(uint64_t, int64_t, int64_t, int64_t)> mask = MaskValue) {
  StoreSpec spec;
  spec.kind = "volumes";
  spec.fields = {StoreField{"MR"}, StoreField{"CT"}, StoreField{"MASK", 1, /*mask=*/true}};
  spec.ids = {"v0", "v1", "v2", "v3"};
  spec.shape = [](uint64_t s, int) { return std::array<int64_t, 3>{kShapes[s].S, kShapes[s].H, kShapes[s].W}; };
  spec.value = [mask](uint64_t s, int f, int64_t k, int64_t y, int64_t x) -> double {
    return f == 2 ? mask(s, k, y, x) : testing::SyntheticValue(s, f, k, y, x);
  };
  EXPECT_TRUE(testing::WriteStore(dir / "m.ps", spec).ok());
  return Reader::Open(dir / "m.ps").value();
}

// The oracle: the valid voxels of the h x w window at (y, x) of slice k.
uint64_t Count(uint64_t s, int64_t k, int64_t y, int64_t x, int64_t h, int64_t w) {
  uint64_t c = 0;
  for (int64_t i = 0; i < h; ++i)
    for (int64_t j = 0; j < w; ++j) c += MaskValue(s, k, y + i, x + j) != 0;
  return c;
}

// Every window of slice k: (qualifying, other) window positions.
std::pair<std::set<std::pair<int64_t, int64_t>>, std::set<std::pair<int64_t, int64_t>>> Windows(uint64_t s, int64_t k,
                                                                                                int64_t h, int64_t w,
                                                                                                uint64_t T) {
  std::set<std::pair<int64_t, int64_t>> pos, neg;
  for (int64_t y = 0; y + h <= kShapes[s].H; ++y)
    for (int64_t x = 0; x + w <= kShapes[s].W; ++x) (Count(s, k, y, x, h, w) >= T ? pos : neg).insert({y, x});
  return {pos, neg};
}

SliceOptions Options() {
  SliceOptions o;
  o.fields = {"MR", "CT"};
  o.seed = 5;
  return o;
}

TEST(SliceOptions, ValidateNamesTheUsersSpelling) {
  auto message = [](SliceOptions o) { return o.Validate().message(); };
  SliceOptions o = Options();
  EXPECT_TRUE(o.Validate().ok());
  o.context.all = -1;
  EXPECT_EQ(message(o), "context (--context) must be in [0, 65536] slices, got -1");
  o = Options();
  o.context.fields = {{"PET", 1}};
  EXPECT_EQ(message(o), "context (--context) names field 'PET', which is not among the fields served (MR, CT)");
  o.context.fields = {{"MR", 1}, {"MR", 2}};
  EXPECT_EQ(message(o), "context (--context) names field 'MR' twice");
  o = Options();
  o.crop = {0, 5};
  EXPECT_EQ(message(o), "crop (--crop) must be S or (h, w) with sides in [1, 2**31), got (0, 5)");
  o.crop = {8, 6};
  o.rot90 = true;
  EXPECT_EQ(message(o), "rot90 (--rot90) needs a square crop (odd turns swap height and width), got 8x6");
  o = Options();
  o.min_valid = 0;
  EXPECT_EQ(message(o),
            "min_valid (--min-valid) must be positive (voxels >= 1, or a fraction of the window < 1), got 0");
  o.min_valid = 65;
  o.crop = {8, 8};
  EXPECT_EQ(message(o), "min_valid (--min-valid) 65 asks for more valid voxels than a 8x8 crop holds (64)");
  o = Options();
  o.positive_fraction = 1.5;
  o.require = "MASK";
  EXPECT_EQ(message(o), "positive_fraction (--positive-fraction) must be in [0, 1] (None, CLI -1: off), got 1.5");
  o.require = "";
  o.positive_fraction = 0.5;
  EXPECT_EQ(message(o), "positive_fraction needs require=<mask field>");
  o = Options();
  o.clamp = {{"CT", 1, 0}};
  EXPECT_EQ(message(o), "clamp for 'CT' needs lo <= hi, got (1, 0)");
  o.clamp = {{"MASK", 0, 1}};
  EXPECT_EQ(message(o), "clamp names field 'MASK', which is not among the fields served (MR, CT)");
  o = Options();
  o.clamp_warn = 2;
  EXPECT_EQ(message(o), "clamp_warn must be a fraction in [0, 1] (None, C++ -1: never), got 2");
  o = Options();
  o.num_threads = 0;
  EXPECT_EQ(message(o), "num_threads must be in [1, 4096] (Python 0: all cores), got 0");
  o = Options();
  o.fields = {"MR", "MR"};
  EXPECT_EQ(message(o), "fields name 'MR' twice");
  // Every row of the table has a spelling (and one without a CLI flag is its Python keyword).
  EXPECT_EQ(SliceOptionSpelling("positive_fraction"), "positive_fraction (--positive-fraction)");
  EXPECT_EQ(SliceOptionSpelling("clamp"), "clamp");
}

TEST(SliceOptions, ContextAndFlipSpellings) {
  SliceContext c = ParseSliceContext("2").value();
  EXPECT_EQ(c.all, 2);
  EXPECT_TRUE(c.fields.empty());
  c = ParseSliceContext("MR=1,CT=0").value();
  EXPECT_EQ(c.Of("MR"), 1);
  EXPECT_EQ(c.Of("CT"), 0);
  EXPECT_EQ(c.Of("MASK"), 0);  // a field not named gets 0
  c = ParseSliceContext("1,CT=0").value();
  EXPECT_EQ(c.Of("MR"), 1);
  EXPECT_EQ(c.Of("CT"), 0);
  for (const char* bad : {"", "x", "MR=", "=1", "1,2", "MR=-1", "1.5"})
    EXPECT_FALSE(ParseSliceContext(bad).ok()) << bad;
  EXPECT_EQ(ParseSliceContext("MR=x").status().message(),
            "context (--context) must be C or FIELD=C,FIELD=C (C >= 0), got 'MR=x': 'x' is not a count of slices");
  EXPECT_EQ(ParseSliceFlip("both").value(), SliceFlip::kBoth);
  EXPECT_EQ(ParseSliceFlip("independent").value(), SliceFlip::kIndependent);
  EXPECT_EQ(ParseSliceFlip("").value(), SliceFlip::kNone);
  EXPECT_FALSE(ParseSliceFlip("sideways").ok());
}

TEST(SliceSampler, WithoutRequireItemIIsSliceIWithDrawSliceTransform) {
  TempDir dir;
  auto reader = MaskStore(dir);
  SliceOptions o = Options();
  o.crop = {7, 9};
  o.flip = SliceFlip::kIndependent;
  o.context.fields = {{"MR", 2}};
  auto s = SliceSampler::Create(reader, o).value();
  ASSERT_EQ(s->size(), 18u);
  EXPECT_EQ(s->context(0), 2);  // MR
  EXPECT_EQ(s->context(1), 0);  // CT: not named
  SliceIndex all = SliceIndex::Build(*reader).value();
  for (uint64_t epoch : {0, 3})
    for (uint64_t i = 0; i < s->size(); ++i) {
      const SliceItem it = s->Item(epoch, i).value();
      EXPECT_EQ(it.ref.sample, all[i].sample);
      EXPECT_EQ(it.ref.slice, all[i].slice);
      const SliceTransform t = DrawSliceTransform(5, epoch, i, 14, 16, 7, 9, SliceFlip::kIndependent, false);
      EXPECT_EQ(std::tie(it.transform.y, it.transform.x, it.transform.flip_v, it.transform.flip_h),
                std::tie(t.y, t.x, t.flip_v, t.flip_h));
      EXPECT_EQ(it.out_h, 7);
      EXPECT_TRUE(it.positive);
    }
  EXPECT_EQ(s->Item(0, 18).status().code(), Code::kOutOfRange);
}

// require + min_valid: the items are exactly the slices whose window can
// hold min_valid valid voxels, in order; every crop served holds them.
TEST(SliceSampler, MinValidItemsAreTheQualifyingSlicesAndEveryCropQualifies) {
  TempDir dir;
  auto reader = MaskStore(dir);
  struct Case {
    int64_t h, w;
    double min_valid;
  };
  for (const Case& c : {Case{0, 0, 1}, Case{0, 0, 12}, Case{0, 0, 0.05}, Case{5, 6, 1}, Case{5, 6, 4}, Case{4, 4, 0.5},
                        Case{14, 16, 3}}) {
    SCOPED_TRACE(std::to_string(c.h) + "x" + std::to_string(c.w) + " min_valid " + std::to_string(c.min_valid));
    SliceOptions o = Options();
    o.require = "MASK";
    o.crop = {c.h, c.w};
    o.min_valid = c.min_valid;
    auto s = SliceSampler::Create(reader, o).value();
    // The oracle's items: every (volume, slice) with a qualifying window, volume and slice order.
    std::vector<std::pair<uint64_t, int64_t>> want;
    std::set<uint64_t> volumes;
    for (uint64_t v = 0; v < 4; ++v)
      for (int64_t k = 0; k < kShapes[v].S; ++k) {
        const int64_t h = c.h ? c.h : kShapes[v].H, w = c.w ? c.w : kShapes[v].W;
        const uint64_t T = std::max<uint64_t>(1,
                                              static_cast<uint64_t>(
                                                  c.min_valid < 1 ? std::ceil(c.min_valid * static_cast<double>(h * w))
                                                                  : std::ceil(c.min_valid)));
        if (!Windows(v, k, h, w, T).first.empty()) {
          want.emplace_back(v, k);
          volumes.insert(v);
        }
      }
    ASSERT_EQ(s->size(), want.size());
    // Volume 3 has an empty mask: skipped and reported; the others serve their qualifying slices.
    EXPECT_EQ(s->skipped(), std::vector<uint64_t>{3});
    EXPECT_NE(s->SkippedReport().find("'v3' (no "), std::string::npos) << s->SkippedReport();
    EXPECT_EQ(s->index().volume_count(), volumes.size());
    for (uint64_t epoch : {0, 1, 7}) {
      std::vector<uint64_t> idx(s->size());
      for (uint64_t i = 0; i < idx.size(); ++i) idx[i] = i;
      std::vector<SliceItem> items(idx.size());
      ASSERT_TRUE(s->Items(epoch, idx.data(), idx.size(), items.data()).ok());
      for (uint64_t i = 0; i < s->size(); ++i) {
        const SliceItem& it = items[i];
        ASSERT_EQ(std::make_pair(it.ref.sample, it.ref.slice), want[i]) << "item " << i;
        const int64_t h = c.h ? c.h : kShapes[it.ref.sample].H, w = c.w ? c.w : kShapes[it.ref.sample].W;
        const uint64_t T = std::max<uint64_t>(1,
                                              static_cast<uint64_t>(
                                                  c.min_valid < 1 ? std::ceil(c.min_valid * static_cast<double>(h * w))
                                                                  : std::ceil(c.min_valid)));
        EXPECT_TRUE(it.positive);
        EXPECT_GE(Count(it.ref.sample, it.ref.slice, it.transform.y, it.transform.x, h, w), T) << "item " << i;
      }
    }
  }
}

// The crop of a qualifying slice is uniform over its qualifying windows,
// also where few qualify (rejected candidates, then the exact lists).
TEST(SliceSampler, MaskAwareCropsAreUniformOverTheQualifyingWindows) {
  TempDir dir;
  auto reader = MaskStore(dir);
  SliceOptions o = Options();
  o.require = "MASK";
  o.crop = {5, 5};
  o.min_valid = 9;  // only windows over most of a blob
  o.samples = {0};
  auto s = SliceSampler::Create(reader, o).value();
  for (uint64_t i = 0; i < s->size(); ++i) {
    const SliceItem first = s->Item(0, i).value();
    const auto [pos, neg] = Windows(0, first.ref.slice, 5, 5, 9);
    ASSERT_FALSE(pos.empty());
    std::map<std::pair<int64_t, int64_t>, int> seen;
    const int draws = 400 * static_cast<int>(pos.size());
    for (int e = 0; e < draws; ++e) {
      const SliceItem it = s->Item(static_cast<uint64_t>(e), i).value();
      ASSERT_EQ(it.ref.slice, first.ref.slice);
      ASSERT_TRUE(pos.count({it.transform.y, it.transform.x})) << it.transform.y << "," << it.transform.x;
      ++seen[{it.transform.y, it.transform.x}];
    }
    ASSERT_EQ(seen.size(), pos.size()) << "slice " << first.ref.slice;  // every qualifying window is drawn
    for (const auto& [w, n] : seen) {
      EXPECT_GT(n, 400 * 0.75) << "slice " << first.ref.slice;
      EXPECT_LT(n, 400 * 1.25) << "slice " << first.ref.slice;
    }
  }
}

// positive_fraction: every slice is an item; a positive item serves a
// qualifying slice and crop, a negative one the others, with probability p,
// replacing the item's slice by one of that kind of its volume when needed.
TEST(SliceSampler, PositiveFractionServesEachKindWithItsProbability) {
  TempDir dir;
  auto reader = MaskStore(dir);
  const uint64_t T = 4;
  for (double p : {0.0, 0.3, 1.0}) {
    SCOPED_TRACE("positive_fraction " + std::to_string(p));
    SliceOptions o = Options();
    o.require = "MASK";
    o.crop = {5, 6};
    o.min_valid = static_cast<double>(T);
    o.positive_fraction = p;
    auto s = SliceSampler::Create(reader, o).value();
    ASSERT_EQ(s->size(), 18u);  // every slice of every volume
    EXPECT_TRUE(s->skipped().empty());
    SliceIndex all = SliceIndex::Build(*reader).value();
    uint64_t positive = 0, total = 0;
    std::map<std::pair<uint64_t, int64_t>, int> served;
    for (uint64_t epoch = 0; epoch < 200; ++epoch)
      for (uint64_t i = 0; i < s->size(); ++i) {
        const SliceItem it = s->Item(epoch, i).value();
        ASSERT_EQ(it.ref.sample, all[i].sample);  // the same volume as item i's slice
        const uint64_t c = Count(it.ref.sample, it.ref.slice, it.transform.y, it.transform.x, 5, 6);
        ASSERT_EQ(c >= T, it.positive) << "item " << i << " epoch " << epoch;
        // Volume 3 has no qualifying window: its items are negative whatever is drawn.
        const auto own = Windows(all[i].sample, all[i].slice, 5, 6, T);
        if (all[i].sample == 3) {
          ASSERT_FALSE(it.positive);
        }
        if (p == 1.0 && all[i].sample != 3) {
          ASSERT_TRUE(it.positive);
        }
        // Item i's own slice is served when it has a window of the kind served.
        if (!(it.positive ? own.first : own.second).empty()) {
          ASSERT_EQ(it.ref.slice, all[i].slice);
        }
        positive += it.positive;
        ++total;
        ++served[{it.ref.sample, it.ref.slice}];
      }
    // Volume 3 (3 slices of 18) can only serve negatives: positives are p of the others.
    const double frac = static_cast<double>(positive) / static_cast<double>(total - 3 * 200);
    EXPECT_NEAR(frac, p, 0.03);
    if (p == 1.0) {
      // Every positive slice of a volume is served equally often (replacements are uniform).
      for (uint64_t v = 0; v < 3; ++v) {
        std::vector<int> counts;
        for (int64_t k = 0; k < kShapes[v].S; ++k)
          if (!Windows(v, k, 5, 6, T).first.empty()) counts.push_back(served[{v, k}]);
        const double mean = 200.0 * static_cast<double>(kShapes[v].S) / static_cast<double>(counts.size());
        for (int n : counts) EXPECT_NEAR(n, mean, 0.2 * mean) << "volume " << v;
      }
    }
  }
}

TEST(SliceSampler, AMaskValidEverywhereServesTheItemsOfNoMask) {
  TempDir dir;
  auto reader = MaskStore(dir, [](uint64_t, int64_t, int64_t, int64_t) { return 1.0; });
  SliceOptions plain = Options();
  plain.crop = {6, 6};
  plain.flip = SliceFlip::kBoth;
  plain.rot90 = true;
  auto a = SliceSampler::Create(reader, plain).value();
  for (double p : {-1.0, 0.25}) {
    SliceOptions o = plain;
    o.require = "MASK";
    o.min_valid = 36;
    o.positive_fraction = p;
    auto b = SliceSampler::Create(reader, o).value();
    ASSERT_EQ(a->size(), b->size());
    for (uint64_t i = 0; i < a->size(); ++i) {
      const SliceItem x = a->Item(2, i).value(), y = b->Item(2, i).value();
      EXPECT_EQ(std::tie(x.ref.sample, x.ref.slice, x.transform.y, x.transform.x, x.transform.rot90),
                std::tie(y.ref.sample, y.ref.slice, y.transform.y, y.transform.x, y.transform.rot90));
    }
  }
}

TEST(SliceSampler, FlagsFromAnotherProcessGiveTheSameItemsOnAnyThreadCount) {
  TempDir dir;
  auto reader = MaskStore(dir);
  SliceOptions o = Options();
  o.require = "MASK";
  o.crop = {4, 5};
  o.min_valid = 3;
  o.positive_fraction = 0.6;
  auto a = SliceSampler::Create(reader, o).value();
  const std::vector<uint8_t> flags = a->slice_flags();
  ASSERT_EQ(flags.size(), 18u);
  o.num_threads = 3;
  auto b = SliceSampler::Create(reader, o, &flags).value();
  std::vector<uint64_t> idx(a->size());
  for (uint64_t i = 0; i < idx.size(); ++i) idx[i] = (i * 7) % idx.size();
  std::vector<SliceItem> x(idx.size()), y(idx.size());
  ASSERT_TRUE(a->Items(4, idx.data(), idx.size(), x.data()).ok());
  ASSERT_TRUE(b->Items(4, idx.data(), idx.size(), y.data()).ok());
  for (size_t k = 0; k < idx.size(); ++k)
    EXPECT_EQ(std::tie(x[k].ref.slice, x[k].transform.y, x[k].transform.x, x[k].positive),
              std::tie(y[k].ref.slice, y[k].transform.y, y[k].transform.x, y[k].positive));
  const std::vector<uint8_t> short_flags(5, SliceSampler::kPositive);
  EXPECT_EQ(SliceSampler::Create(reader, o, &short_flags).status().code(), Code::kInvalidArgument);
  idx.push_back(18);
  EXPECT_EQ(a->Items(0, idx.data(), idx.size(), x.data()).code(), Code::kOutOfRange);
}

TEST(SliceSampler, ErrorsNameTheProblem) {
  TempDir dir;
  auto reader = MaskStore(dir);
  SliceOptions o = Options();
  o.require = "SEG";
  EXPECT_EQ(SliceSampler::Create(reader, o).status().code(), Code::kNotFound);
  o.require = "MASK";
  o.samples = {3};  // an empty mask: no slice qualifies
  auto st = SliceSampler::Create(reader, o).status();
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("no slice qualifies (require='MASK', min_valid=1): 'v3' (no slice with >= 1 valid "
                              "voxels of 'MASK')"),
            std::string::npos)
      << st.message();
  o.samples = {0, 0};
  EXPECT_EQ(SliceSampler::Create(reader, o).status().code(), Code::kInvalidArgument);
  o = Options();
  o.crop = {20, 20};
  st = SliceSampler::Create(reader, o).status();
  EXPECT_NE(st.message().find("crop 20x20 is larger than the slices of every volume ('v0' (14x16 slices)"),
            std::string::npos)
      << st.message();
  o = Options();
  o.rot90 = true;
  st = SliceSampler::Create(reader, o).status();
  EXPECT_NE(st.message().find("rot90 (--rot90) needs square slices or a square crop"), std::string::npos)
      << st.message();
  o = Options();
  o.ids = {"nope"};
  EXPECT_EQ(SliceSampler::Create(reader, o).status().code(), Code::kNotFound);
  // An image store is not a volume store.
  StoreSpec spec;
  spec.fields = {StoreField{"MR"}};
  spec.ids = {"a"};
  spec.height = spec.width = 8;
  ASSERT_TRUE(testing::WriteStore(dir / "f.ps", spec).ok());
  o = Options();
  o.fields = {"MR"};
  st = SliceSampler::Create(Reader::Open(dir / "f.ps").value(), o).status();
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("this one holds frames"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace patchstore
