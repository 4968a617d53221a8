#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "patchstore/store/store.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::TempDir;
using testing::WriteSyntheticStore;

TEST(Store, WritesAndReadsBackAlignedRecords) {
  TempDir dir;
  const std::string path = dir / "s.ps";
  ASSERT_TRUE(WriteSyntheticStore(path, 5, {{"rgb", 3}, {"mask", 1}}, 6, 7).ok());
  auto snap = Snapshot::Open(path);
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  EXPECT_EQ((*snap)->id_count(), 5u);
  EXPECT_EQ((*snap)->meta().sample_count, 5u);
  EXPECT_TRUE((*snap)->meta().sealed);
  EXPECT_TRUE((*snap)->no_lock());  // sealed stores are read without the lock table
  int records = 0;
  ASSERT_TRUE((*snap)
                  ->ForEachRecord([&](uint64_t s, uint16_t f, const uint8_t* data, size_t size) -> Status {
                    ++records;
                    EXPECT_EQ(reinterpret_cast<uintptr_t>(data + kRecordHeaderSize) % kPayloadAlignment, 0u);
                    auto h = ParseRecordHeader(data, size);
                    EXPECT_TRUE(h.ok());
                    EXPECT_TRUE(VerifyRecordBody(*h, data).ok());
                    auto* v = reinterpret_cast<const float*>(data + kRecordHeaderSize);
                    EXPECT_EQ(v[0], testing::SyntheticValue(s, f, 0, 0, 0));
                    return Status::OK();
                  })
                  .ok());
  EXPECT_EQ(records, 10);
  std::vector<std::string> ids;
  ASSERT_TRUE((*snap)
                  ->ForEachId([&](uint64_t i, std::string_view id) -> Status {
                    EXPECT_EQ(i, ids.size());
                    ids.emplace_back(id);
                    return Status::OK();
                  })
                  .ok());
  EXPECT_EQ(ids, (std::vector<std::string>{"s/0", "s/1", "s/2", "s/3", "s/4"}));
}

TEST(Store, UnsealedStoresUseTheLockTable) {
  TempDir dir;
  const std::string path = dir / "s.ps";
  ASSERT_TRUE(WriteSyntheticStore(path, 2, {{"x", 1}}, 4, 4, /*seal=*/false).ok());
  auto snap = Snapshot::Open(path);
  ASSERT_TRUE(snap.ok());
  EXPECT_FALSE((*snap)->meta().sealed);
  EXPECT_FALSE((*snap)->no_lock());
}

TEST(Store, MapGrowsByItself) {
  TempDir dir;
  const std::string path = dir / "s.ps";
  // 64 KiB initial map, ~40 samples of 3x64x64 floats (48 KiB each).
  ASSERT_TRUE(WriteSyntheticStore(path, 40, {{"rgb", 3}}, 64, 64, true, 8, 64 << 10).ok());
  auto snap = Snapshot::Open(path);
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ((*snap)->id_count(), 40u);
}

TEST(Store, ResumeSkipsPresentIdsAndRejectsDuplicates) {
  TempDir dir;
  const std::string path = dir / "s.ps";
  ASSERT_TRUE(WriteSyntheticStore(path, 3, {{"x", 1}}, 4, 4, false).ok());
  ASSERT_TRUE(WriteSyntheticStore(path, 6, {{"x", 1}}, 4, 4, true).ok());  // continues at index 3
  auto w = Writer::Open(path, WriterOptions{});
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->sample_count(), 6u);
  EXPECT_TRUE((*w)->Contains("s/5"));
  EXPECT_FALSE((*w)->Contains("s/6"));
  SampleInput dup;
  dup.id = "s/2";
  Status st = (*w)->WriteBatch({dup});
  EXPECT_EQ(st.code(), Code::kAlreadyExists);
  EXPECT_NE(st.message().find("s/2"), std::string::npos);
}

TEST(Store, OnlyOneWriterAtATime) {
  TempDir dir;
  const std::string path = dir / "s.ps";
  auto w1 = Writer::Open(path, WriterOptions{});
  ASSERT_TRUE(w1.ok());
  auto w2 = Writer::Open(path, WriterOptions{});
  ASSERT_FALSE(w2.ok());
  EXPECT_NE(w2.status().message().find("another process"), std::string::npos);
}

TEST(Store, KindMismatchIsRefused) {
  TempDir dir;
  const std::string path = dir / "s.ps";
  ASSERT_TRUE(WriteSyntheticStore(path, 1, {{"x", 1}}, 4, 4).ok());
  WriterOptions wo;
  wo.kind = "volumes";
  auto w = Writer::Open(path, wo);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), Code::kInvalidArgument);
}

TEST(Store, MissingStoreIsNotFound) {
  TempDir dir;
  auto a = Snapshot::Open(dir / "nope");
  EXPECT_EQ(a.status().code(), Code::kNotFound);
  auto b = Snapshot::Open(dir.path());  // a folder without data.mdb
  EXPECT_EQ(b.status().code(), Code::kNotFound);
  EXPECT_NE(b.status().message().find("not a patchstore store"), std::string::npos);
}

TEST(Store, TruncatedDataFileIsRefusedBeforeAnyAccess) {
  TempDir dir;
  const std::string path = dir / "s.ps";
  ASSERT_TRUE(WriteSyntheticStore(path, 8, {{"rgb", 3}}, 32, 32).ok());
  const std::string data = path + "/data.mdb";
  const auto size = std::filesystem::file_size(data);
  for (auto cut : {size - 4096, size / 2, uint64_t{3 * 4096}}) {
    ASSERT_EQ(::truncate(data.c_str(), static_cast<off_t>(cut)), 0);
    auto snap = Snapshot::Open(path);
    ASSERT_FALSE(snap.ok()) << "cut to " << cut;
  }
}

TEST(Store, ForkedChildMayDropAnInheritedSnapshot) {
  TempDir dir;
  const std::string path = dir / "s.ps";
  ASSERT_TRUE(WriteSyntheticStore(path, 2, {{"x", 1}}, 4, 4, /*seal=*/false).ok());
  auto snap = Snapshot::Open(path);
  ASSERT_TRUE(snap.ok());
  pid_t pid = fork();
  if (pid == 0) {
    // Child: destroying the inherited snapshot must not touch LMDB; opening
    // anew must work.
    snap->reset();
    auto again = Snapshot::Open(path);
    _exit(again.ok() && (*again)->id_count() == 2 ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // The parent's snapshot still works.
  auto rec = (*snap)->GetRecord(1, 0);
  ASSERT_TRUE(rec.ok());
  EXPECT_TRUE(ParseRecordHeader(rec->data(), rec->size()).ok());
}

// PlanWillNeed: which page runs Snapshot::WillNeed requests, under a
// made-up residency (addresses are never touched).
struct FakeResidency {
  static constexpr uintptr_t kPage = 4096;
  std::set<uintptr_t> missing;  // page addresses out of memory
  std::vector<std::pair<uintptr_t, uintptr_t>> calls;
  bool fail = false;
  ResidencyFn fn() {
    return [this](uintptr_t b, uintptr_t e, unsigned char* vec) {
      calls.emplace_back(b, e);
      if (fail) return false;
      for (uintptr_t a = b; a < e; a += kPage) vec[(a - b) / kPage] = missing.count(a) ? 0 : 1;
      return true;
    };
  }
};

const void* At(uintptr_t a) { return reinterpret_cast<const void*>(a); }

TEST(PlanWillNeed, RowsOfAWindowAreOneClusterPerChannelAndOnlyRunsWithAMissingPageAreRequested) {
  constexpr uintptr_t P = FakeResidency::kPage, base = uintptr_t{1} << 32;
  // Two channels 8 MiB apart, 16 rows of 1,000 bytes each, rows three pages
  // apart (as the rows of a window of a wide plane: no two share a page).
  std::vector<std::pair<const void*, size_t>> ranges;
  for (uintptr_t c = 0; c < 2; ++c)
    for (uintptr_t r = 0; r < 16; ++r) ranges.emplace_back(At(base + c * (8u << 20) + r * 3 * P + 100), 1000);
  FakeResidency res;
  EXPECT_TRUE(PlanWillNeed(ranges, P, res.fn()).empty());        // all in memory: nothing requested
  ASSERT_EQ(res.calls.size(), 2u);                               // one residency check per channel
  EXPECT_EQ(res.calls[0], std::make_pair(base, base + 46 * P));  // row 15 is page 45
  EXPECT_EQ(res.calls[1].first, base + (8u << 20));

  // The pages of row 5 of channel 0 and row 3 of channel 1, and a page
  // between rows, are out of memory: exactly those two rows are requested.
  res.calls.clear();
  res.missing = {base + 15 * P, base + (8u << 20) + 9 * P, base + 16 * P};
  auto plan = PlanWillNeed(ranges, P, res.fn());
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0], std::make_pair(base + 15 * P, base + 16 * P));
  EXPECT_EQ(plan[1], std::make_pair(base + (8u << 20) + 9 * P, base + (8u << 20) + 10 * P));

  // A residency it cannot tell: every run of the cluster.
  res.fail = true;
  plan = PlanWillNeed(ranges, P, res.fn());
  EXPECT_EQ(plan.size(), 32u);
}

TEST(PlanWillNeed, RunsMergeWhereTheyTouchAndClustersEndAtGapsSpansAndBackwardSteps) {
  constexpr uintptr_t P = FakeResidency::kPage, base = uintptr_t{1} << 32;
  FakeResidency res;
  for (uintptr_t a = base; a < base + 4 * (kWillNeedSpanPages + 1024) * P; a += P) res.missing.insert(a);
  // Touching and overlapping ranges are one run; an empty range is nothing.
  auto plan = PlanWillNeed({{At(base + 10), 100}, {At(base + P), P}, {At(base + 2 * P - 1), 2}, {At(base), 0}}, P,
                           res.fn());
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0], std::make_pair(base, base + 3 * P));
  EXPECT_EQ(res.calls.size(), 1u);

  // A gap of kWillNeedGapPages pages joins, one more page splits.
  res.calls.clear();
  plan = PlanWillNeed({{At(base), P},
                       {At(base + (1 + kWillNeedGapPages) * P), P},
                       {At(base + (3 + 2 * kWillNeedGapPages) * P), P}},
                      P, res.fn());
  EXPECT_EQ(plan.size(), 3u);
  ASSERT_EQ(res.calls.size(), 2u);
  EXPECT_EQ(res.calls[0], std::make_pair(base, base + (2 + kWillNeedGapPages) * P));

  // A step backwards starts a new cluster; so does passing the span; a run
  // longer than the span is a cluster of its own.
  res.calls.clear();
  plan = PlanWillNeed({{At(base + 8 * P), P}, {At(base), P}}, P, res.fn());
  EXPECT_EQ(plan.size(), 2u);
  EXPECT_EQ(res.calls.size(), 2u);
  res.calls.clear();
  plan = PlanWillNeed({{At(base), P},
                       {At(base + 10 * P), (kWillNeedSpanPages - 10) * P},
                       {At(base + (kWillNeedSpanPages + 1) * P), P},
                       {At(base + (kWillNeedSpanPages + 3) * P), (kWillNeedSpanPages + 5) * P}},
                      P, res.fn());
  EXPECT_EQ(plan.size(), 4u);
  ASSERT_EQ(res.calls.size(), 3u);
  EXPECT_EQ(res.calls[0], std::make_pair(base, base + kWillNeedSpanPages * P));
  EXPECT_EQ(res.calls[1], std::make_pair(base + (kWillNeedSpanPages + 1) * P, base + (kWillNeedSpanPages + 2) * P));
  EXPECT_EQ(res.calls[2], std::make_pair(base + (kWillNeedSpanPages + 3) * P, base + (2 * kWillNeedSpanPages + 8) * P));
}

}  // namespace
}  // namespace patchstore

// Result::value() on an error aborts with the status text (as Arrow's
// ValueOrDie) instead of throwing a bare bad_variant_access.
TEST(ResultDeathTest, ValueOnErrorAbortsWithStatus) {
  patchstore::Result<int> r(patchstore::Status::NotFound("no sample 'x'"));
  EXPECT_DEATH((void)r.value(), "Result::value\\(\\) on an error: NotFound: no sample 'x'");
  patchstore::Result<int> ok(7);
  EXPECT_EQ(ok.value(), 7);
}
