// Issue 29 item 2, "convert after": CopyStore re-lays out and re-encodes a
// store from its records (ingest/convert.h). Reads from the copy equal the
// source's bit for bit for exact encodings, in both directions (rows <->
// tiles, float32 <-> compact); every sample's metadata, the store's
// attributes, mask block counts and input order are carried; a conversion
// that would change a value is refused naming sample and field; a failed or
// cancelled copy leaves no DST.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "encoding_test_util.h"
#include "hdf5_test_util.h"
#include "ingest/encoding.h"
#include "patchstore/ingest/convert.h"
#include "patchstore/ingest/ingest_hdf5.h"
#include "patchstore/reader/reader.h"
#include "test_util.h"

namespace patchstore {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

bool SameBits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// Anything but the store itself in `dir` (temporary folders of a copy).
std::vector<std::string> Leftovers(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".copy-") != std::string::npos) out.push_back(e.path().string());
  return out;
}

Result<CopySummary> Copy(const std::string& src, const std::string& dst, const std::string& layout,
                         std::vector<std::string> encoding, uint32_t tile = 0) {
  CopyOptions o;
  o.src = src;
  o.dst = dst;
  o.layout = layout;
  o.tile_size = tile;
  o.encoding = std::move(encoding);
  o.durable = false;
  o.threads = 2;
  return CopyStore(o);
}

// Every field of every sample of `got` reads as in `ref` (whole records as
// float32, bit for bit; `half`: fields expected rounded to float16), with the
// same ids, order, field metadata (but dtype and tile), attributes, seal,
// valid counts and mask block counts.
void ExpectSameStore(const std::string& got_path, const std::string& ref_path,
                     const std::vector<std::string>& half = {}) {
  auto got = Reader::Open(got_path);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  auto ref = Reader::Open(ref_path);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  const Reader& g = **got;
  const Reader& r = **ref;
  ASSERT_EQ(g.size(), r.size());
  EXPECT_EQ(g.meta().kind, r.meta().kind);
  EXPECT_EQ(g.sealed(), r.sealed());
  auto attrs = g.meta().attributes;
  attrs.erase("copy_command");
  auto ref_attrs = r.meta().attributes;
  ref_attrs.erase("copy_command");
  EXPECT_EQ(attrs, ref_attrs);
  ASSERT_EQ(g.field_count(), r.field_count());
  for (int f = 0; f < r.field_count(); ++f) {
    const FieldMeta &a = g.field(f), &b = r.field(f);
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.channels, b.channels);
    EXPECT_EQ(a.layout, b.layout);
    EXPECT_EQ(a.source_type, b.source_type);
    EXPECT_TRUE(a.norm == b.norm) << a.name;
    EXPECT_EQ(a.channel_names, b.channel_names);
    EXPECT_EQ(a.is_mask, b.is_mask);
    EXPECT_EQ(a.source_format, b.source_format);
    EXPECT_EQ(a.mask_blocks, b.mask_blocks) << a.name;
  }
  for (uint64_t s = 0; s < r.size(); ++s) {
    ASSERT_EQ(g.id(s), r.id(s));
    for (int f = 0; f < r.field_count(); ++f) {
      const std::string name = r.field(f).name;
      auto hr = r.Header(s, f);
      auto hg = g.Header(s, f);
      ASSERT_TRUE(hr.ok() && hg.ok()) << name;
      EXPECT_EQ(hg->shape, hr->shape);
      EXPECT_EQ(hg->source_type, hr->source_type);
      EXPECT_TRUE(hg->norm == hr->norm);
      const int64_t C = hr->shape[0], H = hr->shape[1], W = hr->shape[2];
      std::vector<float> a(C * H * W), b(C * H * W);
      ASSERT_TRUE(g.CopyPatch(s, f, 0, 0, H, W, a.data()).ok()) << name;
      ASSERT_TRUE(r.CopyPatch(s, f, 0, 0, H, W, b.data()).ok()) << name;
      const bool rounded = std::find(half.begin(), half.end(), name) != half.end();
      for (size_t i = 0; i < a.size(); ++i) {
        const float want = rounded ? ToFloat32(ToFloat16(b[i])) : b[i];
        ASSERT_TRUE(SameBits(a[i], want))
            << "sample " << g.id(s) << " field " << name << " element " << i << ": " << a[i] << " vs " << want;
      }
      const RecordSummary &sg = g.summary(s, f), &sr = r.summary(s, f);
      EXPECT_EQ(sg.has_valid_count, sr.has_valid_count);
      EXPECT_EQ(sg.valid_count, sr.valid_count) << name;
      if (r.field(f).mask_blocks) {
        auto bg = g.MaskBlocks(s, f);
        auto br = r.MaskBlocks(s, f);
        ASSERT_TRUE(bg.ok() && br.ok()) << name;
        ASSERT_EQ(bg->B, br->B);
        ASSERT_EQ(bg->by, br->by);
        ASSERT_EQ(bg->bx, br->bx);
        EXPECT_EQ(std::memcmp(bg->data, br->data, (bg->by + 1) * (bg->bx + 1) * sizeof(uint32_t)), 0) << name;
      }
    }
  }
}

struct Layouts {
  std::string name, layout;
  uint32_t tile;
  std::vector<std::string> encoding;
};

TEST(Convert, FramesBetweenRowsTilesFloat32AndCompactReadTheSame) {
  TempDir dir;
  const std::string manifest = testing::MakeFrames(dir / "in", 5);
  const std::vector<Layouts> configs = {
      {"rows-f32", "rows", 0, {"float32"}},
      {"tiles16-compact", "tiles", 16, {"compact"}},
      {"rows-compact", "rows", 0, {"compact"}},
      {"tiles8-f32", "tiles", 8, {"float32"}},
  };
  for (const Layouts& c : configs) {
    auto o = testing::Options(manifest, dir / ("ingest-" + c.name + ".ps"));
    o.layout = c.layout;
    o.tile_size = c.tile;
    o.encoding = c.encoding;
    ASSERT_TRUE(IngestImages(o).ok()) << c.name;
  }
  const std::string ref = dir / "ingest-rows-f32.ps";
  for (const Layouts& from : configs) {
    for (const Layouts& to : configs) {
      if (from.name == to.name) continue;
      SCOPED_TRACE(from.name + " -> " + to.name);
      const std::string dst = dir / (from.name + "-to-" + to.name + ".ps");
      auto r = Copy(dir / ("ingest-" + from.name + ".ps"), dst, to.layout, to.encoding, to.tile);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_TRUE(r->converted);
      EXPECT_EQ(r->samples, 5u);
      ExpectSameStore(dst, ref);
      // The copy is what an ingest with the target's flags writes: the same
      // dtypes, tiles and record bytes (checksums included), but for masks
      // that come from float32 records: binary normalisation kept only
      // {0,1} of their source values (0, 1, 2 here), so compact stores 0 and
      // 255, which read as the same {0,1}.
      auto got = Reader::Open(dst);
      auto want = Reader::Open(dir / ("ingest-" + to.name + ".ps"));
      ASSERT_TRUE(got.ok() && want.ok());
      for (int f = 0; f < (*want)->field_count(); ++f) {
        EXPECT_EQ((*got)->field(f).dtype, (*want)->field(f).dtype) << (*want)->field(f).name;
        EXPECT_EQ((*got)->field(f).tile, (*want)->field(f).tile) << (*want)->field(f).name;
        if ((*want)->field(f).norm.kind == NormKind::kBinary && from.encoding != to.encoding &&
            from.encoding[0] == "float32")
          continue;
        for (uint64_t s = 0; s < (*want)->size(); ++s) {
          auto a = (*got)->snapshot()->GetRecord(s, static_cast<uint16_t>(f));
          auto b = (*want)->snapshot()->GetRecord(s, static_cast<uint16_t>(f));
          ASSERT_TRUE(a.ok() && b.ok());
          EXPECT_TRUE(*a == *b) << "record bytes of sample " << s << " field " << (*want)->field(f).name << " "
                                << DTypeName((*want)->field(f).dtype);
        }
      }
      EXPECT_TRUE(Leftovers(dir.path()).empty());
    }
  }
}

TEST(Convert, CompactDtypesFollowTheSources) {
  TempDir dir;
  const std::string manifest = testing::MakeFrames(dir / "in", 2);
  ASSERT_TRUE(IngestImages(testing::Options(manifest, dir / "rows.ps")).ok());
  auto r = Copy(dir / "rows.ps", dir / "c.ps", "tiles", {"compact"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto c = Reader::Open(dir / "c.ps");
  ASSERT_TRUE(c.ok());
  const std::map<std::string, DType> want = {{"rgb8", DType::kUInt8},
                                             {"rgb16", DType::kUInt16},
                                             {"mask", DType::kUInt8},
                                             {"depth", DType::kFloat32},
                                             {"zh", DType::kFloat16}};
  for (const FieldMeta& f : (*c)->meta().fields) {
    EXPECT_EQ(f.dtype, want.at(f.name)) << f.name;
    EXPECT_EQ(f.tile, kDefaultTileSize) << f.name;  // tiles without --tile-size: the default edge
  }
  // A binary mask's float32 {0,1} become the source values the inverse
  // gives: 0 and 255 (the 8-bit source's largest), as export writes them.
  const int mask = (*c)->FieldIndex("mask").value();
  std::set<int> seen;
  for (uint64_t s = 0; s < (*c)->size(); ++s) {
    auto v = (*c)->Get(s, mask);
    ASSERT_TRUE(v.ok());
    for (int64_t i = 0; i < v->elements(); ++i) seen.insert(v->data_as<uint8_t>()[i]);
  }
  EXPECT_EQ(seen, (std::set<int>{0, 255}));
}

TEST(Convert, EncodingOfOneFieldLeavesTheOthersAndFloat16Rounds) {
  TempDir dir;
  const std::string manifest = testing::MakeFrames(dir / "in", 3);
  auto o = testing::Options(manifest, dir / "compact.ps");
  o.encoding = {"compact"};
  ASSERT_TRUE(IngestImages(o).ok());
  ASSERT_TRUE(IngestImages(testing::Options(manifest, dir / "ref.ps")).ok());
  auto r = Copy(dir / "compact.ps", dir / "half.ps", "", {"depth=float16"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto h = Reader::Open(dir / "half.ps");
  ASSERT_TRUE(h.ok());
  auto c = Reader::Open(dir / "compact.ps");
  ASSERT_TRUE(c.ok());
  for (int f = 0; f < (*h)->field_count(); ++f) {
    const FieldMeta& fm = (*h)->field(f);
    EXPECT_EQ(fm.dtype, fm.name == "depth" ? DType::kFloat16 : (*c)->field(f).dtype) << fm.name;
    EXPECT_EQ(fm.tile, 0) << fm.name;  // no --layout: each field keeps its own
  }
  ExpectSameStore(dir / "half.ps", dir / "ref.ps", {"depth"});
  // The same bytes as an ingest with those flags.
  auto i = testing::Options(manifest, dir / "ingest-half.ps");
  i.encoding = {"compact", "depth=float16"};
  ASSERT_TRUE(IngestImages(i).ok());
  auto ih = Reader::Open(dir / "ingest-half.ps");
  ASSERT_TRUE(ih.ok());
  const int depth = (*h)->FieldIndex("depth").value();
  for (uint64_t s = 0; s < 3; ++s)
    EXPECT_TRUE(*(*h)->snapshot()->GetRecord(s, depth) == *(*ih)->snapshot()->GetRecord(s, depth));
}

TEST(Convert, ALossyConversionIsRefusedNamingSampleAndField) {
  TempDir dir;
  const std::string manifest = testing::MakeFrames(dir / "in", 3);
  auto o = testing::Options(manifest, dir / "half.ps");
  o.encoding = {"rgb8=float16"};  // float16 values of 8-bit sources: no uint8 holds them
  ASSERT_TRUE(IngestImages(o).ok());
  auto r = Copy(dir / "half.ps", dir / "c.ps", "tiles", {"compact"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("sample 'f/0'"), std::string::npos) << m;
  EXPECT_NE(m.find("field 'rgb8' cannot be stored as uint8 (--encoding compact)"), std::string::npos) << m;
  EXPECT_NE(m.find("--encoding rgb8=float16"), std::string::npos) << m;  // how to keep it
  EXPECT_FALSE(fs::exists(dir / "c.ps"));
  EXPECT_TRUE(Leftovers(dir.path()).empty());
  // A float32 store of a float16 EXR converts to compact float16 exactly
  // (and float16 on request rounds) ...
  ASSERT_TRUE(IngestImages(testing::Options(manifest, dir / "f32.ps")).ok());
  ASSERT_TRUE(Copy(dir / "f32.ps", dir / "zh.ps", "", {"zh=compact", "rgb8=float16"}).ok());
  EXPECT_EQ(Reader::Open(dir / "zh.ps").value()->field(4).dtype, DType::kFloat16);
  ExpectSameStore(dir / "zh.ps", dir / "f32.ps", {"rgb8"});
  // ... but float32 values of a float16 source that are not float16 values
  // are refused for compact.
  {
    WriterOptions wo;
    wo.durable = false;
    auto w = Writer::Open(dir / "odd.ps", wo);
    ASSERT_TRUE(w.ok());
    FieldMeta fm;
    fm.name = "z";
    fm.channels = 1;
    fm.source_type = SourceType::kFloat16;
    ASSERT_TRUE((*w)->EnsureField(fm).ok());
    std::vector<SampleInput> in;
    std::vector<std::vector<float>> data = {{0.5f, 0.25f, 2.f, 4.f}, {0.5f, 0.1f, 2.f, 4.f}};
    for (int s = 0; s < 2; ++s) {
      SampleInput si;
      si.id = "odd/" + std::to_string(s);
      RecordInput r;
      r.header.shape = {1, 2, 2, 0};
      r.header.source_type = SourceType::kFloat16;
      r.data = data[s].data();
      si.records.push_back(r);
      in.push_back(si);
    }
    ASSERT_TRUE((*w)->WriteBatch(in).ok());
  }
  auto odd = Copy(dir / "odd.ps", dir / "odd-c.ps", "", {"compact"});
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("sample 'odd/1': field 'z' cannot be stored as float16 (--encoding compact) "
                                        "without changing its values: the value 0.100000001 at (0, 0, 1)"),
            std::string::npos)
      << odd.status().message();
  EXPECT_NE(odd.status().message().find("--encoding z=float32"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir / "odd-c.ps"));
}

TEST(Convert, VolumesConvertTheirEncodingAndRefuseTiles) {
  TempDir dir;
  const std::string h5 = dir / "v.h5";
  const std::vector<hsize_t> d{11, 9, 7};
  const size_t n = 11 * 9 * 7;
  {
    testing::H5Out f(h5);
    ASSERT_TRUE(f.ok());
    for (int p = 0; p < 3; ++p) {
      auto u8 = testing::RandomValues<uint8_t>(n, p, 0, 3.99);
      auto i16 = testing::RandomValues<int16_t>(n, p + 1, -32768, 32767.99);
      auto u16 = testing::RandomValues<uint16_t>(n, p + 2, 0, 65535.99);
      auto f32 = testing::RandomValues<float>(n, p + 3, -1e4, 1e4);
      const std::string id = "/p" + std::to_string(p);
      ASSERT_TRUE(f.Write("/MASK" + id, H5T_STD_U8LE, H5T_NATIVE_UINT8, d, u8.data()));
      ASSERT_TRUE(f.Write("/CT" + id, H5T_STD_I16LE, H5T_NATIVE_INT16, d, i16.data()));
      ASSERT_TRUE(f.Write("/MR" + id, H5T_STD_U16LE, H5T_NATIVE_UINT16, d, u16.data()));
      ASSERT_TRUE(f.Write("/F" + id, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, d, f32.data()));
    }
  }
  Hdf5IngestOptions o;
  o.files = {h5};
  o.store = dir / "v.ps";
  o.groups = {"MASK", "CT", "MR", "F"};
  o.mask_fields = {"MASK"};
  o.norm = {{"CT", "range:-1024,3000"}, {"MR", "symmetric"}};
  o.durable = false;
  ASSERT_TRUE(IngestHdf5(o).ok());
  auto r = Copy(dir / "v.ps", dir / "c.ps", "", {"compact"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto c = Reader::Open(dir / "c.ps");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->field(0).dtype, DType::kUInt8);
  EXPECT_EQ((*c)->field(1).dtype, DType::kInt16);
  EXPECT_EQ((*c)->field(2).dtype, DType::kUInt16);
  EXPECT_EQ((*c)->field(3).dtype, DType::kFloat32);
  EXPECT_EQ((*c)->meta().attributes.at("slice_axis"), "2");
  ExpectSameStore(dir / "c.ps", dir / "v.ps");
  ASSERT_TRUE(Copy(dir / "c.ps", dir / "back.ps", "rows", {"float32"}).ok());
  ExpectSameStore(dir / "back.ps", dir / "v.ps");
  auto tiles = Copy(dir / "v.ps", dir / "t.ps", "tiles", {});
  ASSERT_FALSE(tiles.ok());
  EXPECT_NE(tiles.status().message().find("--layout tiles is for image frames"), std::string::npos)
      << tiles.status().message();
  EXPECT_FALSE(fs::exists(dir / "t.ps"));
}

TEST(Convert, ShardsKeepTheirInputOrderAndUnsealedStoresStayUnsealed) {
  TempDir dir;
  const std::string manifest = testing::MakeFrames(dir / "in", 8);
  auto o = testing::Options(manifest, dir / "shard.ps");
  o.shard_index = 1;
  o.shard_count = 2;
  ASSERT_TRUE(IngestImages(o).ok());
  ASSERT_TRUE(Copy(dir / "shard.ps", dir / "c.ps", "tiles", {"compact"}).ok());
  ExpectSameStore(dir / "c.ps", dir / "shard.ps");
  auto a = Reader::Open(dir / "c.ps");
  auto b = Reader::Open(dir / "shard.ps");
  ASSERT_TRUE(a.ok() && b.ok());
  auto oa = (*a)->snapshot()->InputOrder();
  auto ob = (*b)->snapshot()->InputOrder();
  ASSERT_TRUE(oa.ok() && ob.ok()) << oa.status().ToString();
  EXPECT_EQ(*oa, *ob);

  ASSERT_TRUE(testing::WriteSyntheticStore(dir / "open.ps", 3, {{"img", 2}}, 20, 30, /*seal=*/false).ok());
  ASSERT_TRUE(Copy(dir / "open.ps", dir / "open-tiles.ps", "tiles", {}, 8).ok());
  ExpectSameStore(dir / "open-tiles.ps", dir / "open.ps");
  EXPECT_FALSE(Reader::Open(dir / "open-tiles.ps").value()->sealed());
}

TEST(Convert, ACancelledOrFailedCopyLeavesNoDestination) {
  TempDir dir;
  const std::string manifest = testing::MakeFrames(dir / "in", 6);
  ASSERT_TRUE(IngestImages(testing::Options(manifest, dir / "src.ps")).ok());
  CopyOptions o;
  o.src = dir / "src.ps";
  o.dst = dir / "dst.ps";
  o.layout = "tiles";
  o.durable = false;
  int polls = 0;
  o.cancelled = [&] { return ++polls > 3; };
  auto r = CopyStore(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kAborted);
  EXPECT_FALSE(fs::exists(dir / "dst.ps"));
  EXPECT_TRUE(Leftovers(dir.path()).empty());

  // A damaged record: its checksum fails on read, naming sample and field.
  ASSERT_TRUE(testing::WriteSyntheticStore(dir / "bad.ps", 4, {{"img", 1}}, 32, 32).ok());
  {
    auto reader = Reader::Open(dir / "bad.ps");
    ASSERT_TRUE(reader.ok());
    auto v = (*reader)->Get(2, 0);
    ASSERT_TRUE(v.ok());
    const std::string needle(static_cast<const char*>(v->data), 64);
    std::ifstream in(dir / "bad.ps/data.mdb", std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string bytes = ss.str();
    const size_t at = bytes.find(needle);
    ASSERT_NE(at, std::string::npos);
    bytes[at + 5] ^= 0x40;
    std::ofstream(dir / "bad.ps/data.mdb", std::ios::binary) << bytes;
  }
  auto bad = Copy(dir / "bad.ps", dir / "bad-copy.ps", "tiles", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kCorruption);
  EXPECT_NE(bad.status().message().find("'s/2' field 'img'"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(fs::exists(dir / "bad-copy.ps"));
  EXPECT_TRUE(Leftovers(dir.path()).empty());
}

TEST(Convert, OptionsAreCheckedBeforeAnythingIsWritten) {
  TempDir dir;
  ASSERT_TRUE(testing::WriteSyntheticStore(dir / "s.ps", 2, {{"img", 1}}, 16, 16).ok());
  struct Bad {
    std::string layout;
    uint32_t tile;
    std::vector<std::string> encoding;
    std::string says;
  };
  for (const Bad& b :
       {Bad{"", 32, {}, "--tile-size 32 is for --layout tiles"},
        Bad{"tiles", 12, {}, "--tile-size must be a multiple of 8"},
        Bad{"", 0, {"nope=compact"}, "--encoding names field 'nope'"},
        Bad{"", 0, {"float16"}, "float16 loses precision"}, Bad{"diagonal", 0, {}, "--layout must be rows or tiles"}}) {
    auto r = Copy(dir / "s.ps", dir / "d.ps", b.layout, b.encoding, b.tile);
    ASSERT_FALSE(r.ok()) << b.says;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(b.says), std::string::npos) << r.status().message();
    EXPECT_FALSE(fs::exists(dir / "d.ps"));
  }
  EXPECT_TRUE(Leftovers(dir.path()).empty());
  fs::create_directories(dir / "exists.ps");
  auto r = Copy(dir / "s.ps", dir / "exists.ps", "tiles", {});
  EXPECT_EQ(r.status().code(), Code::kAlreadyExists);
  // Without layout or encoding: the compacting copy, as before.
  auto plain = Copy(dir / "s.ps", dir / "plain.ps", "", {});
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_FALSE(plain->converted);
  EXPECT_EQ(plain->samples, 2u);
  ExpectSameStore(dir / "plain.ps", dir / "s.ps");
}

TEST(Convert, TheCommandLineConvertsAndRefuses) {
  TempDir dir;
  const std::string manifest = testing::MakeFrames(dir / "in", 2);
  auto o = testing::Options(manifest, dir / "src.ps");
  o.encoding = {"rgb8=float16"};
  ASSERT_TRUE(IngestImages(o).ok());
  const std::string cli = PATCHSTORE_CLI;
  std::string out;
  ASSERT_EQ(testing::RunCommand(cli + " copy " + (dir / "src.ps") + " " + (dir / "t.ps") +
                                    " --layout tiles --tile-size 16 --encoding rgb16=compact 2>&1",
                                &out),
            0)
      << out;
  EXPECT_NE(out.find("copy: re-laying out and re-encoding"), std::string::npos) << out;
  EXPECT_NE(out.find("rgb16 float32 rows -> uint16 tiles 16"), std::string::npos) << out;
  EXPECT_NE(out.find("copied '" + (dir / "src.ps") + "' to '" + (dir / "t.ps") + "': 2 samples"), std::string::npos)
      << out;
  // The verification counts records; it has no byte rate to show (it printed "0 MB/s, 0 failed").
  EXPECT_NE(out.find("verify: 12/12 records, "), std::string::npos) << out;
  EXPECT_EQ(out.find("MB/s, 0 failed", out.find("verify: ")), std::string::npos) << out;
  ExpectSameStore(dir / "t.ps", dir / "src.ps");
  EXPECT_EQ(testing::RunCommand(cli + " copy " + (dir / "src.ps") + " " + (dir / "c.ps") + " --encoding compact", &out),
            1)
      << out;
  EXPECT_NE(out.find("patchstore: error: copy '" + (dir / "src.ps") + "': sample 'f/0': field 'rgb8'"),
            std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(dir / "c.ps"));
}

}  // namespace
}  // namespace patchstore
