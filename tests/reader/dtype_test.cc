// dtype-aware views: TensorView::data_as<T>, the float32 copy kernel over
// every source dtype, and readers/verify refusing a record whose dtype is not
// its field's.
#include <gtest/gtest.h>
#include <lmdb.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "patchstore/reader/reader.h"
#include "patchstore/reader/tensor_view.h"
#include "patchstore/reader/verify.h"
#include "patchstore/store/store.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::TempDir;

TEST(TensorViewDType, DataAsReturnsThePointerOfTheMatchingType) {
  float buf[4] = {1, 2, 3, 4};
  TensorView v;
  v.data = buf;
  v.rank = 1;
  v.shape = {4, 0, 0, 0};
  v.strides = {4, 0, 0, 0};
  EXPECT_EQ(v.dtype, DType::kFloat32);  // the default
  EXPECT_EQ(v.data_as<float>(), buf);
  EXPECT_EQ(v.itemsize(), 4);
  EXPECT_TRUE(v.contiguous());
  uint16_t h[4] = {};
  v.data = h;
  v.dtype = DType::kUInt16;
  v.strides = {2, 0, 0, 0};
  EXPECT_EQ(v.data_as<uint16_t>(), h);
  EXPECT_TRUE(v.contiguous());  // 2-byte elements, 2-byte stride
}

TEST(TensorViewDType, DataAsOfAnotherTypeAbortsNamingBoth) {
  float buf[1] = {0};
  TensorView v;
  v.data = buf;
  EXPECT_DEATH(v.data_as<uint8_t>(), "data_as<T>\\(\\) with T other than the view's dtype.*uint8.*float32");
  v.dtype = DType::kFloat16;
  EXPECT_DEATH(v.data_as<float>(), "float32.*float16");
  EXPECT_DEATH(v.data_as<uint16_t>(), "uint16.*float16");  // same size, other type: still refused
}

// A (2, 3, 4) window at (1, 2) of a (2, 5, 7) array of T filled with `value(i)`.
template <class T, class F>
void CheckCopy(DType dtype, F value) {
  SCOPED_TRACE(DTypeName(dtype));
  constexpr int64_t C = 2, H = 5, W = 7, h = 3, w = 4, y = 1, x = 2;
  std::vector<T> src(C * H * W);
  for (size_t i = 0; i < src.size(); ++i) src[i] = value(static_cast<int64_t>(i));
  TensorView v;
  v.dtype = dtype;
  v.rank = 3;
  v.shape = {C, h, w, 0};
  v.strides = {H * W * int64_t{sizeof(T)}, W * int64_t{sizeof(T)}, int64_t{sizeof(T)}, 0};
  v.data = src.data() + y * W + x;
  std::vector<float> dst(C * h * w, -99.0f);
  CopyToFloat32(v, dst.data());
  for (int64_t c = 0; c < C; ++c)
    for (int64_t r = 0; r < h; ++r)
      for (int64_t q = 0; q < w; ++q)
        ASSERT_EQ(dst[(c * h + r) * w + q], ToFloat32(src[(c * H + y + r) * W + x + q])) << c << "," << r << "," << q;
}

TEST(TensorViewDType, CopyToFloat32ConvertsEverySourceDType) {
  CheckCopy<float>(DType::kFloat32, [](int64_t i) { return static_cast<float>(i) * 0.25f - 3.0f; });
  CheckCopy<uint8_t>(DType::kUInt8, [](int64_t i) { return static_cast<uint8_t>(i * 37); });
  CheckCopy<uint16_t>(DType::kUInt16, [](int64_t i) { return static_cast<uint16_t>(i * 997 + 60000); });
  CheckCopy<int16_t>(DType::kInt16, [](int64_t i) { return static_cast<int16_t>(i * 911 - 32768); });
  CheckCopy<uint32_t>(DType::kUInt32, [](int64_t i) { return static_cast<uint32_t>(i * 100003); });
  CheckCopy<Float16>(DType::kFloat16, [](int64_t i) { return Float16{static_cast<uint16_t>(0x3c00 + i * 3)}; });
  // Spot values, not only "agrees with ToFloat32".
  const uint8_t u8[4] = {0, 1, 128, 255};
  const Float16 f16[4] = {{0x3c00}, {0xc000}, {0x7bff}, {0x0001}};
  float out[4];
  TensorView v;
  v.rank = 3;
  v.shape = {1, 1, 4, 0};
  v.data = u8;
  v.dtype = DType::kUInt8;
  v.strides = {4, 4, 1, 0};
  CopyToFloat32(v, out);
  EXPECT_EQ(std::vector<float>(out, out + 4), (std::vector<float>{0, 1, 128, 255}));
  v.data = f16;
  v.dtype = DType::kFloat16;
  v.strides = {8, 8, 2, 0};
  CopyToFloat32(v, out);
  EXPECT_EQ(std::vector<float>(out, out + 4), (std::vector<float>{1, -2, 65504, std::ldexp(1.0f, -24)}));
}

// A store with one 1-channel 4x4 field "x" and samples "a" and "b": "b" holds
// float32; "a" holds uint8 records when `bad` (the field saying float32).
std::string MakeStore(const TempDir& dir, bool bad) {
  const std::string path = dir / "s.ps";
  WriterOptions wo;
  wo.durable = false;
  auto w = Writer::Open(path, wo).value();
  FieldMeta f;
  f.name = "x";
  f.channels = 1;
  f.dtype = bad ? DType::kUInt8 : DType::kFloat32;
  EXPECT_TRUE(w->EnsureField(f).ok());
  std::vector<uint8_t> u8(16);
  std::vector<float> f32(16);
  for (int i = 0; i < 16; ++i) {
    u8[i] = static_cast<uint8_t>(i);
    f32[i] = static_cast<float>(i) + 0.5f;
  }
  SampleInput a;
  a.id = "a";
  RecordInput r;
  r.header.dtype = f.dtype;
  r.header.shape = {1, 4, 4, 0};
  r.data = bad ? static_cast<const void*>(u8.data()) : f32.data();
  a.records = {r};
  EXPECT_TRUE(w->WriteBatch({a}).ok());
  if (bad) {
    // The writer refuses a record of another dtype than its field, so the
    // disagreement is made the other way: the metadata changes afterwards.
    w->mutable_meta().fields[0].dtype = DType::kFloat32;
    EXPECT_TRUE(w->CommitMeta().ok());
  }
  SampleInput b;
  b.id = "b";
  r.header.dtype = DType::kFloat32;
  r.data = f32.data();
  b.records = {r};
  EXPECT_TRUE(w->WriteBatch({b}).ok());
  EXPECT_TRUE(w->Seal().ok());
  return path;
}

TEST(RecordDType, ViewsCarryTheStoredDType) {
  TempDir dir;
  auto r = Reader::Open(MakeStore(dir, false)).value();
  EXPECT_EQ(r->field(0).dtype, DType::kFloat32);
  TensorView v = r->Get(0, 0).value();
  EXPECT_EQ(v.dtype, DType::kFloat32);
  EXPECT_EQ(v.strides[2], 4);
  EXPECT_EQ(v.data_as<float>()[5], 5.5f);
  TensorView p = r->Patch(0, 0, 1, 2, 2, 2).value();
  EXPECT_EQ(p.dtype, DType::kFloat32);
  EXPECT_EQ(p.data_as<float>()[0], 6.5f);  // (1, 2)
  float out[4];
  ASSERT_TRUE(r->CopyPatch(0, 0, 1, 2, 2, 2, out).ok());
  EXPECT_EQ(std::vector<float>(out, out + 4), (std::vector<float>{6.5f, 7.5f, 10.5f, 11.5f}));
  EXPECT_EQ(r->Header(0, 0)->dtype, DType::kFloat32);
  EXPECT_EQ(r->Summary(0, 0)->dtype, DType::kFloat32);
}

TEST(RecordDType, ARecordWhoseDTypeDisagreesWithItsFieldIsRefusedByReaderAndNamedByVerify) {
  TempDir dir;
  const std::string path = MakeStore(dir, true);
  auto r = Reader::Open(path).value();
  for (auto st : {r->Get(0, 0).status(), r->Patch(0, 0, 0, 0, 2, 2).status(), r->Header(0, 0).status()}) {
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), Code::kCorruption);
    EXPECT_NE(st.message().find("'a' field 'x'"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("the record holds uint8 but the field is float32"), std::string::npos) << st.message();
  }
  float out[8];
  EXPECT_EQ(r->CopyPatch(0, 0, 0, 0, 2, 2, out).code(), Code::kCorruption);
  EXPECT_EQ(r->CopyPatches({{1, 0, 0, 0}, {0, 0, 0, 0}}, 2, 2, out).code(), Code::kCorruption);
  EXPECT_TRUE(r->Get(1, 0).ok());  // the other sample reads
  auto rep = VerifyStore(path).value();
  ASSERT_EQ(rep.problems.size(), 1u);
  EXPECT_EQ(rep.problems[0].id, "a");
  EXPECT_EQ(rep.problems[0].field, "x");
  EXPECT_EQ(rep.problems[0].message, "record holds uint8 but the field is float32");
}

// Runs `edit` on the store's metadata text in one LMDB write transaction.
void EditMetaText(const std::string& path, const std::function<std::string(std::string)>& edit) {
  MDB_env* env = nullptr;
  ASSERT_EQ(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 8);
  ASSERT_EQ(mdb_env_open(env, path.c_str(), 0, 0644), 0);
  MDB_txn* txn = nullptr;
  ASSERT_EQ(mdb_txn_begin(env, nullptr, 0, &txn), 0);
  MDB_dbi meta;
  ASSERT_EQ(mdb_dbi_open(txn, "meta", 0, &meta), 0);
  MDB_val k{5, const_cast<char*>("store")}, v;
  ASSERT_EQ(mdb_get(txn, meta, &k, &v), 0);
  const std::string text = edit(std::string(static_cast<const char*>(v.mv_data), v.mv_size));
  MDB_val nv{text.size(), const_cast<char*>(text.data())};
  ASSERT_EQ(mdb_put(txn, meta, &k, &nv, 0), 0);
  ASSERT_EQ(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

std::string WithChecksum(const std::string& body) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(Checksum64(body.data(), body.size())));
  return body + "checksum=" + hex + "\n";
}

TEST(RecordDType, AStoreWhoseMetadataPredatesTheFieldDTypeReadsAsFloat32) {
  TempDir dir;
  const std::string path = MakeStore(dir, false);
  EditMetaText(path, [](std::string text) {
    const size_t at = text.find("field.0.dtype=1\n");
    EXPECT_NE(at, std::string::npos);
    text.erase(at, 16);
    return WithChecksum(text.substr(0, text.rfind("checksum=")));
  });
  auto r = Reader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->field(0).dtype, DType::kFloat32);
  EXPECT_EQ((*r)->Get(1, 0)->data_as<float>()[15], 15.5f);
  EXPECT_TRUE(VerifyStore(path).value().ok());
}

TEST(RecordDType, AStoreWhoseFieldDTypeDisagreesWithItsRecordsOpensButEveryReadIsRefusedNamingTheField) {
  TempDir dir;
  const std::string path = MakeStore(dir, false);
  EditMetaText(path, [](std::string text) {
    const size_t at = text.find("field.0.dtype=1\n");
    EXPECT_NE(at, std::string::npos);
    text.replace(at, 16, "field.0.dtype=4\n");
    return WithChecksum(text.substr(0, text.rfind("checksum=")));
  });
  // Every dtype is read (compact encodings), so the store opens; its records
  // are refused by name.
  auto r = Reader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto g = (*r)->Get(0, 0);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), Code::kCorruption);
  EXPECT_NE(g.status().message().find("'a' field 'x'"), std::string::npos) << g.status().message();
  EXPECT_NE(g.status().message().find("the record holds float32 but the field is uint16"), std::string::npos)
      << g.status().message();
  // Verify still reads it and names every record that disagrees.
  auto rep = VerifyStore(path).value();
  ASSERT_EQ(rep.problems.size(), 2u);
  EXPECT_EQ(rep.problems[0].message, "record holds float32 but the field is uint16");
}

}  // namespace
}  // namespace patchstore
