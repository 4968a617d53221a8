#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

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
  ASSERT_TRUE((*snap)->ForEachId([&](uint64_t i, std::string_view id) -> Status {
    EXPECT_EQ(i, ids.size());
    ids.emplace_back(id);
    return Status::OK();
  }).ok());
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
