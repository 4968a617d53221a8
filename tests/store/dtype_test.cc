// The DType table (store/dtype.h), the field dtype in the metadata, and the
// writer's refusal of a record whose dtype is not its field's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "patchstore/store/dtype.h"
#include "patchstore/store/format.h"
#include "patchstore/store/store.h"
#include "test_util.h"

namespace patchstore {
namespace {

TEST(DType, VisitDTypeCoversEveryEnumeratorWithItsOwnType) {
  // Every header byte the table knows is listed in kAllDTypes, and nothing else.
  std::vector<DType> known;
  for (int code = 0; code < 256; ++code)
    if (IsKnownDType(static_cast<uint8_t>(code))) known.push_back(static_cast<DType>(code));
  ASSERT_EQ(known, std::vector<DType>(std::begin(kAllDTypes), std::end(kAllDTypes)));
  ASSERT_EQ(known.size(), 6u);
  std::set<std::string> names, formats;
  for (DType t : kAllDTypes) {
    SCOPED_TRACE(DTypeName(t));
    const DType visited = VisitDType(t, [](auto tag) { return decltype(tag)::dtype; });
    const size_t size = VisitDType(t, [](auto tag) { return sizeof(typename decltype(tag)::type); });
    // The tag's C++ type maps back to the same enumerator.
    const DType back = VisitDType(t, [](auto tag) { return DTypeOf<typename decltype(tag)::type>::value; });
    EXPECT_EQ(visited, t);
    EXPECT_EQ(back, t);
    EXPECT_EQ(size, DTypeSize(t));
    EXPECT_NE(std::string(DTypeName(t)), "unknown");
    ASSERT_NE(DTypeFormat(t), nullptr);
    names.insert(DTypeName(t));
    formats.insert(DTypeFormat(t));
    DType parsed;
    ASSERT_TRUE(ParseDTypeName(DTypeName(t), &parsed));
    EXPECT_EQ(parsed, t);
  }
  EXPECT_EQ(names.size(), known.size());
  EXPECT_EQ(formats.size(), known.size());
  // The values FORMAT.md documents.
  EXPECT_EQ(static_cast<int>(DType::kFloat32), 1);
  EXPECT_EQ(static_cast<int>(DType::kUInt32), 2);
  EXPECT_EQ(static_cast<int>(DType::kUInt8), 3);
  EXPECT_EQ(static_cast<int>(DType::kUInt16), 4);
  EXPECT_EQ(static_cast<int>(DType::kInt16), 5);
  EXPECT_EQ(static_cast<int>(DType::kFloat16), 6);
  EXPECT_STREQ(DTypeFormat(DType::kFloat32), "f");
  EXPECT_STREQ(DTypeFormat(DType::kUInt8), "B");
  EXPECT_STREQ(DTypeFormat(DType::kUInt16), "H");
  EXPECT_STREQ(DTypeFormat(DType::kInt16), "h");
  EXPECT_STREQ(DTypeFormat(DType::kFloat16), "e");
  EXPECT_STREQ(DTypeFormat(DType::kUInt32), "I");
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeSize(static_cast<DType>(0)), 0u);
  EXPECT_EQ(DTypeSize(static_cast<DType>(7)), 0u);
  EXPECT_STREQ(DTypeName(static_cast<DType>(200)), "unknown");
  DType parsed;
  EXPECT_FALSE(ParseDTypeName("float64", &parsed));
}

TEST(DType, VisitDTypeOnANonEnumeratorAborts) {
  EXPECT_DEATH(VisitDType(static_cast<DType>(99), [](auto) { return 0; }), "VisitDType on a value that is no DType");
}

TEST(DType, Float16ConvertsExactly) {
  auto f = [](uint16_t bits) { return ToFloat32(Float16{bits}); };
  EXPECT_EQ(f(0x3c00), 1.0f);
  EXPECT_EQ(f(0xc000), -2.0f);
  EXPECT_EQ(f(0x3555), 0.333251953125f);
  EXPECT_EQ(f(0x7bff), 65504.0f);                      // largest finite
  EXPECT_EQ(f(0x0400), std::ldexp(1.0f, -14));         // smallest normal
  EXPECT_EQ(f(0x0001), std::ldexp(1.0f, -24));         // smallest subnormal
  EXPECT_EQ(f(0x03ff), 1023 * std::ldexp(1.0f, -24));  // largest subnormal
  EXPECT_EQ(f(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(f(0x8000)));
  EXPECT_EQ(f(0x8000), 0.0f);
  EXPECT_EQ(f(0x7c00), INFINITY);
  EXPECT_EQ(f(0xfc00), -INFINITY);
  EXPECT_TRUE(std::isnan(f(0x7e00)));
}

TEST(DType, CountValidInEveryDType) {
  const uint8_t u8[] = {0, 1, 255, 0, 7};
  EXPECT_EQ(CountValid(DType::kUInt8, u8, 5), 3u);
  const int16_t i16[] = {0, -1, 0, 300};
  EXPECT_EQ(CountValid(DType::kInt16, i16, 4), 2u);
  const uint16_t h[] = {0x0000, 0x8000, 0x3c00, 0x7e00, 0x0001, 0x7c00};  // 0, -0, 1, NaN, tiny, inf
  EXPECT_EQ(CountValid(DType::kFloat16, h, 6), 3u);
  const float f[] = {0.0f, -0.0f, NAN, 2.0f};
  EXPECT_EQ(CountValid(DType::kFloat32, f, 4), 1u);
}

// `body` (metadata lines) followed by its checksum line.
std::string WithChecksum(const std::string& body) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(Checksum64(body.data(), body.size())));
  return body + "checksum=" + hex + "\n";
}

// The metadata text with every "field.<i>.dtype=" line removed and the
// checksum line recomputed: what stores written before the key existed hold.
std::string WithoutDTypeLines(const std::string& text) {
  std::string body;
  for (size_t pos = 0; pos < text.size();) {
    const size_t nl = text.find('\n', pos);
    const std::string line = text.substr(pos, nl - pos + 1);
    pos = nl + 1;
    if (line.rfind("checksum=", 0) == 0 || line.find(".dtype=") != std::string::npos) continue;
    body += line;
  }
  return WithChecksum(body);
}

StoreMeta TwoFields() {
  StoreMeta m;
  m.sample_count = 3;
  FieldMeta a, b;
  a.name = "rgb";
  a.channels = 3;
  b.name = "small";
  b.channels = 1;
  b.dtype = DType::kUInt8;
  m.fields = {a, b};
  return m;
}

TEST(DType, FieldDTypeRoundTripsThroughTheMetadata) {
  const StoreMeta m = TwoFields();
  const std::string text = m.Encode();
  EXPECT_NE(text.find("field.0.dtype=1\n"), std::string::npos);
  EXPECT_NE(text.find("field.1.dtype=3\n"), std::string::npos);
  auto d = StoreMeta::Decode(text);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_EQ(d->fields.size(), 2u);
  EXPECT_EQ(d->fields[0].dtype, DType::kFloat32);
  EXPECT_EQ(d->fields[1].dtype, DType::kUInt8);
  EXPECT_EQ(d->Encode(), text);
}

TEST(DType, MetadataWithoutFieldDTypeReadsAsFloat32) {
  const std::string old = WithoutDTypeLines(TwoFields().Encode());
  ASSERT_EQ(old.find("dtype"), std::string::npos);
  auto d = StoreMeta::Decode(old);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->fields[0].dtype, DType::kFloat32);
  EXPECT_EQ(d->fields[1].dtype, DType::kFloat32);
}

TEST(DType, UnknownFieldDTypeInTheMetadataIsCorruption) {
  std::string text = TwoFields().Encode();
  const size_t at = text.find("field.1.dtype=3\n");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 16, "field.1.dtype=9\n");
  auto d = StoreMeta::Decode(WithChecksum(text.substr(0, text.rfind("checksum="))));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kCorruption);
  EXPECT_NE(d.status().message().find("field 'small' has unknown dtype 9"), std::string::npos) << d.status().message();
}

TEST(DType, WriterRefusesARecordOfAnotherDTypeThanItsField) {
  testing::TempDir dir;
  WriterOptions wo;
  wo.durable = false;
  auto w = Writer::Open(dir / "s.ps", wo).value();
  FieldMeta f;
  f.name = "x";
  f.channels = 1;
  ASSERT_TRUE(w->EnsureField(f).ok());
  // The same name with another dtype is another field: refused.
  FieldMeta g = f;
  g.dtype = DType::kUInt16;
  auto again = w->EnsureField(g);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("holds float32 in the store but uint16 here"), std::string::npos)
      << again.status().message();
  std::vector<uint8_t> bytes(16, 1);
  SampleInput s;
  s.id = "a";
  RecordInput r;
  r.header.dtype = DType::kUInt8;
  r.header.shape = {1, 4, 4, 0};
  r.data = bytes.data();
  s.records.push_back(r);
  Status st = w->WriteBatch({s});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("sample 'a'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("field 'x' holds float32, the record uint8"), std::string::npos) << st.message();
  EXPECT_EQ(w->sample_count(), 0u);
}

}  // namespace
}  // namespace patchstore
