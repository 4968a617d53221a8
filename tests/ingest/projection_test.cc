// Issue 29 item 2, "decide before ingest": both ingests report the store's
// projected size next to the machine's RAM before they write
// (ingest/projection.h), and past half of RAM name the flags that serve a
// store read from disk. The projection is checked against the real
// data.mdb: within 3% (it counts LMDB's pages for every record exactly and
// estimates the small B-tree entries).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "encoding_test_util.h"
#include "hdf5_test_util.h"
#include "ingest/projection.h"
#include "patchstore/ingest/ingest_hdf5.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::TempDir;

constexpr double kTolerance = 0.03;

// PATCHSTORE_ASSUME_RAM_BYTES for the life of the object.
class AssumeRam {
 public:
  explicit AssumeRam(uint64_t bytes) { ::setenv("PATCHSTORE_ASSUME_RAM_BYTES", std::to_string(bytes).c_str(), 1); }
  ~AssumeRam() { ::unsetenv("PATCHSTORE_ASSUME_RAM_BYTES"); }
};

uint64_t StoreBytes(const std::string& store) {
  return std::filesystem::file_size(std::filesystem::path(store) / "data.mdb");
}

struct IngestRun {
  IngestSummary summary;
  std::vector<std::string> messages;
  size_t steps_before_message = 0;  // progress steps reported before the first notice
};

IngestRun Ingest(ImageIngestOptions o) {
  IngestRun run;
  o.progress = [&run](const Progress& p) {
    if (!p.message.empty()) run.messages.push_back(p.message);
    else if (run.messages.empty()) ++run.steps_before_message;
  };
  auto r = IngestImages(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (r.ok()) run.summary = *r;
  return run;
}

TEST(Projection, ImageIngestProjectsTheStoreSizeBeforeItWrites) {
  TempDir dir;
  const std::string manifest = testing::MakeFrames(dir / "in", 6);
  struct Case {
    std::string name, layout;
    std::vector<std::string> encoding;
  };
  for (const Case& c : {Case{"rows-f32", "rows", {}}, Case{"tiles-compact", "tiles", {"compact"}},
                        Case{"tiles-half", "tiles", {"compact", "depth=float16"}}}) {
    SCOPED_TRACE(c.name);
    auto o = testing::Options(manifest, dir / (c.name + ".ps"));
    o.layout = c.layout;
    o.tile_size = 16;
    o.encoding = c.encoding;
    AssumeRam ram(uint64_t{64} << 30);
    IngestRun run = Ingest(o);
    ASSERT_EQ(run.messages.size(), 1u);
    EXPECT_EQ(run.steps_before_message, 0u) << "the projection comes before the first sample is written";
    const double real = static_cast<double>(StoreBytes(o.store));
    const double projected = static_cast<double>(run.summary.projected_bytes);
    EXPECT_NEAR(projected / real, 1.0, kTolerance) << projected << " projected, " << real << " written";
    EXPECT_EQ(run.summary.ram_bytes, uint64_t{64} << 30);
    EXPECT_EQ(run.summary.advice, "");
    EXPECT_NE(run.messages[0].find("ingest: projected store size " + FormatBytes(projected) + " (6 samples of "),
              std::string::npos)
        << run.messages[0];
    EXPECT_NE(run.messages[0].find("RAM 64.0 GiB: fits the page cache"), std::string::npos) << run.messages[0];
  }
}

TEST(Projection, FullHdFramesProjectWithinTolerance) {
  // Frames of the size the advice is for: 1080 x 1920 rgb + mask + depth.
  TempDir dir;
  std::filesystem::create_directories(dir / "in");
  std::ofstream m(dir / "in/manifest.csv");
  m << "id,rgb,mask,depth\n";
  cv::RNG rng(1);
  for (int i = 0; i < 3; ++i) {
    cv::Mat rgb(1080, 1920, CV_8UC3), mask(1080, 1920, CV_8UC1), depth(1080, 1920, CV_32F);
    rng.fill(rgb, cv::RNG::UNIFORM, 0, 256);
    rng.fill(mask, cv::RNG::UNIFORM, 0, 2);
    rng.fill(depth, cv::RNG::UNIFORM, 0.f, 100.f);
    const std::string s = std::to_string(i);
    testing::CheckWrite(cv::imwrite(dir / ("in/a" + s + ".png"), rgb));
    testing::CheckWrite(cv::imwrite(dir / ("in/m" + s + ".png"), mask));
    testing::WriteExr(dir / ("in/d" + s + ".exr"), depth, Imf::FLOAT);
    m << "video/" << s << ",a" << s << ".png,m" << s << ".png,d" << s << ".exr\n";
  }
  m.close();
  // 60 MiB: neither the rows store (~100 MB) nor the tiled compact one (~36 MB) takes at most half.
  AssumeRam ram(uint64_t{60} << 20);
  auto o = testing::Options(dir / "in/manifest.csv", dir / "rows.ps");
  IngestRun rows = Ingest(o);
  EXPECT_NEAR(static_cast<double>(rows.summary.projected_bytes) / StoreBytes(o.store), 1.0, kTolerance);
  ASSERT_EQ(rows.summary.advice, "--layout tiles --encoding compact --encoding depth=float16");
  ASSERT_EQ(rows.messages.size(), 1u);
  EXPECT_NE(rows.messages[0].find("more than half of RAM"), std::string::npos) << rows.messages[0];
  EXPECT_NE(rows.messages[0].find("served best by --layout tiles --encoding compact --encoding depth=float16 "
                                  "(float16 where half precision is enough)"),
            std::string::npos)
      << rows.messages[0];
  // The advice's own projection is what those flags write.
  auto t = testing::Options(dir / "in/manifest.csv", dir / "tiles.ps");
  t.layout = "tiles";
  t.encoding = {"compact", "depth=float16"};
  IngestRun tiles = Ingest(t);
  EXPECT_NEAR(static_cast<double>(tiles.summary.projected_bytes) / StoreBytes(t.store), 1.0, kTolerance);
  EXPECT_NE(rows.messages[0].find(": " + FormatBytes(static_cast<double>(tiles.summary.projected_bytes)) +
                                  " with those flags"),
            std::string::npos)
      << rows.messages[0];
  EXPECT_EQ(tiles.summary.advice, "");
  EXPECT_NE(tiles.messages[0].find("already the ones for that"), std::string::npos) << tiles.messages[0];
}

TEST(Projection, AdviceNamesOnlyTheFlagsNotGiven) {
  TempDir dir;
  const std::string manifest = testing::MakeFrames(dir / "in", 3);
  AssumeRam ram(1000);  // a tiny machine: nothing fits
  {
    IngestRun run = Ingest(testing::Options(manifest, dir / "a.ps"));
    // zh (a half EXR) is float16 under compact; depth (float32 EXR) stays float32 there.
    EXPECT_EQ(run.summary.advice, "--layout tiles --encoding compact --encoding depth=float16");
    EXPECT_EQ(run.summary.ram_bytes, 1000u);
  }
  {
    auto o = testing::Options(manifest, dir / "b.ps");
    o.encoding = {"compact"};
    EXPECT_EQ(Ingest(o).summary.advice, "--layout tiles --encoding depth=float16");
  }
  {
    auto o = testing::Options(manifest, dir / "c.ps");
    o.layout = "tiles";
    EXPECT_EQ(Ingest(o).summary.advice, "--encoding compact --encoding depth=float16");
  }
}

TEST(Projection, VolumeIngestProjectsFromTheDatasetHeaders) {
  TempDir dir;
  const std::string h5 = dir / "v.h5";
  {
    testing::H5Out f(h5);
    ASSERT_TRUE(f.ok());
    for (int p = 0; p < 3; ++p) {
      const std::vector<hsize_t> d{96, 90, 30u + p};  // volumes of different sizes
      const size_t n = d[0] * d[1] * d[2];
      auto mr = testing::RandomValues<int16_t>(n, p, -1000, 3000);
      auto ct = testing::RandomValues<float>(n, p + 10, -1000, 3000);
      const std::string id = "p" + std::to_string(p);
      ASSERT_TRUE(f.Write("/MR/" + id, H5T_STD_I16LE, H5T_NATIVE_INT16, d, mr.data()));
      ASSERT_TRUE(f.Write("/CT/" + id, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, d, ct.data()));
    }
  }
  AssumeRam ram(4096);
  Hdf5IngestOptions o;
  o.files = {h5};
  o.store = dir / "v.ps";
  o.groups = {"MR", "CT"};
  o.durable = false;
  std::vector<std::string> messages;
  size_t steps_before = 0;
  o.progress = [&](const Progress& p) {
    if (!p.message.empty()) messages.push_back(p.message);
    else if (messages.empty()) ++steps_before;
  };
  auto r = IngestHdf5(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(steps_before, 0u);
  EXPECT_NEAR(static_cast<double>(r->projected_bytes) / StoreBytes(o.store), 1.0, kTolerance);
  // Volumes are rows only: no --layout tiles in the advice.
  EXPECT_EQ(r->advice, "--encoding compact --encoding CT=float16");
  EXPECT_NE(messages[0].find("(3 samples of "), std::string::npos) << messages[0];
}

TEST(Projection, RamFigureComesFromTheEnvironmentOrTheMachine) {
  {
    AssumeRam ram(123456789);
    EXPECT_EQ(MachineRamBytes(), 123456789u);
  }
  const uint64_t machine = MachineRamBytes();
  EXPECT_GT(machine, uint64_t{64} << 20);
  for (const char* bad : {"", "0", "12x", "-5"}) {
    ::setenv("PATCHSTORE_ASSUME_RAM_BYTES", bad, 1);
    EXPECT_EQ(MachineRamBytes(), machine) << "'" << bad << "' is not a RAM figure: the machine's is used";
  }
  ::unsetenv("PATCHSTORE_ASSUME_RAM_BYTES");
}

TEST(Projection, TheCommandLinePrintsItUnlessQuiet) {
  TempDir dir;
  const std::string manifest = testing::MakeFrames(dir / "in", 2);
  const std::string cli = std::string("PATCHSTORE_ASSUME_RAM_BYTES=1000 ") + PATCHSTORE_CLI;
  std::string out;
  ASSERT_EQ(testing::RunCommand(cli + " ingest images " + (dir / "a.ps") + " --manifest " + manifest +
                                    " --in-process --no-sync 2>&1",
                                &out),
            0)
      << out;
  EXPECT_NE(out.find("ingest: projected store size "), std::string::npos) << out;
  EXPECT_NE(out.find("served best by --layout tiles --encoding compact"), std::string::npos) << out;
  ASSERT_EQ(testing::RunCommand(cli + " --quiet ingest images " + (dir / "b.ps") + " --manifest " + manifest +
                                    " --in-process --no-sync 2>&1",
                                &out),
            0)
      << out;
  EXPECT_EQ(out.find("projected"), std::string::npos) << out;
}

}  // namespace
}  // namespace patchstore
