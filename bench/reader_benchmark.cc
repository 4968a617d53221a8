// Hot paths of the reader, each next to a plain memcpy of the same bytes.
//
// The store is written once per run into $PATCHSTORE_BENCH_DIR (default
// /tmp) and read while it sits in the page cache: 16 samples of 1920x1080
// with rgb (3), mask (1) and depth (1) channels, 664 MB of float32.
//   BM_Memcpy            1.3 MB contiguous copy from random places in a
//                        buffer as large as the store (the bandwidth ceiling)
//   BM_InRamCrop         the same 5x256x256 window cut from a malloc'd array
//   BM_RecordGet         Reader::Get of one field (a view: no bytes move)
//   BM_PatchCopy         Reader::CopyPatch of 5x256x256 (rgb+mask+depth)
//   BM_BatchGather/T     Reader::CopyPatches, 64 windows of 256x256 rgb, T threads
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include "patchstore/reader/reader.h"
#include "patchstore/store/store.h"

namespace ps = patchstore;

namespace {

constexpr int kSamples = 16, kH = 1080, kW = 1920, kP = 256;

std::string StorePath() {
  const char* d = std::getenv("PATCHSTORE_BENCH_DIR");
  return std::string(d && *d ? d : "/tmp") + "/patchstore-bench-frames.ps";
}

std::shared_ptr<ps::Reader> OpenBenchStore() {
  static std::shared_ptr<ps::Reader> reader = [] {
    const std::string path = StorePath();
    auto r = ps::Reader::Open(path);
    if (r.ok() && (*r)->size() == kSamples) return *r;
    std::filesystem::remove_all(path);
    ps::WriterOptions wo;
    wo.durable = false;
    auto w = ps::Writer::Open(path, wo);
    if (!w.ok()) std::abort();
    const int channels[3] = {3, 1, 1};
    const char* names[3] = {"rgb", "mask", "depth"};
    for (int f = 0; f < 3; ++f) {
      ps::FieldMeta m;
      m.name = names[f];
      m.channels = static_cast<uint32_t>(channels[f]);
      m.is_mask = f == 1;
      if (!(*w)->EnsureField(m).ok()) std::abort();
    }
    std::vector<float> buf(static_cast<size_t>(3) * kH * kW);
    std::mt19937 rng(1);
    for (auto& v : buf) v = static_cast<float>(rng() % 1000) / 1000.0f;
    for (int s = 0; s < kSamples; ++s) {
      ps::SampleInput in;
      in.id = "video/" + std::to_string(s);
      for (int f = 0; f < 3; ++f) {
        ps::RecordInput rec;
        rec.field = static_cast<uint16_t>(f);
        rec.header.rank = 3;
        rec.header.shape = {static_cast<uint64_t>(channels[f]), kH, kW, 0};
        rec.data = buf.data();
        in.records.push_back(rec);
      }
      if (!(*w)->WriteBatch({in}).ok()) std::abort();
    }
    if (!(*w)->Seal().ok()) std::abort();
    w->reset();
    r = ps::Reader::Open(path);
    if (!r.ok()) std::abort();
    // Touch everything once so the data is in the page cache.
    double sum = 0;
    for (uint64_t s = 0; s < (*r)->size(); ++s)
      for (int f = 0; f < 3; ++f) {
        auto v = (*r)->Get(s, f);
        for (int64_t i = 0; i < v->elements(); i += 1024) sum += v->data_as<float>()[i];
      }
    benchmark::DoNotOptimize(sum);
    return *r;
  }();
  return reader;
}

struct Window {
  uint64_t s;
  int64_t y, x;
};

std::vector<Window> RandomWindows(size_t n) {
  std::mt19937 rng(7);
  std::vector<Window> w(n);
  for (auto& x : w)
    x = {rng() % kSamples, static_cast<int64_t>(rng() % (kH - kP + 1)), static_cast<int64_t>(rng() % (kW - kP + 1))};
  return w;
}

constexpr int64_t kPatchBytes = int64_t{5} * kP * kP * 4;

void BM_Memcpy(benchmark::State& state) {
  const size_t total = static_cast<size_t>(kSamples) * 5 * kH * kW;  // as many floats as the store
  std::unique_ptr<float[]> src(new float[total]);
  std::memset(src.get(), 1, total * 4);
  std::vector<float> dst(kPatchBytes / 4);
  std::mt19937 rng(3);
  for (auto _ : state) {
    size_t off = (rng() % (total - dst.size())) & ~size_t{15};
    std::memcpy(dst.data(), src.get() + off, kPatchBytes);
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * kPatchBytes);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Memcpy);

void BM_InRamCrop(benchmark::State& state) {
  const size_t frame = static_cast<size_t>(5) * kH * kW;
  std::unique_ptr<float[]> src(new float[frame * kSamples]);
  std::memset(src.get(), 1, frame * kSamples * 4);
  std::vector<float> dst(kPatchBytes / 4);
  auto wins = RandomWindows(4096);
  size_t i = 0;
  for (auto _ : state) {
    const Window& w = wins[i++ % wins.size()];
    const float* base = src.get() + w.s * frame;
    float* out = dst.data();
    for (int c = 0; c < 5; ++c)
      for (int r = 0; r < kP; ++r, out += kP)
        std::memcpy(out, base + (static_cast<size_t>(c) * kH + w.y + r) * kW + w.x, kP * 4);
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * kPatchBytes);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_InRamCrop);

void BM_RecordGet(benchmark::State& state) {
  auto r = OpenBenchStore();
  size_t i = 0;
  for (auto _ : state) {
    auto v = r->Get(i++ % kSamples, 0);
    benchmark::DoNotOptimize(v->data);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RecordGet);

void BM_PatchCopy(benchmark::State& state) {
  auto r = OpenBenchStore();
  std::vector<float> dst(kPatchBytes / 4);
  auto wins = RandomWindows(4096);
  size_t i = 0;
  for (auto _ : state) {
    const Window& w = wins[i++ % wins.size()];
    // rgb (3 channels) then mask and depth (1 each): one 5x256x256 patch.
    if (!r->CopyPatch(w.s, 0, w.y, w.x, kP, kP, dst.data()).ok() ||
        !r->CopyPatch(w.s, 1, w.y, w.x, kP, kP, dst.data() + 3 * kP * kP).ok() ||
        !r->CopyPatch(w.s, 2, w.y, w.x, kP, kP, dst.data() + 4 * kP * kP).ok())
      state.SkipWithError("copy failed");
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * kPatchBytes);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PatchCopy);

void BM_BatchGather(benchmark::State& state) {
  auto r = OpenBenchStore();
  const int threads = static_cast<int>(state.range(0));
  const size_t batch = 64;
  std::vector<float> dst(batch * 3 * kP * kP);
  auto wins = RandomWindows(batch * 64);
  size_t i = 0;
  std::vector<ps::PatchRequest> reqs(batch);
  for (auto _ : state) {
    for (auto& q : reqs) {
      const Window& w = wins[i++ % wins.size()];
      q = {w.s, 0, w.y, w.x};
    }
    if (!r->CopyPatches(reqs, kP, kP, dst.data(), threads).ok()) state.SkipWithError("gather failed");
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(dst.size() * 4));
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(batch));
}
BENCHMARK(BM_BatchGather)->Arg(1)->Arg(2)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
