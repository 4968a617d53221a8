// Damaged stores: single-bit flips in a stored record's header, payload flips,
// metadata that disagrees with records, ids of any bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>

#include "patchstore/reader/reader.h"
#include "patchstore/reader/verify.h"
#include "patchstore/store/store.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::SyntheticValue;
using testing::TempDir;
using testing::WriteSyntheticStore;

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// File offset of the header of the record whose first payload float is `first`.
size_t HeaderOffset(const std::string& bytes, float first) {
  std::string needle(reinterpret_cast<const char*>(&first), 4);
  size_t at = bytes.find(needle);
  while (at != std::string::npos) {
    if (at >= kRecordHeaderSize && bytes.compare(at - kRecordHeaderSize, 4, "PSR1") == 0) return at - kRecordHeaderSize;
    at = bytes.find(needle, at + 1);
  }
  return std::string::npos;
}

TEST(Damage, EveryHeaderBitFlipInTheFileIsRejectedAndReported) {
  TempDir dir;
  const std::string path = dir / "s.ps", data = path + "/data.mdb";
  ASSERT_TRUE(WriteSyntheticStore(path, 3, {{"rgb", 3}, {"depth", 1}}, 16, 16).ok());
  const std::string good = ReadAll(data);
  const size_t hdr = HeaderOffset(good, SyntheticValue(1, 1, 0, 0, 0));
  ASSERT_NE(hdr, std::string::npos);
  int flips = 0, caught_by_verify = 0, caught_by_read = 0;
  for (size_t byte = 0; byte < kRecordHeaderSize; ++byte)
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[hdr + byte] ^= static_cast<char>(1 << bit);
      WriteAll(data, bad);
      ++flips;
      auto report = VerifyStore(path);
      ASSERT_TRUE(report.ok());
      if (!report->ok() && report->problems[0].id == "s/1" && report->problems[0].field == "depth") ++caught_by_verify;
      auto r = Reader::Open(path);
      ASSERT_TRUE(r.ok()) << r.status().ToString();  // one bad record does not hide the others
      if (!(*r)->Get(1, 1).ok()) ++caught_by_read;
      EXPECT_TRUE((*r)->Get(1, 0).ok());
    }
  EXPECT_EQ(caught_by_verify, flips);
  EXPECT_EQ(caught_by_read, flips);
  std::printf("[ damage ] %d header bit flips: %d reported by verify, %d refused on read\n", flips, caught_by_verify,
              caught_by_read);
}

TEST(Damage, PayloadFlipsAreReportedByVerify) {
  TempDir dir;
  const std::string path = dir / "s.ps", data = path + "/data.mdb";
  ASSERT_TRUE(WriteSyntheticStore(path, 2, {{"rgb", 3}}, 32, 32).ok());
  const std::string good = ReadAll(data);
  const size_t hdr = HeaderOffset(good, SyntheticValue(0, 0, 0, 0, 0));
  ASSERT_NE(hdr, std::string::npos);
  std::mt19937 rng(4);
  const size_t payload = 3 * 32 * 32 * 4;
  int caught = 0;
  const int kFlips = 200;
  for (int i = 0; i < kFlips; ++i) {
    std::string bad = good;
    bad[hdr + kRecordHeaderSize + rng() % payload] ^= static_cast<char>(1 << (rng() % 8));
    WriteAll(data, bad);
    auto report = VerifyStore(path);
    caught += report.ok() && report->problems.size() == 1 && report->problems[0].id == "s/0";
  }
  EXPECT_EQ(caught, kFlips);
}

TEST(Damage, MetadataThatDisagreesWithRecordsIsRefused) {
  TempDir dir;
  const std::string path = dir / "s.ps";
  ASSERT_TRUE(WriteSyntheticStore(path, 2, {{"rgb", 3}}, 8, 8).ok());
  {
    // Rewrite the metadata to claim a 4-channel field (a consistent, checksummed text).
    auto w = Writer::Open(path, WriterOptions{});
    ASSERT_TRUE(w.ok());
    (*w)->mutable_meta().fields[0].channels = 4;
    ASSERT_TRUE((*w)->CommitMeta().ok());
  }
  auto r = Reader::Open(path);
  ASSERT_TRUE(r.ok());
  auto v = (*r)->Get(0, 0);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), Code::kCorruption);
  auto report = VerifyStore(path);
  EXPECT_EQ(report->problems.size(), 2u);
}

TEST(Damage, IdsOfAnyBytesAreStoredAndListedFaithfully) {
  TempDir dir;
  const std::string path = dir / "s.ps";
  std::vector<std::string> ids = {
      "../x",      "/abs/path", std::string("nul\0byte", 8), "new\nline", std::string(4096, 'L'), "\xff\xfe not utf-8",
      "plain/0001"};
  testing::StoreSpec spec;
  spec.fields = {testing::StoreField{"x"}};
  spec.ids = ids;
  spec.height = spec.width = 2;
  spec.value = [](uint64_t, int, int64_t, int64_t y, int64_t x) { return static_cast<double>(y * 2 + x + 1); };
  spec.batch = ids.size();
  ASSERT_TRUE(testing::WriteStore(path, spec).ok());
  auto r = Reader::Open(path).value();
  ASSERT_EQ(r->size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(r->id(i), ids[i]);
    EXPECT_EQ(*r->Find(ids[i]), i);
  }
  std::string out;
  ASSERT_EQ(testing::RunCommand(std::string(PATCHSTORE_CLI) + " ls --json " + path, &out), 0);
  EXPECT_NE(out.find("\"nul\\u0000byte\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"new\\nline\""), std::string::npos);
  // Bytes that are not UTF-8 become \udcXX (Python's surrogateescape), see docs/limits.md.
  EXPECT_NE(out.find("\"\\udcff\\udcfe not utf-8\""), std::string::npos) << out;
}

}  // namespace
}  // namespace patchstore
