// Reader::OpenSet: several stores (a shard set) read as one.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "patchstore/reader/reader.h"
#include "patchstore/store/store.h"
#include "store/shard.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::TempDir;

constexpr int64_t kH = 8, kW = 12;

// The value of every pixel of sample `id`: its number, so a read names the sample it came from.
float ValueOf(const std::string& id) { return static_cast<float>(std::stoi(id.substr(2))); }

// Writes the ids into a store of one 1-channel field "x", recording shard `spec` ("" for none).
void WriteStore(const std::string& path, const std::vector<std::string>& ids, const std::string& spec,
                const char* field = "x", const Writer::OrdinalOf& ordinal = nullptr) {
  testing::StoreSpec store;
  store.fields = {testing::StoreField{field}};
  store.ids = ids;
  store.height = kH;
  store.width = kW;
  store.value = [&](uint64_t s, int, int64_t, int64_t, int64_t) -> double { return ValueOf(ids[s]); };
  if (!spec.empty()) store.attributes[kShardAttribute] = spec;
  store.batch = ids.size();
  store.ordinal = ordinal;
  ASSERT_TRUE(testing::WriteStore(path, store).ok());
}

// 30 ids "s/0".."s/29" split into `n` shards by ShardOfId, written as shard stores; returns their paths.
std::vector<std::string> WriteShards(const TempDir& dir, uint32_t n, std::vector<std::vector<std::string>>* parts) {
  parts->assign(n, {});
  for (int i = 0; i < 30; ++i) {
    const std::string id = "s/" + std::to_string(i);
    (*parts)[ShardOfId(id, n)].push_back(id);
  }
  std::vector<std::string> paths;
  for (uint32_t i = 0; i < n; ++i) {
    paths.push_back(dir / ("shard-" + std::to_string(i) + ".ps"));
    WriteStore(paths.back(), (*parts)[i], std::to_string(i) + "/" + std::to_string(n));
  }
  return paths;
}

TEST(ShardOfId, IsXxh3Of64BitsModN) {
  // XXH3_64bits("") = 0x2D06800538D394C2 (the xxHash reference value).
  EXPECT_EQ(ShardOfId("", 1u << 20), 0x2D06800538D394C2ull % (1u << 20));
  EXPECT_EQ(ShardOfId("", 7), 0x2D06800538D394C2ull % 7);
  EXPECT_EQ(ShardOfId("anything", 1), 0u);
  uint32_t i = 0, n = 0;
  EXPECT_TRUE(ParseShardSpec("2/5", &i, &n).ok());
  EXPECT_EQ(i, 2u);
  EXPECT_EQ(n, 5u);
  for (const char* bad : {"5/5", "0/0", "", "1", "a/3", "1/3x", "-1/3", "1/2000000"})
    EXPECT_EQ(ParseShardSpec(bad, &i, &n).code(), Code::kInvalidArgument) << bad;
}

TEST(ShardSet, ReadsAsOneStoreInShardOrder) {
  TempDir dir;
  std::vector<std::vector<std::string>> parts;
  auto paths = WriteShards(dir, 3, &parts);
  // Given in any order: read in shard order.
  auto set = Reader::OpenSet({paths[2], paths[0], paths[1]}).value();
  ASSERT_EQ(set->size(), 30u);
  ASSERT_EQ(set->store_count(), 3u);
  EXPECT_TRUE(set->sealed());
  EXPECT_TRUE(set->no_lock());
  EXPECT_EQ(set->meta().sample_count, 30u);
  uint64_t g = 0;
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(set->store_path(s), paths[s]);
    EXPECT_EQ(set->store_begin(s), g);
    for (const std::string& id : parts[s]) {
      EXPECT_EQ(set->id(g), id);
      EXPECT_EQ(set->StoreOf(g), s);
      EXPECT_EQ(set->Find(id).value(), g);
      auto v = set->Patch(g, 0, 2, 3, 4, 5).value();
      EXPECT_EQ(v.data_as<float>()[0], ValueOf(id));
      ++g;
    }
  }
  EXPECT_EQ(set->store_begin(3), 30u);
  // Views outlive the reader (they own every store's snapshot).
  auto view = set->Get(29, 0).value();
  const float want = ValueOf(std::string(set->id(29)));
  set.reset();
  EXPECT_EQ(view.data_as<float>()[kH * kW - 1], want);
  // Errors name the store of the sample.
  auto again = Reader::OpenSet(paths).value();
  EXPECT_NE(again->Describe(29, 0).find(paths[2]), std::string::npos);
  EXPECT_EQ(again->Find("s/99").status().code(), Code::kNotFound);
}

TEST(ShardSet, RefusesIncompleteMixedOrDuplicatedSets) {
  TempDir dir;
  std::vector<std::vector<std::string>> parts;
  auto paths = WriteShards(dir, 4, &parts);
  auto missing = Reader::OpenSet({paths[0], paths[1], paths[3]});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("4 shards: 3 found"), std::string::npos) << missing.status().message();
  EXPECT_NE(missing.status().message().find("shard 2 missing"), std::string::npos);
  // Some shards on purpose (rank-local reading): in shard order, still each once.
  ReaderOptions partial;
  partial.partial_set = true;
  auto some = Reader::OpenSet({paths[3], paths[0]}, partial).value();
  ASSERT_EQ(some->size(), parts[0].size() + parts[3].size());
  EXPECT_EQ(some->store_path(0), paths[0]);
  EXPECT_EQ(some->id(some->store_begin(1)), parts[3].front());
  EXPECT_FALSE(Reader::OpenSet({paths[0], paths[0]}, partial).ok());
  auto twice = Reader::OpenSet({paths[0], paths[1], paths[1], paths[2], paths[3]});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("are both shard 1/4"), std::string::npos) << twice.status().message();
  std::vector<std::vector<std::string>> other_parts;
  TempDir other;
  auto three = WriteShards(other, 3, &other_parts);
  auto mixed = Reader::OpenSet({paths[0], three[1]});
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("two different shard sets"), std::string::npos);
  // Plain stores sharing an id: both named.
  WriteStore(dir / "a.ps", {"s/1", "s/2"}, "");
  WriteStore(dir / "b.ps", {"s/3", "s/2"}, "");
  auto dup = Reader::OpenSet({dir / "a.ps", dir / "b.ps"});
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().message(), "opening a set of stores: sample id 's/2' is in '" + (dir / "a.ps") +
                                        "' (sample #1) and in '" + (dir / "b.ps") +
                                        "' (sample #1); every id must be in one store of a set");
  // Plain stores are read in the order given.
  WriteStore(dir / "c.ps", {"s/7"}, "");
  auto plain = Reader::OpenSet({dir / "c.ps", dir / "a.ps"}).value();
  ASSERT_EQ(plain->size(), 3u);
  EXPECT_EQ(plain->id(0), "s/7");
  EXPECT_EQ(plain->id(2), "s/2");
  // Different fields.
  WriteStore(dir / "y.ps", {"s/8"}, "", "y");
  auto fields = Reader::OpenSet({dir / "c.ps", dir / "y.ps"});
  ASSERT_FALSE(fields.ok());
  EXPECT_EQ(fields.status().message(), "opening a set of stores: store '" + (dir / "y.ps") +
                                           "' has no field 'x' (store '" + (dir / "c.ps") +
                                           "' has): a set needs the same fields in every store");
  EXPECT_FALSE(Reader::OpenSet({}).ok());
  EXPECT_EQ(Reader::OpenSet({dir / "nothing.ps"}).status().code(), Code::kNotFound);
}

// Two shards "I/2" of field "depth" (2 channels, 5 x 7) that differ only by
// what `edit` changes in the second; the message OpenSet gives.
std::string MismatchMessage(const std::function<void(testing::StoreField*)>& edit) {
  TempDir dir;
  testing::StoreSpec spec;
  spec.fields = {testing::StoreField{"depth", 2}, testing::StoreField{"seg", 1, /*mask=*/true}};
  spec.height = 5;
  spec.width = 7;
  spec.value = [](uint64_t s, int f, int64_t c, int64_t y, int64_t x) -> double {
    return f == 1 ? double((x + 2 * y + s) % 3 == 0) : double(s * 40 + c * 20 + y * 3 + x) / 64.0;
  };
  spec.ids = {"s/3", "s/4"};
  spec.attributes[kShardAttribute] = "0/2";
  EXPECT_TRUE(testing::WriteStore(dir / "p.ps", spec).ok());
  spec.ids = {"s/11"};
  spec.attributes[kShardAttribute] = "1/2";
  edit(&spec.fields[0]);
  EXPECT_TRUE(testing::WriteStore(dir / "q.ps", spec).ok());
  auto r = Reader::OpenSet({dir / "q.ps", dir / "p.ps"});
  EXPECT_FALSE(r.ok());
  std::string m = r.ok() ? "" : r.status().message();
  // Paths relative to the folder, for exact comparisons.
  for (size_t at; (at = m.find(dir.path() + "/")) != std::string::npos;) m.erase(at, dir.path().size() + 1);
  return m;
}

TEST(ShardSet, AMismatchNamesThePropertyAndBothValues) {
  const std::string tail = ": a set needs the same fields in every store";
  EXPECT_EQ(MismatchMessage([](testing::StoreField* f) { f->dtype = DType::kFloat16; }),
            "opening a set of stores: store 'q.ps' field 'depth': dtype float16, store 'p.ps' has float32" + tail);
  EXPECT_EQ(MismatchMessage([](testing::StoreField* f) { f->tile = 16; }),
            "opening a set of stores: store 'q.ps' field 'depth': layout tiles of 16x16, store 'p.ps' has rows" + tail);
  EXPECT_EQ(MismatchMessage([](testing::StoreField* f) {
              f->norm.kind = NormKind::kAffine;
              f->norm.scale = 0.25;
              f->norm.offset = -3;
            }),
            "opening a set of stores: store 'q.ps' field 'depth': normalisation affine(0.25,-3), store 'p.ps' has "
            "none" +
                tail);
  EXPECT_EQ(MismatchMessage([](testing::StoreField* f) { f->channels = 3; }),
            "opening a set of stores: store 'q.ps' field 'depth': channels 3, store 'p.ps' has 2" + tail);
}

TEST(ShardSet, EmptyShardIsPartOfTheSet) {
  TempDir dir;
  WriteStore(dir / "0.ps", {"s/1"}, "0/2");
  WriteStore(dir / "1.ps", {}, "1/2");
  {
    // A shard ingest that found no sample of its shard: sealed, no fields.
    WriterOptions wo;
    wo.durable = false;
    auto w = Writer::Open(dir / "2.ps", wo).value();
    w->mutable_meta().attributes[kShardAttribute] = "0/2";
    ASSERT_TRUE(w->Seal().ok());
    WriteStore(dir / "3.ps", {"s/5"}, "1/2");
    auto set = Reader::OpenSet({dir / "3.ps", dir / "2.ps"}).value();
    ASSERT_EQ(set->size(), 1u);
    EXPECT_EQ(set->field_count(), 1);
    EXPECT_EQ(set->FieldIndex("x").value(), 0);
  }
  auto set = Reader::OpenSet({dir / "1.ps", dir / "0.ps"}).value();
  ASSERT_EQ(set->size(), 1u);
  EXPECT_EQ(set->id(0), "s/1");
  EXPECT_EQ(set->Patch(0, 0, 0, 0, 2, 2).value().data_as<float>()[0], 1.0f);
}

// The ordinal of "s/<n>" in an input listing ids by number.
bool OrdinalOfNumber(std::string_view id, uint64_t* ordinal) {
  *ordinal = static_cast<uint64_t>(std::stoi(std::string(id.substr(2))));
  return true;
}

TEST(ShardSet, ShardsSealedWithTheirInputOrderReadInThatOrder) {
  TempDir dir;
  const uint32_t n = 3;
  std::vector<std::vector<std::string>> parts(n);
  for (int i = 0; i < 30; ++i) {
    const std::string id = "s/" + std::to_string(i);
    parts[ShardOfId(id, n)].push_back(id);
  }
  std::vector<std::string> paths;
  for (uint32_t i = 0; i < n; ++i) {
    paths.push_back(dir.path() + "/o" + std::to_string(i) + ".ps");
    WriteStore(paths.back(), parts[i], std::to_string(i) + "/" + std::to_string(n), "x", OrdinalOfNumber);
    auto order = Snapshot::Open(paths.back()).value()->InputOrder();
    ASSERT_TRUE(order.ok()) << order.status().ToString();
    ASSERT_EQ(order->size(), parts[i].size());
    for (size_t k = 0; k < parts[i].size(); ++k) EXPECT_EQ((*order)[k], std::stoul(parts[i][k].substr(2)));
  }
  auto set = Reader::OpenSet({paths[2], paths[0], paths[1]});
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  const auto& r = *set;
  EXPECT_TRUE(r->input_ordered());
  ASSERT_EQ(r->size(), 30u);
  for (uint64_t g = 0; g < 30; ++g) {
    // The single ingest's order: s/0, s/1, ...
    ASSERT_EQ(std::string(r->id(g)), "s/" + std::to_string(g));
    const size_t s = r->StoreOf(g);
    EXPECT_EQ(std::string(r->store_path(s)), paths[s]);
    EXPECT_EQ(parts[s][r->LocalIndex(g)], "s/" + std::to_string(g));
    EXPECT_EQ(r->Find("s/" + std::to_string(g)).value(), g);
    auto v = r->Get(g, 0);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(v->data_as<float>()[kH * kW - 1], static_cast<float>(g));
    EXPECT_EQ(r->summary(g, 0).shape[1], static_cast<uint64_t>(kH));
  }
  for (uint32_t i = 0; i < n; ++i) EXPECT_EQ(r->store_size(i), parts[i].size());
  // Without an order in every store (one written without): shard order, as before.
  WriteStore(paths[1] + ".plain", parts[1], "1/3");
  auto mixed = Reader::OpenSet({paths[0], paths[1] + ".plain", paths[2]}).value();
  EXPECT_FALSE(mixed->input_ordered());
  EXPECT_EQ(std::string(mixed->id(0)), parts[0][0]);
  EXPECT_EQ(std::string(mixed->id(parts[0].size())), parts[1][0]);
}

TEST(ShardSet, AppendingToAShardDropsItsInputOrderUntilTheNextSeal) {
  TempDir dir;
  const std::string path = dir.path() + "/a.ps";
  WriteStore(path, {"s/4", "s/9"}, "", "x", OrdinalOfNumber);
  EXPECT_TRUE(Snapshot::Open(path).value()->InputOrder().ok());
  {
    WriterOptions wo;
    wo.durable = false;
    auto w = Writer::Open(path, wo).value();
    std::vector<float> data(kH * kW, 1.0f);
    SampleInput s;
    s.id = "s/1";
    RecordInput rec;
    rec.field = 0;
    rec.header.rank = 3;
    rec.header.shape = {1, kH, kW, 0};
    rec.data = data.data();
    s.records.push_back(rec);
    ASSERT_TRUE(w->WriteBatch({s}).ok());
    EXPECT_EQ(Snapshot::Open(path).value()->InputOrder().status().code(), Code::kNotFound);
    ASSERT_TRUE(w->Seal(OrdinalOfNumber).ok());
  }
  auto order = Snapshot::Open(path).value()->InputOrder();
  ASSERT_TRUE(order.ok());
  EXPECT_EQ(*order, (std::vector<uint64_t>{4, 9, 1}));
  // Damage is reported, not taken as "no order".
  std::string blob = EncodeInputOrder({4, 9, 1});
  blob[20] ^= 1;
  EXPECT_EQ(DecodeInputOrder(blob.data(), blob.size()).status().code(), Code::kCorruption);
  EXPECT_EQ(DecodeInputOrder(blob.data(), blob.size() - 8).status().code(), Code::kCorruption);
}

}  // namespace
}  // namespace patchstore
