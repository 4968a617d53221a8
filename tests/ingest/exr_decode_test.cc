// OpenEXR decoding (issue 31, items 5 and 11): UINT channels above 2^24 are
// reported (float32 rounds them), luminance/chroma images are read through
// the RGBA interface, equal to what Imf::RgbaInputFile returns.
#include <gtest/gtest.h>

#include <ImfChannelList.h>
#include <ImfFrameBuffer.h>
#include <ImfHeader.h>
#include <ImfOutputFile.h>
#include <ImfRgbaFile.h>
#include <half.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "ingest/decode.h"
#include "patchstore/ingest/ingest.h"
#include "patchstore/reader/reader.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::TempDir;

constexpr uint64_t kLimit = uint64_t{1} << 26;

void WriteUintAndHalf(const std::string& path, int W, int H, const std::vector<uint32_t>& ids,
                      const std::vector<half>& shade) {
  Imf::Header header(W, H);
  header.channels().insert("id", Imf::Channel(Imf::UINT));
  header.channels().insert("shade", Imf::Channel(Imf::HALF));
  Imf::FrameBuffer fb;
  fb.insert("id", Imf::Slice(Imf::UINT, reinterpret_cast<char*>(const_cast<uint32_t*>(ids.data())), 4, 4 * W));
  fb.insert("shade", Imf::Slice(Imf::HALF, reinterpret_cast<char*>(const_cast<half*>(shade.data())), 2, 2 * W));
  Imf::OutputFile out(path.c_str(), header);
  out.setFrameBuffer(fb);
  out.writePixels(H);
}

TEST(ExrDecode, UintAbove2To24IsReadAndReported) {
  TempDir dir;
  const int W = 13, H = 7;
  std::vector<uint32_t> ids(W * H);
  std::vector<half> shade(W * H);
  for (int i = 0; i < W * H; ++i) {
    ids[i] = static_cast<uint32_t>(i * 4099 + 11);
    shade[i] = half(static_cast<float>(i) / 8.0f);
  }
  ids[40] = 4000000007u;  // rounds to 4000000000 in float32
  ids[41] = 16777219u;
  const std::string path = dir.path() + "/ids.exr";
  WriteUintAndHalf(path, W, H, ids, shade);
  auto img = DecodeFile(path, "", kLimit);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->channel_names, "id,shade");
  EXPECT_EQ(img->source_type, SourceType::kUInt32);
  for (int i = 0; i < W * H; ++i) {
    ASSERT_EQ(img->pixels.ptr<float>(0)[i * 2], static_cast<float>(ids[i])) << i;
    ASSERT_EQ(img->pixels.ptr<float>(0)[i * 2 + 1], static_cast<float>(shade[i])) << i;
  }
  ASSERT_EQ(img->warnings.size(), 1u);
  EXPECT_EQ(img->warnings[0], "'" + path +
                                  "': uint32 values up to 4000000007 exceed 2^24 = 16777216 and are "
                                  "rounded to the nearest float32 (e.g. 16777217 is stored as 16777216)");
  // One channel chosen: the same note for it alone.
  auto one = DecodeFile(path, "id", kLimit);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  ASSERT_EQ(one->warnings.size(), 1u);
  EXPECT_EQ(one->pixels.ptr<float>(0)[41], 16777220.0f);

  // Values up to 2^24 are exact: no note.
  for (auto& v : ids) v %= (1u << 24) + 1;
  WriteUintAndHalf(path, W, H, ids, shade);
  auto exact = DecodeFile(path, "", kLimit);
  ASSERT_TRUE(exact.ok()) << exact.status().ToString();
  EXPECT_TRUE(exact->warnings.empty()) << exact->warnings[0];
}

// A luminance/chroma file (Y full resolution, RY and BY at half) written by
// the RGBA interface, with and without alpha.
void WriteYc(const std::string& path, int W, int H, bool alpha, std::vector<Imf::Rgba>* px) {
  px->resize(static_cast<size_t>(W) * H);
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      Imf::Rgba& p = (*px)[static_cast<size_t>(y) * W + x];
      p.r = half(0.1f + 0.03f * x);
      p.g = half(0.7f - 0.02f * y);
      p.b = half(0.25f + 0.01f * ((x * y) % 9));
      p.a = half(alpha ? 0.5f + 0.05f * (x % 5) : 1.0f);
    }
  Imf::RgbaOutputFile out(path.c_str(), W, H, alpha ? Imf::WRITE_YCA : Imf::WRITE_YC);
  out.setFrameBuffer(px->data(), 1, W);
  out.writePixels(H);
}

std::vector<Imf::Rgba> ReadRgba(const std::string& path, int W, int H) {
  Imf::RgbaInputFile in(path.c_str());
  std::vector<Imf::Rgba> px(static_cast<size_t>(W) * H);
  in.setFrameBuffer(px.data(), 1, W);
  in.readPixels(0, H - 1);
  return px;
}

TEST(ExrDecode, LuminanceChromaIsReadThroughTheRgbaInterface) {
  TempDir dir;
  for (bool alpha : {false, true}) {
    const int W = 22, H = 16;  // even: chroma is sampled every second pixel
    const std::string path = dir.path() + (alpha ? "/yca.exr" : "/yc.exr");
    std::vector<Imf::Rgba> written;
    WriteYc(path, W, H, alpha, &written);
    {
      Imf::RgbaInputFile check(path.c_str());
      ASSERT_TRUE(check.header().channels().findChannel("RY") != nullptr);
      ASSERT_EQ(check.header().channels().findChannel("RY")->xSampling, 2);
    }
    const std::vector<Imf::Rgba> want = ReadRgba(path, W, H);
    auto img = DecodeFile(path, "", kLimit);
    ASSERT_TRUE(img.ok()) << img.status().ToString();
    EXPECT_EQ(img->format, "exr-yc");
    EXPECT_EQ(img->channel_names, alpha ? "R,G,B,A" : "R,G,B");
    EXPECT_EQ(img->source_type, SourceType::kFloat16);
    const int C = alpha ? 4 : 3;
    ASSERT_EQ(img->channels(), C);
    ASSERT_EQ(img->height(), H);
    ASSERT_EQ(img->width(), W);
    bool differs_from_written = false;
    for (int i = 0; i < W * H; ++i) {
      const float* p = img->pixels.ptr<float>(0) + static_cast<size_t>(i) * C;
      ASSERT_EQ(p[0], static_cast<float>(want[i].r)) << i;
      ASSERT_EQ(p[1], static_cast<float>(want[i].g)) << i;
      ASSERT_EQ(p[2], static_cast<float>(want[i].b)) << i;
      if (alpha) {
        ASSERT_EQ(p[3], static_cast<float>(want[i].a)) << i;
      }
      differs_from_written = differs_from_written || want[i].r != written[i].r;
    }
    // The chroma really was subsampled (the reconstruction is not the input).
    EXPECT_TRUE(differs_from_written);
  }
  // Ingested: the store says where the values came from (info's source_format).
  {
    FILE* f = std::fopen((dir.path() + "/m.csv").c_str(), "w");
    std::fputs("id,rgb\na,yca.exr\n", f);
    std::fclose(f);
    ImageIngestOptions o;
    o.store = dir.path() + "/s.ps";
    o.manifest = dir.path() + "/m.csv";
    o.threads = 1;
    o.durable = false;
    auto sum = IngestImages(o);
    ASSERT_TRUE(sum.ok()) << sum.status().ToString();
    auto r = Reader::Open(o.store).value();
    EXPECT_EQ(r->field(0).source_format, "exr-yc");
    EXPECT_EQ(r->field(0).channel_names, "R,G,B,A");
    const std::vector<Imf::Rgba> want = ReadRgba(dir.path() + "/yca.exr", 22, 16);
    const float* g = r->Get(0, 0)->data_as<float>() + 22 * 16;  // the G plane
    for (int i = 0; i < 22 * 16; ++i) ASSERT_EQ(g[i], static_cast<float>(want[i].g)) << i;
  }
  // Its full-resolution luminance can still be chosen alone.
  auto y = DecodeFile(dir.path() + "/yc.exr", "Y", kLimit);
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  EXPECT_EQ(y->channel_names, "Y");
}

TEST(ExrDecode, FullResolutionChromaIsRefusedNamingTheSampling) {
  // Y, RY, BY all at full resolution: not the luminance/chroma layout the RGBA
  // interface reconstructs (chroma 2x2). Refused, saying how to read a channel.
  TempDir dir;
  const int W = 10, H = 6;
  const std::string path = dir.path() + "/fullyc.exr";
  std::vector<half> y(W * H), ry(W * H), by(W * H);
  for (int i = 0; i < W * H; ++i) {
    y[i] = half(0.25f * static_cast<float>(i % 7));
    ry[i] = half(-0.125f * static_cast<float>(i % 3));
    by[i] = half(0.0625f * static_cast<float>(i % 5));
  }
  {
    Imf::Header header(W, H);
    Imf::FrameBuffer fb;
    for (auto [name, data] : {std::pair<const char*, std::vector<half>*>{"Y", &y}, {"RY", &ry}, {"BY", &by}}) {
      header.channels().insert(name, Imf::Channel(Imf::HALF));
      fb.insert(name, Imf::Slice(Imf::HALF, reinterpret_cast<char*>(data->data()), 2, 2 * W));
    }
    Imf::OutputFile out(path.c_str(), header);
    out.setFrameBuffer(fb);
    out.writePixels(H);
  }
  auto img = DecodeFile(path, "", kLimit);
  ASSERT_FALSE(img.ok());
  EXPECT_NE(img.status().message().find("channel RY is sampled 1x1"), std::string::npos) << img.status().message();
  EXPECT_NE(img.status().message().find(path + ":Y"), std::string::npos) << img.status().message();
  // One channel as stored is read.
  auto ry_only = DecodeFile(path, "RY", kLimit);
  ASSERT_TRUE(ry_only.ok()) << ry_only.status().ToString();
  for (int i = 0; i < W * H; ++i) ASSERT_EQ(ry_only->pixels.ptr<float>(0)[i], static_cast<float>(ry[i])) << i;
}

}  // namespace
}  // namespace patchstore
