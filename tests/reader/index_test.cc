// The sample index (store format 2): written with every sample, read by
// open/info/samplers instead of the records, checked against the records by
// readers and verify, and added to format-1 stores by `upgrade`.
#include <gtest/gtest.h>
#include <lmdb.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "patchstore/reader/reader.h"
#include "patchstore/reader/sampler.h"
#include "patchstore/reader/verify.h"
#include "patchstore/store/store.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::TempDir;

constexpr int64_t kH = 12, kW = 10;

// Masks with known valid counts: sample s has s*7 valid pixels (NaN and -0
// are not valid), sample 0 none. Field "img" has 2 channels.
float MaskValue(uint64_t s, int64_t i) {
  if (static_cast<uint64_t>(i) < s * 7) return (i % 3 == 0) ? 0.5f : -2.0f;
  if (i % 5 == 0) return std::numeric_limits<float>::quiet_NaN();
  return (i % 2) ? -0.0f : 0.0f;
}

std::string MakeStore(const TempDir& dir, uint64_t n, const std::string& name = "s.ps", bool seal = true) {
  const std::string path = dir / name;
  testing::StoreSpec spec;
  spec.fields = {testing::StoreField{"img", 2}, testing::StoreField{"mask", 1, /*mask=*/true}};
  spec.ids = testing::NumberedIds(n, "s");
  spec.height = kH;
  spec.width = kW;
  spec.value = [](uint64_t s, int f, int64_t c, int64_t y, int64_t x) -> double {
    return f == 0 ? static_cast<float>(s * 1000 + (c * kH + y) * kW + x) : MaskValue(s, y * kW + x);
  };
  spec.seal = seal;
  spec.batch = 1;
  EXPECT_TRUE(testing::WriteStore(path, spec).ok());
  return path;
}

// Runs `edit` in one LMDB write transaction on the store's environment.
void EditLmdb(const std::string& path, const std::function<void(MDB_txn*, MDB_dbi meta, MDB_dbi index)>& edit) {
  MDB_env* env = nullptr;
  ASSERT_EQ(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 8);
  ASSERT_EQ(mdb_env_open(env, path.c_str(), 0, 0644), 0);
  MDB_txn* txn = nullptr;
  ASSERT_EQ(mdb_txn_begin(env, nullptr, 0, &txn), 0);
  MDB_dbi meta, index;
  ASSERT_EQ(mdb_dbi_open(txn, "meta", 0, &meta), 0);
  const int irc = mdb_dbi_open(txn, "index", 0, &index);  // absent in a format-1 store
  if (irc == MDB_NOTFOUND) index = 0;
  else ASSERT_EQ(irc, 0);
  edit(txn, meta, index);
  ASSERT_EQ(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

// Turns a store into what patchstore 0.1.0 (store format 1) wrote: no index
// database, `patchstore_format=1`.
void MakeFormat1(const std::string& path) {
  EditLmdb(path, [&](MDB_txn* txn, MDB_dbi meta, MDB_dbi index) {
    ASSERT_EQ(mdb_drop(txn, index, 1), 0);
    MDB_val k{5, const_cast<char*>("store")}, v;
    ASSERT_EQ(mdb_get(txn, meta, &k, &v), 0);
    auto m = StoreMeta::Decode(std::string_view(static_cast<const char*>(v.mv_data), v.mv_size)).value();
    m.format_version = 1;
    const std::string text = m.Encode();
    MDB_val nv{text.size(), const_cast<char*>(text.data())};
    ASSERT_EQ(mdb_put(txn, meta, &k, &nv, 0), 0);
  });
}

TEST(SampleIndex, SummaryRoundTripsAndRejectsDamage) {
  SampleSummary s;
  s.fields.resize(3);
  s.fields[0].present = true;
  s.fields[0].rank = 3;
  s.fields[0].shape = {3, 1080, 1920, 0};
  s.fields[2].present = true;
  s.fields[2].rank = 3;
  s.fields[2].layout = Layout::kSHW;
  s.fields[2].shape = {96, 256, 256, 0};
  s.fields[2].has_valid_count = true;
  s.fields[2].valid_count = 12345;
  const std::string bytes = EncodeSampleSummary(7, s);
  auto back = DecodeSampleSummary(7, bytes.data(), bytes.size());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->fields.size(), 3u);
  for (int f = 0; f < 3; ++f) EXPECT_TRUE(back->fields[f] == s.fields[f]) << f;
  EXPECT_EQ(back->fields[0].payload_bytes(), 3u * 1080 * 1920 * 4);
  // Stored under another sample's key: refused (the checksum covers the key).
  EXPECT_EQ(DecodeSampleSummary(8, bytes.data(), bytes.size()).status().code(), Code::kCorruption);
  // Every single bit flip is refused.
  for (size_t i = 0; i < bytes.size() * 8; ++i) {
    std::string bad = bytes;
    bad[i / 8] = static_cast<char>(bad[i / 8] ^ (1 << (i % 8)));
    EXPECT_FALSE(DecodeSampleSummary(7, bad.data(), bad.size()).ok()) << "bit " << i;
  }
  EXPECT_FALSE(DecodeSampleSummary(7, bytes.data(), bytes.size() - 1).ok());
  // A valid count larger than the record is refused even with a good checksum.
  s.fields[2].valid_count = 96ull * 256 * 256 + 1;
  const std::string big = EncodeSampleSummary(7, s);
  EXPECT_EQ(DecodeSampleSummary(7, big.data(), big.size()).status().code(), Code::kCorruption);
}

TEST(SampleIndex, WriterRecordsShapesAndExactMaskCounts) {
  TempDir dir;
  const std::string path = MakeStore(dir, 5);
  auto r = Reader::Open(path).value();
  EXPECT_EQ(r->meta().format_version, kStoreFormatVersion);
  for (uint64_t s = 0; s < 5; ++s) {
    auto img = r->Summary(s, 0).value();
    auto mask = r->Summary(s, 1).value();
    EXPECT_FALSE(img.has_valid_count);
    EXPECT_EQ(img.shape, (std::array<uint64_t, 4>{2, kH, kW, 0}));
    EXPECT_EQ(img.payload_bytes(), r->Header(s, 0)->payload_bytes);
    ASSERT_TRUE(mask.has_valid_count);
    // Brute force over the stored mask, with the sampler's validity rule.
    auto v = r->Get(s, 1).value();
    uint64_t want = 0;
    for (int64_t i = 0; i < kH * kW; ++i) want += (v.data_as<float>()[i] != 0.0f && !std::isnan(v.data_as<float>()[i]));
    EXPECT_EQ(want, s * 7);
    EXPECT_EQ(mask.valid_count, want) << "sample " << s;
  }
  EXPECT_EQ(r->Summary(5, 0).status().code(), Code::kOutOfRange);
  EXPECT_EQ(r->Summary(0, 2).status().code(), Code::kNotFound);
}

TEST(SampleIndex, SamplerConstructionReadsNoRecord) {
  // Damage the header of every record of sample 3 (img and mask). Opening
  // the store and building a mask-aware sampler read only the index, so
  // they succeed; gathering a window of sample 3 reads it and fails.
  TempDir dir;
  const std::string path = MakeStore(dir, 5);
  {
    MDB_env* env = nullptr;
    ASSERT_EQ(mdb_env_create(&env), 0);
    mdb_env_set_maxdbs(env, 8);
    ASSERT_EQ(mdb_env_open(env, path.c_str(), MDB_WRITEMAP, 0644), 0);
    MDB_txn* txn = nullptr;
    ASSERT_EQ(mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn), 0);
    MDB_dbi rec;
    ASSERT_EQ(mdb_dbi_open(txn, "records", 0, &rec), 0);
    for (uint16_t f = 0; f < 2; ++f) {
      auto key = RecordKey(3, f);
      MDB_val k{key.size(), key.data()}, v;
      ASSERT_EQ(mdb_get(txn, rec, &k, &v), 0);
      static_cast<uint8_t*>(v.mv_data)[0] ^= 0xff;  // magic: the header no longer parses
    }
    mdb_txn_abort(txn);
    mdb_env_close(env);
  }
  auto r = Reader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  SamplerOptions o;
  o.fields = {"img", "mask"};
  o.patch_size = 4;
  o.require = "mask";
  auto sampler = PatchSampler::Create(*r, o);
  ASSERT_TRUE(sampler.ok()) << sampler.status().ToString();
  EXPECT_EQ((*sampler)->eligible_samples(), 4u);  // sample 0 has an empty mask
  EXPECT_EQ((*sampler)->skipped_ids(), std::vector<std::string>{"s0"});
  EXPECT_EQ((*r)->Header(3, 0).status().code(), Code::kCorruption);
  std::vector<float> a(2 * 16), m(16);
  auto st = (*sampler)->GatherWindows({Window{3, 0, 0}}, {a.data(), m.data()});
  EXPECT_EQ(st.code(), Code::kCorruption);
  EXPECT_NE(st.message().find("'s3'"), std::string::npos) << st.message();
}

TEST(SampleIndex, MinValidUsesTheCountThenExactWindows) {
  TempDir dir;
  const std::string path = MakeStore(dir, 6);
  auto r = Reader::Open(path).value();
  SamplerOptions o;
  o.fields = {"img"};
  o.patch_size = kW;  // full-width windows of height kW: 3 positions per sample
  o.require = "mask";
  // Sample s has 7*s valid pixels, the first ones in index order (rows 0..).
  // min_valid=21: samples 0..2 cannot qualify by their count (0, 7, 14);
  // samples 3..5 are decided exactly from their windows.
  o.min_valid = 21;
  auto sampler = PatchSampler::Create(r, o).value();
  std::set<uint64_t> eligible;
  for (uint64_t s = 0; s < 6; ++s)
    if (sampler->eligible(s)) eligible.insert(s);
  EXPECT_EQ(eligible, (std::set<uint64_t>{3, 4, 5}));
  // A threshold above any sample's count leaves nothing (no record read needed).
  o.min_valid = 36;
  auto none = PatchSampler::Create(r, o).value();
  EXPECT_EQ(none->eligible_samples(), 0u);
  EXPECT_EQ(none->skipped_samples(), 6u);
}

TEST(SampleIndex, Format1StoreIsRefusedWithTheUpgradeCommandThenUpgraded) {
  TempDir dir;
  const std::string path = MakeStore(dir, 4);
  const std::string fresh = MakeStore(dir, 4, "fresh.ps");
  MakeFormat1(path);
  auto r = Reader::Open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnsupported);
  EXPECT_NE(r.status().message().find("patchstore upgrade " + path), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("format 1"), std::string::npos) << r.status().message();
  // verify checks the records of an old store and names the missing index.
  auto rep = VerifyStore(path).value();
  ASSERT_EQ(rep.problems.size(), 1u);
  EXPECT_NE(rep.problems[0].message.find("patchstore upgrade"), std::string::npos);

  auto up = UpgradeStore(path);
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  EXPECT_EQ(*up, 1);
  EXPECT_EQ(UpgradeStore(path).value(), kStoreFormatVersion);  // nothing left to do
  auto a = Reader::Open(path).value(), b = Reader::Open(fresh).value();
  EXPECT_TRUE(a->sealed());  // the upgrade keeps the sealed state
  EXPECT_EQ(a->meta().format_version, kStoreFormatVersion);
  for (uint64_t s = 0; s < 4; ++s)
    for (int f = 0; f < 2; ++f) EXPECT_TRUE(a->summary(s, f) == b->summary(s, f)) << s << "," << f;
  EXPECT_TRUE(VerifyStore(path).value().ok());
}

TEST(SampleIndex, UpgradeRefusesAHostileSampleCountInsteadOfAllocatingIt) {
  TempDir dir;
  const std::string path = MakeStore(dir, 3);
  MakeFormat1(path);
  EditLmdb(path, [&](MDB_txn* txn, MDB_dbi meta, MDB_dbi) {
    MDB_val k{5, const_cast<char*>("store")}, v;
    ASSERT_EQ(mdb_get(txn, meta, &k, &v), 0);
    auto m = StoreMeta::Decode(std::string_view(static_cast<const char*>(v.mv_data), v.mv_size)).value();
    m.sample_count = uint64_t{1} << 60;
    const std::string text = m.Encode();
    MDB_val nv{text.size(), const_cast<char*>(text.data())};
    ASSERT_EQ(mdb_put(txn, meta, &k, &nv, 0), 0);
  });
  WriterOptions wo;
  wo.durable = false;
  auto w = Writer::Open(path, wo);  // a resumed ingest opens the store like this
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), Code::kCorruption);
  EXPECT_NE(w.status().message().find("ids database holds 3"), std::string::npos) << w.status().message();
}

TEST(SampleIndex, IdsOfASealedStoreOutliveItsSealedIndex) {
  // A reader of a sealed store keeps valid ids after a writer appends (the
  // append frees the sealed index's pages, which later commits reuse).
  TempDir dir;
  const std::string path = MakeStore(dir, 4);
  auto r = Reader::Open(path).value();
  {
    // Six more samples, one commit each (the store stays unsealed).
    testing::StoreSpec more;
    more.fields = {testing::StoreField{"img", 2}, testing::StoreField{"mask", 1, /*mask=*/true}};
    more.ids = testing::NumberedIds(6, "new");
    more.height = kH;
    more.width = kW;
    more.value = [](uint64_t, int f, int64_t, int64_t, int64_t) { return f == 0 ? 3.0 : 1.0; };
    more.seal = false;
    more.batch = 1;
    ASSERT_TRUE(testing::WriteStore(path, more).ok());
  }
  for (uint64_t s = 0; s < 4; ++s) EXPECT_EQ(r->id(s), "s" + std::to_string(s));
  EXPECT_EQ(r->Find("s2").value(), 2u);
}

TEST(SampleIndex, IndexDisagreeingWithRecordsIsRefusedAndNamed) {
  TempDir dir;
  // Unsealed: readers use the per-sample entries (a sealed store's readers
  // use the sealed index; see SealedIndex* below).
  const std::string path = MakeStore(dir, 4, "s.ps", /*seal=*/false);
  // A well-formed summary (good checksum) that lies: sample 2's img is said
  // to be 2x12x9, and its mask count is off by one.
  EditLmdb(path, [&](MDB_txn* txn, MDB_dbi, MDB_dbi index) {
    SampleSummary s;
    s.fields.resize(2);
    s.fields[0].present = true;
    s.fields[0].rank = 3;
    s.fields[0].shape = {2, kH, kW - 1, 0};
    s.fields[1].present = true;
    s.fields[1].rank = 3;
    s.fields[1].shape = {1, kH, kW, 0};
    s.fields[1].has_valid_count = true;
    s.fields[1].valid_count = 2 * 7 + 1;
    const std::string v = EncodeSampleSummary(2, s);
    auto key = IndexKey(2);
    MDB_val k{key.size(), key.data()}, val{v.size(), const_cast<char*>(v.data())};
    ASSERT_EQ(mdb_put(txn, index, &k, &val, 0), 0);
  });
  auto r = Reader::Open(path).value();
  auto got = r->Get(2, 0);
  EXPECT_EQ(got.status().code(), Code::kCorruption);
  EXPECT_NE(got.status().message().find("sample index"), std::string::npos) << got.status().message();
  EXPECT_NE(got.status().message().find("'s2'"), std::string::npos) << got.status().message();
  EXPECT_TRUE(r->Get(1, 0).ok());
  auto rep = VerifyStore(path).value();
  ASSERT_EQ(rep.problems.size(), 2u);
  for (const auto& p : rep.problems) {
    EXPECT_EQ(p.id, "s2");
    EXPECT_NE(p.message.find("sample index disagrees"), std::string::npos) << p.message;
  }
  EXPECT_EQ(rep.problems[0].field, "img");
  EXPECT_EQ(rep.problems[1].field, "mask");
}

TEST(SampleIndex, MissingIndexEntryIsRefusedAtOpen) {
  TempDir dir;
  const std::string path = MakeStore(dir, 3);
  EditLmdb(path, [&](MDB_txn* txn, MDB_dbi, MDB_dbi index) {
    auto key = IndexKey(1);
    MDB_val k{key.size(), key.data()};
    ASSERT_EQ(mdb_del(txn, index, &k, nullptr), 0);
  });
  auto r = Reader::Open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorruption);
  EXPECT_NE(r.status().message().find("index holds 2"), std::string::npos) << r.status().message();
}

TEST(SampleIndex, ReadAheadHintsNeverFailAndChangeNothing) {
  TempDir dir;
  const std::string path = MakeStore(dir, 3);
  auto r = Reader::Open(path).value();
  r->Prefetch(99, 0);  // no such sample: ignored
  r->Prefetch(0, 7);   // no such field: ignored
  r->PrefetchWindow(TensorView{});
  r->PrefetchBytes(nullptr, 0);
  r->Prefetch(1, 0);
  auto w = r->Patch(2, 0, 3, 4, 5, 6).value();
  r->PrefetchWindow(w);
  auto whole = r->Get(2, 0).value();
  r->PrefetchBytes(whole.data, 2 * kH * kW * sizeof(float));
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t y = 0; y < 5; ++y)
      for (int64_t x = 0; x < 6; ++x)
        EXPECT_EQ(w.data_as<float>()[c * kH * kW + y * kW + x],
                  static_cast<float>(2000 + c * kH * kW + (y + 3) * kW + x + 4));
}

}  // namespace
}  // namespace patchstore

namespace patchstore {
namespace {

std::string SealedBlob(const std::string& path) {
  auto snap = Snapshot::Open(path).value();
  auto blob = snap->SealedIndex();
  return blob.ok() ? std::string(*blob) : std::string();
}

TEST(SampleIndex, SealedStoresAreOpenedFromOneValueThatAppendingRemoves) {
  TempDir dir;
  const std::string sealed = MakeStore(dir, 5, "a.ps");
  const std::string open = MakeStore(dir, 5, "b.ps", /*seal=*/false);
  EXPECT_FALSE(SealedBlob(sealed).empty());
  EXPECT_TRUE(SealedBlob(open).empty());
  const std::string blob = SealedBlob(sealed);  // entries point into it
  auto entries = DecodeSealedIndex(blob.data(), blob.size()).value();
  ASSERT_EQ(entries.size(), 5u);
  EXPECT_EQ(entries[3].id, "s3");
  auto a = Reader::Open(sealed).value(), b = Reader::Open(open).value();
  ASSERT_EQ(a->size(), b->size());
  for (uint64_t s = 0; s < 5; ++s) {
    EXPECT_EQ(a->id(s), b->id(s));
    for (int f = 0; f < 2; ++f) {
      EXPECT_TRUE(a->summary(s, f) == b->summary(s, f));
      auto va = a->Get(s, f).value(), vb = b->Get(s, f).value();
      EXPECT_EQ(0, std::memcmp(va.data, vb.data, static_cast<size_t>(va.elements()) * 4));
    }
  }
  EXPECT_TRUE(VerifyStore(sealed).value().ok());
  // Appending unseals the store and drops the sealed index in the same
  // transaction; sealing again writes a new one that lists every sample.
  {
    WriterOptions wo;
    wo.durable = false;
    auto w = Writer::Open(sealed, wo).value();
    std::vector<float> img(2 * kH * kW, 1.0f), mask(kH * kW, 1.0f);
    SampleInput in;
    in.id = "extra";
    RecordInput ra, rm;
    ra.field = 0;
    ra.header.shape = {2, kH, kW, 0};
    ra.data = img.data();
    rm.field = 1;
    rm.header.shape = {1, kH, kW, 0};
    rm.data = mask.data();
    in.records = {ra, rm};
    ASSERT_TRUE(w->WriteBatch({in}).ok());
    EXPECT_TRUE(SealedBlob(sealed).empty());
    auto r = Reader::Open(sealed).value();
    EXPECT_EQ(r->size(), 6u);
    EXPECT_EQ(r->summary(5, 1).valid_count, static_cast<uint64_t>(kH * kW));
    ASSERT_TRUE(w->Seal().ok());
  }
  const std::string resealed = SealedBlob(sealed);
  EXPECT_EQ(DecodeSealedIndex(resealed.data(), resealed.size()).value().size(), 6u);
  EXPECT_EQ(Reader::Open(sealed).value()->id(5), "extra");
  EXPECT_TRUE(VerifyStore(sealed).value().ok());
}

TEST(SampleIndex, DamagedOrDisagreeingSealedIndexIsRefusedAndNamed) {
  TempDir dir;
  const std::string path = MakeStore(dir, 4);
  std::string blob = SealedBlob(path);
  // One flipped byte inside: the checksum refuses it at open.
  std::string bad = blob;
  bad[bad.size() / 2] = static_cast<char>(bad[bad.size() / 2] ^ 0x10);
  auto put = [&](const std::string& value) {
    EditLmdb(path, [&](MDB_txn* txn, MDB_dbi meta, MDB_dbi) {
      MDB_val k{12, const_cast<char*>("sealed_index")}, v{value.size(), const_cast<char*>(value.data())};
      ASSERT_EQ(mdb_put(txn, meta, &k, &v, 0), 0);
    });
  };
  put(bad);
  auto r = Reader::Open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorruption);
  EXPECT_NE(r.status().message().find("sealed index"), std::string::npos) << r.status().message();
  auto rep = VerifyStore(path).value();
  ASSERT_EQ(rep.problems.size(), 1u);
  EXPECT_NE(rep.problems[0].message.find("sealed index"), std::string::npos);
  // A well-formed blob that names another id for sample 1: verify names it.
  std::string other = BeginSealedIndex(4);
  auto snap = Snapshot::Open(path, SnapshotOptions{}).value();
  for (uint64_t i = 0; i < 4; ++i) {
    SampleSummary s;
    s.fields.resize(2);
    s.fields[0].present = s.fields[1].present = true;
    s.fields[0].rank = s.fields[1].rank = 3;
    s.fields[0].shape = {2, kH, kW, 0};
    s.fields[1].shape = {1, kH, kW, 0};
    s.fields[1].has_valid_count = true;
    s.fields[1].valid_count = i * 7;
    AppendSealedIndexEntry(&other, i == 1 ? "zz" : "s" + std::to_string(i), EncodeSampleSummary(i, s));
  }
  FinishSealedIndex(&other);
  snap.reset();
  put(other);
  EXPECT_EQ(Reader::Open(path).value()->id(1), "zz");  // what the sealed index says...
  rep = VerifyStore(path).value();                     // ...and verify says it is wrong
  ASSERT_EQ(rep.problems.size(), 1u);
  EXPECT_EQ(rep.problems[0].id, "s1");
  EXPECT_NE(rep.problems[0].message.find("sealed index disagrees"), std::string::npos);
}

}  // namespace
}  // namespace patchstore

namespace patchstore {
namespace {

// Issue 31 item 8: `upgrade` reports what is wrong instead of "nothing to
// do", and verify names an interrupted upgrade as the cause of unused block
// counts.
TEST(Upgrade, RewritesMissingMaskBlockRecordsAndRefusesAStoreThatDoesNotOpen) {
  TempDir dir;
  const std::string gap = MakeStore(dir, 6, "gap.ps");
  EditLmdb(gap, [&](MDB_txn* txn, MDB_dbi, MDB_dbi) {
    MDB_dbi rec;
    ASSERT_EQ(mdb_dbi_open(txn, "records", 0, &rec), 0);
    for (uint64_t s : {4, 2}) {
      auto key = RecordKey(s, static_cast<uint16_t>(kAuxFieldBase + 1));
      MDB_val k{key.size(), key.data()};
      ASSERT_EQ(mdb_del(txn, rec, &k, nullptr), 0);
    }
  });
  auto gaps = FindMaskBlocksGaps(gap).value();
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_EQ(std::make_tuple(gaps[0].field, gaps[0].samples, gaps[0].first_id), std::make_tuple("mask", 2ull, "s2"));
  std::string out;
  EXPECT_EQ(testing::RunCommand(std::string(PATCHSTORE_CLI) + " -q upgrade " + gap, &out), 0) << out;
  EXPECT_NE(out.find("upgrade: field 'mask' of '" + gap +
                     "' has mask block counts, but 2 samples lack them (first: "
                     "'s2'; deleted records or a damaged store): rewriting them all"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("rewrote the mask block counts of field 'mask' of '" + gap + "'"), std::string::npos) << out;
  EXPECT_EQ(out.find("nothing to do"), std::string::npos) << out;
  EXPECT_TRUE(FindMaskBlocksGaps(gap).value().empty());
  auto r = Reader::Open(gap).value();
  // 12x10 in one 32-block: a 2x2 table whose last corner is the sample's valid count (s*7).
  for (uint64_t s : {2, 4, 5}) EXPECT_EQ(static_cast<uint64_t>(r->MaskBlocks(s, 1).value().data[3]), s * 7) << s;
  EXPECT_TRUE(VerifyStore(gap).value().ok());

  // A store that readers refuse (its sealed index damaged): not "up to date".
  const std::string broken = MakeStore(dir, 3, "broken.ps");
  std::string blob = SealedBlob(broken);
  ASSERT_FALSE(blob.empty());
  blob[blob.size() / 3] = static_cast<char>(blob[blob.size() / 3] ^ 0x21);
  EditLmdb(broken, [&](MDB_txn* txn, MDB_dbi meta, MDB_dbi) {
    MDB_val k{12, const_cast<char*>("sealed_index")}, v{blob.size(), blob.data()};
    ASSERT_EQ(mdb_put(txn, meta, &k, &v, 0), 0);
  });
  EXPECT_EQ(testing::RunCommand(std::string(PATCHSTORE_CLI) + " -q upgrade " + broken, &out), 1) << out;
  EXPECT_NE(out.find("patchstore: error: '" + broken + "' does not open after the upgrade: "), std::string::npos)
      << out;
  EXPECT_NE(out.find("sealed index"), std::string::npos) << out;
  EXPECT_EQ(out.find("nothing to do"), std::string::npos) << out;
}

TEST(Upgrade, VerifyNamesAnInterruptedUpgradeApartFromAnOlderWriter) {
  TempDir dir;
  const std::string path = MakeStore(dir, 7, "m.ps");
  auto drop_blocks = [&] {
    WriterOptions wo;
    wo.durable = false;
    auto w = Writer::Open(path, wo).value();
    w->mutable_meta().fields[1].mask_blocks = 0;  // what an older writer's metadata says
    ASSERT_TRUE(w->CommitMeta().ok());
  };
  drop_blocks();
  auto rep = VerifyStore(path).value();
  ASSERT_EQ(rep.problems.size(), 7u);
  EXPECT_NE(rep.problems[0].message.find("an older patchstore appended to the store and rewrote it, or an upgrade by a "
                                         "patchstore that did not mark its progress was interrupted"),
            std::string::npos)
      << rep.problems[0].message;
  // Upgraded to the end, then the metadata lost them again, then an upgrade
  // stopped after its first transaction (3 of 7 samples).
  ASSERT_TRUE(AddMaskBlocks(path).ok());
  drop_blocks();
  auto stopped = AddMaskBlocks(
      path, [](uint64_t, uint64_t) { return false; }, 3);
  ASSERT_EQ(stopped.status().code(), Code::kAborted);
  EXPECT_EQ(Snapshot::Open(path).value()->meta().attributes.at(kUpgradingAttribute), "mask block counts");
  rep = VerifyStore(path).value();
  ASSERT_EQ(rep.problems.size(), 7u);
  for (const VerifyProblem& p : rep.problems)
    EXPECT_EQ(p.message, "unused mask block counts: `patchstore upgrade` was interrupted while adding them; run "
                         "`patchstore upgrade` again to finish");
  std::string out;
  EXPECT_EQ(testing::RunCommand(std::string(PATCHSTORE_CLI) + " -q upgrade " + path, &out), 0) << out;
  EXPECT_NE(out.find("finished the interrupted upgrade of '" + path + "'"), std::string::npos) << out;
  EXPECT_EQ(Snapshot::Open(path).value()->meta().attributes.count(kUpgradingAttribute), 0u);
  EXPECT_TRUE(VerifyStore(path).value().ok());
}

}  // namespace
}  // namespace patchstore
