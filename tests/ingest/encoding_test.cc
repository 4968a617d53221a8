// Ingest side of tiled records and compact encodings (issue 13): the records
// an ingest writes, read raw through the store-level Snapshot and format.h
// (no reader involved): dtype, norm, exact source values, tiles, valid counts,
// the float16 rounding, option errors and refused resumes.
#include <gtest/gtest.h>

#include <ImfChannelList.h>
#include <ImfFrameBuffer.h>
#include <ImfHeader.h>
#include <ImfOutputFile.h>
#include <half.h>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "encoding_test_util.h"
#include "hdf5_test_util.h"
#include "ingest/encoding.h"
#include "patchstore/ingest/ingest.h"
#include "patchstore/ingest/ingest_hdf5.h"
#include "patchstore/store/store.h"
#include "test_util.h"

namespace patchstore {
namespace {

namespace fs = std::filesystem;
using testing::MakeFrames;
using testing::Options;
using testing::TempDir;

// ---------------------------------------------------------------------------
// Raw records through the store API.

struct RawRecord {
  RecordHeader header;
  std::vector<uint8_t> rows;     // payload, untiled to row-major when tiled
  std::vector<uint8_t> payload;  // as stored
};

std::map<std::string, std::map<std::string, RawRecord>> ReadRaw(const std::string& store) {
  std::map<std::string, std::map<std::string, RawRecord>> out;
  auto snap = Snapshot::Open(store);
  EXPECT_TRUE(snap.ok()) << snap.status().ToString();
  if (!snap.ok()) return out;
  std::map<uint64_t, std::string> ids;
  EXPECT_TRUE((*snap)
                  ->ForEachId([&](uint64_t i, std::string_view id) {
                    ids[i] = std::string(id);
                    return Status::OK();
                  })
                  .ok());
  const StoreMeta& meta = (*snap)->meta();
  for (const auto& [i, id] : ids)
    for (size_t f = 0; f < meta.fields.size(); ++f) {
      auto rec = (*snap)->GetRecord(i, static_cast<uint16_t>(f));
      EXPECT_TRUE(rec.ok()) << rec.status().ToString();
      if (!rec.ok()) continue;
      auto h = ParseRecordHeader(rec->data(), rec->size());
      EXPECT_TRUE(h.ok()) << h.status().ToString();
      if (!h.ok()) continue;
      EXPECT_TRUE(VerifyRecordBody(*h, rec->data()).ok());
      RawRecord r;
      r.header = *h;
      const uint8_t* p = reinterpret_cast<const uint8_t*>(rec->data()) + kRecordHeaderSize;
      r.payload.assign(p, p + h->payload_bytes);
      if (h->tiled()) {
        r.rows.resize(h->elements() * DTypeSize(h->dtype));
        UntileCHW(p, DTypeSize(h->dtype), h->grid(), r.rows.data());
      } else {
        r.rows = r.payload;
      }
      out[id][meta.fields[f].name] = std::move(r);
    }
  return out;
}

std::map<std::string, std::vector<RecordSummary>> Summaries(const std::string& store) {
  std::map<std::string, std::vector<RecordSummary>> out;
  auto snap = Snapshot::Open(store);
  EXPECT_TRUE(snap.ok());
  std::map<uint64_t, std::string> ids;
  EXPECT_TRUE((*snap)
                  ->ForEachId([&](uint64_t i, std::string_view id) {
                    ids[i] = std::string(id);
                    return Status::OK();
                  })
                  .ok());
  EXPECT_TRUE((*snap)
                  ->ForEachSummary([&](uint64_t i, const SampleSummary& s) {
                    out[ids[i]] = s.fields;
                    return Status::OK();
                  })
                  .ok());
  return out;
}

const FieldMeta& Field(const std::string& store, const std::string& name, StoreMeta* keep) {
  auto snap = Snapshot::Open(store);
  EXPECT_TRUE(snap.ok());
  *keep = (*snap)->meta();
  return keep->fields[keep->FieldIndex(name)];
}

// The float32 a reader returns for element i of a row-major payload.
float LogicalValue(const RecordHeader& h, const std::vector<uint8_t>& rows, size_t i) {
  return VisitDType(h.dtype, [&](auto tag) -> float {
    using T = typename decltype(tag)::type;
    T v;
    std::memcpy(&v, rows.data() + i * sizeof(T), sizeof(T));
    if constexpr (std::is_arithmetic_v<T>) {
      if (StoresRawSource(h.dtype)) return h.norm.Apply(static_cast<double>(v));
    }
    return ToFloat32(v);
  });
}

// "" when every element of `got` converts to the float32 of `want` bit for
// bit; else the first mismatch.
std::string SameAsFloat32(const RawRecord& got, const RawRecord& want) {
  if (want.header.dtype != DType::kFloat32) return "reference is not float32";
  const size_t n = want.header.elements();
  if (got.header.elements() != n) return "element count differs";
  for (size_t i = 0; i < n; ++i) {
    const float a = LogicalValue(got.header, got.rows, i);
    float b;
    std::memcpy(&b, want.rows.data() + 4 * i, 4);
    if (std::memcmp(&a, &b, 4) != 0)
      return "element " + std::to_string(i) + ": " + std::to_string(a) + " vs " + std::to_string(b);
  }
  return "";
}

// ---------------------------------------------------------------------------

TEST(EncodingPlanTest, SpecsParseAndErrorsNameTheSpec) {
  auto p = ParseEncodings({"compact", "depth=float16", "rgb=float32"});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->For("mask"), FieldEncoding::kCompact);
  EXPECT_EQ(p->For("depth"), FieldEncoding::kFloat16);
  EXPECT_EQ(p->For("rgb"), FieldEncoding::kFloat32);
  EXPECT_EQ(ParseEncodings({})->For("x"), FieldEncoding::kFloat32);
  auto bad = ParseEncodings({"compact", "depth=bfloat16"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown encoding 'bfloat16'"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("'depth=bfloat16'"), std::string::npos);
  auto half_all = ParseEncodings({"float16"});
  ASSERT_FALSE(half_all.ok());
  EXPECT_NE(half_all.status().message().find("FIELD=float16"), std::string::npos);
  EXPECT_FALSE(ParseEncodings({"=compact"}).ok());
  auto unknown = CheckEncodingFields(*p, {"rgb", "mask"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.message().find("field 'depth'"), std::string::npos) << unknown.message();
  EXPECT_TRUE(CheckEncodingFields(*p, {"rgb", "mask", "depth"}).ok());
}

TEST(EncodingPlanTest, CompactIsTheSmallestExactType) {
  Normalization none, sym;
  sym.kind = NormKind::kSymmetric;
  sym.scale = 255;
  const auto C = FieldEncoding::kCompact;
  EXPECT_EQ(RecordDType(C, SourceType::kUInt8, sym), DType::kUInt8);
  EXPECT_EQ(RecordDType(C, SourceType::kUInt16, sym), DType::kUInt16);
  EXPECT_EQ(RecordDType(C, SourceType::kInt8, none), DType::kInt16);
  EXPECT_EQ(RecordDType(C, SourceType::kInt16, none), DType::kInt16);
  EXPECT_EQ(RecordDType(C, SourceType::kFloat16, none), DType::kFloat16);
  EXPECT_EQ(RecordDType(C, SourceType::kFloat16, sym), DType::kFloat32);  // normalised: not exact in half
  Normalization clamped;
  clamped.clamp = true;
  EXPECT_EQ(RecordDType(C, SourceType::kFloat16, clamped), DType::kFloat32);
  for (SourceType s : {SourceType::kFloat32, SourceType::kFloat64, SourceType::kInt32, SourceType::kUInt32,
                       SourceType::kInt64, SourceType::kUInt64})
    EXPECT_EQ(RecordDType(C, s, none), DType::kFloat32);
  EXPECT_EQ(RecordDType(FieldEncoding::kFloat32, SourceType::kUInt8, sym), DType::kFloat32);
  EXPECT_EQ(RecordDType(FieldEncoding::kFloat16, SourceType::kUInt8, sym), DType::kFloat16);
  EXPECT_EQ(*ParseLayout("rows", 32), 0);
  EXPECT_EQ(*ParseLayout("tiles", 32), 32);
  EXPECT_EQ(*ParseLayout("tiles", 0), kDefaultTileSize);  // --layout tiles alone
  EXPECT_EQ(*ParseLayout("rows", 0), 0);
  EXPECT_FALSE(ParseLayout("tiles", 12).ok());
  EXPECT_FALSE(ParseLayout("tiles", 4104).ok());
  EXPECT_FALSE(ParseLayout("columns", 32).ok());
}

TEST(EncodingTest, StoredTileIsTheEdgeOfTheStoresImageFields) {
  StoreMeta m;
  EXPECT_EQ(StoredTile(m), 0);  // a new store
  FieldMeta rgb;
  rgb.layout = Layout::kCHW;
  m.fields.push_back(rgb);
  EXPECT_EQ(StoredTile(m), 0);  // rows
  FieldMeta vol;
  vol.layout = Layout::kSHW;
  vol.tile = 0;
  m.fields.insert(m.fields.begin(), vol);
  m.fields[1].tile = 16;
  EXPECT_EQ(StoredTile(m), 16);
}

TEST(Float16Test, RoundsToNearestEven) {
  // Every half value converts back to itself (including subnormals, +-0, inf).
  for (uint32_t b = 0; b < 0x10000; ++b) {
    Float16 h{static_cast<uint16_t>(b)};
    const float f = ToFloat32(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(ToFloat32(ToFloat16(f)))) << b;
      continue;
    }
    ASSERT_EQ(ToFloat16(f).bits, b) << b;
  }
  // Between two neighbours: the nearer one; at the exact midpoint, the even one.
  for (uint32_t b = 0; b < 0x7bff; ++b) {
    const float lo = ToFloat32(Float16{static_cast<uint16_t>(b)});
    const float hi = ToFloat32(Float16{static_cast<uint16_t>(b + 1)});
    const double mid = (static_cast<double>(lo) + hi) / 2;  // exact in float32 for halves
    const uint16_t even = (b & 1) ? static_cast<uint16_t>(b + 1) : static_cast<uint16_t>(b);
    ASSERT_EQ(ToFloat16(static_cast<float>(mid)).bits, even) << b;
    ASSERT_EQ(ToFloat16(std::nextafter(static_cast<float>(mid), -INFINITY)).bits, b) << b;
    ASSERT_EQ(ToFloat16(std::nextafter(static_cast<float>(mid), INFINITY)).bits, b + 1) << b;
    ASSERT_EQ(ToFloat16(-static_cast<float>(mid)).bits, even | 0x8000u) << b;
  }
  EXPECT_EQ(ToFloat16(65519.99f).bits, 0x7bffu);  // below the rounding boundary to inf
  EXPECT_EQ(ToFloat16(65520.f).bits, 0x7c00u);    // tie between 65504 and "65536": to even = inf
  EXPECT_EQ(ToFloat16(1e30f).bits, 0x7c00u);
  EXPECT_EQ(ToFloat16(-1e30f).bits, 0xfc00u);
  EXPECT_EQ(ToFloat16(1e-30f).bits, 0u);
  EXPECT_EQ(ToFloat16(-0.f).bits, 0x8000u);
}

class ImageEncodingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    manifest_ = MakeFrames(dir_ / "in", 4);
    auto r = IngestImages(Options(manifest_, store("f32")));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ref_ = ReadRaw(store("f32"));
    ASSERT_EQ(ref_.size(), 4u);
  }
  std::string store(const std::string& name) const { return (dir_ / (name + ".ps")); }
  TempDir dir_;
  std::string manifest_;
  std::map<std::string, std::map<std::string, RawRecord>> ref_;
};

TEST_F(ImageEncodingTest, CompactHoldsTheSourceValuesAndConvertsToTheFloat32RecordBitForBit) {
  for (const char* layout : {"rows", "tiles"}) {
    SCOPED_TRACE(layout);
    auto o = Options(manifest_, store(std::string("compact_") + layout));
    o.encoding = {"compact"};
    o.layout = layout;
    o.tile_size = 16;
    auto r = IngestImages(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const auto got = ReadRaw(o.store);
    const std::map<std::string, DType> want = {{"rgb8", DType::kUInt8},
                                               {"rgb16", DType::kUInt16},
                                               {"mask", DType::kUInt8},
                                               {"depth", DType::kFloat32},
                                               {"zh", DType::kFloat16}};
    StoreMeta meta;
    for (const auto& [field, dtype] : want) {
      EXPECT_EQ(Field(o.store, field, &meta).dtype, dtype) << field;
      EXPECT_EQ(Field(o.store, field, &meta).tile, std::string(layout) == "tiles" ? 16 : 0) << field;
    }
    for (const auto& [id, fields] : ref_)
      for (const auto& [field, ref] : fields) {
        const RawRecord& rec = got.at(id).at(field);
        EXPECT_EQ(rec.header.dtype, want.at(field)) << id << " " << field;
        EXPECT_TRUE(rec.header.norm == ref.header.norm) << id << " " << field;
        EXPECT_EQ(rec.header.source_type, ref.header.source_type);
        EXPECT_EQ(rec.header.shape, ref.header.shape);
        EXPECT_EQ(SameAsFloat32(rec, ref), "") << id << " " << field;
      }
    // The integer records are the source pixels themselves (RGB order).
    const std::string s = "0";
    cv::Mat a = cv::imread((dir_ / "in/a0.png"), cv::IMREAD_UNCHANGED);
    cv::Mat b = cv::imread((dir_ / "in/b0.png"), cv::IMREAD_UNCHANGED);
    cv::Mat m = cv::imread((dir_ / "in/m0.png"), cv::IMREAD_UNCHANGED);
    const RawRecord& ra = got.at("f/0").at("rgb8");
    const RawRecord& rb = got.at("f/0").at("rgb16");
    const RawRecord& rm = got.at("f/0").at("mask");
    for (int y = 0; y < 37; ++y)
      for (int x = 0; x < 50; ++x) {
        for (int c = 0; c < 3; ++c) {
          ASSERT_EQ(ra.rows[(c * 37 + y) * 50 + x], a.at<cv::Vec3b>(y, x)[2 - c]);
          uint16_t v;
          std::memcpy(&v, rb.rows.data() + 2 * ((c * 37 + y) * 50 + x), 2);
          ASSERT_EQ(v, b.at<cv::Vec3w>(y, x)[2 - c]);
        }
        ASSERT_EQ(rm.rows[y * 50 + x], m.at<uint8_t>(y, x));  // 0,1,2 kept; readers apply binary
      }
    // Valid counts (the sample index) are the float32 store's.
    EXPECT_EQ(Summaries(o.store).at("f/1")[2].valid_count, 0u);
    const auto want_sum = Summaries(store("f32")), got_sum = Summaries(o.store);
    for (const auto& [id, recs] : want_sum)
      for (size_t f = 0; f < recs.size(); ++f) {
        EXPECT_EQ(got_sum.at(id)[f].has_valid_count, recs[f].has_valid_count);
        EXPECT_EQ(got_sum.at(id)[f].valid_count, recs[f].valid_count) << id << " " << f;
      }
  }
  // Compact rows take far fewer bytes than float32 (uint8 rgb: a quarter).
  EXPECT_EQ(ReadRaw(store("compact_rows")).at("f/0").at("rgb8").payload.size() * 4,
            ref_.at("f/0").at("rgb8").payload.size());
}

TEST_F(ImageEncodingTest, TilesHoldTileCHWOfTheRowsExactly) {
  for (uint32_t T : {8u, 16u, 64u}) {
    SCOPED_TRACE(T);
    auto o = Options(manifest_, store("tiles" + std::to_string(T)));
    o.layout = "tiles";
    o.tile_size = T;
    ASSERT_TRUE(IngestImages(o).ok());
    const auto got = ReadRaw(o.store);
    for (const auto& [id, fields] : ref_)
      for (const auto& [field, ref] : fields) {
        const RawRecord& rec = got.at(id).at(field);
        ASSERT_EQ(rec.header.tile, T);
        ASSERT_EQ(rec.header.dtype, DType::kFloat32);
        const TileGrid g = rec.header.grid();
        std::vector<uint8_t> want(g.elements() * 4);
        TileCHW(ref.payload.data(), 4, g, want.data());
        EXPECT_EQ(rec.payload, want) << id << " " << field;  // padding zeros included
        EXPECT_EQ(rec.rows, ref.payload);
      }
    const auto want_sum = Summaries(store("f32")), got_sum = Summaries(o.store);
    for (const auto& [id, recs] : want_sum)
      for (size_t f = 0; f < recs.size(); ++f) {
        EXPECT_EQ(got_sum.at(id)[f].valid_count, recs[f].valid_count);
        EXPECT_EQ(got_sum.at(id)[f].tile, T);
      }
  }
}

TEST_F(ImageEncodingTest, Float16IsTheNormalisedValueRoundedToNearest) {
  auto o = Options(manifest_, store("half"));
  o.encoding = {"compact", "depth=float16", "rgb8=float16"};
  o.layout = "tiles";
  o.tile_size = 8;
  ASSERT_TRUE(IngestImages(o).ok());
  const auto got = ReadRaw(o.store);
  for (const auto& [id, fields] : ref_)
    for (const char* field : {"depth", "rgb8"}) {
      const RawRecord& rec = got.at(id).at(field);
      const RawRecord& ref = fields.at(field);
      ASSERT_EQ(rec.header.dtype, DType::kFloat16);
      EXPECT_TRUE(rec.header.norm == ref.header.norm);
      for (size_t i = 0; i < ref.header.elements(); ++i) {
        float v;
        std::memcpy(&v, ref.rows.data() + 4 * i, 4);
        Float16 h;
        std::memcpy(&h, rec.rows.data() + 2 * i, 2);
        ASSERT_EQ(h.bits, ToFloat16(v).bits) << id << " " << field << " " << i;
        const float back = ToFloat32(h);
        if (std::isnan(v)) {
          ASSERT_TRUE(std::isnan(back));
        } else {
          // The stated bound: relative 2^-11 (normal range), absolute 2^-25 below 2^-14.
          ASSERT_LE(std::fabs(back - v), std::max(std::fabs(v) * 0x1p-11f, 0x1p-25f)) << v;
        }
      }
    }
  EXPECT_EQ(got.at("f/0").at("mask").header.dtype, DType::kUInt8);  // the others stay compact
}

TEST_F(ImageEncodingTest, AResumeWithAnotherEncodingOrLayoutIsRefusedAndChangesNothing) {
  // A half-finished ingest: the first two frames.
  const std::string part = (dir_ / "in/part.csv");
  {
    std::ifstream in(manifest_);
    std::ofstream out(part);
    std::string line;
    for (int i = 0; i < 3 && std::getline(in, line); ++i) out << line << "\n";
  }
  auto o = Options(part, store("resume"));
  o.encoding = {"compact"};
  ASSERT_TRUE(IngestImages(o).ok());
  const auto before = ReadRaw(o.store);
  auto read_all = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  const std::string bytes_before = read_all(o.store + "/data.mdb");

  auto other = Options(manifest_, o.store);
  auto r = IngestImages(other);  // float32
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("is stored as uint8"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("--encoding"), std::string::npos);
  EXPECT_NE(r.status().message().find("new store"), std::string::npos);

  other.encoding = {"compact"};
  other.layout = "tiles";
  r = IngestImages(other);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--layout rows"), std::string::npos) << r.status().message();
  // --layout tiles without --tile-size on a rows store asks for the default edge.
  EXPECT_NE(r.status().message().find("--layout tiles --tile-size " + std::to_string(kDefaultTileSize)),
            std::string::npos)
      << r.status().message();
  EXPECT_EQ(read_all(o.store + "/data.mdb"), bytes_before);
  EXPECT_EQ(ReadRaw(o.store).size(), before.size());

  // The same options finish it, and equal a single compact ingest.
  other.layout = "rows";
  ASSERT_TRUE(IngestImages(other).ok());
  auto one = Options(manifest_, store("one"));
  one.encoding = {"compact"};
  ASSERT_TRUE(IngestImages(one).ok());
  const auto a = ReadRaw(o.store), b = ReadRaw(one.store);
  ASSERT_EQ(a.size(), 4u);
  for (const auto& [id, fields] : b)
    for (const auto& [field, rec] : fields) EXPECT_EQ(a.at(id).at(field).payload, rec.payload) << id << field;
}

TEST_F(ImageEncodingTest, BadOptionsAreErrorsNamingThem) {
  auto o = Options(manifest_, store("bad"));
  o.encoding = {"compact", "normals=float16"};
  auto r = IngestImages(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--encoding names field 'normals'"), std::string::npos) << r.status().message();
  o.encoding = {"zstd"};
  r = IngestImages(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unknown encoding 'zstd'"), std::string::npos);
  o.encoding = {};
  o.layout = "tiles";
  o.tile_size = 20;
  r = IngestImages(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--tile-size must be a multiple of 8"), std::string::npos);
  EXPECT_FALSE(fs::exists(o.store)) << "nothing is created for bad options";
}

TEST_F(ImageEncodingTest, ACompactFieldRefusesAFileOfAnotherBitDepthNamingIt) {
  // Frame 2's rgb8 becomes a 16-bit PNG.
  cv::Mat b16(37, 50, CV_16UC3, cv::Scalar(1000, 2000, 3000));
  ASSERT_TRUE(cv::imwrite((dir_ / "in/a2.png"), b16));
  auto o = Options(manifest_, store("mixed"));
  o.encoding = {"compact"};
  auto r = IngestImages(o);
  ASSERT_FALSE(r.ok());
  const std::string msg = r.status().message();
  EXPECT_NE(msg.find("sample 'f/2'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("a2.png"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stored as uint8"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--encoding rgb8=float32"), std::string::npos) << msg;
  // float32 takes both (each record keeps its own normalisation).
  auto f = Options(manifest_, store("mixed32"));
  EXPECT_TRUE(IngestImages(f).ok());
}

// ---------------------------------------------------------------------------
// HDF5.

TEST(Hdf5EncodingTest, CompactKeepsIntegerDatasetsAndConvertsBitForBit) {
  TempDir dir;
  const std::string h5 = (dir / "v.h5");
  const std::array<hsize_t, 3> dims{9, 11, 5};
  const size_t n = 9 * 11 * 5;
  auto u8 = testing::RandomValues<uint8_t>(n, 1, 0, 255.99);
  auto i8 = testing::RandomValues<int8_t>(n, 2, -128, 127.99);
  auto i16 = testing::RandomValues<int16_t>(n, 3, -32768, 32767.99);
  auto u16 = testing::RandomValues<uint16_t>(n, 4, 0, 65535.99);
  auto f32 = testing::RandomValues<float>(n, 5, -1e4, 1e4);
  auto lab = testing::RandomValues<uint8_t>(n, 6, 0, 3.99);
  {
    testing::H5Out f(h5);
    ASSERT_TRUE(f.ok());
    const std::vector<hsize_t> d(dims.begin(), dims.end()), chunk{4, 4, 5};
    ASSERT_TRUE(f.Write("/U8/p1", H5T_STD_U8LE, H5T_NATIVE_UINT8, d, u8.data(), chunk, 4));
    ASSERT_TRUE(f.Write("/I8/p1", H5T_STD_I8LE, H5T_NATIVE_INT8, d, i8.data()));
    ASSERT_TRUE(f.Write("/I16/p1", H5T_STD_I16BE, H5T_NATIVE_INT16, d, i16.data(), chunk, 1, true));
    ASSERT_TRUE(f.Write("/U16/p1", H5T_STD_U16LE, H5T_NATIVE_UINT16, d, u16.data()));
    ASSERT_TRUE(f.Write("/F32/p1", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, d, f32.data()));
    ASSERT_TRUE(f.Write("/MASK/p1", H5T_STD_U8LE, H5T_NATIVE_UINT8, d, lab.data()));
  }
  auto opts = [&](const std::string& store) {
    Hdf5IngestOptions o;
    o.files = {h5};
    o.store = (dir / store);
    o.groups = {"U8", "I8", "I16", "U16", "F32", "MASK"};
    o.mask_fields = {"MASK"};
    o.norm = {{"I16", "range:-1024,3000"}, {"U16", "unit"}};
    o.durable = false;
    return o;
  };
  ASSERT_TRUE(IngestHdf5(opts("f32.ps")).ok());
  auto c = opts("compact.ps");
  c.encoding = {"compact", "F32=float16"};
  auto r = IngestHdf5(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto ref = ReadRaw((dir / "f32.ps")), got = ReadRaw(c.store);
  const std::map<std::string, DType> want = {{"U8", DType::kUInt8},    {"I8", DType::kInt16},
                                             {"I16", DType::kInt16},   {"U16", DType::kUInt16},
                                             {"F32", DType::kFloat16}, {"MASK", DType::kUInt8}};
  const RawRecord& i8rec = got.at("p1").at("I8");
  for (const auto& [field, dtype] : want) {
    SCOPED_TRACE(field);
    const RawRecord& rec = got.at("p1").at(field);
    const RawRecord& f = ref.at("p1").at(field);
    EXPECT_EQ(rec.header.dtype, dtype);
    EXPECT_EQ(rec.header.tile, 0);
    EXPECT_TRUE(rec.header.norm == f.header.norm);
    EXPECT_EQ(rec.header.shape, f.header.shape);
    if (dtype != DType::kFloat16) {
      EXPECT_EQ(SameAsFloat32(rec, f), "");
    }
  }
  // Raw values in (S,H,W) order: slice axis -1 (the last).
  for (uint64_t s = 0; s < 5; ++s)
    for (uint64_t h = 0; h < 9; ++h)
      for (uint64_t w = 0; w < 11; ++w) {
        const size_t src = testing::SourceIndex(dims, 2, s, h, w), dst = (s * 9 + h) * 11 + w;
        int16_t v;
        std::memcpy(&v, i8rec.rows.data() + 2 * dst, 2);
        ASSERT_EQ(v, i8[src]);
        ASSERT_EQ(got.at("p1").at("U8").rows[dst], u8[src]);
        std::memcpy(&v, got.at("p1").at("I16").rows.data() + 2 * dst, 2);
        ASSERT_EQ(v, i16[src]);
        Float16 hv;
        std::memcpy(&hv, got.at("p1").at("F32").rows.data() + 2 * dst, 2);
        ASSERT_EQ(hv.bits, ToFloat16(f32[src]).bits);
      }
  EXPECT_EQ(Summaries(c.store).at("p1")[5].valid_count, Summaries((dir / "f32.ps")).at("p1")[5].valid_count);
  // float16 of normalised (range, binary) and plain integer volumes: the float32 record rounded to nearest.
  auto hf = opts("half.ps");
  hf.encoding = {"I16=float16", "MASK=float16", "U16=float16"};
  ASSERT_TRUE(IngestHdf5(hf).ok());
  const auto half = ReadRaw(hf.store);
  for (const char* field : {"I16", "MASK", "U16"}) {
    const RawRecord& rec = half.at("p1").at(field);
    const RawRecord& f = ref.at("p1").at(field);
    ASSERT_EQ(rec.header.dtype, DType::kFloat16) << field;
    for (size_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, f.rows.data() + 4 * i, 4);
      Float16 h;
      std::memcpy(&h, rec.rows.data() + 2 * i, 2);
      ASSERT_EQ(h.bits, ToFloat16(v).bits) << field << " " << i;
    }
  }
  EXPECT_EQ(half.at("p1").at("U8").header.dtype, DType::kFloat32);
  // A resume with another encoding is refused before anything is read.
  auto again = opts("compact.ps");
  auto e = IngestHdf5(again);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("is stored as uint8"), std::string::npos) << e.status().message();
  // Tiles are refused for volumes, with the reason.
  auto t = opts("tiles.ps");
  t.layout = "tiles";
  e = IngestHdf5(t);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("tiles would not help"), std::string::npos) << e.status().message();
  EXPECT_FALSE(fs::exists(t.store));
  auto u = opts("unknown.ps");
  u.encoding = {"CT=compact"};
  e = IngestHdf5(u);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("field 'CT'"), std::string::npos) << e.status().message();
}

}  // namespace
}  // namespace patchstore
