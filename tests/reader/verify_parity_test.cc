// `verify` finds every defect a read refuses (issue 31, item 6): a record
// whose tile edge or normalisation disagrees with its field, a duplicate id,
// a field normalisation that maps every value to one.
#include <gtest/gtest.h>

#include <lmdb.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "patchstore/reader/reader.h"
#include "patchstore/reader/verify.h"
#include "patchstore/store/store.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::TempDir;

// Two samples ("p", "q") of one uint8 field "g" (1x6x5, symmetric/255),
// unsealed; `change` edits the field's metadata afterwards.
std::string MakeU8Store(const TempDir& dir, const std::function<void(FieldMeta*)>& change) {
  const std::string path = dir / "u.ps";
  WriterOptions wo;
  wo.durable = false;
  auto w = Writer::Open(path, wo).value();
  FieldMeta f;
  f.name = "g";
  f.channels = 1;
  f.dtype = DType::kUInt8;
  f.source_type = SourceType::kUInt8;
  f.norm.kind = NormKind::kSymmetric;
  f.norm.scale = 255;
  EXPECT_TRUE(w->EnsureField(f).ok());
  std::vector<uint8_t> px(30);
  for (int i = 0; i < 30; ++i) px[i] = static_cast<uint8_t>(i * 7 + 3);
  for (const char* id : {"p", "q"}) {
    SampleInput s;
    s.id = id;
    RecordInput r;
    r.header.dtype = DType::kUInt8;
    r.header.shape = {1, 6, 5, 0};
    r.header.norm = f.norm;
    r.header.source_type = SourceType::kUInt8;
    r.data = px.data();
    s.records = {r};
    EXPECT_TRUE(w->WriteBatch({s}).ok());
  }
  if (change) {
    change(&w->mutable_meta().fields[0]);
    EXPECT_TRUE(w->CommitMeta().ok());
  }
  return path;
}

TEST(VerifyParity, AFieldTileEdgeTheRecordsDoNotHaveIsReported) {
  TempDir dir;
  const std::string path = MakeU8Store(dir, [](FieldMeta* f) { f->tile = 16; });
  auto r = Reader::Open(path).value();
  auto g = r->Get(0, 0);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("run `patchstore verify`"), std::string::npos) << g.status().message();
  auto rep = VerifyStore(path).value();
  ASSERT_EQ(rep.problems.size(), 2u);
  EXPECT_EQ(rep.problems[0].id, "p");
  EXPECT_EQ(rep.problems[0].field, "g");
  EXPECT_EQ(rep.problems[0].message, "the record is stored in rows but the field in 16-pixel tiles (reads refuse it)");
  EXPECT_EQ(rep.problems[1].id, "q");
}

TEST(VerifyParity, ARawRecordsNormalisationThatDisagreesWithItsFieldIsReported) {
  TempDir dir;
  const std::string path = MakeU8Store(dir, [](FieldMeta* f) { f->norm.kind = NormKind::kUnit; });
  auto r = Reader::Open(path).value();
  ASSERT_FALSE(r->Get(1, 0).ok());
  auto rep = VerifyStore(path).value();
  ASSERT_EQ(rep.problems.size(), 2u);
  EXPECT_EQ(rep.problems[1].id, "q");
  EXPECT_EQ(rep.problems[1].message,
            "the record's normalisation symmetric/255 disagrees with its field's unit/255 (reads refuse it: raw "
            "values are normalised with the field's table)");
}

TEST(VerifyParity, AFieldNormalisationThatCollapsesEveryValueIsReported) {
  // As an older ingest accepted affine:1e-50,0 (every stored value 0).
  TempDir dir;
  const std::string path = MakeU8Store(dir, nullptr);
  {
    auto w = Writer::Open(path, WriterOptions{}).value();
    FieldMeta f;
    f.name = "z";
    f.channels = 1;
    f.source_type = SourceType::kUInt16;
    f.norm.kind = NormKind::kAffine;
    f.norm.scale = 3e-46;
    f.norm.offset = 0.25;
    ASSERT_TRUE(w->EnsureField(f).ok());
    ASSERT_TRUE(w->CommitMeta().ok());
  }
  auto rep = VerifyStore(path).value();
  bool found = false;
  for (const auto& p : rep.problems)
    if (p.field == "z" && p.id.empty()) {
      found = true;
      EXPECT_EQ(p.message, "normalisation 'affine(2.9999999999999999e-46,0.25)' maps every uint16 value to 0.25 "
                           "(float32 cannot tell them apart after the transform) (the stored values are not the "
                           "source's)");
    }
  EXPECT_TRUE(found);
}

// Rewrites the id of sample `idx` in the `ids` database, checksum included
// (FORMAT.md: u64be index -> id_bytes || u64le xxh3_64(u64be index || id_bytes)).
void RewriteId(const std::string& path, uint64_t idx, const std::string& id) {
  MDB_env* env = nullptr;
  ASSERT_EQ(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 8);
  ASSERT_EQ(mdb_env_open(env, path.c_str(), 0, 0644), 0);
  MDB_txn* txn = nullptr;
  ASSERT_EQ(mdb_txn_begin(env, nullptr, 0, &txn), 0);
  MDB_dbi ids;
  ASSERT_EQ(mdb_dbi_open(txn, "ids", 0, &ids), 0);
  unsigned char key[8];
  for (int i = 0; i < 8; ++i) key[i] = static_cast<unsigned char>(idx >> (56 - 8 * i));
  std::string summed(reinterpret_cast<const char*>(key), 8);
  summed += id;
  const uint64_t sum = Checksum64(summed.data(), summed.size());
  std::string value = id;
  for (int i = 0; i < 8; ++i) value.push_back(static_cast<char>(sum >> (8 * i)));
  MDB_val k{8, key}, v{value.size(), value.data()};
  ASSERT_EQ(mdb_put(txn, ids, &k, &v, 0), 0);
  ASSERT_EQ(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

TEST(VerifyParity, ADuplicateIdIsReported) {
  TempDir dir;
  const std::string path = MakeU8Store(dir, nullptr);
  ASSERT_TRUE(VerifyStore(path).value().ok());
  RewriteId(path, 1, "p");
  auto rep = VerifyStore(path).value();
  ASSERT_EQ(rep.problems.size(), 1u) << rep.problems[0].message;
  EXPECT_EQ(rep.problems[0].id, "p");
  EXPECT_EQ(rep.problems[0].message, "duplicate id: samples #0 and #1 have it (lookups by id find one of them)");
  // The CLI names the sample only (the problem has no field).
  std::string out;
  EXPECT_EQ(testing::RunCommand(std::string(PATCHSTORE_CLI) + " verify '" + path + "'", &out), 3) << out;
  EXPECT_NE(out.find("BAD  'p': duplicate id: samples #0 and #1"), std::string::npos) << out;
  EXPECT_EQ(out.find("field ''"), std::string::npos) << out;
}

}  // namespace
}  // namespace patchstore
