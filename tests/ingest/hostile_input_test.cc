// Bad inputs: corrupt, truncated and hostile PNG, JPEG and EXR files give a
// clear error naming the file within seconds and bounded memory; a stalled or
// crashed decoder is contained; --on-error skip goes on; abort keeps the store.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ImfChannelList.h>
#include <ImfFrameBuffer.h>
#include <ImfHeader.h>
#include <ImfOutputFile.h>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "patchstore/ingest/ingest.h"
#include "patchstore/reader/reader.h"
#include "patchstore/reader/verify.h"
#include "test_util.h"

namespace patchstore {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

std::string ReadAll(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
void WriteAll(const std::string& p, const std::string& b) { std::ofstream(p, std::ios::binary) << b; }

void WriteExr(const std::string& path, int W, int H) {
  Imf::Header header(W, H);
  header.channels().insert("Z", Imf::Channel(Imf::FLOAT));
  std::vector<float> z(static_cast<size_t>(W) * H, 1.5f);
  Imf::FrameBuffer fb;
  fb.insert("Z", Imf::Slice(Imf::FLOAT, reinterpret_cast<char*>(z.data()), 4, 4 * W));
  Imf::OutputFile out(path.c_str(), header);
  out.setFrameBuffer(fb);
  out.writePixels(H);
}

// Runs the CLI; returns exit code, fills output; reports the child's peak RSS (KiB)
// including its decoder processes, and wall seconds.
int RunCli(const std::vector<std::string>& args, std::string* out, long* max_rss_kb, double* seconds) {
  const std::string log = testing::TempDir().path() + ".log";
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(PATCHSTORE_CLI));
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(PATCHSTORE_CLI, argv.data());
    _exit(127);
  }
  int status = 0;
  struct rusage ru {};
  wait4(pid, &status, 0, &ru);
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  struct rusage children {};
  getrusage(RUSAGE_CHILDREN, &children);
  *max_rss_kb = std::max(ru.ru_maxrss, children.ru_maxrss);
  *out = ReadAll(log);
  std::remove(log.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class HostileInput : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir_ / "in");
    cv::Mat img(48, 64, CV_8UC3), mask(48, 64, CV_8UC1);
    cv::RNG rng(3);
    rng.fill(img, cv::RNG::UNIFORM, 0, 256);
    rng.fill(mask, cv::RNG::UNIFORM, 0, 2);
    ASSERT_TRUE(cv::imwrite(dir_ / "in/good.png", img));
    ASSERT_TRUE(cv::imwrite(dir_ / "in/good.jpg", img));
    WriteExr(dir_ / "in/good.exr", 64, 48);
  }
  TempDir dir_;
};

TEST_F(HostileInput, FlippedAndCutFilesFailCleanlyAndSkipGoesOn) {
  std::mt19937 rng(99);
  std::ofstream manifest(dir_ / "in/manifest.csv");
  manifest << "id,x\n";
  int files = 0;
  for (const char* src : {"good.png", "good.jpg", "good.exr"}) {
    const std::string good = ReadAll(dir_ / (std::string("in/") + src));
    const std::string ext = fs::path(src).extension().string();
    for (int i = 0; i < 40; ++i) {
      std::string bad = good;
      if (i % 2 == 0) {
        bad = bad.substr(0, rng() % bad.size());  // truncated
      } else {
        for (int k = 0; k < 1 + i % 7; ++k) bad[rng() % bad.size()] ^= static_cast<char>(1 << (rng() % 8));
      }
      const std::string name = "bad" + std::to_string(files) + ext;
      WriteAll(dir_ / ("in/" + name), bad);
      manifest << "b" << files << "," << name << "\n";
      ++files;
    }
  }
  manifest << "last,good.png\n";
  manifest.close();
  std::string out;
  long rss = 0;
  double secs = 0;
  int rc = RunCli({"-q", "ingest", "images", dir_ / "s.ps", "--manifest", dir_ / "in/manifest.csv", "--on-error",
                   "skip", "--no-sync"},
                  &out, &rss, &secs);
  ASSERT_EQ(rc, 0) << out;
  auto r = Reader::Open(dir_ / "s.ps");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE((*r)->Find("last").ok());  // the ingest went on to the end
  EXPECT_TRUE(VerifyStore(dir_ / "s.ps")->ok());
  // Every failure is in the report with its file name.
  std::ifstream rep(dir_ / "s.ps/ingest-errors.tsv");
  std::string line;
  int failed = 0;
  while (std::getline(rep, line)) {
    ++failed;
    EXPECT_NE(line.find("/in/bad"), std::string::npos) << line;
  }
  EXPECT_EQ(static_cast<uint64_t>(failed) + (*r)->size(), static_cast<uint64_t>(files) + 1);
  EXPECT_GT(failed, files / 2);
  EXPECT_LT(secs, 60.0);
  std::printf("[ hostile ] %d damaged PNG/JPEG/EXR files: %d refused with their name, %llu decoded anyway "
              "(harmless flips), %.1f s, peak RSS %ld MiB\n",
              files, failed, static_cast<unsigned long long>((*r)->size() - 1), secs, rss / 1024);
}

TEST_F(HostileInput, AbsurdDeclaredSizesAreRefusedBeforeAllocating) {
  // A PNG whose header declares 60000 x 60000 (its CRC fixed), and the EXR
  // data window stretched to 2,000,000 x 2,000,000.
  std::string png = ReadAll(dir_ / "in/good.png");
  auto put32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) png[at + i] = static_cast<char>(v >> (24 - 8 * i));
  };
  put32(16, 60000);
  put32(20, 60000);
  uint32_t crc = 0xffffffffu;
  for (size_t i = 12; i < 29; ++i) {
    crc ^= static_cast<uint8_t>(png[i]);
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  put32(29, ~crc);
  WriteAll(dir_ / "in/huge.png", png);
  std::string exr = ReadAll(dir_ / "in/good.exr");
  for (const char* attr : {"dataWindow", "displayWindow"}) {
    size_t at = exr.find(std::string(attr) + std::string("\0box2i\0", 7));
    ASSERT_NE(at, std::string::npos);
    at += std::strlen(attr) + 7 + 4;
    int32_t box[4] = {0, 0, 1999999, 1999999};
    std::memcpy(exr.data() + at, box, 16);
  }
  WriteAll(dir_ / "in/huge.exr", exr);
  for (const char* f : {"huge.png", "huge.exr"}) {
    std::ofstream(dir_ / "in/m.csv") << "id,x\nh," << f << "\n";
    std::string out;
    long rss = 0;
    double secs = 0;
    int rc = RunCli({"-q", "ingest", "images", dir_ / "h.ps", "--manifest", dir_ / "in/m.csv"}, &out, &rss, &secs);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find(f), std::string::npos) << out;
    EXPECT_LT(rss, 512 * 1024) << f;  // well under the gigabytes the header asks for
    EXPECT_LT(secs, 10.0) << f;
    std::printf("[ hostile ] %s: refused in %.2f s, peak RSS %ld MiB: %s", f, secs, rss / 1024,
                out.substr(out.find("error:")).c_str());
  }
}

TEST_F(HostileInput, WrongChannelCountsNameTheFile) {
  cv::Mat gray(48, 64, CV_8UC1, cv::Scalar(7));
  ASSERT_TRUE(cv::imwrite(dir_ / "in/gray.png", gray));
  ImageIngestOptions o;
  o.store = dir_ / "c.ps";
  o.manifest = dir_ / "in/m2.csv";
  o.durable = false;
  std::ofstream(o.manifest) << "id,rgb\na,good.png\nb,gray.png\n";
  auto r = IngestImages(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("gray.png"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("3 channels in the store but 1"), std::string::npos) << r.status().message();
  auto store = Reader::Open(o.store);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->size(), 1u);  // the sample before it is intact
}

TEST_F(HostileInput, AStalledDecoderTimesOutAndACrashedOneIsContained) {
  // A FIFO never delivers its bytes: the decoder stalls on it.
  ASSERT_EQ(mkfifo((dir_ / "in/stall.png").c_str(), 0644), 0);
  ImageIngestOptions o;
  o.store = dir_ / "t.ps";
  o.manifest = dir_ / "in/m3.csv";
  o.decode_timeout_s = 1.0;
  o.skip_errors = true;
  o.durable = false;
  std::ofstream(o.manifest) << "id,x\na,good.png\nstuck,stall.png\nb,good.png\n";
  const auto t0 = std::chrono::steady_clock::now();
  auto r = IngestImages(o);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->samples_written, 2u);
  ASSERT_EQ(r->errors.size(), 1u);
  EXPECT_NE(r->errors[0].find("stall.png"), std::string::npos) << r->errors[0];
  EXPECT_NE(r->errors[0].find("timeout"), std::string::npos) << r->errors[0];
  EXPECT_LT(secs, 10.0);

  // A decoder killed by a signal mid-file (as a segfaulting library would be).
  ASSERT_EQ(mkfifo((dir_ / "in/crash.png").c_str(), 0644), 0);
  std::ofstream(dir_ / "in/m4.csv") << "id,x\nc,crash.png\nd,good.png\n";
  o.store = dir_ / "k.ps";
  o.manifest = dir_ / "in/m4.csv";
  o.decode_timeout_s = 30;
  o.threads = 1;
  std::thread killer([&] {
    // The decoder is our child process; once it is blocked on the FIFO, crash it.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    for (auto& p : fs::directory_iterator("/proc")) {
      const std::string name = p.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream stat(p.path() / "stat");
      std::string line;
      std::getline(stat, line);
      size_t close = line.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream rest(line.substr(close + 2));
      char state;
      int ppid = 0;
      rest >> state >> ppid;
      if (ppid == getpid()) kill(std::stoi(name), SIGSEGV);
    }
  });
  auto k = IngestImages(o);
  killer.join();
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(k->samples_written, 1u);  // the next file decoded in a fresh decoder
  ASSERT_EQ(k->errors.size(), 1u);
  EXPECT_NE(k->errors[0].find("crash.png"), std::string::npos) << k->errors[0];
  EXPECT_NE(k->errors[0].find("crashed"), std::string::npos) << k->errors[0];
}

}  // namespace
}  // namespace patchstore
