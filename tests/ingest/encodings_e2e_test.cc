// End to end (issue 13): every layout x encoding x source type, READ through
// the Reader (CopyPatch, which returns float32), equals the float32 row store
// bit for bit; float16 fields equal the float32 value rounded to nearest
// binary16. Needs the reader that understands tiles and compact dtypes: on a
// branch without it these tests fail at Reader::Open (Unsupported).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "encoding_test_util.h"
#include "hdf5_test_util.h"
#include "ingest/encoding.h"
#include "patchstore/ingest/ingest_hdf5.h"
#include "patchstore/reader/reader.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::TempDir;

struct Config {
  std::string name, layout;
  uint32_t tile = 32;
  std::vector<std::string> encoding;
  std::vector<std::string> half_fields;  // fields stored as float16
};

// Every window of `fields` read from `got` equals the float32 rows store
// `ref` (float16 fields: rounded to nearest). Windows: the whole record and
// random ones, including ones crossing tile edges and touching the last
// (padded) tiles.
void CompareStores(const std::string& got_path, const std::string& ref_path, const Config& c) {
  auto got = Reader::Open(got_path);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  auto ref = Reader::Open(ref_path);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  ASSERT_EQ((*got)->size(), (*ref)->size());
  std::mt19937 rng(3);
  for (uint64_t s = 0; s < (*ref)->size(); ++s) {
    ASSERT_EQ((*got)->id(s), (*ref)->id(s));
    for (int f = 0; f < (*ref)->field_count(); ++f) {
      const std::string name = (*ref)->meta().fields[f].name;
      auto h = (*ref)->Header(s, f);
      ASSERT_TRUE(h.ok());
      const int64_t C = h->shape[0], H = h->shape[1], W = h->shape[2];
      std::vector<std::array<int64_t, 4>> windows = {{0, 0, H, W}, {H - 1, W - 1, 1, 1}};
      for (int k = 0; k < 12; ++k) {
        const int64_t wh = 1 + rng() % H, ww = 1 + rng() % W;
        windows.push_back(
            {static_cast<int64_t>(rng() % (H - wh + 1)), static_cast<int64_t>(rng() % (W - ww + 1)), wh, ww});
      }
      const bool half = std::find(c.half_fields.begin(), c.half_fields.end(), name) != c.half_fields.end();
      for (const auto& [y, x, wh, ww] : windows) {
        std::vector<float> a(C * wh * ww), b(C * wh * ww);
        ASSERT_TRUE((*got)->CopyPatch(s, f, y, x, wh, ww, a.data()).ok()) << name;
        ASSERT_TRUE((*ref)->CopyPatch(s, f, y, x, wh, ww, b.data()).ok()) << name;
        for (size_t i = 0; i < a.size(); ++i) {
          const float want = half ? ToFloat32(ToFloat16(b[i])) : b[i];
          ASSERT_EQ(std::memcmp(&a[i], &want, 4), 0)
              << c.name << " sample " << s << " field " << name << " window (" << y << "," << x << "," << wh << ","
              << ww << ") element " << i << ": " << a[i] << " vs " << want;
        }
      }
    }
  }
}

TEST(EncodingsEndToEnd, FramesOfEverySourceTypeReadBackAsTheFloat32Rows) {
  TempDir dir;
  const std::string manifest = testing::MakeFrames(dir / "in", 4);
  const std::string ref = dir / "ref.ps";
  ASSERT_TRUE(IngestImages(testing::Options(manifest, ref)).ok());
  const std::vector<Config> configs = {
      {"f32-tiles8", "tiles", 8, {}, {}},
      {"f32-tiles32", "tiles", 32, {}, {}},
      {"compact-rows", "rows", 32, {"compact"}, {}},
      {"compact-tiles16", "tiles", 16, {"compact"}, {}},
      {"half-rows", "rows", 32, {"compact", "depth=float16", "rgb8=float16"}, {"depth", "rgb8"}},
      {"half-tiles8", "tiles", 8, {"compact", "depth=float16", "rgb16=float16"}, {"depth", "rgb16"}},
  };
  for (const Config& c : configs) {
    SCOPED_TRACE(c.name);
    auto o = testing::Options(manifest, dir / (c.name + ".ps"));
    o.layout = c.layout;
    o.tile_size = c.tile;
    o.encoding = c.encoding;
    auto r = IngestImages(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    CompareStores(o.store, ref, c);
  }
}

TEST(EncodingsEndToEnd, VolumesOfEveryIntegerTypeReadBackAsTheFloat32Rows) {
  TempDir dir;
  const std::string h5 = dir / "v.h5";
  const std::array<hsize_t, 3> dims{12, 10, 7};
  const size_t n = 12 * 10 * 7;
  auto u8 = testing::RandomValues<uint8_t>(n, 1, 0, 255.99);
  auto i8 = testing::RandomValues<int8_t>(n, 2, -128, 127.99);
  auto i16 = testing::RandomValues<int16_t>(n, 3, -32768, 32767.99);
  auto u16 = testing::RandomValues<uint16_t>(n, 4, 0, 65535.99);
  auto f32 = testing::RandomValues<float>(n, 5, -1e4, 1e4);
  {
    testing::H5Out f(h5);
    ASSERT_TRUE(f.ok());
    const std::vector<hsize_t> d(dims.begin(), dims.end());
    ASSERT_TRUE(f.Write("/U8/p1", H5T_STD_U8LE, H5T_NATIVE_UINT8, d, u8.data()));
    ASSERT_TRUE(f.Write("/I8/p1", H5T_STD_I8LE, H5T_NATIVE_INT8, d, i8.data()));
    ASSERT_TRUE(f.Write("/I16/p1", H5T_STD_I16LE, H5T_NATIVE_INT16, d, i16.data()));
    ASSERT_TRUE(f.Write("/U16/p1", H5T_STD_U16LE, H5T_NATIVE_UINT16, d, u16.data()));
    ASSERT_TRUE(f.Write("/F32/p1", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, d, f32.data()));
  }
  auto opts = [&](const std::string& store) {
    Hdf5IngestOptions o;
    o.files = {h5};
    o.store = dir / store;
    o.groups = {"U8", "I8", "I16", "U16", "F32"};
    o.mask_fields = {"U8"};
    o.norm = {{"I16", "range:-1024,3000"}, {"U16", "symmetric"}};
    o.durable = false;
    return o;
  };
  ASSERT_TRUE(IngestHdf5(opts("ref.ps")).ok());
  for (const Config& c : {Config{"compact", "rows", 32, {"compact"}, {}},
                          Config{"half", "rows", 32, {"compact", "F32=float16", "I16=float16"}, {"F32", "I16"}}}) {
    auto o = opts(c.name + ".ps");
    o.encoding = c.encoding;
    auto r = IngestHdf5(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    CompareStores(o.store, dir / "ref.ps", c);
  }
}

}  // namespace
}  // namespace patchstore
