// Crash safety: ingest killed with SIGKILL at random moments never leaves a
// store that fails to open, a record that fails its checksum or a partial
// sample, and a resumed ingest ends with the same content as a clean run.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "patchstore/reader/reader.h"
#include "patchstore/reader/verify.h"
#include "patchstore/store/store.h"
#include "test_util.h"

namespace patchstore {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// id -> (field -> body checksum), read through the public Reader.
std::map<std::string, std::vector<uint64_t>> Content(const std::string& store) {
  std::map<std::string, std::vector<uint64_t>> out;
  auto r = Reader::Open(store);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return out;
  for (uint64_t i = 0; i < (*r)->size(); ++i)
    for (int f = 0; f < (*r)->field_count(); ++f) {
      auto h = (*r)->Header(i, f);
      EXPECT_TRUE(h.ok()) << h.status().ToString();
      out[std::string((*r)->id(i))].push_back(h.ok() ? h->body_checksum : 0);
    }
  return out;
}

// id -> (field -> the whole record's bytes), read through the store-level
// Snapshot (layout- and dtype-agnostic: tiled and compact records too).
std::map<std::string, std::vector<std::string>> RawContent(const std::string& store) {
  std::map<std::string, std::vector<std::string>> out;
  auto snap = Snapshot::Open(store);
  EXPECT_TRUE(snap.ok()) << snap.status().ToString();
  if (!snap.ok()) return out;
  EXPECT_TRUE((*snap)
                  ->ForEachId([&](uint64_t i, std::string_view id) {
                    for (uint16_t f = 0; f < (*snap)->meta().fields.size(); ++f) {
                      auto rec = (*snap)->GetRecord(i, f);
                      EXPECT_TRUE(rec.ok()) << rec.status().ToString();
                      out[std::string(id)].push_back(rec.ok() ? std::string(*rec) : "");
                    }
                    return Status::OK();
                  })
                  .ok());
  return out;
}

// Like StartIngest below, with any extra arguments.
pid_t StartIngestWith(const std::string& manifest, const std::string& store, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {PATCHSTORE_CLI,   "-q", "ingest",    "images", store, "--manifest", manifest,
                                   "--commit-every", "2",  "--threads", "2"};
  args.insert(args.end(), extra.begin(), extra.end());
  pid_t pid = fork();
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(PATCHSTORE_CLI, argv.data());
    _exit(127);
  }
  return pid;
}

pid_t StartIngest(const std::string& manifest, const std::string& store, const char* extra = nullptr) {
  pid_t pid = fork();
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    if (extra)
      execl(PATCHSTORE_CLI, PATCHSTORE_CLI, "-q", "ingest", "images", store.c_str(), "--manifest", manifest.c_str(),
            "--commit-every", "2", "--threads", "2", extra, static_cast<char*>(nullptr));
    else
      execl(PATCHSTORE_CLI, PATCHSTORE_CLI, "-q", "ingest", "images", store.c_str(), "--manifest", manifest.c_str(),
            "--commit-every", "2", "--threads", "2", static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

class CrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir_ / "in");
    std::ofstream m(dir_ / "in/manifest.csv");
    m << "id,rgb,mask\n";
    cv::RNG rng(1);
    for (int i = 0; i < 40; ++i) {
      cv::Mat img(96, 128, CV_8UC3), mask(96, 128, CV_8UC1);
      rng.fill(img, cv::RNG::UNIFORM, 0, 256);
      rng.fill(mask, cv::RNG::UNIFORM, 0, 2);
      const std::string n = std::to_string(i);
      ASSERT_TRUE(cv::imwrite(dir_ / ("in/" + n + ".png"), img));
      ASSERT_TRUE(cv::imwrite(dir_ / ("in/m" + n + ".png"), mask));
      m << "frame/" << n << "," << n << ".png,m" << n << ".png\n";
    }
  }
  TempDir dir_;
};

TEST_F(CrashTest, SigkillAtRandomMomentsLosesNothingCommitted) {
  const std::string manifest = dir_ / "in/manifest.csv";
  // The reference: one uninterrupted run.
  ASSERT_EQ(Wait(StartIngest(manifest, dir_ / "clean.ps")), 0);
  const auto clean = Content(dir_ / "clean.ps");
  ASSERT_EQ(clean.size(), 40u);
  // How long a full run takes, to spread the kills over it.
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(Wait(StartIngest(manifest, dir_ / "timing.ps")), 0);
  const double full_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();

  const int kills = std::getenv("PATCHSTORE_CRASH_KILLS") ? std::atoi(std::getenv("PATCHSTORE_CRASH_KILLS")) : 25;
  std::mt19937 rng(12345);
  int survived = 0, completed_before_kill = 0;
  size_t last = 0;
  for (int k = 0; k < kills; ++k) {
    const std::string store = dir_ / "crash.ps";
    pid_t pid = StartIngest(manifest, store);
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(full_us * (rng() % 1000) / 1000.0)));
    ::kill(pid, SIGKILL);
    int rc = Wait(pid);
    if (rc == 0) ++completed_before_kill;
    if (!fs::exists(store + "/data.mdb")) continue;  // killed before the environment existed
    // Every time: the store opens, verifies, holds only whole samples that
    // equal the clean run's, in the clean run's order.
    auto report = VerifyStore(store);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    ASSERT_TRUE(report->ok()) << report->problems[0].message;
    auto got = Content(store);
    for (const auto& [id, sums] : got) {
      ASSERT_TRUE(clean.count(id)) << id;
      ASSERT_EQ(sums, clean.at(id)) << id;
    }
    EXPECT_GE(got.size(), last);  // the store only grows across kills
    last = got.size();
    ++survived;
  }
  // Resume to completion: the same content as the uninterrupted run.
  ASSERT_EQ(Wait(StartIngest(manifest, dir_ / "crash.ps")), 0);
  EXPECT_EQ(Content(dir_ / "crash.ps"), clean);
  auto r = Reader::Open(dir_ / "crash.ps");
  EXPECT_TRUE((*r)->sealed());
  for (uint64_t i = 0; i < 40; ++i) EXPECT_EQ((*r)->id(i), "frame/" + std::to_string(i));
  std::printf("[ crash ] %d kills survived (%d runs finished first); resumed store equals the clean run\n", survived,
              completed_before_kill);
}

TEST_F(CrashTest, KilledTiledCompactIngestResumesToTheSameBytes) {
  const std::string manifest = dir_ / "in/manifest.csv";
  const std::vector<std::string> opts = {"--layout", "tiles", "--tile-size", "16", "--encoding", "compact"};
  ASSERT_EQ(Wait(StartIngestWith(manifest, dir_ / "clean.ps", opts)), 0);
  const auto clean = RawContent(dir_ / "clean.ps");
  ASSERT_EQ(clean.size(), 40u);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(Wait(StartIngestWith(manifest, dir_ / "timing.ps", opts)), 0);
  const double full_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  std::mt19937 rng(777);
  const std::string store = dir_ / "crash.ps";
  for (int k = 0; k < 8; ++k) {
    pid_t pid = StartIngestWith(manifest, store, opts);
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(full_us * (rng() % 1000) / 1000.0)));
    ::kill(pid, SIGKILL);
    Wait(pid);
    if (!fs::exists(store + "/data.mdb")) continue;
    auto got = RawContent(store);
    for (const auto& [id, recs] : got) {
      ASSERT_TRUE(clean.count(id)) << id;
      ASSERT_EQ(recs, clean.at(id)) << id;  // whole samples, byte for byte
    }
    // A resume with another layout or encoding is refused (exit 1) and
    // leaves the store as it is.
    if (!got.empty()) {
      EXPECT_EQ(Wait(StartIngestWith(manifest, store, {"--encoding", "compact"})), 1);
      EXPECT_EQ(Wait(StartIngestWith(manifest, store, {"--layout", "tiles", "--tile-size", "16"})), 1);
      EXPECT_EQ(RawContent(store), got);
    }
  }
  ASSERT_EQ(Wait(StartIngestWith(manifest, store, opts)), 0);
  EXPECT_EQ(RawContent(store), clean);
}

TEST_F(CrashTest, FileSizeLimitGivesAClearErrorAndKeepsTheLastCommit) {
  // Like a full disk: the process may not grow files past ~1 MB (EFBIG).
  const std::string manifest = dir_ / "in/manifest.csv";
  const std::string store = dir_ / "full.ps";
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {1 << 20, 1 << 20};
    setrlimit(RLIMIT_FSIZE, &lim);
    int fd = open((dir_ / "err.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    execl(PATCHSTORE_CLI, PATCHSTORE_CLI, "-q", "ingest", "images", store.c_str(), "--manifest", manifest.c_str(),
          "--commit-every", "2", static_cast<char*>(nullptr));
    _exit(127);
  }
  EXPECT_EQ(Wait(pid), 1);
  std::ifstream err(dir_ / "err.txt");
  std::string msg((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  EXPECT_NE(msg.find("patchstore: error:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("full.ps"), std::string::npos) << msg;
  auto report = VerifyStore(store);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->ok());
  EXPECT_GT(report->samples, 0u);
  EXPECT_LT(report->samples, 40u);
  // Without the limit, the same command completes the store.
  ASSERT_EQ(Wait(StartIngest(manifest, store)), 0);
  EXPECT_EQ(Content(store).size(), 40u);
}

}  // namespace
}  // namespace patchstore
