// The sampling engine: batch gather with mask-aware windows, and the cost of
// drawing windows as the valid area shrinks.
//
//   BM_Memcpy1T           contiguous memcpy of one gathered batch's bytes
//   BM_SamplerGather/T    PatchSampler::Gather: 64 windows of 256x256 (k=4),
//                         rgb+mask+depth, require=mask, T threads
//   BM_SamplerGatherCandidates  that gather on tiles + compact with
//                         candidates checked by their own mask tiles or in
//                         the window lists, with and without read-ahead
//   BM_SamplerDraw/pm     one window draw (WindowAt) on 1920x1080 masks whose
//                         valid area is pm per mille of the frame (200 = 20%,
//                         1 = 0.1%), after the per-sample index is built
//   BM_SamplerIndex/pm    building that per-sample index: the mask's
//                         summed-area table, then runs of qualifying windows
//                         (once per sample and window size, then cached)
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "patchstore/reader/sampler.h"
#include "patchstore/store/store.h"

namespace ps = patchstore;

namespace {

constexpr int kSamples = 8, kH = 1080, kW = 1920, kP = 256, kBatch = 64;

std::string Dir() {
  const char* d = std::getenv("PATCHSTORE_BENCH_DIR");
  return std::string(d && *d ? d : "/tmp");
}

// A frames store whose masks hold one square blob covering `permille` of
// the frame (at a random place per sample), written as ingest writes it
// (store format 2: no stored summed-area tables; the sampler computes a
// frame's table from its mask on the first visit).
// `tile` > 0: every field in tiles of tile x tile (FORMAT.md "Tiled
// records"); `compact`: rgb and mask as uint8 source values (unit and binary
// normalisation), depth float32, as `--encoding compact` writes 8-bit sources.
std::shared_ptr<ps::Reader> MaskStore(int permille, uint16_t tile = 0, bool compact = false) {
  static std::map<std::string, std::shared_ptr<ps::Reader>> cache;
  const std::string key = std::to_string(permille) + (tile ? "-t" + std::to_string(tile) : "") + (compact ? "-u8" : "");
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const std::string path = Dir() + "/patchstore-bench-mask-" + key + ".ps";
  auto r = ps::Reader::Open(path);
  if (!r.ok() || (*r)->size() != kSamples) {
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
      m.tile = tile;
      if (compact && f < 2) {
        m.dtype = ps::DType::kUInt8;
        m.norm.kind = f == 0 ? ps::NormKind::kUnit : ps::NormKind::kBinary;
        m.norm.scale = 255;
      }
      (void)w->EnsureField(m);
    }
    std::vector<uint8_t> rgb8(static_cast<size_t>(3) * kH * kW, 128), mask8(static_cast<size_t>(kH) * kW);
    std::vector<std::vector<uint8_t>> tiled(3);
    std::vector<float> rgb(static_cast<size_t>(3) * kH * kW, 0.5f), mask(static_cast<size_t>(kH) * kW);
    std::mt19937 rng(permille);
    const int side = std::max(1, static_cast<int>(std::sqrt(permille / 1000.0 * kH * kW)));
    for (int s = 0; s < kSamples; ++s) {
      std::fill(mask.begin(), mask.end(), 0.0f);
      const int y0 = static_cast<int>(rng() % (kH - std::min(side, kH) + 1));
      const int x0 = static_cast<int>(rng() % (kW - std::min(side, kW) + 1));
      for (int y = y0; y < std::min(kH, y0 + side); ++y)
        for (int x = x0; x < std::min(kW, x0 + side); ++x) mask[static_cast<size_t>(y) * kW + x] = 1.0f;
      ps::SampleInput in;
      in.id = "frame/" + std::to_string(s);
      for (size_t i = 0; i < mask.size(); ++i) mask8[i] = mask[i] != 0.0f ? 255 : 0;
      const void* data[3] = {rgb.data(), mask.data(), rgb.data()};
      if (compact) {
        data[0] = rgb8.data();
        data[1] = mask8.data();
      }
      for (int f = 0; f < 3; ++f) {
        ps::RecordInput rec;
        rec.field = static_cast<uint16_t>(f);
        rec.header.shape = {static_cast<uint64_t>(channels[f]), kH, kW, 0};
        const bool u8 = compact && f < 2;
        if (u8) {
          rec.header.dtype = ps::DType::kUInt8;
          rec.header.norm.kind = f == 0 ? ps::NormKind::kUnit : ps::NormKind::kBinary;
          rec.header.norm.scale = 255;
        }
        rec.header.tile = tile;
        rec.data = data[f];
        if (tile) {
          const ps::TileGrid g{channels[f], kH, kW, tile};
          const size_t es = u8 ? 1 : 4;
          tiled[f].resize(static_cast<size_t>(g.elements()) * es);
          ps::TileCHW(data[f], es, g, tiled[f].data());
          rec.data = tiled[f].data();
        }
        in.records.push_back(rec);
      }
      if (!w->WriteBatch({in}).ok()) std::abort();
    }
    if (!w->Seal().ok()) std::abort();
    w.reset();
    r = ps::Reader::Open(path);
  }
  cache[key] = r.value();
  return r.value();
}

ps::SamplerOptions Options(int threads) {
  ps::SamplerOptions o;
  o.fields = {"rgb", "mask", "depth"};
  o.patch_size = kP;
  o.patches_per_sample = 4;
  o.require = "mask";
  o.num_threads = threads;
  return o;
}

constexpr int64_t kBatchBytes = int64_t{kBatch} * 5 * kP * kP * 4;

void BM_Memcpy1T(benchmark::State& state) {
  std::vector<char> src(size_t{1} << 30, 1), dst(kBatchBytes);
  std::mt19937_64 rng(1);
  for (auto _ : state) {
    size_t off = (rng() % (src.size() - dst.size())) & ~size_t{63};
    std::memcpy(dst.data(), src.data() + off, dst.size());
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * kBatchBytes);
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_Memcpy1T)->UseRealTime();

void BM_SamplerGather(benchmark::State& state) {
  auto reader = MaskStore(200);
  auto s = ps::PatchSampler::Create(reader, Options(static_cast<int>(state.range(0)))).value();
  std::vector<float> rgb(static_cast<size_t>(kBatch) * 3 * kP * kP), mask(static_cast<size_t>(kBatch) * kP * kP),
      depth(mask.size());
  std::vector<float*> outs = {rgb.data(), mask.data(), depth.data()};
  if (!s->Next(kBatch, outs).ok()) state.SkipWithError("gather failed");  // warm the per-sample index
  for (auto _ : state)
    if (!s->Next(kBatch, outs).ok()) state.SkipWithError("gather failed");
  state.SetBytesProcessed(state.iterations() * kBatchBytes);
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_SamplerGather)->Arg(1)->Arg(2)->UseRealTime();

// Next(kBatch) into reused rgb/mask/depth buffers, once untimed (window
// lists, page faults), then per iteration.
void RunNext(benchmark::State& state, ps::PatchSampler& s) {
  std::vector<float> rgb(static_cast<size_t>(kBatch) * 3 * kP * kP), mask(static_cast<size_t>(kBatch) * kP * kP),
      depth(mask.size());
  std::vector<float*> outs = {rgb.data(), mask.data(), depth.data()};
  if (!s.Next(kBatch, outs).ok()) state.SkipWithError("gather failed");
  for (auto _ : state)
    if (!s.Next(kBatch, outs).ok()) state.SkipWithError("gather failed");
  state.SetBytesProcessed(state.iterations() * kBatchBytes);
  state.SetItemsProcessed(state.iterations() * kBatch);
}

// The same gather on one thread per layout: args (tile edge, 0 rows;
// compact: uint8 rgb + mask; flips + quarter turns on).
void BM_SamplerGatherLayout(benchmark::State& state) {
  auto reader = MaskStore(200, static_cast<uint16_t>(state.range(0)), state.range(1) != 0);
  ps::SamplerOptions o = Options(1);
  o.flip = o.rot90 = state.range(2) != 0;
  RunNext(state, *ps::PatchSampler::Create(reader, o).value());
}
BENCHMARK(BM_SamplerGatherLayout)
    ->ArgNames({"tile", "compact", "transforms"})
    ->Args({0, 0, 0})
    ->Args({32, 0, 0})
    ->Args({64, 0, 0})
    ->Args({0, 1, 0})
    ->Args({32, 1, 0})
    ->Args({64, 1, 0})
    ->Args({0, 0, 1})
    ->Args({64, 0, 1})
    ->Args({64, 1, 1})
    ->UseRealTime();

// The same gather (tiles of 32, compact) with windows drawn by checking
// candidates against their own mask tiles (MaskIndex::kWindows: what a store
// larger than RAM does) instead of the window lists (kBuild), and the
// stateful Next() with the read-ahead of the next batches (prefetch_next).
void BM_SamplerGatherCandidates(benchmark::State& state) {
  auto reader = MaskStore(200, 32, true);
  ps::SamplerOptions o = Options(1);
  o.mask_index = state.range(0) ? ps::MaskIndex::kWindows : ps::MaskIndex::kBuild;
  o.prefetch_next = state.range(1) != 0;
  RunNext(state, *ps::PatchSampler::Create(reader, o).value());
}
BENCHMARK(BM_SamplerGatherCandidates)
    ->ArgNames({"candidates", "prefetch"})
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({0, 1})
    ->Args({1, 1})
    ->UseRealTime();

void BM_SamplerDraw(benchmark::State& state) {
  auto reader = MaskStore(static_cast<int>(state.range(0)));
  auto s = ps::PatchSampler::Create(reader, Options(1)).value();
  for (uint64_t p = 0; p < s->visits_per_epoch(); ++p) (void)s->WindowAt(0, p, 0);  // build indexes
  uint64_t i = 0;
  for (auto _ : state) {
    auto w = s->WindowAt(0, i % s->visits_per_epoch(), static_cast<int>(i / s->visits_per_epoch()));
    benchmark::DoNotOptimize(w);
    ++i;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_SamplerDraw)->Arg(200)->Arg(50)->Arg(10)->Arg(1);

void BM_SamplerIndex(benchmark::State& state) {
  auto reader = MaskStore(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    auto s = ps::PatchSampler::Create(reader, Options(1)).value();
    auto w = s->WindowAt(0, 0, 0);  // builds the index of one sample
    benchmark::DoNotOptimize(w);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_SamplerIndex)->Arg(200)->Arg(50)->Arg(10)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
