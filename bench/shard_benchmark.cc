// A shard set read as one store vs one store holding the same samples, both
// in the page cache (issue 16: "reading a 4-shard set costs within 5% of one
// store").
//
//   BM_ShardGather/N   PatchSampler::Next: 64 windows of 128x128 (k=4) of
//                      rgb+mask+depth, require=mask, 1 thread, from 32
//                      samples of 512x512 in N stores (1: one store; 4: a
//                      shard set split by ShardOfId, sealed with their
//                      input order, opened with OpenSet)
//   BM_ShardPatch/N    Reader::Patch of one random 128x128 window (the
//                      per-window cost the sampler's gather pays)
//
// Stores are written once under $PATCHSTORE_BENCH_DIR (default /tmp) and
// kept for later runs (about 170 MB).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "patchstore/reader/sampler.h"
#include "patchstore/store/store.h"
#include "store/shard.h"

namespace ps = patchstore;

namespace {

constexpr int kSamples = 32, kH = 512, kW = 512, kP = 128, kBatch = 64;

std::string Dir() {
  const char* d = std::getenv("PATCHSTORE_BENCH_DIR");
  return std::string(d && *d ? d : "/tmp");
}

// Writes the samples whose index is in `which` (all when empty) into `path`.
void WriteStore(const std::string& path, const std::vector<int>& which, const std::string& shard) {
  std::filesystem::remove_all(path);
  ps::WriterOptions wo;
  wo.durable = false;
  auto w = ps::Writer::Open(path, wo).value();
  const int channels[3] = {3, 1, 1};
  const char* names[3] = {"rgb", "mask", "depth"};
  for (int f = 0; f < 3; ++f) {
    ps::FieldMeta m;
    m.name = names[f];
    m.channels = static_cast<uint32_t>(channels[f]);
    m.is_mask = f == 1;
    (void)w->EnsureField(m);
  }
  if (!shard.empty()) w->mutable_meta().attributes[ps::kShardAttribute] = shard;
  std::vector<float> rgb(static_cast<size_t>(3) * kH * kW), mask(static_cast<size_t>(kH) * kW);
  for (int s : which) {
    std::mt19937 rng(s);
    for (float& v : rgb) v = static_cast<float>(rng() % 255) / 255.f;
    std::fill(mask.begin(), mask.end(), 0.0f);
    for (int y = 100; y < 400; ++y)
      for (int x = 50 + s; x < 300 + s; ++x) mask[static_cast<size_t>(y) * kW + x] = 1.0f;
    ps::SampleInput in;
    in.id = "frame/" + std::to_string(s);
    const void* data[3] = {rgb.data(), mask.data(), rgb.data()};
    for (int f = 0; f < 3; ++f) {
      ps::RecordInput rec;
      rec.field = static_cast<uint16_t>(f);
      rec.header.shape = {static_cast<uint64_t>(channels[f]), kH, kW, 0};
      rec.data = data[f];
      in.records.push_back(rec);
    }
    if (!w->WriteBatch({in}).ok()) std::abort();
  }
  // Sealed as a shard ingest seals: with each sample's place in the whole
  // input, so the 4-shard set is numbered as the single store (input order).
  auto ordinal = [](std::string_view id, uint64_t* o) {
    *o = std::stoull(std::string(id.substr(id.find('/') + 1)));
    return true;
  };
  if (!w->CommitMeta().ok() || !w->Seal(ordinal).ok()) std::abort();
}

// One store (n = 1) or a set of n shards of the same kSamples samples.
std::shared_ptr<ps::Reader> Stores(int n) {
  static std::map<int, std::shared_ptr<ps::Reader>> cache;
  if (cache.count(n)) return cache[n];
  std::vector<std::string> paths;
  std::vector<std::vector<int>> parts(n);
  for (int s = 0; s < kSamples; ++s) parts[n == 1 ? 0 : ps::ShardOfId("frame/" + std::to_string(s), n)].push_back(s);
  for (int i = 0; i < n; ++i) {
    paths.push_back(Dir() + "/patchstore-bench-shard2-" + std::to_string(i) + "-of-" + std::to_string(n) + ".ps");
    auto r = ps::Reader::Open(paths.back());
    if (!r.ok() || (*r)->size() != parts[i].size())
      WriteStore(paths.back(), parts[i], n == 1 ? "" : std::to_string(i) + "/" + std::to_string(n));
  }
  auto r = n == 1 ? ps::Reader::Open(paths[0]) : ps::Reader::OpenSet(paths);
  if (!r.ok() || (*r)->size() != kSamples || (n > 1 && !(*r)->input_ordered())) std::abort();
  cache[n] = r.value();
  return cache[n];
}

void BM_ShardGather(benchmark::State& state) {
  auto reader = Stores(static_cast<int>(state.range(0)));
  ps::SamplerOptions o;
  o.fields = {"rgb", "mask", "depth"};
  o.patch_size = kP;
  o.patches_per_sample = 4;
  o.require = "mask";
  o.num_threads = 1;
  auto s = ps::PatchSampler::Create(reader, o).value();
  std::vector<float> rgb(static_cast<size_t>(kBatch) * 3 * kP * kP), mask(static_cast<size_t>(kBatch) * kP * kP),
      depth(mask.size());
  std::vector<float*> outs = {rgb.data(), mask.data(), depth.data()};
  for (int i = 0; i < 8; ++i)  // every sample visited: indexes built, pages resident
    if (!s->Next(kBatch, outs).ok()) state.SkipWithError("gather failed");
  for (auto _ : state)
    if (!s->Next(kBatch, outs).ok()) state.SkipWithError("gather failed");
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.SetBytesProcessed(state.iterations() * int64_t{kBatch} * 5 * kP * kP * 4);
}
BENCHMARK(BM_ShardGather)->Arg(1)->Arg(4)->UseRealTime();

void BM_ShardPatch(benchmark::State& state) {
  auto reader = Stores(static_cast<int>(state.range(0)));
  std::mt19937_64 rng(7);
  for (uint64_t s = 0; s < reader->size(); ++s) (void)reader->Get(s, 0);  // resolve every record once
  for (auto _ : state) {
    const uint64_t s = rng() % reader->size();
    auto v = reader->Patch(s, 0, static_cast<int64_t>(rng() % (kH - kP)), static_cast<int64_t>(rng() % (kW - kP)), kP,
                           kP);
    benchmark::DoNotOptimize(v);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ShardPatch)->Arg(1)->Arg(4);

}  // namespace

BENCHMARK_MAIN();
