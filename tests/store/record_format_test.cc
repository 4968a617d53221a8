#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "patchstore/store/format.h"

namespace patchstore {
namespace {

std::vector<uint8_t> MakeRecord(std::vector<uint64_t> shape, uint32_t seed = 1) {
  RecordHeader h;
  h.rank = static_cast<uint8_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) h.shape[i] = shape[i];
  h.layout = Layout::kCHW;
  h.source_type = SourceType::kUInt8;
  h.norm.kind = NormKind::kSymmetric;
  h.norm.scale = 255;
  EXPECT_TRUE(FinalizeHeader(&h).ok());
  std::vector<uint8_t> rec(h.record_bytes(), 0);
  std::mt19937 rng(seed);
  auto* body = reinterpret_cast<float*>(rec.data() + kRecordHeaderSize);
  for (uint64_t i = 0; i < h.elements(); ++i) body[i] = static_cast<float>(rng() % 1000) / 7.0f;
  h.body_checksum = Checksum64(rec.data() + kRecordHeaderSize, h.body_bytes);
  EncodeRecordHeader(h, rec.data());
  return rec;
}

TEST(RecordFormat, RoundTripsHeader) {
  auto rec = MakeRecord({3, 5, 7});
  auto h = ParseRecordHeader(rec.data(), rec.size());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->rank, 3);
  EXPECT_EQ(h->shape[0], 3u);
  EXPECT_EQ(h->shape[1], 5u);
  EXPECT_EQ(h->shape[2], 7u);
  EXPECT_EQ(h->shape[3], 0u);
  EXPECT_EQ(h->payload_bytes, 3u * 5 * 7 * 4);
  EXPECT_EQ(h->norm.kind, NormKind::kSymmetric);
  EXPECT_EQ(h->norm.scale, 255.0);
  EXPECT_EQ(h->source_type, SourceType::kUInt8);
  EXPECT_TRUE(VerifyRecordBody(*h, rec.data()).ok());
}

TEST(RecordFormat, SmallRecordsArePaddedToForceOverflowPages) {
  auto rec = MakeRecord({1, 2, 2});
  EXPECT_EQ(rec.size(), kMinRecordSize);
  EXPECT_EQ(BodyBytesFor(1), kMinRecordSize - kRecordHeaderSize);
  EXPECT_EQ(BodyBytesFor(1 << 20), uint64_t{1} << 20);
  EXPECT_EQ(BodyBytesFor((1 << 20) + 4), (uint64_t{1} << 20) + 16);
}

TEST(RecordFormat, EveryHeaderBitFlipIsRejected) {
  auto rec = MakeRecord({2, 9, 11});
  int caught = 0;
  for (size_t byte = 0; byte < kRecordHeaderSize; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      auto bad = rec;
      bad[byte] ^= static_cast<uint8_t>(1u << bit);
      auto h = ParseRecordHeader(bad.data(), bad.size());
      bool rejected = !h.ok() || !VerifyRecordBody(*h, bad.data()).ok();
      EXPECT_TRUE(rejected) << "flip at byte " << byte << " bit " << bit;
      caught += rejected;
    }
  }
  EXPECT_EQ(caught, static_cast<int>(kRecordHeaderSize * 8));
}

TEST(RecordFormat, EveryBodyBitFlipIsCaughtByVerify) {
  auto rec = MakeRecord({1, 3, 4});  // small: body is mostly padding, check it all
  for (size_t byte = kRecordHeaderSize; byte < rec.size(); ++byte) {
    for (int bit = 0; bit < 8; bit += 3) {
      auto bad = rec;
      bad[byte] ^= static_cast<uint8_t>(1u << bit);
      auto h = ParseRecordHeader(bad.data(), bad.size());
      ASSERT_TRUE(h.ok());  // header intact
      EXPECT_FALSE(VerifyRecordBody(*h, bad.data()).ok()) << "flip at byte " << byte;
    }
  }
}

TEST(RecordFormat, WrongLengthIsRejected) {
  auto rec = MakeRecord({3, 8, 8});
  for (size_t len : {size_t{0}, size_t{10}, kRecordHeaderSize - 1, kRecordHeaderSize, rec.size() - 1}) {
    auto h = ParseRecordHeader(rec.data(), len);
    EXPECT_FALSE(h.ok()) << len;
    EXPECT_EQ(h.status().code(), Code::kCorruption);
  }
  rec.push_back(0);
  EXPECT_FALSE(ParseRecordHeader(rec.data(), rec.size()).ok());
  EXPECT_FALSE(ParseRecordHeader(nullptr, 0).ok());
}

TEST(RecordFormat, HostileShapesDoNotOverflow) {
  // A header whose own checksum is valid but whose shape multiplies past 2^64.
  RecordHeader h;
  h.rank = 4;
  h.shape = {uint64_t{1} << 20, uint64_t{1} << 20, uint64_t{1} << 20, uint64_t{1} << 20};
  EXPECT_FALSE(FinalizeHeader(&h).ok());
  std::vector<uint8_t> rec(kMinRecordSize, 0);
  h.payload_bytes = 16;
  h.body_bytes = kMinRecordSize - kRecordHeaderSize;
  EncodeRecordHeader(h, rec.data());
  auto parsed = ParseRecordHeader(rec.data(), rec.size());
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), Code::kCorruption);
}

TEST(RecordFormat, RandomBytesNeverParseAndNeverCrash) {
  std::mt19937_64 rng(42);
  std::vector<uint8_t> buf(8192);
  for (int i = 0; i < 2000; ++i) {
    size_t n = rng() % buf.size();
    for (size_t j = 0; j < n; ++j) buf[j] = static_cast<uint8_t>(rng());
    if (n >= 4 && (i % 2)) std::memcpy(buf.data(), "PSR1", 4);
    EXPECT_FALSE(ParseRecordHeader(buf.data(), n).ok());
  }
}

TEST(RecordFormat, KeysRoundTripAndSortByIndex) {
  auto a = RecordKey(1, 2), b = RecordKey(1, 3), c = RecordKey(256, 0);
  EXPECT_LT(std::memcmp(a.data(), b.data(), kRecordKeySize), 0);
  EXPECT_LT(std::memcmp(b.data(), c.data(), kRecordKeySize), 0);
  uint64_t s;
  uint16_t f;
  ASSERT_TRUE(DecodeRecordKey(c.data(), c.size(), &s, &f));
  EXPECT_EQ(s, 256u);
  EXPECT_EQ(f, 0u);
  EXPECT_FALSE(DecodeRecordKey(c.data(), 9, &s, &f));
}

TEST(IdValue, RoundTripsAnyBytesAndDetectsDamage) {
  std::string id("a/../b\0c\n\xff", 11);
  std::string v = EncodeIdValue(7, id);
  auto back = DecodeIdValue(7, v.data(), v.size());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, id);
  EXPECT_FALSE(DecodeIdValue(8, v.data(), v.size()).ok());  // wrong index
  for (size_t i = 0; i < v.size(); ++i) {
    std::string bad = v;
    bad[i] ^= 0x10;
    EXPECT_FALSE(DecodeIdValue(7, bad.data(), bad.size()).ok()) << i;
  }
}

TEST(StoreMeta, RoundTripsAndDetectsDamage) {
  StoreMeta m;
  m.tool_version = "0.1.0";
  m.sealed = true;
  m.sample_count = 12;
  FieldMeta f;
  f.name = "rgb";
  f.channels = 3;
  f.norm.kind = NormKind::kSymmetric;
  f.norm.scale = 255;
  f.channel_names = "R,G,B";
  f.source_format = "png";
  m.fields.push_back(f);
  f.name = "we=ird\nname\\";
  f.channels = 1;
  f.is_mask = true;
  f.norm.clamp = true;
  f.norm.clamp_lo = -1;
  f.norm.clamp_hi = 0.5;
  m.fields.push_back(f);
  m.attributes["ingest_command"] = "patchstore ingest images x --field a=b\nline2";
  const std::string text = m.Encode();
  auto back = StoreMeta::Decode(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->Encode(), text);
  EXPECT_EQ(back->fields[1].name, "we=ird\nname\\");
  EXPECT_TRUE(back->fields[1].norm == f.norm);
  EXPECT_EQ(back->attributes["ingest_command"], m.attributes["ingest_command"]);
  for (size_t i = 0; i < text.size(); i += 7) {
    std::string bad = text;
    bad[i] ^= 0x01;
    EXPECT_FALSE(StoreMeta::Decode(bad).ok()) << "flip at " << i;
  }
  EXPECT_FALSE(StoreMeta::Decode("").ok());
  EXPECT_FALSE(StoreMeta::Decode(text.substr(0, text.size() - 3)).ok());
}

TEST(Normalization, MatchesTheSeedFormulaBitForBit) {
  Normalization n;
  n.kind = NormKind::kSymmetric;
  n.scale = 255;
  for (int x = 0; x <= 255; ++x) {
    // numpy: img.astype(np.float32) / 255 * 2 - 1, all in float32
    float expect = static_cast<float>(x) / 255.0f * 2.0f - 1.0f;
    float got = n.Apply(x);
    EXPECT_EQ(std::memcmp(&expect, &got, 4), 0) << x;
  }
  EXPECT_EQ(n.Apply(0), -1.0f);
  EXPECT_EQ(n.Apply(255), 1.0f);
}

TEST(Normalization, SourceMaxValueIsTheIntegerRange) {
  EXPECT_EQ(SourceMaxValue(SourceType::kUInt8), 255.0);
  EXPECT_EQ(SourceMaxValue(SourceType::kUInt16), 65535.0);
  for (SourceType t :
       {SourceType::kUnknown, SourceType::kFloat16, SourceType::kFloat32, SourceType::kInt16, SourceType::kFloat64,
        SourceType::kInt8, SourceType::kUInt32, SourceType::kInt32, SourceType::kInt64, SourceType::kUInt64})
    EXPECT_EQ(SourceMaxValue(t), 0.0) << SourceTypeName(t);
}

// Invert(Apply(x)) rounded is x for every uint8 and uint16 value and every
// normalisation export writes back as PNG (what makes its round trip exact).
TEST(Normalization, InvertUndoesApplyForEveryIntegerValue) {
  for (SourceType t : {SourceType::kUInt8, SourceType::kUInt16}) {
    const double maxval = SourceMaxValue(t);
    // (range is always clamped to [-1, 1]: its [LO, HI] covers the type's values)
    const char* range = t == SourceType::kUInt8 ? "range:-1024,3000" : "range:0,65535";
    for (const char* spec : {"none", "symmetric", "unit", "affine:0.5,-3", range}) {
      auto n = ParseNormalization(spec, maxval);
      ASSERT_TRUE(n.ok()) << spec;
      for (int x = 0; x <= static_cast<int>(maxval); ++x) {
        const double back = n->Invert(n->Apply(x), maxval);
        ASSERT_EQ(std::nearbyint(back), x) << spec << " maxval " << maxval << " value " << back;
      }
    }
    auto b = ParseNormalization("binary", maxval);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b->Invert(b->Apply(0), maxval), 0.0);
    EXPECT_EQ(b->Invert(b->Apply(1), maxval), maxval);  // a mask comes back as 0 / maxval
    EXPECT_EQ(b->Invert(b->Apply(maxval), maxval), maxval);
  }
  // Exact formulas (not just round trips), and a zero affine scale.
  Normalization s;
  s.kind = NormKind::kSymmetric;
  s.scale = 255;
  EXPECT_EQ(s.Invert(-1.0f, 255), 0.0);
  EXPECT_EQ(s.Invert(1.0f, 255), 255.0);
  EXPECT_EQ(s.Invert(0.0f, 255), 127.5);
  auto r = ParseNormalization("range:-1024,3000", 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->Invert(-1.0f, 0), -1024.0);
  EXPECT_EQ(r->Invert(0.0f, 0), 988.0);
  EXPECT_EQ(r->Invert(1.0f, 0), 3000.0);
  Normalization z;  // (ParseNormalization refuses a zero scale; a damaged header may hold one)
  z.kind = NormKind::kAffine;
  z.scale = 0;
  z.offset = 2;
  EXPECT_EQ(z.Invert(2.0f, 0), 0.0);
  Normalization none;
  EXPECT_EQ(none.Invert(-3.25f, 0), -3.25);
}

TEST(Normalization, ParsesSpecsAndRejectsBadOnes) {
  auto a = ParseNormalization("affine:0.001,-1+clamp:-1,1", 0);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kind, NormKind::kAffine);
  EXPECT_EQ(a->scale, 0.001);
  EXPECT_EQ(a->offset, -1);
  EXPECT_TRUE(a->clamp);
  EXPECT_EQ(a->Apply(5000), 1.0f);
  EXPECT_EQ(a->Apply(-3000), -1.0f);
  auto c = ParseNormalization("clamp:-1,1", 0);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->kind, NormKind::kNone);
  EXPECT_EQ(c->Apply(3), 1.0f);
  EXPECT_TRUE(std::isnan(c->Apply(NAN)));
  EXPECT_EQ(ParseNormalization("unit", 65535)->Apply(65535), 1.0f);
  EXPECT_EQ(ParseNormalization("binary", 0)->Apply(7), 1.0f);
  for (const char* bad : {"", "foo", "affine:1", "affine:a,b", "clamp:1,0", "none+clamp:1", "affine:inf,0"})
    EXPECT_FALSE(ParseNormalization(bad, 255).ok()) << bad;
  EXPECT_FALSE(ParseNormalization("symmetric", 0).ok());  // needs an integer source
}

// range:LO,HI maps [LO, HI] onto [-1, 1] exactly (LO -> -1, midpoint -> 0,
// HI -> 1) and clamps outside; the CT and MR ranges of the volumes user.
TEST(Normalization, RangeMapsOntoMinusOneOneExactlyAndClamps) {
  for (auto [lo, hi] : {std::pair<double, double>{-1024, 3000}, {0, 3000}, {-1000, 2000}, {0.1, 0.7}}) {
    auto n = ParseNormalization("range:" + std::to_string(lo) + "," + std::to_string(hi), 0);
    ASSERT_TRUE(n.ok()) << n.status().message();
    EXPECT_EQ(n->kind, NormKind::kRange);
    EXPECT_TRUE(n->clamp);
    EXPECT_EQ(n->Apply(lo), -1.0f) << lo;
    EXPECT_EQ(n->Apply(hi), 1.0f) << hi;
    EXPECT_EQ(n->Apply((lo + hi) / 2), 0.0f) << lo << "," << hi;
    EXPECT_EQ(n->Apply(lo + (hi - lo) / 4), -0.5f);
    EXPECT_EQ(n->Apply(lo - 5000), -1.0f);
    EXPECT_EQ(n->Apply(hi + 1e6), 1.0f);
    EXPECT_TRUE(std::isnan(n->Apply(NAN)));
  }
  auto ct = ParseNormalization("range:-1024,3000", 0);
  EXPECT_EQ(ct->Apply(0), static_cast<float>((0 - 988.0) / 2012.0));
  EXPECT_EQ(ct->ToString(), "range[-1024,3000] clamp[-1,1]");
  // The header round-trips kind 5.
  RecordHeader h;
  h.rank = 3;
  h.shape[0] = 2;
  h.shape[1] = 3;
  h.shape[2] = 4;
  h.layout = Layout::kSHW;
  h.source_type = SourceType::kInt16;
  h.norm = *ct;
  ASSERT_TRUE(FinalizeHeader(&h).ok());
  std::vector<uint8_t> rec(h.record_bytes(), 0);
  h.body_checksum = Checksum64(rec.data() + kRecordHeaderSize, h.body_bytes);
  EncodeRecordHeader(h, rec.data());
  auto back = ParseRecordHeader(rec.data(), rec.size());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->norm == *ct);
  for (const char* bad : {"range:1,1", "range:3,1", "range:1", "range:-1024,3000+clamp:-1,1", "range:0,inf"})
    EXPECT_FALSE(ParseNormalization(bad, 0).ok()) << bad;
}

}  // namespace
}  // namespace patchstore

namespace patchstore {
namespace {

TEST(TiledRecord, HeaderRoundTripsAndPayloadCoversThePaddedGrid) {
  RecordHeader h;
  h.rank = 3;
  h.shape = {3, 70, 45, 0};  // 3 x 2 tiles of 32, the last row and column padded
  h.dtype = DType::kUInt8;
  h.tile = 32;
  ASSERT_TRUE(FinalizeHeader(&h).ok());
  EXPECT_EQ(h.payload_bytes, uint64_t{3 * 2} * 3 * 32 * 32);
  std::vector<uint8_t> rec(h.record_bytes(), 0);
  h.body_checksum = Checksum64(rec.data() + kRecordHeaderSize, h.body_bytes);
  EncodeRecordHeader(h, rec.data());
  auto p = ParseRecordHeader(rec.data(), rec.size());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->tile, 32);
  EXPECT_EQ(p->payload_bytes, h.payload_bytes);
  EXPECT_EQ(SummaryOf(*p).payload_bytes(), h.payload_bytes);
  // Only (C,H,W) records tile, with an edge that is a multiple of 8.
  RecordHeader v = h;
  v.layout = Layout::kSHW;
  EXPECT_FALSE(FinalizeHeader(&v).ok());
  v = h;
  v.tile = 12;
  EXPECT_FALSE(FinalizeHeader(&v).ok());
  v = h;
  v.tile = 8192;
  EXPECT_FALSE(FinalizeHeader(&v).ok());
}

TEST(TiledRecord, TileAndUntileAreInverseAndPadWithZeros) {
  const TileGrid g{2, 19, 13, 8};  // 3 x 2 tiles
  std::vector<uint16_t> rows(2 * 19 * 13);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<uint16_t>(i + 1);  // no zero
  std::vector<uint16_t> tiles(static_cast<size_t>(g.elements()), 0xffff);
  TileCHW(rows.data(), sizeof(uint16_t), g, tiles.data());
  size_t zeros = 0;
  for (uint16_t v : tiles) zeros += v == 0;
  EXPECT_EQ(zeros, static_cast<size_t>(g.elements()) - rows.size());
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t y = 0; y < 19; ++y)
      for (int64_t x = 0; x < 13; ++x)
        ASSERT_EQ(tiles[g.ElementOffset(c, y, x)], rows[(c * 19 + y) * 13 + x]) << c << "," << y << "," << x;
  std::vector<uint16_t> back(rows.size(), 0);
  UntileCHW(tiles.data(), sizeof(uint16_t), g, back.data());
  EXPECT_EQ(back, rows);
}

TEST(CountValidOfRecord, CountsNormalisedLogicalValuesOnly) {
  // A uint8 mask of raw source values 0 / 7 with a 0 -> -1 normalisation
  // ("symmetric"): every value is valid once normalised, tile padding is not.
  RecordHeader h;
  h.rank = 3;
  h.shape = {1, 9, 10, 0};
  h.dtype = DType::kUInt8;
  h.norm.kind = NormKind::kSymmetric;
  h.norm.scale = 255;
  std::vector<uint8_t> rows(90, 0);
  for (size_t i = 0; i < rows.size(); i += 3) rows[i] = 7;
  EXPECT_EQ(CountValid(h, rows.data()), 90u);
  h.norm.kind = NormKind::kNone;
  EXPECT_EQ(CountValid(h, rows.data()), 30u);
  h.norm.kind = NormKind::kBinary;
  EXPECT_EQ(CountValid(h, rows.data()), 30u);
  h.tile = 8;
  ASSERT_TRUE(FinalizeHeader(&h).ok());
  std::vector<uint8_t> tiles(static_cast<size_t>(h.grid().elements()));
  TileCHW(rows.data(), 1, h.grid(), tiles.data());
  EXPECT_EQ(CountValid(h, tiles.data()), 30u);
  h.norm.kind = NormKind::kSymmetric;
  EXPECT_EQ(CountValid(h, tiles.data()), 90u);  // not the 256 elements of the padded grid
  // Float records hold normalised values: counted as stored.
  RecordHeader f;
  f.rank = 3;
  f.shape = {1, 2, 2, 0};
  f.norm.kind = NormKind::kSymmetric;
  const float v[4] = {0.0f, -1.0f, NAN, 0.5f};
  EXPECT_EQ(CountValid(f, v), 2u);
}

TEST(StoreMeta, FieldTileRoundTripsAndIsChecked) {
  StoreMeta m;
  FieldMeta f;
  f.name = "rgb";
  f.channels = 3;
  f.tile = 64;
  m.fields.push_back(f);
  auto d = StoreMeta::Decode(m.Encode());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->fields[0].tile, 64);
  m.fields[0].tile = 0;
  d = StoreMeta::Decode(m.Encode());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->fields[0].tile, 0);
  EXPECT_EQ(m.Encode().find("tile="), std::string::npos);  // rows: stores written as before
}

}  // namespace
}  // namespace patchstore
