// TIFF decoding through libtiff (ingest/decode_tiff.cc): files written here
// with libtiff in the layouts OpenCV got wrong (planar 16-bit, tiled 8-bit,
// unassociated alpha) and the ones that must be refused (CMYK, odd bit
// depths, MinIsWhite, several pages), compared value for value with what was
// written.
#include <gtest/gtest.h>

#include <tiffio.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ingest/decode.h"
#include "patchstore/ingest/ingest.h"
#include "patchstore/reader/reader.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::TempDir;

struct TiffSpec {
  uint32_t w = 0, h = 0;
  uint16_t spp = 1, bps = 8, format = SAMPLEFORMAT_UINT, photometric = PHOTOMETRIC_MINISBLACK;
  uint16_t planar = PLANARCONFIG_CONTIG, compression = COMPRESSION_NONE, predictor = 0;
  uint32_t tile = 0;  // 0: strips
  uint32_t rows_per_strip = 0;
  std::vector<uint16_t> extras;    // ExtraSamples types
  std::vector<uint16_t> colormap;  // palette: 3 * 2^bps entries (R..., G..., B...)
  int pages = 1;
};

// Writes `data` (H x W x spp samples, interleaved, native byte order, bps/8
// bytes each) as a TIFF laid out as `s` says.
void WriteTiff(const std::string& path, const TiffSpec& s, const std::vector<uint8_t>& data) {
  TIFF* t = TIFFOpen(path.c_str(), "w");
  ASSERT_NE(t, nullptr);
  const size_t es = s.bps / 8, S = s.spp;
  for (int page = 0; page < s.pages; ++page) {
    TIFFSetField(t, TIFFTAG_IMAGEWIDTH, s.w);
    TIFFSetField(t, TIFFTAG_IMAGELENGTH, s.h);
    TIFFSetField(t, TIFFTAG_SAMPLESPERPIXEL, s.spp);
    TIFFSetField(t, TIFFTAG_BITSPERSAMPLE, s.bps);
    TIFFSetField(t, TIFFTAG_SAMPLEFORMAT, s.format);
    TIFFSetField(t, TIFFTAG_PHOTOMETRIC, s.photometric);
    TIFFSetField(t, TIFFTAG_PLANARCONFIG, s.planar);
    TIFFSetField(t, TIFFTAG_COMPRESSION, s.compression);
    if (s.predictor) TIFFSetField(t, TIFFTAG_PREDICTOR, s.predictor);
    if (!s.extras.empty())
      TIFFSetField(t, TIFFTAG_EXTRASAMPLES, static_cast<uint16_t>(s.extras.size()), s.extras.data());
    if (!s.colormap.empty()) {
      const size_t n = size_t{1} << s.bps;
      TIFFSetField(t, TIFFTAG_COLORMAP, s.colormap.data(), s.colormap.data() + n, s.colormap.data() + 2 * n);
    }
    if (s.pages > 1) {
      TIFFSetField(t, TIFFTAG_SUBFILETYPE, FILETYPE_PAGE);
      TIFFSetField(t, TIFFTAG_PAGENUMBER, static_cast<uint16_t>(page), static_cast<uint16_t>(s.pages));
    }
    const bool separate = s.planar == PLANARCONFIG_SEPARATE;
    const size_t planes = separate ? S : 1, cs = separate ? 1 : S;
    auto sample = [&](size_t y, size_t x, size_t c) { return data.data() + ((y * s.w + x) * S + c) * es; };
    if (s.tile) {
      TIFFSetField(t, TIFFTAG_TILEWIDTH, s.tile);
      TIFFSetField(t, TIFFTAG_TILELENGTH, s.tile);
      std::vector<uint8_t> buf(size_t{s.tile} * s.tile * cs * es);
      for (size_t p = 0; p < planes; ++p)
        for (uint32_t ty = 0; ty < s.h; ty += s.tile)
          for (uint32_t tx = 0; tx < s.w; tx += s.tile) {
            std::fill(buf.begin(), buf.end(), 0xAB);  // padding the decoder must not show
            for (uint32_t y = ty; y < std::min(s.h, ty + s.tile); ++y)
              for (uint32_t x = tx; x < std::min(s.w, tx + s.tile); ++x)
                for (size_t c = 0; c < cs; ++c)
                  std::memcpy(buf.data() + (((y - ty) * s.tile + (x - tx)) * cs + c) * es,
                              sample(y, x, separate ? p : c), es);
            ASSERT_GE(TIFFWriteTile(t, buf.data(), tx, ty, 0, static_cast<uint16_t>(p)), 0);
          }
    } else {
      TIFFSetField(t, TIFFTAG_ROWSPERSTRIP, s.rows_per_strip ? s.rows_per_strip : s.h);
      const size_t row_bytes = es ? s.w * cs * es : (size_t{s.w} * s.bps * cs + 7) / 8;
      std::vector<uint8_t> row(row_bytes);
      for (size_t p = 0; p < planes; ++p)
        for (uint32_t y = 0; y < s.h; ++y) {
          if (es == 0) {  // packed sub-byte samples: data holds the packed rows
            std::memcpy(row.data(), data.data() + y * row_bytes, row_bytes);
          } else {
            for (uint32_t x = 0; x < s.w; ++x)
              for (size_t c = 0; c < cs; ++c)
                std::memcpy(row.data() + (x * cs + c) * es, sample(y, x, separate ? p : c), es);
          }
          ASSERT_EQ(TIFFWriteScanline(t, row.data(), y, static_cast<uint16_t>(p)), 1);
        }
    }
    ASSERT_EQ(TIFFWriteDirectory(t), 1);
  }
  TIFFClose(t);
}

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

constexpr uint64_t kLimit = uint64_t{1} << 26;

TEST(TiffDecode, PlanarSeparate16BitRgbKeepsEachSampleInItsChannel) {
  TempDir dir;
  TiffSpec s;
  s.w = 37, s.h = 23, s.spp = 3, s.bps = 16, s.photometric = PHOTOMETRIC_RGB, s.planar = PLANARCONFIG_SEPARATE;
  s.rows_per_strip = 5;
  std::vector<uint16_t> v(size_t{s.w} * s.h * 3);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>((i * 7919 + 1201) % 65536);
  const std::string path = dir.path() + "/planar.tif";
  WriteTiff(path, s, Bytes(v));
  auto img = DecodeFile(path, "", kLimit);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->channel_names, "R,G,B");
  EXPECT_EQ(img->source_type, SourceType::kUInt16);
  ASSERT_EQ(img->pixels.type(), CV_16UC3);
  ASSERT_EQ(img->height(), 23);
  ASSERT_EQ(img->width(), 37);
  for (int y = 0; y < 23; ++y)
    for (int x = 0; x < 37; ++x)
      for (int c = 0; c < 3; ++c)
        ASSERT_EQ(img->pixels.ptr<uint16_t>(y)[x * 3 + c], v[(static_cast<size_t>(y) * 37 + x) * 3 + c])
            << y << "," << x << "," << c;
}

TEST(TiffDecode, Tiled8BitRgbWithPartialEdgeTilesIsRead) {
  TempDir dir;
  TiffSpec s;
  s.w = 45, s.h = 29, s.spp = 3, s.bps = 8, s.photometric = PHOTOMETRIC_RGB, s.tile = 16;
  s.compression = COMPRESSION_ADOBE_DEFLATE;
  std::vector<uint8_t> v(size_t{s.w} * s.h * 3);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>((i * 131 + 17) % 251);
  const std::string path = dir.path() + "/tiled.tiff";
  WriteTiff(path, s, v);
  auto img = DecodeFile(path, "", kLimit);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->channel_names, "R,G,B");
  EXPECT_EQ(img->source_type, SourceType::kUInt8);
  ASSERT_EQ(img->pixels.type(), CV_8UC3);
  ASSERT_EQ(0, std::memcmp(img->pixels.data, v.data(), v.size()));
}

TEST(TiffDecode, UnassociatedAlphaIsNotPremultiplied) {
  TempDir dir;
  TiffSpec s;
  s.w = 19, s.h = 11, s.spp = 4, s.bps = 8, s.photometric = PHOTOMETRIC_RGB;
  s.extras = {EXTRASAMPLE_UNASSALPHA};
  s.compression = COMPRESSION_PACKBITS;
  std::vector<uint8_t> v(size_t{s.w} * s.h * 4);
  for (size_t p = 0; p < size_t{s.w} * s.h; ++p) {
    v[p * 4 + 0] = static_cast<uint8_t>(200 + p % 50);
    v[p * 4 + 1] = static_cast<uint8_t>(p * 3 % 256);
    v[p * 4 + 2] = 251;
    v[p * 4 + 3] = static_cast<uint8_t>(p % 7 * 30);  // 0..180: premultiplying would change R, G, B
  }
  const std::string path = dir.path() + "/rgba.tif";
  WriteTiff(path, s, v);
  auto img = DecodeFile(path, "", kLimit);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->channel_names, "R,G,B,A");
  ASSERT_EQ(img->pixels.type(), CV_8UC4);
  ASSERT_EQ(0, std::memcmp(img->pixels.data, v.data(), v.size()));
}

TEST(TiffDecode, Float32WithFloatingPointPredictorIsBitExact) {
  TempDir dir;
  TiffSpec s;
  s.w = 21, s.h = 13, s.bps = 32, s.format = SAMPLEFORMAT_IEEEFP, s.compression = COMPRESSION_LZW;
  s.predictor = PREDICTOR_FLOATINGPOINT;
  s.rows_per_strip = 4;
  std::vector<float> v(size_t{s.w} * s.h);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = std::ldexp(static_cast<float>(i % 97) - 48.25f, static_cast<int>(i % 11) - 5);
  v[3] = std::numeric_limits<float>::quiet_NaN();
  v[4] = -std::numeric_limits<float>::infinity();
  v[5] = std::numeric_limits<float>::denorm_min() * 3;
  v[6] = -0.0f;
  const std::string path = dir.path() + "/depth.tif";
  WriteTiff(path, s, Bytes(v));
  auto img = DecodeFile(path, "", kLimit);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->channel_names, "Y");
  EXPECT_EQ(img->source_type, SourceType::kFloat32);
  ASSERT_EQ(img->pixels.type(), CV_32FC1);
  ASSERT_EQ(0, std::memcmp(img->pixels.data, v.data(), v.size() * 4));  // bit for bit, NaN and -0 included
}

TEST(TiffDecode, Lzw16BitWithHorizontalPredictorAndAnUnspecifiedExtraSample) {
  TempDir dir;
  TiffSpec s;
  s.w = 33, s.h = 17, s.spp = 2, s.bps = 16, s.compression = COMPRESSION_LZW, s.predictor = PREDICTOR_HORIZONTAL;
  s.extras = {EXTRASAMPLE_UNSPECIFIED};
  s.rows_per_strip = 6;
  std::vector<uint16_t> v(size_t{s.w} * s.h * 2);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>(i % 2 ? 65535 - i * 29 : 40000 + i * 13);
  const std::string path = dir.path() + "/two.tif";
  WriteTiff(path, s, Bytes(v));
  auto img = DecodeFile(path, "", kLimit);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->channel_names, "Y,S1");
  ASSERT_EQ(img->pixels.type(), CV_16UC2);
  ASSERT_EQ(0, std::memcmp(img->pixels.data, v.data(), v.size() * 2));
}

TEST(TiffDecode, SignedAndWideIntegersKeepTheirValuesAndLargeOnesAreNoted) {
  TempDir dir;
  TiffSpec s;
  s.w = 9, s.h = 5, s.bps = 16, s.format = SAMPLEFORMAT_INT;
  std::vector<int16_t> v16(45);
  for (size_t i = 0; i < v16.size(); ++i) v16[i] = static_cast<int16_t>(static_cast<int>(i) * 1451 - 32000);
  WriteTiff(dir.path() + "/i16.tif", s, Bytes(v16));
  auto a = DecodeFile(dir.path() + "/i16.tif", "", kLimit);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->source_type, SourceType::kInt16);
  for (size_t i = 0; i < v16.size(); ++i) ASSERT_EQ(a->pixels.ptr<float>(0)[i], static_cast<float>(v16[i]));
  EXPECT_TRUE(a->warnings.empty());

  s.bps = 32, s.format = SAMPLEFORMAT_UINT;
  std::vector<uint32_t> v32(45, 12);
  v32[17] = 33554435u;  // above 2^24: float32 rounds it
  WriteTiff(dir.path() + "/u32.tif", s, Bytes(v32));
  auto b = DecodeFile(dir.path() + "/u32.tif", "", kLimit);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->source_type, SourceType::kUInt32);
  ASSERT_EQ(b->warnings.size(), 1u);
  EXPECT_NE(b->warnings[0].find("u32.tif"), std::string::npos) << b->warnings[0];
  EXPECT_NE(b->warnings[0].find("33554435"), std::string::npos) << b->warnings[0];
  EXPECT_NE(b->warnings[0].find("2^24"), std::string::npos) << b->warnings[0];
}

TEST(TiffDecode, PaletteIsExpandedThroughItsColourMap) {
  TempDir dir;
  TiffSpec s;
  s.w = 14, s.h = 6, s.bps = 8, s.photometric = PHOTOMETRIC_PALETTE;
  s.colormap.resize(3 * 256);
  for (int i = 0; i < 256; ++i) {
    s.colormap[i] = static_cast<uint16_t>(i * 251);
    s.colormap[256 + i] = static_cast<uint16_t>(65535 - i * 3);
    s.colormap[512 + i] = static_cast<uint16_t>(i * i);
  }
  std::vector<uint8_t> idx(size_t{s.w} * s.h);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<uint8_t>((i * 37 + 5) % 256);
  WriteTiff(dir.path() + "/pal.tif", s, idx);
  auto img = DecodeFile(dir.path() + "/pal.tif", "", kLimit);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->channel_names, "R,G,B");
  EXPECT_EQ(img->source_type, SourceType::kUInt16);
  ASSERT_EQ(img->pixels.type(), CV_16UC3);
  for (size_t i = 0; i < idx.size(); ++i)
    for (int c = 0; c < 3; ++c) ASSERT_EQ(img->pixels.ptr<uint16_t>(0)[i * 3 + c], s.colormap[c * 256 + idx[i]]) << i;
}

void ExpectRefused(const std::string& path, const std::vector<std::string>& words) {
  auto img = DecodeFile(path, "", kLimit);
  ASSERT_FALSE(img.ok());
  const std::string msg = img.status().message();
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg;
}

TEST(TiffDecode, CmykIsRefusedNamingTheTag) {
  TempDir dir;
  TiffSpec s;
  s.w = 8, s.h = 3, s.spp = 4, s.bps = 8, s.photometric = PHOTOMETRIC_SEPARATED;
  WriteTiff(dir.path() + "/cmyk.tif", s, std::vector<uint8_t>(8 * 3 * 4, 90));
  ExpectRefused(dir.path() + "/cmyk.tif", {"PhotometricInterpretation (tag 262)", "5", "CMYK"});
}

TEST(TiffDecode, OddBitDepthsMinIsWhiteAndSeveralPagesAreRefused) {
  TempDir dir;
  TiffSpec s;
  s.w = 10, s.h = 4, s.bps = 4;  // packed nibbles: 5 bytes a row
  WriteTiff(dir.path() + "/nibble.tif", s, std::vector<uint8_t>(5 * 4, 0x3c));
  ExpectRefused(dir.path() + "/nibble.tif", {"BitsPerSample (tag 258)", "= 4"});

  TiffSpec w;
  w.w = 6, w.h = 2, w.photometric = PHOTOMETRIC_MINISWHITE;
  WriteTiff(dir.path() + "/white.tif", w, std::vector<uint8_t>(12, 7));
  ExpectRefused(dir.path() + "/white.tif", {"PhotometricInterpretation (tag 262)", "MinIsWhite"});

  TiffSpec p;
  p.w = 5, p.h = 3, p.pages = 3;
  WriteTiff(dir.path() + "/pages.tif", p, std::vector<uint8_t>(15, 1));
  ExpectRefused(dir.path() + "/pages.tif", {"more than one image (3 directories)"});
}

TEST(TiffDecode, TruncatedFileIsAnErrorNamingTheFile) {
  TempDir dir;
  TiffSpec s;
  s.w = 40, s.h = 30, s.spp = 3, s.photometric = PHOTOMETRIC_RGB, s.compression = COMPRESSION_LZW;
  std::vector<uint8_t> v(40 * 30 * 3);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 7);
  const std::string path = dir.path() + "/cut.tif";
  WriteTiff(path, s, v);
  // Keep the header and directory (written last, at the end) but cut pixel
  // data: rewrite the file with its strip bytes zeroed out half way.
  std::vector<uint8_t> bytes;
  {
    FILE* f = std::fopen(path.c_str(), "rb");
    ASSERT_NE(f, nullptr);
    std::fseek(f, 0, SEEK_END);
    bytes.resize(static_cast<size_t>(std::ftell(f)));
    std::fseek(f, 0, SEEK_SET);
    ASSERT_EQ(std::fread(bytes.data(), 1, bytes.size(), f), bytes.size());
    std::fclose(f);
  }
  bytes.resize(bytes.size() / 3);
  {
    FILE* f = std::fopen(path.c_str(), "wb");
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
  auto img = DecodeFile(path, "", kLimit);
  ASSERT_FALSE(img.ok());
  EXPECT_NE(img.status().message().find(path), std::string::npos) << img.status().message();
}

// Through the whole ingest (isolated decoders): the stored values are the
// file's, and the 2^24 note reaches the ingest summary.
TEST(TiffDecode, IngestStoresTheSamplesAsWrittenAndReportsRounding) {
  TempDir dir;
  TiffSpec s;
  s.w = 26, s.h = 18, s.spp = 3, s.bps = 16, s.photometric = PHOTOMETRIC_RGB, s.planar = PLANARCONFIG_SEPARATE;
  s.tile = 16;
  std::vector<uint16_t> v(size_t{s.w} * s.h * 3);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>(i * 613 % 65521);
  WriteTiff(dir.path() + "/a.tif", s, Bytes(v));
  TiffSpec d;
  d.w = 26, d.h = 18, d.bps = 32, d.format = SAMPLEFORMAT_INT;
  std::vector<int32_t> depth(size_t{d.w} * d.h, -5);
  depth[100] = -20000001;
  WriteTiff(dir.path() + "/a_depth.tif", d, Bytes(depth));
  {
    FILE* f = std::fopen((dir.path() + "/m.csv").c_str(), "w");
    std::fputs("id,rgb,depth\ns0,a.tif,a_depth.tif\n", f);
    std::fclose(f);
  }
  ImageIngestOptions o;
  o.store = dir.path() + "/s.ps";
  o.manifest = dir.path() + "/m.csv";
  o.encoding = {"compact"};
  o.threads = 1;
  o.durable = false;
  auto sum = IngestImages(o);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  ASSERT_EQ(sum->warnings.size(), 1u);
  EXPECT_NE(sum->warnings[0].find("a_depth.tif"), std::string::npos) << sum->warnings[0];
  EXPECT_NE(sum->warnings[0].find("20000001"), std::string::npos) << sum->warnings[0];
  auto r = Reader::Open(o.store);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ((*r)->size(), 1u);
  auto rec = (*r)->Get(0, (*r)->meta().FieldIndex("rgb"));
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  const uint16_t* p = rec->data_as<uint16_t>();
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 26 * 18; ++i) ASSERT_EQ(p[c * 26 * 18 + i], v[static_cast<size_t>(i) * 3 + c]) << c << "," << i;
}

}  // namespace
}  // namespace patchstore
