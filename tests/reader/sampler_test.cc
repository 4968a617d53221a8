#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "patchstore/reader/sampler.h"
#include "patchstore/store/store.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::TempDir;

// A store of `masks.size()` samples, H x W: field "img" (2 channels, value =
// 100000*s + 10000*c + y*W + x: small exact ints) and field "mask" (1 channel).
// With `with_sat` the summed-area tables are stored as at ingest.
std::string MakeStore(const TempDir& dir, const std::vector<std::vector<float>>& masks, int64_t H, int64_t W,
                      bool with_sat) {
  const std::string path = dir / (with_sat ? "sat.ps" : "nosat.ps");
  testing::StoreSpec spec;
  spec.fields = {testing::StoreField{"img", 2}, testing::StoreField{"mask", 1, /*mask=*/true}};
  spec.fields[1].sat = with_sat;
  spec.ids = testing::NumberedIds(masks.size(), "s");
  spec.height = H;
  spec.width = W;
  spec.value = [&](uint64_t s, int f, int64_t c, int64_t y, int64_t x) -> double {
    return f == 0 ? static_cast<float>(s * 100000 + c * 10000 + y * W + x) : masks[s][y * W + x];
  };
  spec.batch = masks.size();
  EXPECT_TRUE(testing::WriteStore(path, spec).ok());
  return path;
}

uint64_t BruteCountHW(const std::vector<float>& m, int64_t W, int64_t y, int64_t x, int64_t h, int64_t w);

std::vector<float> BlobMask(int64_t H, int64_t W, std::vector<std::pair<int64_t, int64_t>> pixels) {
  std::vector<float> m(H * W, 0.0f);
  for (auto [y, x] : pixels) m[y * W + x] = 1.0f;
  return m;
}

uint64_t BruteCount(const std::vector<float>& m, int64_t W, int64_t y, int64_t x, int64_t P) {
  uint64_t n = 0;
  for (int64_t i = 0; i < P; ++i)
    for (int64_t j = 0; j < P; ++j) n += m[(y + i) * W + x + j] != 0;
  return n;
}

TEST(Sat, StoredAndComputedTablesAgreeWithBruteForce) {
  TempDir dir;
  const int64_t H = 13, W = 17;
  std::mt19937 rng(1);
  std::vector<float> m(H * W);
  for (auto& v : m) v = (rng() % 5 == 0) ? 1.0f : 0.0f;
  auto stored = Reader::Open(MakeStore(dir, {m}, H, W, true)).value();
  auto computed = Reader::Open(MakeStore(dir, {m}, H, W, false)).value();
  auto a = stored->Sat(0, 1).value(), b = computed->Sat(0, 1).value();
  for (int64_t P : {1, 3, 5})
    for (int64_t y = 0; y + P <= H; ++y)
      for (int64_t x = 0; x + P <= W; ++x) {
        ASSERT_EQ(a.Count(0, y, x, P, P), BruteCount(m, W, y, x, P));
        ASSERT_EQ(b.Count(0, y, x, P, P), BruteCount(m, W, y, x, P));
      }
  EXPECT_EQ(stored->Sat(0, 0).status().code(), Code::kInvalidArgument);  // 2-channel field
}

class SamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(5);
    for (int s = 0; s < 7; ++s) {
      std::vector<float> m(H * W, 0.0f);
      if (s == 3) {
        masks_.push_back(m);  // empty: must be skipped
        continue;
      }
      for (int k = 0; k < 3 + s; ++k) m[(rng() % H) * W + rng() % W] = 1.0f;
      masks_.push_back(m);
    }
    reader_ = Reader::Open(MakeStore(dir_, masks_, H, W, true)).value();
  }
  std::unique_ptr<PatchSampler> Make(SamplerOptions o) {
    if (o.fields.empty()) o.fields = {"img", "mask"};
    auto s = PatchSampler::Create(reader_, o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  const int64_t H = 20, W = 24;
  TempDir dir_;
  std::vector<std::vector<float>> masks_;
  std::shared_ptr<Reader> reader_;
};

TEST_F(SamplerTest, EveryWindowHoldsTheRequiredValidPixels) {
  for (double min_valid : {1.0, 2.0, 0.02}) {
    SamplerOptions o;
    o.patch_size = 7;
    o.patches_per_sample = 3;
    o.require = "mask";
    o.min_valid = min_valid;
    auto s = Make(o);
    const uint64_t need = min_valid < 1 ? static_cast<uint64_t>(std::ceil(min_valid * 49))
                                        : static_cast<uint64_t>(min_valid);
    for (uint64_t e = 0; e < 5; ++e)
      for (uint64_t p = 0; p < s->visits_per_epoch(); ++p)
        for (int j = 0; j < 3; ++j) {
          Window w = s->WindowAt(e, p, j).value();
          ASSERT_GE(BruteCount(masks_[w.sample], W, w.y, w.x, 7), need) << "sample " << w.sample;
          ASSERT_NE(w.sample, 3u);
        }
    EXPECT_GE(s->skipped_samples(), 1u);
    EXPECT_EQ(s->skipped_ids()[0], "s3");
  }
}

TEST_F(SamplerTest, DrawsAreUniformOverQualifyingWindows) {
  // One sample, two valid pixels far apart: the qualifying windows are those
  // covering either pixel. Chi-square over 20000 draws, fixed seed, fixed bound.
  TempDir dir;
  const int64_t h = 12, w = 16, P = 4;
  auto m = BlobMask(h, w, {{2, 3}, {9, 12}});
  auto reader = Reader::Open(MakeStore(dir, {m}, h, w, false)).value();
  SamplerOptions o;
  o.fields = {"img"};
  o.patch_size = P;
  o.patches_per_sample = 20000;
  o.require = "mask";
  o.seed = 11;
  // Both ways of checking candidates (window lists; the candidates' own mask
  // pixels, with the lists only after kWindowTries misses: 24 of 117 windows
  // qualify, so about 3% of the draws end there).
  for (MaskIndex mi : {MaskIndex::kBuild, MaskIndex::kWindows}) {
    o.mask_index = mi;
    auto s = PatchSampler::Create(reader, o).value();
    std::map<std::pair<int64_t, int64_t>, int> hist;
    int cells = 0;
    for (int64_t y = 0; y + P <= h; ++y)
      for (int64_t x = 0; x + P <= w; ++x)
        if (BruteCount(m, w, y, x, P) > 0) hist[{y, x}] = 0, ++cells;
    ASSERT_EQ(cells, 24);  // 3 x 4 windows cover each pixel (clipped by the border), disjoint
    for (int j = 0; j < 20000; ++j) {
      Window win = s->WindowAt(0, 0, j).value();
      ASSERT_TRUE(hist.count({win.y, win.x}));
      ++hist[{win.y, win.x}];
    }
    const double expect = 20000.0 / cells;
    double chi2 = 0;
    for (auto& [k, n] : hist) chi2 += (n - expect) * (n - expect) / expect;
    // 23 degrees of freedom: the 0.999 quantile is 49.7.
    EXPECT_LT(chi2, 49.7) << "chi2 " << chi2 << " mask_index " << static_cast<int>(mi);
  }
}

// A store of `masks` (H x W each) with a 2-channel float32 "img": rows of
// float32, or every field in tiles of `tile` with the mask as uint8 source
// values (binary normalisation), as `--layout tiles --encoding compact`.
std::string MakeMaskStore(const TempDir& dir, const std::string& name, const std::vector<std::vector<float>>& masks,
                          int64_t H, int64_t W, uint16_t tile, uint16_t mask_blocks = 0) {
  const std::string path = dir / name;
  testing::StoreSpec spec;
  spec.fields = {testing::StoreField{"img", 2}, testing::StoreField{"mask", 1, /*mask=*/true}};
  for (testing::StoreField& f : spec.fields) {
    f.tile = tile;
    f.source_type = SourceType::kUnknown;
  }
  spec.fields[1].mask_blocks = mask_blocks;  // 0: the writer's default
  if (tile) {
    spec.fields[1].dtype = DType::kUInt8;
    spec.fields[1].norm.kind = NormKind::kBinary;
    spec.fields[1].norm.scale = 255;
  }
  spec.ids = testing::NumberedIds(masks.size(), "s");
  spec.height = H;
  spec.width = W;
  spec.value = [&](uint64_t s, int f, int64_t c, int64_t y, int64_t x) -> double {
    if (f == 0) return static_cast<float>(s * 100000 + (c * H + y) * W + x);
    const float m = masks[s][y * W + x];
    return tile ? (m != 0 ? 255 : 0) : m;
  };
  spec.batch = 1;
  EXPECT_TRUE(testing::WriteStore(path, spec).ok());
  return path;
}

TEST(SamplerMaskIndex, CandidateChecksDrawTheWindowsOfTheWindowLists) {
  // Whether a draw checks candidates in the window lists (kBuild; kAuto on a
  // store in memory) or by counting the candidate's own mask pixels
  // (kWindows: what a store larger than RAM does), the windows are the same,
  // for every policy, window shape and layout.
  const int64_t H = 30, W = 40;
  std::mt19937 rng(17);
  std::vector<std::vector<float>> masks;
  for (int s = 0; s < 6; ++s) {
    std::vector<float> m(H * W, 0.0f);
    const int pixels = s == 0 ? 1 : 6 * s * s;  // sample 0: 1 pixel, most draws end in the lists
    for (int k = 0; k < pixels; ++k) m[(rng() % H) * W + rng() % W] = 1.0f;
    masks.push_back(m);
  }
  TempDir dir;
  for (uint16_t tile : {uint16_t{0}, uint16_t{8}}) {
    auto reader = Reader::Open(MakeMaskStore(dir, "t" + std::to_string(tile) + ".ps", masks, H, W, tile)).value();
    for (int variant = 0; variant < 5; ++variant) {
      SamplerOptions o;
      o.fields = {"img", "mask"};
      o.patch_size = 7;
      o.patches_per_sample = 5;
      o.require = "mask";
      o.seed = 40 + variant;
      o.flip = o.rot90 = variant == 0;
      if (variant == 1) o.min_valid = 3;
      if (variant == 2) o.min_valid = 0.05;
      if (variant == 3) o.positive_fraction = 0.4;
      if (variant == 4) o.patch_h = 5, o.patch_w = 11;
      const int64_t ph = o.height(), pw = o.width();
      const uint64_t need = variant == 1 ? 3 : variant == 2 ? static_cast<uint64_t>(std::ceil(0.05 * 49)) : 1;
      std::vector<std::unique_ptr<PatchSampler>> s;
      for (MaskIndex mi : {MaskIndex::kBuild, MaskIndex::kWindows, MaskIndex::kAuto}) {
        o.mask_index = mi;
        auto made = PatchSampler::Create(reader, o);
        ASSERT_TRUE(made.ok()) << made.status().ToString();
        s.push_back(std::move(made).value());
      }
      ASSERT_GT(s[0]->visits_per_epoch(), 0u);
      for (uint64_t e = 0; e < 3; ++e)
        for (uint64_t p = 0; p < s[0]->visits_per_epoch(); ++p)
          for (int j = 0; j < 5; ++j) {
            const Window a = s[0]->WindowAt(e, p, j).value();
            const bool q = BruteCountHW(masks[a.sample], W, a.y, a.x, ph, pw) >= need;
            ASSERT_EQ(q, a.positive) << "variant " << variant;
            if (variant != 3) {
              ASSERT_TRUE(q) << "variant " << variant;
            }
            for (int k = 1; k < 3; ++k) {
              const Window b = s[k]->WindowAt(e, p, j).value();
              ASSERT_EQ(std::make_tuple(a.sample, a.y, a.x, a.flip, a.rot, a.positive),
                        std::make_tuple(b.sample, b.y, b.x, b.flip, b.rot, b.positive))
                  << "tile " << tile << " variant " << variant << " mask_index " << k << " at " << e << "/" << p << "/"
                  << j;
            }
          }
      // Whole batches (DrawMany: all candidates of a round at once) too.
      const int64_t n = static_cast<int64_t>(s[0]->windows_per_epoch());
      std::vector<float> a0(n * 2 * ph * pw), a1(n * ph * pw), b0(a0.size()), b1(a1.size());
      ASSERT_TRUE(s[0]->Gather(1, 0, n, {a0.data(), a1.data()}).ok());
      ASSERT_TRUE(s[1]->Gather(1, 0, n, {b0.data(), b1.data()}).ok());
      EXPECT_EQ(a0, b0);
      EXPECT_EQ(a1, b1);
    }
  }
}

TEST(SamplerMaskIndex, BlockCountsDecideMostCandidatesAndDrawTheSameWindows) {
  // Candidates decided by the mask's block counts (no mask read), the rest
  // by counting: the same windows as the window lists, for every policy and
  // layout, and the block counts decide most candidates.
  const int64_t H = 64, W = 80;
  std::mt19937 rng(23);
  std::vector<std::vector<float>> masks;
  for (int s = 0; s < 5; ++s) {
    std::vector<float> m(H * W, 0.0f);
    // A rectangle of valid pixels plus a few stray ones.
    const int64_t y0 = rng() % 40, x0 = rng() % 50, h = 4 + rng() % 20, w = 4 + rng() % 25;
    for (int64_t y = y0; y < std::min(H, y0 + h); ++y)
      for (int64_t x = x0; x < std::min(W, x0 + w); ++x) m[y * W + x] = 1.0f;
    for (int k = 0; k < 3 * s; ++k) m[(rng() % H) * W + rng() % W] = 1.0f;
    masks.push_back(m);
  }
  TempDir dir;
  for (uint16_t tile : {uint16_t{0}, uint16_t{16}}) {
    auto reader = Reader::Open(
                      MakeMaskStore(dir, "b" + std::to_string(tile) + ".ps", masks, H, W, tile, /*mask_blocks=*/8))
                      .value();
    ASSERT_EQ(reader->MaskBlockEdge(0, 1), 8u);
    for (int variant = 0; variant < 4; ++variant) {
      SCOPED_TRACE("tile " + std::to_string(tile) + " variant " + std::to_string(variant));
      SamplerOptions o;
      o.fields = {"img", "mask"};
      o.patch_size = 20;
      o.patches_per_sample = 6;
      o.require = "mask";
      o.seed = 70 + variant;
      if (variant == 1) o.min_valid = 40;
      if (variant == 2) o.positive_fraction = 0.3;
      if (variant == 3) o.patch_h = 17, o.patch_w = 29;
      const int64_t ph = o.height(), pw = o.width();
      const uint64_t need = variant == 1 ? 40 : 1;
      o.mask_index = MaskIndex::kBuild;
      auto lists = PatchSampler::Create(reader, o).value();
      o.mask_index = MaskIndex::kWindows;
      auto blocks = PatchSampler::Create(reader, o).value();
      for (uint64_t e = 0; e < 4; ++e)
        for (uint64_t p = 0; p < lists->visits_per_epoch(); ++p)
          for (int j = 0; j < 6; ++j) {
            const Window a = lists->WindowAt(e, p, j).value();
            const Window b = blocks->WindowAt(e, p, j).value();
            ASSERT_EQ(std::make_tuple(a.sample, a.y, a.x, a.positive), std::make_tuple(b.sample, b.y, b.x, b.positive))
                << e << "/" << p << "/" << j;
            ASSERT_EQ(BruteCountHW(masks[a.sample], W, a.y, a.x, ph, pw) >= need, a.positive);
          }
      // min_valid > 1 decides eligibility from each mask when the sampler is
      // created, which builds the lists: they decide every draw.
      const auto st = blocks->candidate_stats();
      if (variant == 1) {
        EXPECT_GT(st.by_lists, 0u);
        continue;
      }
      EXPECT_EQ(st.by_lists, 0u);
      EXPECT_GT(st.by_blocks, st.by_counting) << st.by_blocks << " by blocks, " << st.by_counting << " counted";
      EXPECT_GT(st.by_counting, 0u);
      EXPECT_EQ(lists->candidate_stats().by_blocks, 0u);
      EXPECT_GT(lists->candidate_stats().by_lists, 0u);
    }
  }
}

TEST_F(SamplerTest, GatherIsDeterministicAcrossThreadsAndChunking) {
  SamplerOptions o;
  o.patch_size = 8;
  o.patches_per_sample = 4;
  o.require = "mask";
  o.flip = o.rot90 = true;
  o.seed = 3;
  auto one = Make(o);
  o.num_threads = 2;
  auto two = Make(o);
  const int64_t n = static_cast<int64_t>(one->windows_per_epoch());
  std::vector<float> a0(n * 2 * 64), a1(n * 64), b0(n * 2 * 64), b1(n * 64);
  ASSERT_TRUE(one->Gather(1, 0, n, {a0.data(), a1.data()}).ok());
  ASSERT_TRUE(two->Gather(1, 0, 5, {b0.data(), b1.data()}).ok());
  ASSERT_TRUE(two->Gather(1, 5, n - 5, {b0.data() + 5 * 128, b1.data() + 5 * 64}).ok());
  EXPECT_EQ(a0, b0);
  EXPECT_EQ(a1, b1);
  // Another epoch differs; another seed differs.
  std::vector<float> c0(n * 2 * 64), c1(n * 64);
  ASSERT_TRUE(one->Gather(2, 0, n, {c0.data(), c1.data()}).ok());
  EXPECT_NE(a0, c0);
}

TEST_F(SamplerTest, NextContinuesIntoTheNextEpoch) {
  SamplerOptions o;
  o.patch_size = 8;
  o.patches_per_sample = 2;
  auto s = Make(o);
  const uint64_t per = s->windows_per_epoch();
  EXPECT_EQ(per, 14u);  // 7 samples, no requirement: none skipped
  std::vector<float> a(20 * 2 * 64), m(20 * 64);
  std::vector<Window> wins;
  ASSERT_TRUE(s->Next(20, {a.data(), m.data()}, &wins).ok());
  EXPECT_EQ(s->epoch(), 1u);
  EXPECT_EQ(s->cursor(), 6u);
  EXPECT_EQ(wins[14].sample, s->WindowAt(1, 0, 0)->sample);
}

TEST_F(SamplerTest, WindowsCopyExactValuesWithFlipsAndRotations) {
  SamplerOptions o;
  o.fields = {"img"};
  o.patch_size = 6;
  o.patches_per_sample = 256;
  o.flip = o.rot90 = true;
  auto s = Make(o);
  const int64_t n = 256, P = 6;
  std::vector<float> out(n * 2 * P * P);
  std::vector<Window> wins;
  ASSERT_TRUE(s->Gather(0, 0, n, {out.data()}, &wins).ok());
  std::set<int> seen;
  for (int64_t i = 0; i < n; ++i) {
    const Window& w = wins[i];
    seen.insert(w.flip * 4 + w.rot);
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t a = 0; a < P; ++a)
        for (int64_t b = 0; b < P; ++b) {
          // Reference: f = flip(window); out = np.rot90(f, rot): rot90 once maps
          // out[i][j] = f[j][P-1-i].
          int64_t ii = a, jj = b;
          for (int r = 0; r < w.rot; ++r) {
            int64_t ni = jj, nj = P - 1 - ii;  // out[ii][jj] reads f at (jj, P-1-ii) per quarter turn
            ii = ni;
            jj = nj;
          }
          if (w.flip & 1) ii = P - 1 - ii;
          if (w.flip & 2) jj = P - 1 - jj;
          const float expect = static_cast<float>(w.sample * 100000 + c * 10000 + (w.y + ii) * W + (w.x + jj));
          ASSERT_EQ(out[((i * 2 + c) * P + a) * P + b], expect) << "flip " << int(w.flip) << " rot " << int(w.rot);
        }
  }
  EXPECT_EQ(seen.size(), 16u);  // every flip x rotation combination occurred
}

TEST_F(SamplerTest, RankShardsAreDisjointEqualAndCovering) {
  for (int world : {1, 2, 3, 4}) {
    std::vector<uint64_t> all;
    uint64_t per = 0;
    for (int r = 0; r < world; ++r) {
      SamplerOptions o;
      o.patch_size = 8;
      o.require = "mask";
      o.rank = r;
      o.world_size = world;
      o.seed = 9;
      auto s = Make(o);
      if (r == 0) per = s->visits_per_epoch();
      EXPECT_EQ(s->visits_per_epoch(), per);
      for (uint64_t p = 0; p < s->visits_per_epoch(); ++p) all.push_back(s->SampleAt(4, p));
    }
    std::set<uint64_t> distinct(all.begin(), all.end());
    EXPECT_EQ(distinct.size(), 6u) << world;  // all eligible (s3 skipped)
    EXPECT_EQ(all.size(), per * world);
    EXPECT_LE(all.size() - distinct.size(), static_cast<size_t>(world - 1));  // only the padding repeats
  }
}

TEST_F(SamplerTest, PositiveFractionMixesQualifyingAndOtherWindows) {
  SamplerOptions o;
  o.patch_size = 5;
  o.patches_per_sample = 400;
  o.require = "mask";
  o.positive_fraction = 0.25;
  auto s = Make(o);
  EXPECT_EQ(s->skipped_samples(), 0u);  // with negatives allowed the empty mask is usable
  int pos = 0, total = 0;
  for (uint64_t p = 0; p < s->visits_per_epoch(); ++p)
    for (int j = 0; j < 400; ++j) {
      Window w = s->WindowAt(0, p, j).value();
      const bool has = BruteCount(masks_[w.sample], W, w.y, w.x, 5) > 0;
      EXPECT_EQ(has, w.positive);
      if (w.sample != 3) {
        pos += has;
        ++total;
      }
    }
  EXPECT_NEAR(static_cast<double>(pos) / total, 0.25, 0.03);
}

TEST_F(SamplerTest, WindowLargerThanTheImageSkipsEverySampleAndSaysSo) {
  SamplerOptions o;
  o.patch_size = 30;
  auto s = Make(o);
  EXPECT_EQ(s->eligible_samples(), 0u);
  EXPECT_EQ(s->skipped_samples(), 7u);
  std::vector<float> a(2 * 900), m(900);
  Status st = s->Next(1, {a.data(), m.data()});
  EXPECT_EQ(st.code(), Code::kOutOfRange);
  SamplerOptions bad;
  bad.fields = {"img"};
  bad.require = "img";
  EXPECT_EQ(PatchSampler::Create(reader_, bad).status().code(), Code::kInvalidArgument);
  bad.require = "nope";
  EXPECT_EQ(PatchSampler::Create(reader_, bad).status().code(), Code::kNotFound);
}

}  // namespace
}  // namespace patchstore

namespace patchstore {
namespace {

TEST_F(SamplerTest, WindowOfSampleDependsOnlyOnSeedEpochSampleAndJ) {
  SamplerOptions o;
  o.patch_size = 7;
  o.patches_per_sample = 2;
  o.require = "mask";
  o.seed = 21;
  auto a = Make(o);
  o.num_threads = 2;
  o.world_size = 3;  // sharding does not affect per-sample draws
  o.rank = 2;
  auto b = Make(o);
  for (uint64_t s = 0; s < 7; ++s) {
    if (s == 3) {
      EXPECT_FALSE(a->eligible(3));
      EXPECT_EQ(a->WindowOfSample(0, 3, 0).status().code(), Code::kOutOfRange);
      continue;
    }
    for (int j = 0; j < 2; ++j) {
      Window wa = a->WindowOfSample(5, s, j).value(), wb = b->WindowOfSample(5, s, j).value();
      EXPECT_EQ(wa.sample, s);
      EXPECT_EQ(wa.y, wb.y);
      EXPECT_EQ(wa.x, wb.x);
      EXPECT_GE(BruteCount(masks_[s], W, wa.y, wa.x, 7), 1u);
    }
  }
  std::vector<Window> wins = {a->WindowOfSample(1, 0, 0).value(), a->WindowOfSample(1, 6, 1).value()};
  std::vector<float> img(2 * 2 * 49), m(2 * 49);
  ASSERT_TRUE(a->GatherWindows(wins, {img.data(), m.data()}).ok());
  EXPECT_EQ(img[49 + 8], static_cast<float>(0 * 100000 + 1 * 10000 + (wins[0].y + 1) * W + wins[0].x + 1));
  EXPECT_EQ(a->GatherWindows(wins, {img.data()}).code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace patchstore

namespace patchstore {
namespace {

TEST_F(SamplerTest, ABoundedIndexCacheGivesTheSameWindows) {
  SamplerOptions o;
  o.patch_size = 6;
  o.patches_per_sample = 3;
  o.require = "mask";
  o.min_valid = 2;
  o.seed = 8;
  auto big = Make(o);
  o.index_cache_bytes = 1;  // every list is dropped right after use
  auto tiny = Make(o);
  for (uint64_t e = 0; e < 3; ++e)
    for (uint64_t p = 0; p < big->visits_per_epoch(); ++p)
      for (int j = 0; j < 3; ++j) {
        Window a = big->WindowAt(e, p, j).value(), b = tiny->WindowAt(e, p, j).value();
        ASSERT_EQ(a.sample, b.sample);
        ASSERT_EQ(a.y, b.y);
        ASSERT_EQ(a.x, b.x);
      }
}

// --- rectangular windows, policies, subsets, served windows -----------------

uint64_t BruteCountHW(const std::vector<float>& m, int64_t W, int64_t y, int64_t x, int64_t h, int64_t w) {
  uint64_t n = 0;
  for (int64_t i = 0; i < h; ++i)
    for (int64_t j = 0; j < w; ++j) n += m[(y + i) * W + x + j] != 0;
  return n;
}

// Brute force over small random masks: a sample is eligible iff some h x w
// window holds >= threshold valid pixels, and the windows drawn from it are
// exactly those windows (each drawn, none other).
TEST(RectSampler, MaskRuleIsExactForRectanglesByBruteForce) {
  const int64_t H = 9, W = 11;
  std::mt19937 rng(17);
  std::vector<std::vector<float>> masks;
  for (int s = 0; s < 8; ++s) {
    std::vector<float> m(H * W, 0.0f);
    const int density = s % 4;  // 0: empty; others sparse to dense
    for (auto& v : m) v = (density > 0 && static_cast<int>(rng() % 12) < density) ? 1.0f : 0.0f;
    masks.push_back(m);
  }
  masks[5] = BlobMask(H, W, {{0, 0}, {8, 10}});  // two corner pixels
  TempDir dir;
  for (bool with_sat : {true, false}) {
    auto reader = Reader::Open(MakeStore(dir, masks, H, W, with_sat)).value();
    for (auto [ph, pw] : std::vector<std::pair<int64_t, int64_t>>{{2, 5}, {5, 2}, {1, 11}, {9, 3}, {4, 4}})
      for (double min_valid : {1.0, 3.0, 0.25}) {
        SamplerOptions o;
        o.fields = {"img"};
        o.patch_size = 99;  // overridden by patch_h / patch_w
        o.patch_h = ph;
        o.patch_w = pw;
        o.require = "mask";
        o.min_valid = min_valid;
        o.patches_per_sample = 1;
        auto sr = PatchSampler::Create(reader, o);
        ASSERT_TRUE(sr.ok()) << sr.status().ToString();
        auto& smp = *sr;
        const uint64_t need = min_valid < 1 ? static_cast<uint64_t>(std::ceil(min_valid * ph * pw))
                                            : static_cast<uint64_t>(min_valid);
        for (uint64_t i = 0; i < masks.size(); ++i) {
          std::set<std::pair<int64_t, int64_t>> expect;
          for (int64_t y = 0; y + ph <= H; ++y)
            for (int64_t x = 0; x + pw <= W; ++x)
              if (BruteCountHW(masks[i], W, y, x, ph, pw) >= need) expect.insert({y, x});
          ASSERT_EQ(smp->eligible(i), !expect.empty())
              << "sample " << i << " " << ph << "x" << pw << " mv " << min_valid;
          if (expect.empty()) {
            EXPECT_EQ(smp->WindowOfSample(0, i, 0).status().code(), Code::kOutOfRange);
            continue;
          }
          std::set<std::pair<int64_t, int64_t>> seen;
          for (int j = 0; j < 40 * static_cast<int>(expect.size()); ++j) {
            Window w = smp->WindowOfSample(0, i, j).value();
            ASSERT_TRUE(expect.count({w.y, w.x})) << "window (" << w.y << "," << w.x << ") of sample " << i << " holds "
                                                  << BruteCountHW(masks[i], W, w.y, w.x, ph, pw) << " < " << need;
            seen.insert({w.y, w.x});
          }
          EXPECT_EQ(seen, expect) << "every qualifying window is drawn";
        }
      }
  }
}

TEST_F(SamplerTest, RectangularWindowsCopyExactValuesWithFlips) {
  SamplerOptions o;
  o.fields = {"img", "mask"};
  o.patch_h = 3;
  o.patch_w = 8;
  o.patches_per_sample = 64;
  o.flip = true;
  auto s = Make(o);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->height(), 3);
  EXPECT_EQ(s->width(), 8);
  const int64_t n = 64, h = 3, w = 8;
  std::vector<float> out(n * 2 * h * w), mout(n * h * w);
  std::vector<Window> wins;
  ASSERT_TRUE(s->Gather(1, 0, n, {out.data(), mout.data()}, &wins).ok());
  std::set<int> flips;
  for (int64_t i = 0; i < n; ++i) {
    const Window& win = wins[i];
    ASSERT_EQ(win.rot, 0);
    ASSERT_LE(win.y + h, H);
    ASSERT_LE(win.x + w, W);
    flips.insert(win.flip);
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t a = 0; a < h; ++a)
        for (int64_t b = 0; b < w; ++b) {
          const int64_t ii = (win.flip & 1) ? h - 1 - a : a, jj = (win.flip & 2) ? w - 1 - b : b;
          const float expect = static_cast<float>(win.sample * 100000 + c * 10000 + (win.y + ii) * W + (win.x + jj));
          ASSERT_EQ(out[((i * 2 + c) * h + a) * w + b], expect);
          if (c == 0) {
            ASSERT_EQ(mout[(i * h + a) * w + b], masks_[win.sample][(win.y + ii) * W + win.x + jj]);
          }
        }
  }
  EXPECT_EQ(flips.size(), 4u);
  // A square window given as patch_h == patch_w draws as patch_size does.
  SamplerOptions sq;
  sq.patch_size = 5;
  sq.require = "mask";
  sq.patches_per_sample = 2;
  sq.flip = sq.rot90 = true;
  sq.seed = 3;
  SamplerOptions hw = sq;
  hw.patch_size = 256;
  hw.patch_h = hw.patch_w = 5;
  auto a = Make(sq), b = Make(hw);
  for (uint64_t p = 0; p < a->visits_per_epoch(); ++p)
    for (int j = 0; j < 2; ++j) {
      Window x = a->WindowAt(2, p, j).value(), y = b->WindowAt(2, p, j).value();
      ASSERT_EQ(std::make_tuple(x.sample, x.y, x.x, x.flip, x.rot), std::make_tuple(y.sample, y.y, y.x, y.flip, y.rot));
    }
}

TEST_F(SamplerTest, Rot90OfANonSquareWindowIsRefused) {
  SamplerOptions o;
  o.fields = {"img"};
  o.patch_h = 4;
  o.patch_w = 6;
  o.rot90 = true;
  auto s = PatchSampler::Create(reader_, o);
  ASSERT_EQ(s.status().code(), Code::kInvalidArgument);
  EXPECT_NE(s.status().message().find("rot90 (--rot90) needs a square window"), std::string::npos)
      << s.status().message();
  // And a hand-made window with a quarter turn is refused by the gather.
  o.rot90 = false;
  auto t = Make(o);
  Window w;
  w.rot = 1;
  std::vector<float> out(2 * 4 * 6);
  EXPECT_EQ(t->GatherWindows({w}, {out.data()}).code(), Code::kInvalidArgument);
  // min_valid is checked against the h x w area.
  o.require = "mask";
  o.min_valid = 25;
  auto u = PatchSampler::Create(reader_, o);
  ASSERT_EQ(u.status().code(), Code::kInvalidArgument);
  EXPECT_NE(u.status().message().find("4x6 window holds (24)"), std::string::npos) << u.status().message();
}

// SamplerOptions::Validate is the one check of the option values: each rule
// refuses with the option's Python keyword and CLI flag and the value given,
// Create reports the same message in its context, and the defaults pass.
TEST(SamplerOptionsTest, ValidateNamesTheUsersSpelling) {
  SamplerOptions ok;
  ok.fields = {"img"};
  EXPECT_TRUE(ok.Validate().ok()) << ok.Validate().message();
  struct Case {
    void (*change)(SamplerOptions*);
    std::string message;
  };
  const Case cases[] = {
      {[](SamplerOptions* o) { o->fields.clear(); }, "no fields given"},
      {[](SamplerOptions* o) { o->patch_size = 0; },
       "patch_size (--patch) must be P or (h, w) with sides in [1, 2**31), got 0"},
      {[](SamplerOptions* o) { o->patch_h = 3, o->patch_w = -1; },
       "patch_size (--patch) must be P or (h, w) with sides in "
       "[1, 2**31), got (3, -1)"},
      {[](SamplerOptions* o) { o->patches_per_sample = 0; },
       "patches_per_sample (-k, --patches-per-sample) must be positive, got 0"},
      {[](SamplerOptions* o) { o->min_valid = 0; },
       "min_valid (--min-valid) must be positive (pixels >= 1, or a fraction of the window < 1), got 0"},
      {[](SamplerOptions* o) { o->min_valid = 65537; },
       "min_valid (--min-valid) 65537 asks for more valid pixels than a 256x256 window holds (65536)"},
      {[](SamplerOptions* o) { o->positive_fraction = 1.5; },
       "positive_fraction (--positive-fraction) must be in [0, 1] (None, CLI -1: off), got 1.5"},
      {[](SamplerOptions* o) { o->positive_fraction = -0.5; },
       "positive_fraction (--positive-fraction) must be in [0, 1] (None, CLI -1: off), got -0.5"},
      {[](SamplerOptions* o) { o->rank = 2, o->world_size = 2; },
       "need 0 <= rank < world_size, got rank (--rank) 2, world_size (--world-size) 2"},
      {[](SamplerOptions* o) { o->num_threads = 0; }, "num_threads must be in [1, 4096] (Python 0: all cores), got 0"},
      {[](SamplerOptions* o) { o->prefetch_batches = 65; },
       "prefetch must be a number of batches in 1..64 (False or 0: off), got 65"},
      {[](SamplerOptions* o) { o->order = SampleOrder::kLocality; }, "order 'locality' needs cache_budget (bytes"},
      {[](SamplerOptions* o) { o->index_cache_bytes = 0; }, "index_cache_bytes must be positive, got 0"},
      {[](SamplerOptions* o) { o->positive_fraction = 0.5; }, "positive_fraction needs require=<mask field>"},
  };
  for (const Case& c : cases) {
    SamplerOptions o = ok;
    c.change(&o);
    const Status st = o.Validate();
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << c.message;
    EXPECT_EQ(st.message().rfind(c.message, 0), 0u) << st.message();
  }
  // Off values are not checked: read-ahead off takes any depth.
  SamplerOptions off = ok;
  off.prefetch_next = false;
  off.prefetch_batches = 0;
  EXPECT_TRUE(off.Validate().ok());
  EXPECT_EQ(SamplerOptionSpelling("locality_budget_bytes"), "cache_budget");
  EXPECT_EQ(SamplerOptionSpelling("world_size"), "world_size (--world-size)");
}

TEST_F(SamplerTest, CreateReportsValidateInItsContext) {
  SamplerOptions o;
  o.fields = {"img"};
  o.positive_fraction = 2;
  auto s = PatchSampler::Create(reader_, o);
  ASSERT_EQ(s.status().code(), Code::kInvalidArgument);
  EXPECT_NE(s.status().message().find("creating a sampler on '"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find(o.Validate().message()), std::string::npos) << s.status().message();
}

TEST_F(SamplerTest, ExplicitPoliciesDrawAsAutoAndRefuseOptionsThatDoNotFit) {
  struct Case {
    SamplingPolicy policy;
    std::string require;
    double pf;
  };
  for (const Case& c : {Case{SamplingPolicy::kUniform, "", -1}, Case{SamplingPolicy::kMinValid, "mask", -1},
                        Case{SamplingPolicy::kPositiveFraction, "mask", 0.5}}) {
    SamplerOptions o;
    o.patch_size = 5;
    o.require = c.require;
    o.positive_fraction = c.pf;
    o.patches_per_sample = 2;
    o.seed = 4;
    auto a = Make(o);
    EXPECT_EQ(o.ResolvedPolicy(), c.policy);
    o.policy = c.policy;
    auto b = Make(o);
    ASSERT_EQ(a->eligible_samples(), b->eligible_samples());
    for (uint64_t p = 0; p < a->visits_per_epoch(); ++p)
      for (int j = 0; j < 2; ++j) {
        Window x = a->WindowAt(0, p, j).value(), y = b->WindowAt(0, p, j).value();
        ASSERT_EQ(std::make_tuple(x.sample, x.y, x.x, x.positive), std::make_tuple(y.sample, y.y, y.x, y.positive));
      }
  }
  SamplerOptions o;
  o.fields = {"img"};
  o.policy = SamplingPolicy::kMinValid;  // needs require
  EXPECT_EQ(PatchSampler::Create(reader_, o).status().code(), Code::kInvalidArgument);
  o.policy = SamplingPolicy::kUniform;
  o.require = "mask";  // a uniform policy takes no mask
  EXPECT_EQ(PatchSampler::Create(reader_, o).status().code(), Code::kInvalidArgument);
  o.policy = SamplingPolicy::kPositiveFraction;  // needs a fraction
  EXPECT_EQ(PatchSampler::Create(reader_, o).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseSamplingPolicy("positive_fraction").value(), SamplingPolicy::kPositiveFraction);
  auto bad = ParseSamplingPolicy("balanced");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("uniform, min_valid, positive_fraction"), std::string::npos);
  // The uniform policy skips only samples smaller than the window.
  o = SamplerOptions();
  o.fields = {"img"};
  o.patch_size = 5;
  EXPECT_EQ(Make(o)->skipped_samples(), 0u);
}

TEST_F(SamplerTest, IdsSubsetRestrictsVisitsAndSkipsOnlyItsOwnSamples) {
  SamplerOptions o;
  o.patch_size = 5;
  o.require = "mask";
  o.patches_per_sample = 2;
  o.ids = {"s5", "s3", "s1"};  // s3 has an empty mask
  o.samples = {6};
  auto s = Make(o);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->considered_samples(), 4u);
  EXPECT_EQ(s->eligible_list(), (std::vector<uint64_t>{1, 5, 6}));
  EXPECT_EQ(s->skipped_samples(), 1u);
  EXPECT_EQ(s->skipped_ids(), std::vector<std::string>{"s3"});
  EXPECT_TRUE(s->considered(3));
  EXPECT_FALSE(s->considered(0));
  std::set<uint64_t> visited;
  for (uint64_t e = 0; e < 4; ++e)
    for (uint64_t p = 0; p < s->visits_per_epoch(); ++p) visited.insert(s->WindowAt(e, p, 1).value().sample);
  EXPECT_EQ(visited, (std::set<uint64_t>{1, 5, 6}));
  EXPECT_EQ(s->WindowOfSample(0, 0, 0).status().code(), Code::kOutOfRange);  // outside the subset
  // A subset's sample draws the same windows as in the full store (WindowOfSample keys on the sample).
  SamplerOptions all = o;
  all.ids.clear();
  all.samples.clear();
  auto full = Make(all);
  for (int j = 0; j < 4; ++j) {
    Window a = s->WindowOfSample(3, 5, j).value(), b = full->WindowOfSample(3, 5, j).value();
    ASSERT_EQ(std::make_pair(a.y, a.x), std::make_pair(b.y, b.x));
  }
  o.fields = {"img"};
  o.ids = {"nope"};
  auto r = PatchSampler::Create(reader_, o);
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_NE(r.status().message().find("nope"), std::string::npos) << r.status().message();
  o.ids = {"s1"};
  o.samples = {1};
  r = PatchSampler::Create(reader_, o);
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'s1' (index 1) twice"), std::string::npos) << r.status().message();
  o.ids.clear();
  o.samples = {7};
  EXPECT_EQ(PatchSampler::Create(reader_, o).status().code(), Code::kOutOfRange);
}

TEST_F(SamplerTest, ServedWindowsFollowEachLoadersOrderAndSkipReportIsOneLine) {
  SamplerOptions o;
  o.patch_h = 4;
  o.patch_w = 7;
  o.require = "mask";
  o.min_valid = 2;
  o.patches_per_sample = 3;
  o.seed = 11;
  auto s = Make(o);
  ASSERT_NE(s, nullptr);
  const uint64_t per = s->windows_per_epoch();
  // sampler / batchloader: Gather's windows, continuing into the next epoch.
  std::vector<float> a(2 * per * 2 * 28), m(2 * per * 28);
  std::vector<Window> g0, g1;
  ASSERT_TRUE(s->Gather(5, 0, static_cast<int64_t>(per), {a.data(), m.data()}, &g0).ok());
  ASSERT_TRUE(s->Gather(6, 0, static_cast<int64_t>(per), {a.data(), m.data()}, &g1).ok());
  g0.insert(g0.end(), g1.begin(), g1.end());
  for (LoaderKind kind : {LoaderKind::kSampler, LoaderKind::kBatchLoader}) {
    auto served = s->ServedWindows(kind, 5, 0, static_cast<int64_t>(2 * per)).value();
    ASSERT_EQ(served.size(), g0.size());
    for (size_t i = 0; i < served.size(); ++i)
      ASSERT_EQ(std::make_tuple(served[i].sample, served[i].y, served[i].x),
                std::make_tuple(g0[i].sample, g0[i].y, g0[i].x));
  }
  // patchdataset: item i = eligible sample i, its k windows from WindowOfSample.
  const auto& el = s->eligible_list();
  auto pd = s->ServedWindows(LoaderKind::kPatchDataset, 2, 1, static_cast<int64_t>(el.size() * 3 + 2)).value();
  for (size_t i = 0; i < pd.size(); ++i) {
    const uint64_t w = i + 1, per_pd = el.size() * 3;
    const uint64_t epoch = 2 + w / per_pd, item = (w % per_pd) / 3;
    Window want = s->WindowOfSample(epoch, el[item], static_cast<int>(w % 3)).value();
    ASSERT_EQ(std::make_tuple(pd[i].sample, pd[i].y, pd[i].x), std::make_tuple(want.sample, want.y, want.x));
  }
  auto of = s->ServedWindowsOfSample(LoaderKind::kPatchDataset, 2, el[1]).value();
  ASSERT_EQ(of.size(), 3u);
  EXPECT_EQ(of[2].y, s->WindowOfSample(2, el[1], 2).value().y);
  EXPECT_TRUE(s->ServedWindowsOfSample(LoaderKind::kSampler, 0, 3).value().empty());  // skipped sample
  auto ofs = s->ServedWindowsOfSample(LoaderKind::kSampler, 0, el[0]).value();
  ASSERT_EQ(ofs.size(), 3u);  // one visit per epoch without rank padding
  // The skip report: count, considered samples, reason, first ids.
  const std::string report = s->SkippedReport();
  const std::string head = "skipping " + std::to_string(s->skipped_samples()) + " of 7 samples of '" + reader_->path() +
                           "' (no 4x7 window with >= 2 valid pixels of 'mask', or smaller than "
                           "4x7): ";
  EXPECT_EQ(report.substr(0, head.size()), head) << report;
  EXPECT_NE(report.find("'s3'"), std::string::npos) << report;
  EXPECT_EQ(report.find('\n'), std::string::npos);
  EXPECT_EQ(ParseLoaderKind("patchdataset").value(), LoaderKind::kPatchDataset);
  EXPECT_EQ(ParseLoaderKind("dataloader").status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace patchstore
