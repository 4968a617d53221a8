// Slices of volumes as training samples, each next to a plain memcpy of the
// same bytes.
//
// The store is written once per run into $PATCHSTORE_BENCH_DIR (default
// /tmp) with store/Writer directly: 8 volumes of 64 x 256 x 256 (S, H, W),
// fields MR and CT, 256 MiB of float32, read while in the page cache.
//   BM_Memcpy/c             memcpy of (2c+1) x 256 x 256 floats out of the map,
//                           from the same random places as BM_CopySliceStack
//   BM_SliceStackView/c     SliceStack: a zero-copy (2c+1,256,256) view
//   BM_CopySliceStack/c/t   CopySliceStack into a caller buffer; t = 0 no
//                           transform, 1 flip_h, 2 flip_v, 3 rot90, 4 rot90 +
//                           flip_h, 5 crop 224 + flip_v + rot90 x3
//   BM_RandomSliceView      SliceIndex lookup of a random flat index + view
//   BM_RandomSliceCopy/c    the same, copied with a random flip/rot90
//   BM_BatchSliceStacks/T   CopySliceStacks of 32 random items, context 2,
//                           random flips/rot90, T threads
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include "patchstore/reader/reader.h"
#include "patchstore/reader/volume.h"
#include "patchstore/store/store.h"

namespace ps = patchstore;

namespace {

constexpr int kVolumes = 8, kS = 64, kH = 256, kW = 256;

std::string StorePath() {
  const char* d = std::getenv("PATCHSTORE_BENCH_DIR");
  return std::string(d && *d ? d : "/tmp") + "/patchstore-bench-volumes.ps";
}

std::shared_ptr<ps::Reader> OpenBenchStore() {
  static std::shared_ptr<ps::Reader> reader = [] {
    const std::string path = StorePath();
    auto r = ps::Reader::Open(path);
    if (r.ok() && (*r)->size() == kVolumes && (*r)->meta().kind == "volumes") return *r;
    std::filesystem::remove_all(path);
    ps::WriterOptions wo;
    wo.kind = "volumes";
    wo.durable = false;
    auto w = ps::Writer::Open(path, wo);
    if (!w.ok()) std::abort();
    for (const char* name : {"MR", "CT"}) {
      ps::FieldMeta m;
      m.name = name;
      m.channels = 1;
      m.layout = ps::Layout::kSHW;
      if (!(*w)->EnsureField(m).ok()) std::abort();
    }
    std::vector<float> buf(static_cast<size_t>(kS) * kH * kW);
    std::mt19937 rng(1);
    for (auto& v : buf) v = static_cast<float>(rng() % 4000) - 1000.0f;
    for (int s = 0; s < kVolumes; ++s) {
      ps::SampleInput in;
      in.id = "patient" + std::to_string(s);
      for (int f = 0; f < 2; ++f) {
        ps::RecordInput rec;
        rec.field = static_cast<uint16_t>(f);
        rec.header.layout = ps::Layout::kSHW;
        rec.header.rank = 3;
        rec.header.shape = {kS, kH, kW, 0};
        rec.data = buf.data();
        in.records.push_back(rec);
      }
      if (!(*w)->WriteBatch({in}).ok()) std::abort();
    }
    if (!(*w)->Seal().ok()) std::abort();
    w->reset();
    r = ps::Reader::Open(path);
    if (!r.ok()) std::abort();
    double sum = 0;  // bring the map into the page cache
    for (uint64_t s = 0; s < (*r)->size(); ++s)
      for (int f = 0; f < 2; ++f) {
        auto v = (*r)->Get(s, f);
        for (int64_t i = 0; i < v->elements(); i += 1024) sum += v->data_as<float>()[i];
      }
    benchmark::DoNotOptimize(sum);
    return *r;
  }();
  return reader;
}

ps::SliceTransform TransformFor(int t) {
  ps::SliceTransform x;
  switch (t) {
    case 1: x.flip_h = true; break;
    case 2: x.flip_v = true; break;
    case 3: x.rot90 = 1; break;
    case 4:
      x.rot90 = 1;
      x.flip_h = true;
      break;
    case 5:
      x.y = 13;
      x.x = 21;
      x.height = x.width = 224;
      x.flip_v = true;
      x.rot90 = 3;
      break;
    default: break;
  }
  return x;
}

int64_t StackBytes(int64_t context, int64_t h = kH, int64_t w = kW) { return (2 * context + 1) * h * w * 4; }

void BM_Memcpy(benchmark::State& state) {
  auto r = OpenBenchStore();
  const int64_t c = state.range(0);
  std::vector<const float*> vols;
  for (int v = 0; v < kVolumes; ++v) vols.push_back(ps::Volume(*r, v, 1)->data_as<float>());
  std::vector<float> dst(StackBytes(c) / 4);
  std::mt19937 rng(4);  // the same slices as BM_CopySliceStack
  for (auto _ : state) {
    const int64_t s = c + static_cast<int64_t>(rng() % (kS - 2 * c));
    std::memcpy(dst.data(), vols[rng() % kVolumes] + (s - c) * kH * kW, StackBytes(c));
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * StackBytes(c));
}
BENCHMARK(BM_Memcpy)->Arg(0)->Arg(2);

void BM_SliceStackView(benchmark::State& state) {
  auto r = OpenBenchStore();
  const int64_t c = state.range(0);
  std::mt19937 rng(3);
  for (auto _ : state) {
    const int64_t s = c + static_cast<int64_t>(rng() % (kS - 2 * c));
    auto v = ps::SliceStack(*r, rng() % kVolumes, 0, s, c);
    benchmark::DoNotOptimize(v->data);
  }
  state.SetBytesProcessed(state.iterations() * StackBytes(c));
}
BENCHMARK(BM_SliceStackView)->Arg(0)->Arg(2);

void BM_CopySliceStack(benchmark::State& state) {
  auto r = OpenBenchStore();
  const int64_t c = state.range(0);
  const ps::SliceTransform t = TransformFor(static_cast<int>(state.range(1)));
  const auto [oh, ow] = t.OutputSize(kH, kW);
  std::vector<float> dst(StackBytes(c, oh, ow) / 4);
  std::mt19937 rng(4);
  for (auto _ : state) {
    const int64_t s = c + static_cast<int64_t>(rng() % (kS - 2 * c));
    if (!ps::CopySliceStack(*r, rng() % kVolumes, 1, s, c, t, dst.data()).ok()) std::abort();
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * StackBytes(c, oh, ow));
}
BENCHMARK(BM_CopySliceStack)->ArgsProduct({{0, 2}, {0, 1, 2, 3, 4, 5}});

void BM_RandomSliceView(benchmark::State& state) {
  auto r = OpenBenchStore();
  auto ix = ps::SliceIndex::Build(*r);
  std::mt19937_64 rng(5);
  for (auto _ : state) {
    ps::SliceRef ref = (*ix)[rng() % ix->size()];
    auto v = ps::SliceStack(*r, ref.sample, 0, ref.slice, 0);
    benchmark::DoNotOptimize(v->data);
  }
  state.SetBytesProcessed(state.iterations() * StackBytes(0));
}
BENCHMARK(BM_RandomSliceView);

void BM_RandomSliceCopy(benchmark::State& state) {
  auto r = OpenBenchStore();
  auto ix = ps::SliceIndex::Build(*r);
  const int64_t c = state.range(0);
  std::vector<float> dst(StackBytes(c) / 4);
  std::mt19937_64 rng(6);
  for (auto _ : state) {
    ps::SliceRef ref = (*ix)[rng() % ix->size()];
    ps::SliceTransform t;
    t.flip_h = rng() & 1;
    t.rot90 = static_cast<int>(rng() % 4);
    if (!ps::CopySliceStack(*r, ref.sample, 0, ref.slice, c, t, dst.data()).ok()) std::abort();
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * StackBytes(c));
}
BENCHMARK(BM_RandomSliceCopy)->Arg(0)->Arg(2);

void BM_BatchSliceStacks(benchmark::State& state) {
  auto r = OpenBenchStore();
  auto ix = ps::SliceIndex::Build(*r);
  const int threads = static_cast<int>(state.range(0));
  constexpr int kBatch = 32, kContext = 2;
  std::vector<float> dst(static_cast<size_t>(kBatch) * StackBytes(kContext) / 4);
  std::mt19937_64 rng(7);
  std::vector<ps::SliceStackRequest> reqs(kBatch);
  for (auto _ : state) {
    state.PauseTiming();
    for (auto& q : reqs) {
      ps::SliceRef ref = (*ix)[rng() % ix->size()];
      q.sample = ref.sample;
      q.field = static_cast<int>(rng() % 2);
      q.slice = ref.slice;
      q.transform.flip_v = rng() & 1;
      q.transform.rot90 = static_cast<int>(rng() % 4);
    }
    state.ResumeTiming();
    if (!ps::CopySliceStacks(*r, reqs, kContext, dst.data(), threads).ok()) std::abort();
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * kBatch * StackBytes(kContext));
}
BENCHMARK(BM_BatchSliceStacks)->Arg(1)->Arg(2)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
