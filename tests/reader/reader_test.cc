#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>

#include "patchstore/reader/reader.h"
#include "patchstore/reader/verify.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::SyntheticValue;
using testing::TempDir;
using testing::WriteSyntheticStore;

class ReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_ / "s.ps";
    ASSERT_TRUE(WriteSyntheticStore(path_, 6, {{"rgb", 3}, {"mask", 1}, {"depth", 1}}, 40, 50).ok());
    auto r = Reader::Open(path_);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    reader_ = *r;
  }
  TempDir dir_;
  std::string path_;
  std::shared_ptr<Reader> reader_;
};

TEST_F(ReaderTest, IndexesIdsAndFields) {
  EXPECT_EQ(reader_->size(), 6u);
  EXPECT_EQ(reader_->id(3), "s/3");
  EXPECT_EQ(*reader_->Find("s/4"), 4u);
  EXPECT_EQ(reader_->Find("s/9").status().code(), Code::kNotFound);
  EXPECT_EQ(*reader_->FieldIndex("depth"), 2);
  auto bad = reader_->FieldIndex("normals");
  EXPECT_EQ(bad.status().code(), Code::kNotFound);
  EXPECT_NE(bad.status().message().find("rgb, mask, depth"), std::string::npos);
}

TEST_F(ReaderTest, GetReturnsAContiguousViewIntoTheMap) {
  auto v = reader_->Get(2, 0);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->rank, 3);
  EXPECT_EQ(v->shape[0], 3);
  EXPECT_EQ(v->shape[1], 40);
  EXPECT_EQ(v->shape[2], 50);
  EXPECT_EQ(v->strides[2], 4);
  EXPECT_EQ(v->strides[1], 200);
  EXPECT_EQ(v->strides[0], 8000);
  EXPECT_TRUE(v->contiguous());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v->data) % 16, 0u);
  EXPECT_EQ(v->data_as<float>()[(1 * 40 + 7) * 50 + 9], SyntheticValue(2, 0, 1, 7, 9));
  // Same record twice: the same memory, no copy.
  EXPECT_EQ(reader_->Get(2, 0)->data, v->data);
}

TEST_F(ReaderTest, PatchIsAStridedViewWithExactValues) {
  auto p = reader_->Patch(4, 0, 10, 20, 8, 9);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->shape[0], 3);
  EXPECT_EQ(p->shape[1], 8);
  EXPECT_EQ(p->shape[2], 9);
  EXPECT_FALSE(p->contiguous());
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 8; ++y)
      for (int x = 0; x < 9; ++x) {
        const auto* base = reinterpret_cast<const uint8_t*>(p->data);
        float v = *reinterpret_cast<const float*>(base + c * p->strides[0] + y * p->strides[1] + x * p->strides[2]);
        ASSERT_EQ(v, SyntheticValue(4, 0, c, 10 + y, 20 + x));
      }
}

TEST_F(ReaderTest, ViewsOutliveTheReader) {
  auto p = reader_->Patch(1, 1, 0, 0, 40, 50);
  ASSERT_TRUE(p.ok());
  TensorView keep = *p;
  reader_.reset();
  EXPECT_EQ(keep.data_as<float>()[40 * 50 - 1], SyntheticValue(1, 1, 0, 39, 49));
}

TEST_F(ReaderTest, OutOfRangePatchesAreClearErrors) {
  struct Case {
    int64_t y, x, h, w;
    Code code;
  } cases[] = {{-1, 0, 4, 4, Code::kOutOfRange},      {0, -1, 4, 4, Code::kOutOfRange},
               {37, 0, 4, 4, Code::kOutOfRange},      {0, 47, 4, 4, Code::kOutOfRange},
               {0, 0, 41, 4, Code::kOutOfRange},      {0, 0, 0, 4, Code::kInvalidArgument},
               {0, 0, 4, -2, Code::kInvalidArgument}, {INT64_MAX - 2, 0, 4, 4, Code::kOutOfRange}};
  for (const Case& c : cases) {
    auto p = reader_->Patch(0, 2, c.y, c.x, c.h, c.w);
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), c.code) << c.y << "," << c.x << "," << c.h << "," << c.w;
    EXPECT_NE(p.status().message().find("'s/0' field 'depth'"), std::string::npos) << p.status().message();
  }
  EXPECT_TRUE(reader_->Patch(0, 2, 36, 46, 4, 4).ok());
  EXPECT_EQ(reader_->Get(6, 0).status().code(), Code::kOutOfRange);
  EXPECT_EQ(reader_->Get(0, 3).status().code(), Code::kNotFound);
}

TEST_F(ReaderTest, CopyPatchesIsIndependentOfThreadCount) {
  std::mt19937 rng(3);
  std::vector<PatchRequest> reqs;
  for (int i = 0; i < 37; ++i)
    reqs.push_back({rng() % 6, 0, static_cast<int64_t>(rng() % 25), static_cast<int64_t>(rng() % 35)});
  const int64_t h = 16, w = 16, item = 3 * h * w;
  std::vector<float> one(reqs.size() * item), two(reqs.size() * item, -1);
  ASSERT_TRUE(reader_->CopyPatches(reqs, h, w, one.data(), 1).ok());
  ASSERT_TRUE(reader_->CopyPatches(reqs, h, w, two.data(), 2).ok());
  EXPECT_EQ(one, two);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(one[i * item + (2 * h + 5) * w + 7], SyntheticValue(reqs[i].sample, 0, 2, reqs[i].y + 5, reqs[i].x + 7));
  // One bad request fails the batch and names the sample.
  reqs[5].y = 39;
  Status st = reader_->CopyPatches(reqs, h, w, one.data(), 2);
  EXPECT_EQ(st.code(), Code::kOutOfRange);
  // Mixed channel counts are refused.
  std::vector<PatchRequest> mixed = {{0, 0, 0, 0}, {0, 1, 0, 0}};
  EXPECT_EQ(reader_->CopyPatches(mixed, 4, 4, one.data()).code(), Code::kInvalidArgument);
}

// Flips one byte of data.mdb at `offset`.
void FlipByte(const std::string& file, uint64_t offset, uint8_t mask) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ mask);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

// Finds the file offset of a float value unique to (sample, field).
uint64_t OffsetOf(const std::string& file, float value) {
  std::ifstream f(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string needle(reinterpret_cast<const char*>(&value), 4);
  size_t at = bytes.find(needle);
  return at == std::string::npos ? 0 : at;
}

TEST_F(ReaderTest, FlippedPayloadBitIsReportedByVerifyAndChecksummedReads) {
  reader_.reset();
  const std::string data = path_ + "/data.mdb";
  const float target = SyntheticValue(3, 2, 0, 12, 13);
  uint64_t off = OffsetOf(data, target);
  ASSERT_GT(off, 0u);
  FlipByte(data, off + 1, 0x04);
  auto report = VerifyStore(path_);
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->problems.size(), 1u);
  EXPECT_EQ(report->problems[0].id, "s/3");
  EXPECT_EQ(report->problems[0].field, "depth");
  EXPECT_NE(report->problems[0].message.find("checksum"), std::string::npos);
  ReaderOptions ro;
  ro.verify_checksums = true;
  auto r = Reader::Open(path_, ro);
  ASSERT_TRUE(r.ok());
  auto v = (*r)->Get(3, 2);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), Code::kCorruption);
  EXPECT_TRUE((*r)->Get(3, 1).ok());
}

TEST_F(ReaderTest, ConcurrentReaderProcessesSeeExactData) {
  reader_.reset();
  const int kProcs = 8;
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) {
    pid_t pid = fork();
    if (pid == 0) {
      auto r = Reader::Open(path_);
      if (!r.ok()) _exit(2);
      std::mt19937 rng(static_cast<unsigned>(p));
      std::vector<float> buf(3 * 8 * 8);
      for (int i = 0; i < 2000; ++i) {
        uint64_t s = rng() % 6;
        int64_t y = rng() % 32, x = rng() % 42;
        if (!(*r)->CopyPatch(s, 0, y, x, 8, 8, buf.data()).ok()) _exit(3);
        if (buf[(2 * 8 + 7) * 8 + 3] != SyntheticValue(s, 0, 2, y + 7, x + 3)) _exit(4);
      }
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
}

}  // namespace
}  // namespace patchstore
