// The ingest driver (ingest/driver.h) with a made-up source: input order
// whatever the threads, stop then resume, skip with the failure report,
// units that fail at commit (fill), and --shard.
#include "ingest/driver.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "patchstore/reader/reader.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::TempDir;

constexpr size_t kUnits = 10;

// Unit i is one 1x2x3 float32 record holding i, i+1, ...; decoding unit i
// sleeps a little more for low i, so that workers finish out of order.
class FakeSource : public IngestSource {
 public:
  std::set<size_t> fail_decode;  // Decode fails
  std::set<size_t> fail_fill;    // (deferred) its fill fails at commit
  bool deferred = false;         // records are read at commit
  int prepared = 0;

  Status Prepare(StoreMeta* meta) override {
    ++prepared;
    meta->attributes["fake"] = "yes";
    return Status::OK();
  }
  DecodedUnit Decode(size_t index, int /*slot*/, BufferPool* buffers) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(index % 3 == 0 ? 5 : 0));
    DecodedUnit d;
    if (fail_decode.count(index)) {
      d.status = Status::Corruption("decoding unit " + std::to_string(index) + ": damaged");
      d.failed_file = "file" + std::to_string(index);
      return d;
    }
    UnitField f;
    f.meta.name = "x";
    f.meta.channels = 1;
    f.meta.layout = Layout::kCHW;
    f.meta.dtype = DType::kFloat32;
    f.meta.source_type = SourceType::kFloat32;
    f.meta.source_format = "fake";
    f.header.layout = Layout::kCHW;
    f.header.rank = 3;
    f.header.shape = {1, 2, 3, 0};
    f.header.dtype = DType::kFloat32;
    f.header.source_type = SourceType::kFloat32;
    f.path = "file" + std::to_string(index);
    const float v = static_cast<float>(index);
    if (deferred) {
      const bool bad = fail_fill.count(index) != 0;
      f.fill = [v, bad, index](void* dst) {
        if (bad) return Status::IOError("reading unit " + std::to_string(index) + ": short read");
        for (int i = 0; i < 6; ++i) static_cast<float*>(dst)[i] = v + static_cast<float>(i);
        return Status::OK();
      };
    } else {
      f.buffer = buffers->Acquire(6 * sizeof(float));
      for (int i = 0; i < 6; ++i) f.buffer.data[i] = v + static_cast<float>(i);
    }
    d.fields.push_back(std::move(f));
    d.bytes = 6 * sizeof(float);
    return d;
  }
};

std::vector<IngestUnit> Units(const std::set<size_t>& planned_failures = {}) {
  std::vector<IngestUnit> units;
  for (size_t i = 0; i < kUnits; ++i) {
    IngestUnit u;
    u.id = "s" + std::to_string(i);
    u.file = "file" + std::to_string(i);
    if (planned_failures.count(i)) u.status = Status::InvalidArgument("listing unit " + std::to_string(i) + ": bad");
    units.push_back(std::move(u));
  }
  return units;
}

DriverOptions Options(const std::string& store, int threads = 3) {
  DriverOptions o;
  o.store = store;
  o.writer.durable = false;
  o.threads = threads;
  o.batch_samples = 2;
  return o;
}

// (id, record checksum) of every sample, in store order.
std::vector<std::pair<std::string, uint64_t>> Contents(const std::string& store, bool* sealed = nullptr) {
  auto reader = Reader::Open(store);
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<std::pair<std::string, uint64_t>> out;
  if (!reader.ok()) return out;
  for (uint64_t s = 0; s < (*reader)->size(); ++s)
    out.emplace_back(std::string((*reader)->id(s)), (*reader)->Header(s, 0)->body_checksum);
  if (sealed) *sealed = (*reader)->sealed();
  return out;
}

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(IngestDriver, CommitsInInputOrderWhateverTheThreads) {
  TempDir dir;
  for (bool deferred : {false, true}) {
    const std::string one = dir / ("one" + std::to_string(deferred) + ".ps");
    const std::string many = dir / ("many" + std::to_string(deferred) + ".ps");
    FakeSource a, b;
    a.deferred = b.deferred = deferred;
    DriverOptions o = Options(one, 1);
    o.inline_decode = deferred;
    ASSERT_TRUE(RunIngest(o, Units(), &a).ok());
    o = Options(many, 4);
    auto r = RunIngest(o, Units(), &b);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->samples_written, kUnits);
    EXPECT_EQ(r->bytes_decoded, kUnits * 24);
    bool sealed = false;
    const auto got = Contents(many, &sealed);
    EXPECT_TRUE(sealed);
    ASSERT_EQ(got.size(), kUnits);
    for (size_t i = 0; i < kUnits; ++i) EXPECT_EQ(got[i].first, "s" + std::to_string(i));
    EXPECT_EQ(got, Contents(one));
  }
}

TEST(IngestDriver, StopCommitsWhatCameBeforeAndResumeEqualsAnUninterruptedRun) {
  TempDir dir;
  FakeSource whole;
  ASSERT_TRUE(RunIngest(Options(dir / "whole.ps"), Units(), &whole).ok());
  for (bool deferred : {false, true}) {
    const std::string store = dir / ("r" + std::to_string(deferred) + ".ps");
    FakeSource broken;
    broken.deferred = deferred;
    (deferred ? broken.fail_fill : broken.fail_decode) = {5};
    DriverOptions o = Options(store);
    o.inline_decode = deferred;
    auto r = RunIngest(o, Units(), &broken);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("stopped after 5 new samples"), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().message().find("unit 5"), std::string::npos) << r.status().ToString();
    bool sealed = true;
    EXPECT_EQ(Contents(store, &sealed).size(), 5u);
    EXPECT_FALSE(sealed);
    FakeSource fixed;
    fixed.deferred = deferred;
    r = RunIngest(o, Units(), &fixed);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->samples_present, 5u);
    EXPECT_EQ(r->samples_written, 5u);
    EXPECT_EQ(Contents(store, &sealed), Contents(dir / "whole.ps"));
    EXPECT_TRUE(sealed);
    EXPECT_EQ(fixed.prepared, 1);
  }
}

TEST(IngestDriver, SkipReportsEveryFailureAndLeavesTheStoreOpen) {
  TempDir dir;
  for (bool deferred : {false, true}) {
    const std::string store = dir / ("k" + std::to_string(deferred) + ".ps");
    const std::string report = dir / ("k" + std::to_string(deferred) + ".tsv");
    FakeSource src;
    src.deferred = deferred;
    (deferred ? src.fail_fill : src.fail_decode) = {4};
    DriverOptions o = Options(store);
    o.inline_decode = deferred;
    o.skip_errors = true;
    o.report_path = report;
    std::vector<Progress> progress;
    o.progress = [&](const Progress& p) { progress.push_back(p); };
    auto r = RunIngest(o, Units({1}), &src);  // unit 1 failed while planning
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->samples_written, kUnits - 2);
    EXPECT_EQ(r->samples_failed, 2u);
    EXPECT_EQ(r->report_path, report);
    const auto lines = Lines(report);
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_EQ(lines[0].substr(0, lines[0].find('\t')), "s1");
    EXPECT_NE(lines[0].find("file1\tlisting unit 1: bad"), std::string::npos) << lines[0];
    EXPECT_EQ(lines[1].substr(0, lines[1].find('\t')), "s4");
    bool sealed = true;
    const auto got = Contents(store, &sealed);
    EXPECT_FALSE(sealed);
    EXPECT_EQ(got.size(), kUnits - 2);
    ASSERT_FALSE(progress.empty());
    EXPECT_EQ(progress.back().done, kUnits);
    EXPECT_EQ(progress.back().total, kUnits);
    EXPECT_EQ(progress.back().failed, 2u);
    // The projection is reported once, before the first write.
    EXPECT_FALSE(progress.front().message.empty());
  }
}

TEST(IngestDriver, ShardsSplitTheInputAndKeepEveryShardUnits) {
  TempDir dir;
  std::set<std::string> seen;
  for (uint32_t i = 0; i < 2; ++i) {
    FakeSource src;
    DriverOptions o = Options(dir / ("s" + std::to_string(i) + ".ps"));
    o.shard_index = i;
    o.shard_count = 2;
    o.skip_errors = true;
    std::vector<IngestUnit> units = Units();
    IngestUnit orphan;  // a file that could not be listed: every shard reports it
    orphan.file = "unreadable.h5";
    orphan.status = Status::Corruption("opening 'unreadable.h5': not HDF5");
    orphan.every_shard = true;
    units.push_back(orphan);
    auto r = RunIngest(o, units, &src);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->samples_failed, 1u);
    for (const auto& [id, sum] : Contents(o.store)) EXPECT_TRUE(seen.insert(id).second) << id;
  }
  EXPECT_EQ(seen.size(), kUnits);
  DriverOptions bad = Options(dir / "x.ps");
  bad.shard_index = 2;
  bad.shard_count = 2;
  EXPECT_FALSE(CheckShardOption(bad).ok());
}

}  // namespace
}  // namespace patchstore
