// Batch prefetch (Reader::PrefetchPatch, PatchSampler::PrefetchAhead) and the
// locality-aware epoch order (reader/order.h).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "patchstore/reader/order.h"
#include "patchstore/reader/sampler.h"
#include "patchstore/store/store.h"
#include "test_util.h"

namespace patchstore {

struct ReaderTestAccess {
  static std::vector<std::pair<const void*, size_t>> Ranges(const Reader& r, uint64_t s, int f, int64_t y, int64_t x,
                                                            int64_t h, int64_t w) {
    std::vector<std::pair<const void*, size_t>> out{{nullptr, 1}};  // cleared by WindowRanges
    r.WindowRanges(s, f, y, x, h, w, &out);
    return out;
  }
};

namespace {

using testing::TempDir;
namespace fs = std::filesystem;

// `n` samples of H x W: "img" (3 channels, distinct values), "mask" (1
// channel, `valid` pixels set per sample, sample 2 empty when skip_one).
std::string MakeStore(const TempDir& dir, int n, int64_t H, int64_t W, bool skip_one = false) {
  const std::string path = dir / "s.ps";
  std::mt19937 rng(11);
  std::vector<std::vector<float>> masks;
  for (int s = 0; s < n; ++s) {
    std::vector<float> m(H * W, 0.0f);
    if (!(skip_one && s == 2))
      for (int k = 0; k < 4; ++k) m[(rng() % H) * W + rng() % W] = 1.0f;
    masks.push_back(std::move(m));
  }
  testing::StoreSpec spec;
  spec.fields = {testing::StoreField{"img", 3}, testing::StoreField{"mask", 1, /*mask=*/true}};
  spec.ids = testing::NumberedIds(static_cast<uint64_t>(n), "s");
  spec.height = H;
  spec.width = W;
  spec.value = [&](uint64_t s, int f, int64_t c, int64_t y, int64_t x) -> double {
    return f == 0 ? static_cast<float>(s * 1000000 + (c * H + y) * W + x) : masks[s][y * W + x];
  };
  spec.batch = static_cast<uint64_t>(n);
  EXPECT_TRUE(testing::WriteStore(path, spec).ok());
  return path;
}

// The rows of a Patch() view, merged where adjacent: what WindowRanges must give.
std::vector<std::pair<const void*, size_t>> ViewRows(const TensorView& v) {
  std::vector<std::pair<const void*, size_t>> out;
  const size_t row = static_cast<size_t>(v.shape[2] * v.itemsize());
  for (int64_t c = 0; c < v.shape[0]; ++c)
    for (int64_t y = 0; y < v.shape[1]; ++y) {
      const uint8_t* p = v.bytes() + c * v.strides[0] + y * v.strides[1];
      if (!out.empty() && static_cast<const uint8_t*>(out.back().first) + out.back().second == p)
        out.back().second += row;
      else out.emplace_back(p, row);
    }
  return out;
}

TEST(PrefetchPatch, RangesAreExactlyTheRowsOfThePatchView) {
  TempDir dir;
  const int64_t H = 13, W = 17;
  auto r = Reader::Open(MakeStore(dir, 3, H, W)).value();
  std::mt19937 rng(3);
  for (int t = 0; t < 300; ++t) {
    const uint64_t s = rng() % 3;
    const int f = static_cast<int>(rng() % 2);
    const int64_t h = 1 + rng() % H, w = 1 + rng() % W;
    const int64_t y = rng() % (H - h + 1), x = rng() % (W - w + 1);
    auto v = r->Patch(s, f, y, x, h, w).value();
    ASSERT_EQ(ReaderTestAccess::Ranges(*r, s, f, y, x, h, w), ViewRows(v)) << s << " " << f << " " << y << " " << x;
    r->PrefetchPatch(s, f, y, x, h, w);
  }
  // Full-width windows are one range per channel; whole records one range.
  auto part = ReaderTestAccess::Ranges(*r, 1, 0, 2, 0, 5, W);
  ASSERT_EQ(part.size(), 3u);
  EXPECT_EQ(part[0].second, static_cast<size_t>(5 * W * 4));
  auto whole = ReaderTestAccess::Ranges(*r, 1, 0, 0, 0, H, W);
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].first, static_cast<const void*>(r->Get(1, 0).value().bytes()));
  EXPECT_EQ(whole[0].second, static_cast<size_t>(3 * H * W * 4));
}

TEST(PrefetchPatch, AnyInvalidWindowGivesNoRangeAndDoesNotCrash) {
  TempDir dir;
  const int64_t H = 13, W = 17;
  auto r = Reader::Open(MakeStore(dir, 2, H, W)).value();
  const int64_t big = INT64_MAX, small = INT64_MIN;
  struct Case {
    uint64_t s;
    int f;
    int64_t y, x, h, w;
  };
  const std::vector<Case> bad = {
      {0, 0, -1, 0, 4, 4},         {0, 0, 0, -1, 4, 4},
      {0, 0, 10, 0, 4, 4},         {0, 0, 0, 14, 4, 4},
      {0, 0, 0, 0, 0, 4},          {0, 0, 0, 0, 4, 0},
      {0, 0, 0, 0, -4, 4},         {0, 0, 0, 0, H + 1, 4},
      {0, 0, big, big, big, big},  {0, 0, small, small, big, big},
      {0, 0, 1, 1, big, 2},        {0, 0, 1, 1, 2, big},
      {0, 0, big - 1, 0, 2, 2},    {2, 0, 0, 0, 4, 4},
      {UINT64_MAX, 0, 0, 0, 4, 4}, {0, -1, 0, 0, 4, 4},
      {0, 2, 0, 0, 4, 4},          {0, 99, 0, 0, 4, 4},
  };
  for (const Case& c : bad) {
    EXPECT_TRUE(ReaderTestAccess::Ranges(*r, c.s, c.f, c.y, c.x, c.h, c.w).empty())
        << c.s << " " << c.f << " " << c.y << " " << c.x << " " << c.h << " " << c.w;
    r->PrefetchPatch(c.s, c.f, c.y, c.x, c.h, c.w);
  }
  // The corners of the record are in range.
  EXPECT_EQ(ReaderTestAccess::Ranges(*r, 1, 1, H - 1, W - 1, 1, 1).size(), 1u);
  r->PrefetchPatch(1, 1, H - 1, W - 1, 1, 1);
}

// Every window read (Patch, CopyPatch, CopyPatches: Store.read_patches)
// requests its windows' bytes before copying (PrefetchWindows, counted), and
// serves exactly the stored values, also from a store evicted from the page
// cache.
TEST(PrefetchWindows, EveryWindowReadRequestsItsBytesFirst) {
  TempDir dir;
  const int64_t H = 37, W = 29;
  const std::string path = MakeStore(dir, 4, H, W);
  // Out of the page cache (where the file system honours it).
  for (const char* f : {"data.mdb"}) {
    const int fd = ::open((fs::path(path) / f).c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  auto r = Reader::Open(path).value();
  EXPECT_EQ(r->windows_read_ahead(), 0u);
  // MakeStore's "img" value at (sample s, channel c, row y, column x).
  auto value = [&](int64_t s, int64_t c, int64_t y, int64_t x) {
    return static_cast<float>(s * 1000000 + (c * H + y) * W + x);
  };
  const int64_t h = 5, w = 11;
  const std::vector<PatchRequest> reqs = {{3, 0, 0, 0},  {1, 0, 32, 18}, {0, 0, 17, 3},
                                          {3, 0, 9, 14}, {2, 0, 31, 0},  {1, 0, 0, 18}};
  std::vector<float> out(reqs.size() * 3 * h * w, -1.0f);
  ASSERT_TRUE(r->CopyPatches(reqs, h, w, out.data(), 2).ok());
  EXPECT_EQ(r->windows_read_ahead(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x)
          ASSERT_EQ(out[((i * 3 + c) * h + y) * w + x],
                    value(static_cast<int64_t>(reqs[i].sample), c, reqs[i].y + y, reqs[i].x + x))
              << i << " " << c << " " << y << " " << x;
  // A bad window anywhere: refused before anything is requested or copied.
  std::vector<PatchRequest> bad = reqs;
  bad[4].y = H - h + 1;
  EXPECT_EQ(r->CopyPatches(bad, h, w, out.data()).code(), Code::kOutOfRange);
  EXPECT_EQ(r->windows_read_ahead(), reqs.size());
  // One window: CopyPatch and Patch.
  std::vector<float> one(3 * h * w);
  ASSERT_TRUE(r->CopyPatch(2, 0, 12, 7, h, w, one.data()).ok());
  EXPECT_EQ(r->windows_read_ahead(), reqs.size() + 1);
  EXPECT_EQ(one[(2 * h + 4) * w + 10], value(2, 2, 16, 17));
  auto v = r->Patch(0, 0, 30, 1, h, w);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(r->windows_read_ahead(), reqs.size() + 2);
  const auto* base = static_cast<const uint8_t*>(v->data);
  float got = 0;
  std::memcpy(&got, base + 1 * v->strides[0] + 3 * v->strides[1] + 2 * v->strides[2], sizeof got);
  EXPECT_EQ(got, value(0, 1, 33, 3));
}

class PrefetchSamplerTest : public ::testing::Test {
 protected:
  void SetUp() override { reader_ = Reader::Open(MakeStore(dir_, 9, H, W, /*skip_one=*/true)).value(); }
  std::unique_ptr<PatchSampler> Make(SamplerOptions o) {
    o.fields = {"img", "mask"};
    auto s = PatchSampler::Create(reader_, o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  const int64_t H = 24, W = 20;
  TempDir dir_;
  std::shared_ptr<Reader> reader_;
};

TEST_F(PrefetchSamplerTest, NextServesTheSameWindowsWithAndWithoutPrefetch) {
  for (SampleOrder order : {SampleOrder::kRandom, SampleOrder::kLocality}) {
    SamplerOptions o;
    o.patch_size = 6;
    o.patches_per_sample = 3;
    o.require = "mask";
    o.flip = o.rot90 = true;
    o.seed = 7;
    o.order = order;
    o.locality_budget_bytes = 3 * (4 * H * W * 4 + 64);  // blocks of ~1-2 samples
    o.prefetch_next = true;
    auto on = Make(o);
    o.prefetch_next = false;
    o.index_cache_bytes = 1;  // and window lists rebuilt on every draw: the same windows
    auto off = Make(o);
    ASSERT_EQ(on->eligible_samples(), 8u);  // sample 2's mask is empty
    const int64_t n = 5;                    // batches straddle the epochs of 24 windows
    std::vector<float> a0(n * 3 * 36), a1(n * 36), b0(a0.size()), b1(a1.size());
    for (int batch = 0; batch < 12; ++batch) {
      std::vector<Window> wa, wb;
      ASSERT_TRUE(on->Next(n, {a0.data(), a1.data()}, &wa).ok());
      ASSERT_TRUE(off->Next(n, {b0.data(), b1.data()}, &wb).ok());
      ASSERT_EQ(a0, b0) << "batch " << batch;
      ASSERT_EQ(a1, b1) << "batch " << batch;
      ASSERT_EQ(wa.size(), wb.size());
      for (size_t i = 0; i < wa.size(); ++i) {
        EXPECT_EQ(wa[i].sample, wb[i].sample);
        EXPECT_EQ(wa[i].y, wb[i].y);
        EXPECT_EQ(wa[i].x, wb[i].x);
        EXPECT_EQ(wa[i].flip, wb[i].flip);
        EXPECT_EQ(wa[i].rot, wb[i].rot);
      }
      // PrefetchAhead of any range, in or past the epoch, changes nothing either.
      on->PrefetchAhead(on->epoch(), on->cursor() + 7, 9);
      on->PrefetchAhead(3, 1000, 4);
      on->PrefetchAhead(0, 0, 0);
      on->PrefetchAhead(0, 0, -3);
    }
    EXPECT_EQ(on->epoch(), off->epoch());
    EXPECT_EQ(on->cursor(), off->cursor());
  }
}

// prefetch_batches = 3: the first Next() requests the next 3 batches, each
// later one the one batch that comes into range; a seek requests 3 again.
// Strided batches (a DataLoader worker's) the same way, batch by batch.
TEST_F(PrefetchSamplerTest, PrefetchAheadKeepsTheGivenNumberOfBatchesRequested) {
  SamplerOptions o;
  o.patch_size = 6;
  o.require = "mask";
  o.prefetch_batches = 3;
  auto s = Make(o);
  const int64_t n = 4;
  std::vector<float> a(n * 3 * 36), b(n * 36);
  ASSERT_EQ(s->prefetched_windows(), 0u);
  ASSERT_TRUE(s->Next(n, {a.data(), b.data()}).ok());
  EXPECT_EQ(s->prefetched_windows(), 3u * n);
  for (int i = 1; i <= 5; ++i) {  // 8 windows per epoch: the batches cross epochs
    ASSERT_TRUE(s->Next(n, {a.data(), b.data()}).ok());
    EXPECT_EQ(s->prefetched_windows(), (3u + i) * n) << i;
  }
  s->SetEpoch(0);  // a seek: everything from there again
  ASSERT_TRUE(s->Next(n, {a.data(), b.data()}).ok());
  EXPECT_EQ(s->prefetched_windows(), 11u * n);
  // Strided: batches at 0, 8, 16 of epoch 40, then 24 comes into range.
  s->PrefetchAhead(40, 0, n, 2 * n);
  EXPECT_EQ(s->prefetched_windows(), 14u * n);
  s->PrefetchAhead(40, 2 * n, n, 2 * n);
  EXPECT_EQ(s->prefetched_windows(), 15u * n);
  s->PrefetchAhead(40, 2 * n, n, 2 * n);  // the same call again: nothing new
  EXPECT_EQ(s->prefetched_windows(), 15u * n);
  s->PrefetchAhead(40, 3 * n, n, 2 * n);  // not on the stride: all again
  EXPECT_EQ(s->prefetched_windows(), 18u * n);

  // The gathers (12 batches of n windows, two fields) went through the
  // reader's one window read-ahead.
  EXPECT_EQ(reader_->windows_read_ahead(), 7u * n * 2);
  o.prefetch_batches = 0;
  EXPECT_EQ(PatchSampler::Create(reader_, o).status().code(), Code::kInvalidArgument);
  o.prefetch_batches = 65;
  EXPECT_EQ(PatchSampler::Create(reader_, o).status().code(), Code::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// Locality order

std::vector<uint64_t> Sizes(uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint64_t> b(n);
  for (auto& v : b) v = 100 + rng() % 900;
  return b;
}

TEST(LocalityOrder, EveryItemOnceBlocksWithinBudgetAndContiguousInTheOrder) {
  for (uint64_t budget : {uint64_t{1}, uint64_t{2000}, uint64_t{9000}, uint64_t{1} << 40}) {
    const auto bytes = Sizes(500, 1);
    for (uint64_t epoch = 0; epoch < 3; ++epoch) {
      std::vector<uint64_t> order;
      ASSERT_TRUE(LocalityOrder(bytes.data(), bytes.size(), budget, 42, epoch, &order).ok());
      std::vector<uint64_t> sorted = order;
      std::sort(sorted.begin(), sorted.end());
      std::vector<uint64_t> iota(bytes.size());
      std::iota(iota.begin(), iota.end(), 0);
      ASSERT_EQ(sorted, iota) << "budget " << budget;
      const auto starts = LocalityBlocks(bytes.data(), bytes.size(), budget, 42, epoch);
      ASSERT_EQ(starts.front(), 0u);
      ASSERT_EQ(starts.back(), bytes.size());
      std::vector<uint64_t> block_of(bytes.size());
      for (size_t b = 0; b + 1 < starts.size(); ++b) {
        ASSERT_LT(starts[b], starts[b + 1]);
        uint64_t sum = 0;
        for (uint64_t i = starts[b]; i < starts[b + 1]; ++i) {
          sum += bytes[i];
          block_of[i] = b;
        }
        // Within budget / 2, unless the block is a single item larger than that.
        if (starts[b + 1] - starts[b] > 1) {
          EXPECT_LE(sum, budget / 2) << "block " << b;
        }
      }
      // Each block's items are consecutive in the order (the epoch reads one block at a time).
      std::set<uint64_t> done;
      for (size_t i = 0; i < order.size(); ++i) {
        const uint64_t b = block_of[order[i]];
        if (i > 0 && block_of[order[i - 1]] != b) {
          EXPECT_TRUE(done.insert(block_of[order[i - 1]]).second);
          EXPECT_FALSE(done.count(b)) << "block " << b << " visited twice";
        }
      }
      if (budget == 1) {
        EXPECT_EQ(starts.size(), bytes.size() + 1);  // every item its own block
      } else if (budget == (uint64_t{1} << 40)) {
        EXPECT_EQ(starts.size(), 2u);  // one block
      } else if (budget == 2000) {
        EXPECT_GT(starts.size(), 200u);  // about 3 items (of 100..999 bytes) per 1000-byte block
      }
    }
  }
}

TEST(LocalityOrder, DeterministicAndDifferentPerEpochAndSeed) {
  const auto bytes = Sizes(300, 2);
  auto order = [&](uint64_t seed, uint64_t epoch) {
    std::vector<uint64_t> o;
    EXPECT_TRUE(LocalityOrder(bytes.data(), bytes.size(), 10000, seed, epoch, &o).ok());
    return o;
  };
  EXPECT_EQ(order(1, 0), order(1, 0));
  EXPECT_NE(order(1, 0), order(1, 1));
  EXPECT_NE(order(1, 0), order(2, 0));
  // Block boundaries move from epoch to epoch.
  EXPECT_NE(LocalityBlocks(bytes.data(), bytes.size(), 10000, 1, 0),
            LocalityBlocks(bytes.data(), bytes.size(), 10000, 1, 1));
  // Pinned: the first items of (seed 1, epoch 0), so a change of the sequence is seen (a block of
  // 8 items, 276..283, shuffled, then the start of another).
  const auto o = order(1, 0);
  EXPECT_EQ(std::vector<uint64_t>(o.begin(), o.begin() + 12),
            (std::vector<uint64_t>{282, 278, 280, 281, 277, 276, 283, 279, 26, 23, 25, 27}));
  std::vector<uint64_t> empty;
  EXPECT_EQ(LocalityOrder(bytes.data(), 0, 10000, 1, 0, &empty).code(), Code::kOk);
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(LocalityOrder(bytes.data(), bytes.size(), 0, 1, 0, &empty).code(), Code::kInvalidArgument);
  // Locality: consecutive positions of the order are near each other in storage.
  uint64_t near = 0;
  for (size_t i = 1; i < o.size(); ++i) near += (o[i] > o[i - 1] ? o[i] - o[i - 1] : o[i - 1] - o[i]) <= 20;
  EXPECT_GT(near, o.size() * 8 / 10);  // a full shuffle: about 13%
}

TEST_F(PrefetchSamplerTest, LocalityOrderSplitsEachEpochOverRanksExactlyOnce) {
  // 8 eligible samples: world sizes 1, 2, 4, 8 divide them (no padding).
  for (int world : {1, 2, 4, 8, 3}) {
    for (uint64_t epoch = 0; epoch < 3; ++epoch) {
      std::map<uint64_t, int> seen;
      std::vector<uint64_t> global;
      for (int rank = 0; rank < world; ++rank) {
        SamplerOptions o;
        o.patch_size = 6;
        o.require = "mask";
        o.seed = 5;
        o.rank = rank;
        o.world_size = world;
        o.order = SampleOrder::kLocality;
        o.locality_budget_bytes = 4 * (4 * H * W * 4 + 64);
        auto s = Make(o);
        ASSERT_NE(s, nullptr);
        EXPECT_FALSE(s->eligible(2));
        for (uint64_t p = 0; p < s->visits_per_epoch(); ++p) ++seen[s->SampleAt(epoch, p)];
      }
      std::set<uint64_t> eligible;
      for (uint64_t i = 0; i < reader_->size(); ++i)
        if (i != 2) eligible.insert(i);
      std::set<uint64_t> got;
      int visits = 0;
      for (auto [sample, count] : seen) {
        got.insert(sample);
        visits += count;
        if (8 % world == 0) {
          EXPECT_EQ(count, 1) << "sample " << sample << " world " << world;
        }
      }
      EXPECT_EQ(got, eligible);  // the mask rule decides who is visited, not the order
      EXPECT_EQ(visits, static_cast<int>((8 + world - 1) / world * world));  // padding as DistributedSampler
    }
  }
  // Deterministic per (seed, epoch, rank, world_size); epochs differ.
  SamplerOptions o;
  o.patch_size = 6;
  o.require = "mask";
  o.order = SampleOrder::kLocality;
  o.locality_budget_bytes = 4 * (4 * H * W * 4 + 64);
  auto a = Make(o), b = Make(o);
  std::vector<uint64_t> e0, e0b, e1;
  for (uint64_t p = 0; p < a->visits_per_epoch(); ++p) {
    e0.push_back(a->SampleAt(0, p));
    e0b.push_back(b->SampleAt(0, p));
    e1.push_back(a->SampleAt(1, p));
  }
  EXPECT_EQ(e0, e0b);
  EXPECT_NE(e0, e1);
  // Budget 0 is refused.
  o.locality_budget_bytes = 0;
  o.fields = {"img"};
  auto bad = PatchSampler::Create(reader_, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("budget"), std::string::npos);
}

TEST_F(PrefetchSamplerTest, SampleBytesCountTheGatheredFieldsAndTheMaskOnce) {
  SamplerOptions o;
  o.patch_size = 6;
  o.require = "mask";
  auto s = Make(o);  // img + mask, mask also required
  EXPECT_EQ(s->SampleBytes(0), static_cast<uint64_t>(4 * H * W * 4 + 2 * kRecordHeaderSize));
  o.fields = {"img"};
  auto img_only = PatchSampler::Create(reader_, o).value();
  EXPECT_EQ(img_only->SampleBytes(0), static_cast<uint64_t>(4 * H * W * 4 + 2 * kRecordHeaderSize));
}

TEST(ByteSize, ParsesWhatUsersWrite) {
  EXPECT_EQ(ParseByteSize("1000").value(), 1000u);
  EXPECT_EQ(ParseByteSize("8GB").value(), 8000000000u);
  EXPECT_EQ(ParseByteSize("8G").value(), uint64_t{8} << 30);
  EXPECT_EQ(ParseByteSize("8GiB").value(), uint64_t{8} << 30);
  EXPECT_EQ(ParseByteSize("512 MiB").value(), uint64_t{512} << 20);
  EXPECT_EQ(ParseByteSize("1.5k").value(), 1536u);
  EXPECT_EQ(ParseByteSize("2tb").value(), 2000000000000u);
  for (const char* bad : {"", "GB", "-1", "1.2.3G", "8XB", "8 GBs", "0", "0.1", "1e30", "99999999999T"})
    EXPECT_EQ(ParseByteSize(bad).status().code(), Code::kInvalidArgument) << bad;
}

}  // namespace
}  // namespace patchstore
