// `patchstore bench`: random-window read throughput from 1..N processes.
//
// Each process opens the store itself (after fork, as DataLoader workers
// do), then gathers batches of random windows of every selected field into
// a reused buffer for a fixed time. Reports patches/s and GB/s per process
// count, plus a single-thread memcpy reference of the same bytes.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <random>
#include <sstream>

#include "cli/commands.h"
#include "cli/json.h"
#include "cli/validators.h"
#include "patchstore/reader/reader.h"
#include "patchstore/reader/volume.h"

namespace patchstore::cli {
namespace {

struct BenchConfig {
  std::string store;
  int64_t patch = 256;
  int batch = 64;
  std::vector<int> processes{1, 2};
  std::vector<std::string> fields;
  double seconds = 3.0;
  int threads = 1;
  unsigned seed = 0;
  bool json = false;
  // Volume stores: slices (context 0) and stacks of 2*context+1 slices, cut to crop x crop (0 = whole).
  int64_t context = 2;
  int64_t crop = 0;
  int64_t stack_context = 0;  // what one measurement copies (set per row)
};

struct Counts {
  uint64_t patches = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  int error = 0;
};

// One process's work on a volume store: random slice stacks of every
// selected field (SliceDataset's copy: CopySliceStacks, a random crop).
void RunVolumeWorker(const BenchConfig& cfg, int worker, Counts* out) {
  auto r = Reader::Open(cfg.store);
  auto ix = r.ok() ? SliceIndex::Build(**r) : Result<SliceIndex>(r.status());
  if (!ix.ok()) {
    std::fprintf(stderr, "patchstore bench: worker %d: %s\n", worker, ix.status().message().c_str());
    out->error = 1;
    return;
  }
  const Reader& reader = **r;
  std::vector<int> fields;
  for (const std::string& f : cfg.fields) fields.push_back(*reader.FieldIndex(f));
  const int64_t depth = 2 * cfg.stack_context + 1;
  const int64_t h = cfg.crop ? cfg.crop : ix->height(0), w = cfg.crop ? cfg.crop : ix->width(0);
  std::vector<std::vector<float>> bufs(fields.size(),
                                       std::vector<float>(static_cast<size_t>(cfg.batch * depth * h * w)));
  std::vector<SliceStackRequest> reqs(static_cast<size_t>(cfg.batch));
  std::vector<std::pair<int64_t, int64_t>> hw(reader.size());
  for (uint64_t v = 0; v < ix->volume_count(); ++v) hw[ix->sample(v)] = {ix->height(v), ix->width(v)};
  std::mt19937_64 rng(cfg.seed * 1000003u + static_cast<unsigned>(worker));
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < cfg.seconds) {
    for (SliceStackRequest& q : reqs) {
      const SliceRef ref = (*ix)[rng() % ix->size()];
      const auto [H, W] = hw[ref.sample];
      q = SliceStackRequest{};
      q.sample = ref.sample;
      q.slice = ref.slice;
      if (cfg.crop) {
        q.transform.height = q.transform.width = cfg.crop;
        q.transform.y = static_cast<int64_t>(rng() % static_cast<uint64_t>(H - cfg.crop + 1));
        q.transform.x = static_cast<int64_t>(rng() % static_cast<uint64_t>(W - cfg.crop + 1));
      }
    }
    for (size_t f = 0; f < fields.size(); ++f) {
      for (SliceStackRequest& q : reqs) q.field = fields[f];
      Status st = CopySliceStacks(reader, reqs, cfg.stack_context, bufs[f].data(), cfg.threads);
      if (!st.ok()) {
        std::fprintf(stderr, "patchstore bench: %s\n", st.message().c_str());
        out->error = 1;
        return;
      }
    }
    out->patches += static_cast<uint64_t>(cfg.batch);
    out->bytes += static_cast<uint64_t>(cfg.batch) * fields.size() * depth * h * w * sizeof(float);
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  out->seconds = elapsed;
}

// One process's work: returns counts through shared memory.
void RunWorker(const BenchConfig& cfg, int worker, Counts* out) {
  auto r = Reader::Open(cfg.store);
  if (!r.ok()) {
    std::fprintf(stderr, "patchstore bench: worker %d: %s\n", worker, r.status().message().c_str());
    out->error = 1;
    return;
  }
  const Reader& reader = **r;
  std::vector<int> fields;
  int64_t channels = 0;
  for (const std::string& f : cfg.fields) {
    auto fi = reader.FieldIndex(f);
    if (!fi.ok()) {
      out->error = 1;
      return;
    }
    fields.push_back(*fi);
    channels += reader.field(*fi).channels;
  }
  // Windows are drawn where every selected field is large enough.
  std::vector<std::pair<int64_t, int64_t>> hw(reader.size());
  for (uint64_t s = 0; s < reader.size(); ++s) {
    auto h = reader.Summary(s, fields[0]);
    if (!h.ok()) {
      std::fprintf(stderr, "patchstore bench: %s\n", h.status().message().c_str());
      out->error = 1;
      return;
    }
    hw[s] = {static_cast<int64_t>(h->shape[1]), static_cast<int64_t>(h->shape[2])};
  }
  std::mt19937_64 rng(cfg.seed * 1000003u + static_cast<unsigned>(worker));
  std::vector<std::vector<float>> bufs;
  for (int f : fields)
    bufs.emplace_back(static_cast<size_t>(cfg.batch) * reader.field(f).channels * cfg.patch * cfg.patch);
  std::vector<std::vector<PatchRequest>> reqs(fields.size(), std::vector<PatchRequest>(cfg.batch));
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < cfg.seconds) {
    for (int i = 0; i < cfg.batch; ++i) {
      uint64_t s = rng() % reader.size();
      const auto [H, W] = hw[s];
      int64_t y = H > cfg.patch ? static_cast<int64_t>(rng() % (H - cfg.patch + 1)) : 0;
      int64_t x = W > cfg.patch ? static_cast<int64_t>(rng() % (W - cfg.patch + 1)) : 0;
      for (size_t f = 0; f < fields.size(); ++f) reqs[f][i] = {s, fields[f], y, x};
    }
    for (size_t f = 0; f < fields.size(); ++f) {
      Status st = reader.CopyPatches(reqs[f], cfg.patch, cfg.patch, bufs[f].data(), cfg.threads);
      if (!st.ok()) {
        std::fprintf(stderr, "patchstore bench: %s\n", st.message().c_str());
        out->error = 1;
        return;
      }
    }
    out->patches += static_cast<uint64_t>(cfg.batch);
    out->bytes += static_cast<uint64_t>(cfg.batch) * channels * cfg.patch * cfg.patch * sizeof(float);
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  out->seconds = elapsed;
}

double MemcpyGBps(size_t bytes) {
  const size_t total = std::max<size_t>(bytes * 64, size_t{512} << 20);
  std::vector<char> src(total, 1), dst(bytes);
  std::mt19937_64 rng(1);
  const auto start = std::chrono::steady_clock::now();
  uint64_t done = 0;
  double t = 0;
  while (t < 1.0) {
    size_t off = (rng() % (total - bytes)) & ~size_t{63};
    std::memcpy(dst.data(), src.data() + off, bytes);
    done += bytes;
    t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return done / t / 1e9;
}

// Forks `procs` processes running `work`; sums their counts. False when one failed.
bool Measure(const BenchConfig& cfg, int procs, void (*work)(const BenchConfig&, int, Counts*), Counts* total) {
  auto* counts = static_cast<Counts*>(
      mmap(nullptr, sizeof(Counts) * procs, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (counts == MAP_FAILED) return false;
  for (int p = 0; p < procs; ++p) new (&counts[p]) Counts();
  std::vector<pid_t> pids;
  for (int p = 0; p < procs; ++p) {
    pid_t pid = fork();
    if (pid == 0) {
      work(cfg, p, &counts[p]);
      _exit(counts[p].error);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  *total = Counts{};
  for (int p = 0; p < procs; ++p) {
    total->patches += counts[p].patches;
    total->bytes += counts[p].bytes;
    total->seconds = std::max(total->seconds, counts[p].seconds);
  }
  munmap(counts, sizeof(Counts) * procs);
  return failed == 0;
}

// `patchstore bench` on a volume store: slices and stacks, as SliceDataset copies them.
int RunVolumes(BenchConfig cfg, const Reader& reader) {
  auto ix = SliceIndex::Build(reader);
  if (!ix.ok()) {
    std::fprintf(stderr, "patchstore: error: %s\n", ix.status().message().c_str());
    return 1;
  }
  for (uint64_t v = 0; v < ix->volume_count(); ++v) {
    if (cfg.crop > std::min(ix->height(v), ix->width(v))) {
      std::fprintf(stderr, "patchstore: error: --crop %lld is larger than the %lldx%lld slices of volume '%s'\n",
                   static_cast<long long>(cfg.crop), static_cast<long long>(ix->height(v)),
                   static_cast<long long>(ix->width(v)), std::string(reader.id(ix->sample(v))).c_str());
      return 1;
    }
    if (!cfg.crop && (ix->height(v) != ix->height(0) || ix->width(v) != ix->width(0))) {
      std::fprintf(stderr,
                   "patchstore: error: the volumes have slices of different sizes (%lldx%lld in '%s', "
                   "%lldx%lld in '%s'): give --crop\n",
                   static_cast<long long>(ix->height(0)), static_cast<long long>(ix->width(0)),
                   std::string(reader.id(ix->sample(0))).c_str(), static_cast<long long>(ix->height(v)),
                   static_cast<long long>(ix->width(v)), std::string(reader.id(ix->sample(v))).c_str());
      return 1;
    }
  }
  const int64_t h = cfg.crop ? cfg.crop : ix->height(0), w = cfg.crop ? cfg.crop : ix->width(0);
  std::string names;
  for (auto& f : cfg.fields) names += (names.empty() ? "" : "+") + f;
  std::ostringstream json;
  if (cfg.json) {
    json << "{\"store\": \"" << cfg.store << "\", \"kind\": \"volumes\", \"height\": " << h << ", \"width\": " << w
         << ", \"fields\": " << cfg.fields.size() << ", \"batch\": " << cfg.batch << ", \"runs\": [";
  } else {
    std::printf("store %s: %zu volumes, %llu slices; random %lldx%lld slices of %s (SliceDataset's copy), batch "
                "%d, %d thread(s) per process\n",
                cfg.store.c_str(), static_cast<size_t>(ix->volume_count()), static_cast<unsigned long long>(ix->size()),
                static_cast<long long>(h), static_cast<long long>(w), names.c_str(), cfg.batch, cfg.threads);
    std::printf("%8s %10s %14s %10s %16s\n", "stack", "processes", "items/s", "GB/s", "per process GB/s");
  }
  bool first = true;
  std::vector<int64_t> contexts{0};
  if (cfg.context > 0) contexts.push_back(cfg.context);
  for (int64_t c : contexts) {
    cfg.stack_context = c;
    for (int procs : cfg.processes) {
      Counts t;
      if (!Measure(cfg, procs, RunVolumeWorker, &t)) {
        std::fprintf(stderr, "patchstore: error: reader process(es) failed\n");
        return 1;
      }
      const double ips = t.patches / t.seconds, gbps = t.bytes / t.seconds / 1e9;
      if (cfg.json) {
        json << (first ? "" : ", ") << "{\"context\": " << c << ", \"processes\": " << procs
             << ", \"items_per_s\": " << ips << ", \"gbps\": " << gbps << "}";
      } else {
        std::printf("%8s %10d %14.0f %10.2f %16.2f\n", (std::to_string(2 * c + 1) + (c ? " sl." : " slice")).c_str(),
                    procs, ips, gbps, gbps / procs);
      }
      first = false;
    }
  }
  if (cfg.json) std::printf("%s]}\n", json.str().c_str());
  return 0;
}

int Run(const BenchConfig& cfg0) {
  BenchConfig cfg = cfg0;
  auto r = Reader::Open(cfg.store);
  if (!r.ok()) {
    std::fprintf(stderr, "patchstore: error: %s\n", r.status().message().c_str());
    return 1;
  }
  if ((*r)->size() == 0) {
    std::fprintf(stderr, "patchstore: error: store '%s' holds no samples\n", cfg.store.c_str());
    return 1;
  }
  if ((*r)->meta().kind == "volumes") {
    if (cfg.fields.empty())
      for (int f = 0; f < (*r)->field_count(); ++f) cfg.fields.push_back((*r)->field(f).name);
    for (const std::string& f : cfg.fields) {
      auto fi = (*r)->FieldIndex(f);
      if (!fi.ok()) {
        std::fprintf(stderr, "patchstore: error: %s\n", fi.status().message().c_str());
        return 1;
      }
    }
    return RunVolumes(cfg, **r);
  }
  if ((*r)->meta().kind != "frames") {
    std::fprintf(stderr, "patchstore: error: bench measures image stores (this one holds %s)\n",
                 (*r)->meta().kind.c_str());
    return 1;
  }
  if (cfg.fields.empty())
    for (int f = 0; f < (*r)->field_count(); ++f) cfg.fields.push_back((*r)->field(f).name);
  int64_t channels = 0;
  for (const std::string& f : cfg.fields) {
    auto fi = (*r)->FieldIndex(f);
    if (!fi.ok()) {
      std::fprintf(stderr, "patchstore: error: %s\n", fi.status().message().c_str());
      return 1;
    }
    channels += (*r)->field(*fi).channels;
  }
  for (uint64_t s = 0; s < (*r)->size(); ++s) {
    auto h = (*r)->Summary(s, *(*r)->FieldIndex(cfg.fields[0]));
    if (h.ok() && (static_cast<int64_t>(h->shape[1]) < cfg.patch || static_cast<int64_t>(h->shape[2]) < cfg.patch)) {
      std::fprintf(stderr, "patchstore: error: --patch %lld is larger than sample '%s' (%llux%llu)\n",
                   static_cast<long long>(cfg.patch), std::string((*r)->id(s)).c_str(),
                   static_cast<unsigned long long>(h->shape[2]), static_cast<unsigned long long>(h->shape[1]));
      return 1;
    }
  }
  r->reset();  // children open their own
  const size_t patch_bytes = static_cast<size_t>(channels * cfg.patch * cfg.patch * sizeof(float));
  const double ref = MemcpyGBps(patch_bytes);
  std::ostringstream json;
  if (!cfg.json) {
    std::printf(
        "store %s: %lld x %lld windows of %s (%lld channels, %.2f MB each), batch %d, %d thread(s) per "
        "process\n",
        cfg.store.c_str(), static_cast<long long>(cfg.patch), static_cast<long long>(cfg.patch),
        [&] {
          std::string s;
          for (auto& f : cfg.fields) s += (s.empty() ? "" : "+") + f;
          return s;
        }()
            .c_str(),
        static_cast<long long>(channels), patch_bytes / 1e6, cfg.batch, cfg.threads);
    std::printf("reference: single-thread memcpy of the same bytes: %.2f GB/s (%.0f windows/s)\n", ref,
                ref * 1e9 / patch_bytes);
    std::printf("%10s %14s %10s %16s\n", "processes", "windows/s", "GB/s", "per process GB/s");
  } else {
    json << "{\"store\": " << JsonString(cfg.store) << ", \"patch\": " << cfg.patch << ", \"channels\": " << channels
         << ", \"batch\": " << cfg.batch << ", \"memcpy_gbps\": " << JsonNumber(ref) << ", \"runs\": [";
  }
  bool first = true;
  for (int procs : cfg.processes) {
    auto* counts = static_cast<Counts*>(
        mmap(nullptr, sizeof(Counts) * procs, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (counts == MAP_FAILED) return 1;
    for (int p = 0; p < procs; ++p) new (&counts[p]) Counts();
    std::vector<pid_t> pids;
    for (int p = 0; p < procs; ++p) {
      pid_t pid = fork();
      if (pid == 0) {
        RunWorker(cfg, p, &counts[p]);
        _exit(counts[p].error);
      }
      pids.push_back(pid);
    }
    int failed = 0;
    for (pid_t pid : pids) {
      int status = 0;
      waitpid(pid, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
    }
    uint64_t patches = 0, bytes = 0;
    double secs = 0;
    for (int p = 0; p < procs; ++p) {
      patches += counts[p].patches;
      bytes += counts[p].bytes;
      secs = std::max(secs, counts[p].seconds);
    }
    munmap(counts, sizeof(Counts) * procs);
    if (failed) {
      std::fprintf(stderr, "patchstore: error: %d reader process(es) failed\n", failed);
      return 1;
    }
    const double wps = patches / secs, gbps = bytes / secs / 1e9;
    if (cfg.json) {
      json << (first ? "" : ", ") << "{\"processes\": " << procs << ", \"windows_per_s\": " << JsonNumber(wps)
           << ", \"gbps\": " << JsonNumber(gbps) << "}";
    } else {
      std::printf("%10d %14.0f %10.2f %16.2f\n", procs, wps, gbps, gbps / procs);
    }
    first = false;
  }
  if (cfg.json) std::printf("%s]}\n", json.str().c_str());
  return 0;
}

}  // namespace

Runner RegisterBench(CLI::App* app, const bool* quiet) {
  auto cfg = std::make_shared<BenchConfig>();
  auto* cmd = app->add_subcommand("bench", "Measure random-window read throughput on your store and machine");
  cmd->add_option("STORE", cfg->store)->required();
  cmd->add_option("--patch", cfg->patch, "Window size P (P x P)")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--batch", cfg->batch, "Windows gathered per call")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--processes", cfg->processes, "Process counts to measure, e.g. 1,2,4")
      ->delimiter(',')
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--field", cfg->fields, "Fields to read (default: all)");
  cmd->add_option("--seconds", cfg->seconds, "Seconds per measurement")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0))
      ->check(FiniteNumber());
  cmd->add_option("--threads", cfg->threads, "Gather threads per process")->check(CLI::Range(1, 256));
  cmd->add_option("--seed", cfg->seed, "Random seed for window positions");
  cmd->add_flag("--json", cfg->json, "Machine-readable output");
  cmd->add_option("--context", cfg->context,
                  "Volume stores: also measure stacks of 2*C+1 slices (default 2; 0: "
                  "single slices only)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 16));
  cmd->add_option("--crop", cfg->crop, "Volume stores: random SIZE x SIZE crops (default: whole slices)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  cmd->footer("Examples:\n  patchstore bench frames.ps\n  patchstore bench frames.ps --patch 128 --processes 1,2,4,8 "
              "--field rgb\n  patchstore bench synthrad.ps --context 2 --crop 256 --batch 32\n"
              "Windows are uniform over each sample (no mask requirement). Volume stores: random slices, then\n"
              "stacks of 2*C+1 slices (SliceDataset's copy; --patch does not apply). Run it twice: the first\n"
              "run may read from disk, the second from the page cache.");
  return [cmd, cfg]() -> int { return cmd->parsed() ? Run(*cfg) : -1; };
}

}  // namespace patchstore::cli
