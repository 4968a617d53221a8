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
#include "cli/slice_flags.h"
#include "cli/validators.h"
#include "patchstore/reader/reader.h"
#include "patchstore/reader/slice_sampler.h"
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
  bool json = false;
  // Volume stores: SliceDataset's options (the slice table's flags: --context, --crop, --require, ...);
  // the rows measure single slices, then the given context.
  SliceFlags slice_flags;
  SliceOptions slices;           // applied from slice_flags (the row's context set per row)
  std::vector<uint8_t> flags;    // the slice flags, computed once by the parent (with --require)
  int64_t out_h = 0, out_w = 0;  // the output plane of every item
  uint64_t seed() const { return slice_flags.options.seed; }
};

struct Counts {
  uint64_t patches = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  int error = 0;
};

// One process's work on a volume store: the items of random positions of
// a SliceDataset with these options (the slice sampler's draws, mask-aware
// with --require), copied as SliceDataset copies them (CopySliceStacks,
// each field with its context).
void RunVolumeWorker(const BenchConfig& cfg, int worker, Counts* out) {
  auto r = Reader::Open(cfg.store);
  auto sampler = r.ok() ? SliceSampler::Create(*r, cfg.slices, cfg.flags.empty() ? nullptr : &cfg.flags)
                        : Result<std::unique_ptr<SliceSampler>>(r.status());
  if (!sampler.ok()) {
    std::fprintf(stderr, "patchstore bench: worker %d: %s\n", worker, sampler.status().message().c_str());
    out->error = 1;
    return;
  }
  const Reader& reader = **r;
  const SliceSampler& s = **sampler;
  const size_t nf = cfg.slices.fields.size();
  std::vector<std::vector<float>> bufs(nf);
  int64_t item_floats = 0;
  for (size_t f = 0; f < nf; ++f) {
    const int64_t depth = 2 * s.context(f) + 1;
    bufs[f].resize(static_cast<size_t>(cfg.batch * depth * cfg.out_h * cfg.out_w));
    item_floats += depth * cfg.out_h * cfg.out_w;
  }
  std::vector<uint64_t> idx(static_cast<size_t>(cfg.batch));
  std::vector<SliceItem> items(idx.size());
  std::vector<SliceStackRequest> reqs(idx.size());
  std::mt19937_64 rng(cfg.seed() * 1000003u + static_cast<unsigned>(worker));
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  uint64_t epoch = 0;
  while (elapsed < cfg.seconds) {
    for (uint64_t& i : idx) i = rng() % s.size();
    Status st = s.Items(epoch++, idx.data(), idx.size(), items.data());
    for (size_t f = 0; f < nf && st.ok(); ++f) {
      for (size_t k = 0; k < reqs.size(); ++k)
        reqs[k] = SliceStackRequest{items[k].ref.sample, s.field_index(f), items[k].ref.slice, items[k].transform};
      st = CopySliceStacks(reader, reqs, s.context(f), bufs[f].data(), cfg.threads);
    }
    if (!st.ok()) {
      std::fprintf(stderr, "patchstore bench: %s\n", st.message().c_str());
      out->error = 1;
      return;
    }
    out->patches += static_cast<uint64_t>(cfg.batch);
    out->bytes += static_cast<uint64_t>(cfg.batch * item_floats) * sizeof(float);
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
  std::mt19937_64 rng(cfg.seed() * 1000003u + static_cast<unsigned>(worker));
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

// The context of every field as a JSON value: one number, or {field: C}.
std::string ContextJson(const SliceSampler& s) {
  const std::vector<std::string>& fields = s.options().fields;
  bool uniform = true;
  for (size_t f = 1; f < fields.size(); ++f) uniform = uniform && s.context(f) == s.context(0);
  if (uniform) return std::to_string(s.context(0));
  std::string out = "{";
  for (size_t f = 0; f < fields.size(); ++f)
    out += (f ? ", " : "") + JsonString(fields[f]) + ": " + std::to_string(s.context(f));
  return out + "}";
}

// "1 slice" or "MR 3, CT 1": the stack depth of each field.
std::string Depths(const SliceSampler& s) {
  const std::vector<std::string>& fields = s.options().fields;
  bool uniform = true;
  for (size_t f = 1; f < fields.size(); ++f) uniform = uniform && s.context(f) == s.context(0);
  if (uniform) return std::to_string(2 * s.context(0) + 1) + (s.context(0) ? " sl." : " slice");
  std::string out;
  for (size_t f = 0; f < fields.size(); ++f)
    out += (f ? "," : "") + fields[f] + " " + std::to_string(2 * s.context(f) + 1);
  return out;
}

// `patchstore bench` on a volume store: slices and stacks, as SliceDataset copies them.
int RunVolumes(BenchConfig cfg, const std::shared_ptr<Reader>& reader) {
  if (!ApplySliceFlags(cfg.slice_flags, &cfg.slices)) return 2;
  cfg.slices.fields = cfg.fields;
  const SliceContext given = cfg.slices.context;
  // Whole slices must be of one size to make a batch; a crop must fit every volume (of --ids).
  Result<SliceIndex> all = Status::Internal("not built");
  if (cfg.slices.ids.empty()) {
    all = SliceIndex::Build(*reader);
  } else {
    std::vector<uint64_t> samples;
    for (const std::string& id : cfg.slices.ids) {
      auto s = reader->Find(id);
      if (!s.ok()) {
        std::fprintf(stderr, "patchstore: error: --ids: %s\n", s.status().message().c_str());
        return 1;
      }
      samples.push_back(*s);
    }
    all = SliceIndex::Build(*reader, samples);
  }
  if (!all.ok()) {
    std::fprintf(stderr, "patchstore: error: %s\n", all.status().message().c_str());
    return 1;
  }
  const SliceIndex& ix = *all;
  const CropSize crop = cfg.slices.crop;
  for (uint64_t v = 0; v < ix.volume_count(); ++v) {
    if (!crop.none() && (crop.h > ix.height(v) || crop.w > ix.width(v))) {
      std::fprintf(stderr, "patchstore: error: --crop %s is larger than the %lldx%lld slices of volume '%s'\n",
                   crop.h == crop.w ? std::to_string(crop.h).c_str()
                                    : (std::to_string(crop.h) + "," + std::to_string(crop.w)).c_str(),
                   static_cast<long long>(ix.height(v)), static_cast<long long>(ix.width(v)),
                   std::string(reader->id(ix.sample(v))).c_str());
      return 1;
    }
    if (crop.none() && (ix.height(v) != ix.height(0) || ix.width(v) != ix.width(0))) {
      std::fprintf(stderr,
                   "patchstore: error: the volumes have slices of different sizes (%lldx%lld in '%s', "
                   "%lldx%lld in '%s'): give --crop\n",
                   static_cast<long long>(ix.height(0)), static_cast<long long>(ix.width(0)),
                   std::string(reader->id(ix.sample(0))).c_str(), static_cast<long long>(ix.height(v)),
                   static_cast<long long>(ix.width(v)), std::string(reader->id(ix.sample(v))).c_str());
      return 1;
    }
  }
  // The rows: single slices, then the given context (when it is not that).
  std::vector<SliceContext> rows{SliceContext{}};
  bool stacks = given.all != 0;
  for (const auto& [f, c] : given.fields) stacks = stacks || c != 0;
  if (stacks) rows.push_back(given);
  // The first row's sampler validates the options and, with --require, decides which slices qualify
  // (once: the worker processes get its flags).
  cfg.slices.context = rows[0];
  auto first = SliceSampler::Create(reader, cfg.slices);
  if (!first.ok()) {
    std::fprintf(stderr, "patchstore: error: %s\n", first.status().message().c_str());
    return 1;
  }
  if (!(*first)->skipped().empty())
    std::fprintf(stderr, "patchstore: warning: %s\n", (*first)->SkippedReport().c_str());
  const SliceIndex& served = (*first)->index();
  cfg.out_h = crop.none() ? served.height(0) : crop.h;
  cfg.out_w = crop.none() ? served.width(0) : crop.w;
  std::string names;
  for (auto& f : cfg.fields) names += (names.empty() ? "" : "+") + f;
  std::ostringstream json;
  if (cfg.json) {
    json << "{\"store\": " << JsonString(cfg.store) << ", \"kind\": \"volumes\", \"height\": " << cfg.out_h
         << ", \"width\": " << cfg.out_w << ", \"fields\": " << cfg.fields.size() << ", \"batch\": " << cfg.batch
         << ", \"items\": " << (*first)->size()
         << ", \"require\": " << (cfg.slices.require.empty() ? std::string("null") : JsonString(cfg.slices.require))
         << ", \"runs\": [";
  } else {
    std::printf("store %s: %zu volumes, %llu items%s; random %lldx%lld items of %s (SliceDataset's draws and copy), "
                "batch %d, %d thread(s) per process\n",
                cfg.store.c_str(), static_cast<size_t>(served.volume_count()),
                static_cast<unsigned long long>((*first)->size()),
                cfg.slices.require.empty() ? "" : (" with require=" + cfg.slices.require).c_str(),
                static_cast<long long>(cfg.out_h), static_cast<long long>(cfg.out_w), names.c_str(), cfg.batch,
                cfg.threads);
    std::printf("%14s %10s %14s %10s %16s\n", "stack", "processes", "items/s", "GB/s", "per process GB/s");
  }
  // Worker processes create their samplers from the served volumes and the flags: no mask read there.
  cfg.slices.ids.clear();
  cfg.slices.samples.clear();
  for (uint64_t v = 0; v < served.volume_count(); ++v) cfg.slices.samples.push_back(served.sample(v));
  cfg.flags = cfg.slices.require.empty() ? std::vector<uint8_t>() : (*first)->slice_flags();
  bool first_run = true;
  for (const SliceContext& c : rows) {
    cfg.slices.context = c;
    auto row = SliceSampler::Create(reader, cfg.slices, cfg.flags.empty() ? nullptr : &cfg.flags);
    if (!row.ok()) {
      std::fprintf(stderr, "patchstore: error: %s\n", row.status().message().c_str());
      return 1;
    }
    for (int procs : cfg.processes) {
      Counts t;
      if (!Measure(cfg, procs, RunVolumeWorker, &t)) {
        std::fprintf(stderr, "patchstore: error: reader process(es) failed\n");
        return 1;
      }
      const double ips = t.patches / t.seconds, gbps = t.bytes / t.seconds / 1e9;
      if (cfg.json) {
        json << (first_run ? "" : ", ") << "{\"context\": " << ContextJson(**row) << ", \"processes\": " << procs
             << ", \"items_per_s\": " << JsonNumber(ips) << ", \"gbps\": " << JsonNumber(gbps) << "}";
      } else {
        std::printf("%14s %10d %14.0f %10.2f %16.2f\n", Depths(**row).c_str(), procs, ips, gbps, gbps / procs);
      }
      first_run = false;
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
    return RunVolumes(cfg, *r);
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
  cmd->add_flag("--json", cfg->json, "Machine-readable output");
  // SliceDataset's options for volume stores; --seed also seeds the image stores' window positions.
  AddSliceFlags(cmd, &cfg->slice_flags, "Volume stores: ");
  cmd->footer("Examples:\n  patchstore bench frames.ps\n  patchstore bench frames.ps --patch 128 --processes 1,2,4,8 "
              "--field rgb\n  patchstore bench synthrad.ps --context 2 --crop 256 --batch 32\n"
              "  patchstore bench synthrad.ps --context MR=1 --crop 256 --require MASK --min-valid 0.1\n"
              "Image stores: windows are uniform over each sample (no mask requirement). Volume stores: the\n"
              "items of random positions of a SliceDataset with these options (its draws, mask-aware with\n"
              "--require, and its copy; --patch does not apply): single slices, then stacks of --context.\n"
              "Run it twice: the first run may read from disk, the second from the page cache.");
  return [cmd, cfg]() -> int { return cmd->parsed() ? Run(*cfg) : -1; };
}

}  // namespace patchstore::cli
