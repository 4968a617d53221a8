#include <gtest/gtest.h>

#include <ImfChannelList.h>
#include <ImfFrameBuffer.h>
#include <ImfHeader.h>
#include <ImfInputFile.h>
#include <ImfOutputFile.h>
#include <ImfTileDescriptionAttribute.h>
#include <ImfTiledOutputFile.h>
#include <half.h>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "patchstore/ingest/ingest.h"
#include "patchstore/reader/reader.h"
#include "patchstore/reader/verify.h"
#include "test_util.h"

namespace patchstore {
namespace {

namespace fs = std::filesystem;
using testing::RunCommand;
using testing::TempDir;

cv::Mat RandomImage(int h, int w, int type, uint32_t seed) {
  cv::Mat m(h, w, type);
  cv::RNG rng(seed);
  if (CV_MAT_DEPTH(type) == CV_8U) rng.fill(m, cv::RNG::UNIFORM, 0, 256);
  else rng.fill(m, cv::RNG::UNIFORM, 0, 65536);
  return m;
}

void WriteExr(const std::string& path, const std::vector<std::string>& names, const std::vector<cv::Mat>& planes,
              Imf::PixelType type, Imf::Compression comp = Imf::ZIP_COMPRESSION, bool tiled = false) {
  const int H = planes[0].rows, W = planes[0].cols;
  Imf::Header header(W, H);
  header.compression() = comp;
  for (const auto& n : names) header.channels().insert(n, Imf::Channel(type));
  std::vector<std::vector<half>> halves(planes.size());
  Imf::FrameBuffer fb;
  for (size_t c = 0; c < planes.size(); ++c) {
    if (type == Imf::HALF) {
      halves[c].resize(static_cast<size_t>(H) * W);
      for (int i = 0; i < H * W; ++i) halves[c][i] = half(planes[c].ptr<float>()[i]);
      fb.insert(names[c],
                Imf::Slice(Imf::HALF, reinterpret_cast<char*>(halves[c].data()), sizeof(half), sizeof(half) * W));
    } else {
      fb.insert(names[c], Imf::Slice(Imf::FLOAT, reinterpret_cast<char*>(const_cast<float*>(planes[c].ptr<float>())),
                                     sizeof(float), sizeof(float) * W));
    }
  }
  if (tiled) {
    header.setTileDescription(Imf::TileDescription(16, 16, Imf::ONE_LEVEL));
    Imf::TiledOutputFile out(path.c_str(), header);
    out.setFrameBuffer(fb);
    out.writeTiles(0, out.numXTiles() - 1, 0, out.numYTiles() - 1);
  } else {
    Imf::OutputFile out(path.c_str(), header);
    out.setFrameBuffer(fb);
    out.writePixels(H);
  }
}

// Reads channel `name` of an EXR as float (the library's own decode).
cv::Mat ReadExrChannel(const std::string& path, const std::string& name) {
  Imf::InputFile in(path.c_str());
  auto dw = in.header().dataWindow();
  const int W = dw.max.x - dw.min.x + 1, H = dw.max.y - dw.min.y + 1;
  cv::Mat m(H, W, CV_32F);
  Imf::FrameBuffer fb;
  fb.insert(name, Imf::Slice(Imf::FLOAT, reinterpret_cast<char*>(m.ptr<float>()), 4, 4 * W));
  in.setFrameBuffer(fb);
  in.readPixels(dw.min.y, dw.max.y);
  return m;
}

cv::Mat FloatPlane(int h, int w, uint32_t seed, bool specials = false) {
  cv::Mat m(h, w, CV_32F);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1000.f, 1000.f);
  for (int i = 0; i < h * w; ++i) m.ptr<float>()[i] = d(rng);
  if (specials) {
    m.ptr<float>()[0] = NAN;
    m.ptr<float>()[1] = INFINITY;
    m.ptr<float>()[2] = -INFINITY;
    m.ptr<float>()[3] = -0.0f;
    m.ptr<float>()[4] = 1e-42f;  // denormal
  }
  return m;
}

void WriteFile(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

class ImageIngest : public ::testing::Test {
 protected:
  void SetUp() override { fs::create_directories(dir_ / "in"); }
  std::string Ingest(const std::string& manifest_text, bool skip = false, Status* status = nullptr) {
    WriteFile(dir_ / "in/manifest.csv", manifest_text);
    ImageIngestOptions o;
    o.store = dir_ / "s.ps";
    o.manifest = dir_ / "in/manifest.csv";
    o.durable = false;
    o.skip_errors = skip;
    o.threads = 2;
    auto r = IngestImages(o);
    if (status) *status = r.status();
    else EXPECT_TRUE(r.ok()) << r.status().ToString();
    return o.store;
  }
  TempDir dir_;
};

TEST_F(ImageIngest, EightBitRgbPngIsStoredInRgbOrderWithTheSeedNormalisation) {
  cv::Mat bgr = RandomImage(30, 41, CV_8UC3, 1);
  cv::Mat mask = RandomImage(30, 41, CV_8UC1, 2);
  mask.setTo(0, mask < 128);
  ASSERT_TRUE(cv::imwrite(dir_ / "in/a.png", bgr));
  ASSERT_TRUE(cv::imwrite(dir_ / "in/m.png", mask));
  auto store = Ingest("id,rgb,mask\nframe/1,a.png,m.png\n");
  auto r = Reader::Open(store);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE((*r)->sealed());
  auto v = (*r)->Get(0, 0);
  ASSERT_TRUE(v.ok());
  ASSERT_EQ(v->shape[0], 3);
  for (int y = 0; y < 30; ++y)
    for (int x = 0; x < 41; ++x)
      for (int c = 0; c < 3; ++c) {
        uint8_t raw = bgr.at<cv::Vec3b>(y, x)[2 - c];  // RGB order
        float expect = static_cast<float>(raw) / 255.0f * 2.0f - 1.0f;
        ASSERT_EQ(v->data_as<float>()[(c * 30 + y) * 41 + x], expect);
      }
  auto m = (*r)->Get(0, 1);
  for (int y = 0; y < 30; ++y)
    for (int x = 0; x < 41; ++x) ASSERT_EQ(m->data_as<float>()[y * 41 + x], mask.at<uint8_t>(y, x) ? 1.0f : 0.0f);
  EXPECT_TRUE((*r)->field(1).is_mask);
  EXPECT_EQ((*r)->field(0).channel_names, "R,G,B");
}

TEST_F(ImageIngest, PngRoundTripsArePixelIdentical) {
  struct Case {
    const char* name;
    int type;
  } cases[] = {{"g8", CV_8UC1},   {"rgb8", CV_8UC3},   {"rgba8", CV_8UC4},
               {"g16", CV_16UC1}, {"rgb16", CV_16UC3}, {"rgba16", CV_16UC4}};
  std::string manifest = "id";
  for (auto& c : cases) manifest += std::string(",") + c.name;
  manifest += "\nx";
  uint32_t seed = 10;
  for (auto& c : cases) {
    ASSERT_TRUE(cv::imwrite(dir_ / (std::string("in/") + c.name + ".png"), RandomImage(17, 23, c.type, seed++)));
    manifest += std::string(",") + c.name + ".png";
  }
  auto store = Ingest(manifest + "\n");
  ExportOptions eo;
  eo.store = store;
  eo.outdir = dir_ / "out";
  auto ex = Export(eo);
  ASSERT_TRUE(ex.ok()) << ex.status().ToString();
  EXPECT_EQ(ex->files_written, 6u);
  for (auto& c : cases) {
    cv::Mat src = cv::imread(dir_ / (std::string("in/") + c.name + ".png"), cv::IMREAD_UNCHANGED);
    cv::Mat out = cv::imread(dir_ / (std::string("out/x/") + c.name + ".png"), cv::IMREAD_UNCHANGED);
    ASSERT_FALSE(out.empty()) << c.name;
    ASSERT_EQ(src.type(), out.type()) << c.name;
    EXPECT_EQ(cv::norm(src, out, cv::NORM_INF), 0.0) << c.name;
  }
}

TEST_F(ImageIngest, FloatAndHalfExrRoundTripBitExactly) {
  const int H = 19, W = 33;
  std::vector<cv::Mat> f = {FloatPlane(H, W, 5, true)};
  std::vector<cv::Mat> rgb = {FloatPlane(H, W, 6), FloatPlane(H, W, 7), FloatPlane(H, W, 8)};
  WriteExr(dir_ / "in/depth.exr", {"Z"}, f, Imf::FLOAT);
  WriteExr(dir_ / "in/half.exr", {"B", "G", "R"}, rgb, Imf::HALF, Imf::PIZ_COMPRESSION);
  WriteExr(dir_ / "in/tiled.exr", {"Y"}, f, Imf::FLOAT, Imf::RLE_COMPRESSION, /*tiled=*/true);
  WriteExr(dir_ / "in/multi.exr", {"Z", "alpha", "N"}, {f[0], rgb[0], rgb[1]}, Imf::FLOAT, Imf::ZIPS_COMPRESSION);
  auto store = Ingest("id,depth,color,tiled,pick\nx,depth.exr,half.exr,tiled.exr,multi.exr:alpha\n");
  auto r = Reader::Open(store);
  ASSERT_TRUE(r.ok());
  auto check = [&](int field, int c, const cv::Mat& expect) {
    auto v = (*r)->Get(0, field);
    ASSERT_TRUE(v.ok());
    ASSERT_EQ(0, std::memcmp(v->data_as<float>() + c * H * W, expect.ptr<float>(), sizeof(float) * H * W))
        << "field " << field << " channel " << c;
  };
  check(0, 0, f[0]);
  // Channels come out in R, G, B order, with the library's half->float values.
  EXPECT_EQ((*r)->field(1).channel_names, "R,G,B");
  EXPECT_EQ((*r)->field(1).source_type, SourceType::kFloat16);
  check(1, 0, ReadExrChannel(dir_ / "in/half.exr", "R"));
  check(1, 2, ReadExrChannel(dir_ / "in/half.exr", "B"));
  check(2, 0, f[0]);
  EXPECT_EQ((*r)->field(3).channels, 1u);
  check(3, 0, rgb[0]);

  ExportOptions eo;
  eo.store = store;
  eo.outdir = dir_ / "out";
  ASSERT_TRUE(Export(eo).ok());
  cv::Mat back = ReadExrChannel(dir_ / "out/x/depth.exr", "Z");
  EXPECT_EQ(0, std::memcmp(back.ptr<float>(), f[0].ptr<float>(), sizeof(float) * H * W));  // NaN, Inf too
  cv::Mat backr = ReadExrChannel(dir_ / "out/x/color.exr", "R");
  EXPECT_EQ(0, std::memcmp(backr.ptr<float>(), ReadExrChannel(dir_ / "in/half.exr", "R").ptr<float>(), 4 * H * W));
}

TEST_F(ImageIngest, MismatchedFieldSizesNameBothFiles) {
  ASSERT_TRUE(cv::imwrite(dir_ / "in/a.png", RandomImage(10, 12, CV_8UC3, 1)));
  ASSERT_TRUE(cv::imwrite(dir_ / "in/b.png", RandomImage(11, 12, CV_8UC1, 2)));
  Status st;
  Ingest("id,rgb,mask\nq,a.png,b.png\n", false, &st);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("a.png' is 12x10"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("b.png' is 12x11"), std::string::npos) << st.message();
}

TEST_F(ImageIngest, CorruptInputStopsKeepingEarlierSamplesAndResumeCompletesIdentically) {
  for (int i = 0; i < 6; ++i)
    ASSERT_TRUE(cv::imwrite(dir_ / ("in/" + std::to_string(i) + ".png"), RandomImage(8, 9, CV_8UC3, 100 + i)));
  // Frame 4 is truncated.
  std::string good;
  {
    std::ifstream f(dir_ / "in/4.png", std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  WriteFile(dir_ / "in/4.png", good.substr(0, good.size() / 2));
  std::string manifest = "id,rgb\n";
  for (int i = 0; i < 6; ++i) manifest += "f" + std::to_string(i) + "," + std::to_string(i) + ".png\n";
  Status st;
  auto store = Ingest(manifest, false, &st);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("4.png"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("'f4'"), std::string::npos) << st.message();
  {
    auto r = Reader::Open(store);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ((*r)->size(), 4u);  // f0..f3 committed, nothing partial
    EXPECT_FALSE((*r)->sealed());
    EXPECT_TRUE(VerifyStore(store)->ok());
  }
  // Skip mode goes on and reports the failure.
  Ingest(manifest, true, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  {
    auto r = Reader::Open(store);
    EXPECT_EQ((*r)->size(), 5u);
    EXPECT_FALSE((*r)->sealed());
    std::ifstream rep(store + "/ingest-errors.tsv");
    std::string line;
    std::getline(rep, line);
    EXPECT_EQ(line.rfind("f4\t", 0), 0u) << line;
  }
  // Fix the file and resume: all six, sealed, same content as one clean run.
  WriteFile(dir_ / "in/4.png", good);
  Ingest(manifest, false, &st);
  ASSERT_TRUE(st.ok());
  auto resumed = Reader::Open(store);
  ASSERT_EQ((*resumed)->size(), 6u);
  EXPECT_TRUE((*resumed)->sealed());
  fs::rename(dir_ / "s.ps", dir_ / "resumed.ps");
  Ingest(manifest, false, &st);
  auto clean = Reader::Open(dir_ / "s.ps");
  resumed = Reader::Open(dir_ / "resumed.ps");
  for (int i = 0; i < 6; ++i) {
    const std::string id = "f" + std::to_string(i);
    auto a = (*clean)->Get(*(*clean)->Find(id), 0);
    auto b = (*resumed)->Get(*(*resumed)->Find(id), 0);
    EXPECT_EQ(0, std::memcmp(a->data, b->data, 4 * 3 * 8 * 9)) << id;
    EXPECT_EQ((*clean)->Header(*(*clean)->Find(id), 0)->body_checksum,
              (*resumed)->Header(*(*resumed)->Find(id), 0)->body_checksum);
  }
}

TEST_F(ImageIngest, MissingAndGarbageFilesAreNamed) {
  WriteFile(dir_ / "in/junk.png", "this is not a png");
  WriteFile(dir_ / "in/junk.exr", std::string("\x76\x2f\x31\x01garbage", 11));
  for (const char* cell : {"nothere.png", "junk.png", "junk.exr"}) {
    Status st;
    Ingest(std::string("id,x\na,") + cell + "\n", false, &st);
    ASSERT_FALSE(st.ok()) << cell;
    EXPECT_NE(st.message().find(cell), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("'a'"), std::string::npos) << st.message();
  }
}

TEST_F(ImageIngest, TemplatesFindTheSeedLayout) {
  for (const char* video : {"video01", "video00"})
    for (const char* frame : {"0002", "0001"}) {
      fs::create_directories(dir_ / (std::string("root/") + video + "/render/rgb"));
      fs::create_directories(dir_ / (std::string("root/") + video + "/render/masks"));
      ASSERT_TRUE(cv::imwrite(dir_ / (std::string("root/") + video + "/render/rgb/" + frame + ".png"),
                              RandomImage(6, 7, CV_8UC3, 1)));
      ASSERT_TRUE(cv::imwrite(dir_ / (std::string("root/") + video + "/render/masks/" + frame + ".png"),
                              RandomImage(6, 7, CV_8UC1, 2)));
    }
  ImageIngestOptions o;
  o.store = dir_ / "t.ps";
  o.root = dir_ / "root";
  o.field_templates = {{"rgb", "{video}/render/rgb/{frame}.png"}, {"mask", "{video}/render/masks/{frame}.png"}};
  o.durable = false;
  auto s = IngestImages(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->samples_written, 4u);
  auto r = Reader::Open(o.store);
  ASSERT_EQ((*r)->size(), 4u);
  EXPECT_EQ((*r)->id(0), "video00/0001");
  EXPECT_EQ((*r)->id(3), "video01/0002");
  // A second run resumes and writes nothing.
  auto again = IngestImages(o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->samples_written, 0u);
  EXPECT_EQ(again->samples_present, 4u);
}

TEST(SafeRelativePath, NeverLeavesTheOutputFolder) {
  EXPECT_EQ(SafeRelativePath("video03/0042"), "video03/0042");
  EXPECT_EQ(SafeRelativePath("../x"), "%2E%2E/x");
  EXPECT_EQ(SafeRelativePath("/etc/passwd"), "%/etc/passwd");
  EXPECT_EQ(SafeRelativePath("a//b"), "a/%/b");
  EXPECT_EQ(SafeRelativePath("."), "%2E");
  EXPECT_EQ(SafeRelativePath(std::string("n\0l\n\xff", 5)), "n%00l%0A%FF");
  EXPECT_EQ(SafeRelativePath("a b%"), "a%20b%25");
  std::string longpart(4096, 'x');
  std::string enc = SafeRelativePath(longpart);
  EXPECT_LE(enc.size(), 200u);
  EXPECT_NE(SafeRelativePath(longpart + "y"), enc);
  for (const std::string id : {"../../a", "a/../../b", "/", "..", "x/./y"}) {
    fs::path p = fs::path("/out") / SafeRelativePath(id);
    auto norm = p.lexically_normal().string();
    EXPECT_EQ(norm.rfind("/out/", 0), 0u) << id << " -> " << norm;
  }
}

TEST_F(ImageIngest, CliVerifyNamesAFlippedRecordAndExportStaysInside) {
  ASSERT_TRUE(cv::imwrite(dir_ / "in/a.png", RandomImage(16, 16, CV_8UC3, 9)));
  auto store = Ingest("id,rgb\n../../evil,a.png\nok,a.png\n");
  std::string out;
  EXPECT_EQ(RunCommand(std::string(PATCHSTORE_CLI) + " verify " + store, &out), 0) << out;
  EXPECT_EQ(RunCommand(std::string(PATCHSTORE_CLI) + " info --json " + store, &out), 0) << out;
  EXPECT_NE(out.find("\"shape\": [3, 16, 16]"), std::string::npos) << out;
  EXPECT_NE(out.find("\"channel_names\": [\"R\", \"G\", \"B\"]"), std::string::npos) << out;
  EXPECT_NE(out.find("\"samples\": 2"), std::string::npos) << out;
  EXPECT_EQ(RunCommand(std::string(PATCHSTORE_CLI) + " export " + store + " " + (dir_ / "exp"), &out), 0) << out;
  EXPECT_TRUE(fs::exists(dir_ / "exp/%2E%2E/%2E%2E/evil/rgb.png"));
  EXPECT_FALSE(fs::exists(dir_.path() + "/evil"));
  // Flip one payload bit of the second sample's record in data.mdb.
  auto r = Reader::Open(store);
  auto v = (*r)->Get(1, 0);
  float probe[4];
  std::memcpy(probe, v->data_as<float>() + 100, sizeof probe);
  r->reset();
  v = Result<TensorView>(Status::Internal("released"));
  std::string bytes;
  {
    std::ifstream f(store + "/data.mdb", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  // Both samples hold the same pixels: flip in the last occurrence (sample 'ok').
  size_t at = bytes.rfind(std::string(reinterpret_cast<const char*>(probe), sizeof probe));
  ASSERT_NE(at, std::string::npos);
  bytes[at + 2] ^= 0x20;
  std::ofstream(store + "/data.mdb", std::ios::binary) << bytes;
  EXPECT_EQ(RunCommand(std::string(PATCHSTORE_CLI) + " verify " + store, &out), 3) << out;
  EXPECT_NE(out.find("BAD  'ok' field 'rgb'"), std::string::npos) << out;
  EXPECT_EQ(out.find("evil' field"), std::string::npos) << out;
}

// `patchstore upgrade` on a mask field whose metadata lost mask_blocks (as
// an older writer appending to the store leaves it): verify calls the tables
// stale, upgrade rewrites them with progress on stderr, and a second upgrade
// has nothing to do.
TEST_F(ImageIngest, CliUpgradeRewritesStaleMaskBlockCountsWithProgress) {
  cv::Mat m = RandomImage(40, 70, CV_8UC1, 5);
  cv::threshold(m, m, 200, 255, cv::THRESH_BINARY);
  ASSERT_TRUE(cv::imwrite(dir_ / "in/m.png", m));
  const auto store = Ingest("id,mask\na,m.png\nb,m.png\nc,m.png\n");
  uint32_t want_total = 0;
  {
    auto r = Reader::Open(store).value();
    want_total = r->MaskBlocks(2, 0).value().data[3 * 4 - 1];  // 2 x 3 blocks of 32: the last corner
    EXPECT_EQ(want_total, static_cast<uint32_t>(cv::countNonZero(m)));
  }
  {
    WriterOptions wo;
    wo.durable = false;
    auto w = Writer::Open(store, wo).value();
    w->mutable_meta().fields[0].mask_blocks = 0;
    ASSERT_TRUE(w->CommitMeta().ok());
  }
  std::string out;
  EXPECT_EQ(RunCommand(std::string(PATCHSTORE_CLI) + " verify " + store, &out), 3) << out;
  EXPECT_NE(out.find("stale mask block counts"), std::string::npos) << out;
  EXPECT_EQ(RunCommand(std::string(PATCHSTORE_CLI) + " upgrade " + store, &out), 0) << out;
  EXPECT_NE(out.find("upgrade: mask block counts: 3/3 samples"), std::string::npos) << out;  // not a terminal
  EXPECT_NE(out.find("added mask block counts to field 'mask'"), std::string::npos) << out;
  EXPECT_EQ(RunCommand(std::string(PATCHSTORE_CLI) + " verify " + store, &out), 0) << out;
  EXPECT_EQ(Reader::Open(store).value()->MaskBlocks(2, 0).value().data[11], want_total);
  EXPECT_EQ(RunCommand(std::string(PATCHSTORE_CLI) + " upgrade " + store, &out), 0) << out;
  EXPECT_NE(out.find("nothing to do"), std::string::npos) << out;
  EXPECT_EQ(out.find("samples"), std::string::npos) << out;  // no progress when nothing is written
}

TEST(Cli, HelpAndUsageErrors) {
  std::string out;
  EXPECT_EQ(RunCommand(std::string(PATCHSTORE_CLI) + " --help", &out), 0);
  EXPECT_NE(out.find("ingest"), std::string::npos);
  EXPECT_EQ(RunCommand(std::string(PATCHSTORE_CLI) + " ingest images --help", &out), 0);
  EXPECT_NE(out.find("{video}/render/rgb/{frame}.png"), std::string::npos);
  EXPECT_EQ(RunCommand(std::string(PATCHSTORE_CLI) + " --version", &out), 0);
  EXPECT_NE(out.find("patchstore 0."), std::string::npos);
  EXPECT_EQ(RunCommand(std::string(PATCHSTORE_CLI) + " info", &out), 2);
  EXPECT_EQ(RunCommand(std::string(PATCHSTORE_CLI) + " ingest images /tmp/x", &out), 2);
  EXPECT_EQ(RunCommand(std::string(PATCHSTORE_CLI) + " info /nonexistent/store", &out), 1);
  EXPECT_NE(out.find("/nonexistent/store"), std::string::npos);
}

}  // namespace
}  // namespace patchstore

namespace patchstore {
namespace {

TEST_F(ImageIngest, AnotherFieldSetIsRefusedInsteadOfLeavingHoles) {
  ASSERT_TRUE(cv::imwrite(dir_ / "in/a.png", RandomImage(8, 8, CV_8UC3, 1)));
  ASSERT_TRUE(cv::imwrite(dir_ / "in/m.png", RandomImage(8, 8, CV_8UC1, 2)));
  auto store = Ingest("id,rgb,mask\nx,a.png,m.png\n");
  Status st;
  Ingest("id,image,mask\ny,a.png,m.png\n", false, &st);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("holds the fields rgb,mask but this input gives image,mask"), std::string::npos)
      << st.message();
  Ingest("id,rgb\ny,a.png\n", false, &st);
  EXPECT_FALSE(st.ok());
  Ingest("id,mask,rgb\ny,m.png,a.png\n", false, &st);  // the same fields in another order are fine
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(VerifyStore(store)->ok());
}

TEST_F(ImageIngest, MasksSavedAsColourBecomeOneChannel) {
  cv::Mat bgr(6, 7, CV_8UC3, cv::Scalar(0, 0, 0));
  bgr.at<cv::Vec3b>(2, 3) = cv::Vec3b(0, 0, 255);  // red only
  bgr.at<cv::Vec3b>(4, 1) = cv::Vec3b(9, 0, 0);    // blue only
  ASSERT_TRUE(cv::imwrite(dir_ / "in/m.png", bgr));
  auto store = Ingest("id,mask\nx,m.png\n");
  auto r = Reader::Open(store);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->field(0).channels, 1u);
  auto v = (*r)->Get(0, 0);
  ASSERT_TRUE(v.ok());
  float sum = 0;
  for (int i = 0; i < 42; ++i) sum += v->data_as<float>()[i];
  EXPECT_EQ(sum, 2.0f);
  EXPECT_EQ(v->data_as<float>()[2 * 7 + 3], 1.0f);
  EXPECT_EQ(v->data_as<float>()[4 * 7 + 1], 1.0f);
  EXPECT_TRUE((*r)->Sat(0, 0).ok());
}

}  // namespace
}  // namespace patchstore
