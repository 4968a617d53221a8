// `patchstore bench`: random-window read throughput from 1..N processes.
//
// Each process opens the store itself (after fork, as DataLoader workers
// do), then gathers batches into a reused buffer for a fixed time: on an
// image store the batches a BatchLoader with the sampler table's options
// gathers (PatchSampler's draws and copy), on a volume store the items of a
// SliceDataset with the slice table's options. Reports windows/s and GB/s
// per process count, plus (images) a single-thread memcpy reference of the
// same bytes.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <random>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/json.h"
#include "cli/sampler_flags.h"
#include "cli/slice_flags.h"
#include "cli/validators.h"
#include "patchstore/reader/reader.h"
#include "patchstore/reader/sampler.h"
#include "patchstore/reader/slice_sampler.h"
#include "patchstore/reader/volume.h"

namespace patchstore::cli {
namespace {

struct BenchConfig {
  std::string store;
  int batch = 64;
  std::vector<int> processes{1, 2};
  std::vector<std::string> fields;
  double seconds = 3.0;
  int threads = 1;
  bool json = false;
  // Image stores: PatchSampler's options (the sampler table's flags: --patch, -k, --require, --policy, ...),
  // with --field and --threads; the batches are those a BatchLoader with these options gathers.
  SamplerFlags sampler_flags;
  SamplerOptions sampler;  // applied from sampler_flags
  // Volume stores: SliceDataset's options (the slice table's flags: --context, --crop, --require, ...);
  // the rows measure single slices, then the given context.
  SliceFlags slice_flags;
  SliceOptions slices;           // applied from slice_flags (the row's context set per row)
  std::vector<uint8_t> flags;    // the slice flags, computed once by the parent (with --require)
  int64_t out_h = 0, out_w = 0;  // the output plane of every item
  uint64_t seed() const { return slice_flags.options.seed; }
};

// Windows of its first batch that process 0 reports (image stores, --json: what the sampler drew).
constexpr int kShownWindows = 64;

struct Counts {
  uint64_t patches = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  int error = 0;
  int shown = 0;
  Window windows[kShownWindows];
};

// One process's work on a volume store: the items of random positions of
// a SliceDataset with these options (the slice sampler's draws, mask-aware
// with --require), copied as SliceDataset copies them (CopySliceStacks,
// each field with its context).
void RunVolumeWorker(const BenchConfig& cfg, int worker, int /*procs*/, Counts* out) {
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

// One process's work on an image store: the batches a BatchLoader with
// these options gathers in DataLoader worker `worker` of `procs` (batches
// worker, worker + procs, ... of the windows the sampler serves, epoch after
// epoch; a batch that reaches the end of an epoch goes on into the next, as
// PatchSampler's next() does), each one gather of the process's own
// PatchSampler (its draws, mask-aware with --require, and its copy) into a
// reused buffer. The loader's read-ahead of later batches (PrefetchAhead,
// `prefetch`) is left out, so the figures are the draws and copies alone:
// with the store in the page cache the read-ahead only adds a second
// mincore() pass over every window. The gather still requests its own
// batch's pages before copying them.
void RunWorker(const BenchConfig& cfg, int worker, int procs, Counts* out) {
  auto r = Reader::Open(cfg.store);
  auto sampler = r.ok() ? PatchSampler::Create(*r, cfg.sampler) : Result<std::unique_ptr<PatchSampler>>(r.status());
  if (!sampler.ok()) {
    std::fprintf(stderr, "patchstore bench: worker %d: %s\n", worker, sampler.status().message().c_str());
    out->error = 1;
    return;
  }
  const PatchSampler& s = **sampler;
  const int64_t batch = cfg.batch, plane = s.height() * s.width();
  std::vector<std::vector<float>> bufs;
  int64_t item_floats = 0;
  for (int64_t c : s.channels()) {
    bufs.emplace_back(static_cast<size_t>(batch * c * plane));
    item_floats += c * plane;
  }
  std::vector<float*> outs(bufs.size());
  std::vector<Window> windows;
  const uint64_t per_epoch = s.windows_per_epoch();
  if (per_epoch == 0) {  // the parent checked that some sample is eligible; never divide by zero
    std::fprintf(stderr, "patchstore bench: worker %d: %s\n", worker, s.SkippedReport().c_str());
    out->error = 1;
    return;
  }
  const uint64_t stride = static_cast<uint64_t>(procs) * static_cast<uint64_t>(batch);
  uint64_t at = static_cast<uint64_t>(worker) * static_cast<uint64_t>(batch);  // first window of the batch
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < cfg.seconds) {
    for (int64_t done = 0; done < batch;) {
      const uint64_t w = at + static_cast<uint64_t>(done);
      const int64_t take = static_cast<int64_t>(std::min<uint64_t>(batch - done, per_epoch - w % per_epoch));
      for (size_t f = 0; f < outs.size(); ++f) outs[f] = bufs[f].data() + done * s.channels()[f] * plane;
      const bool record = worker == 0 && out->patches == 0;
      Status st = s.Gather(w / per_epoch, w % per_epoch, take, outs, record ? &windows : nullptr);
      if (!st.ok()) {
        std::fprintf(stderr, "patchstore bench: %s\n", st.message().c_str());
        out->error = 1;
        return;
      }
      for (size_t i = 0; record && i < windows.size() && out->shown < kShownWindows; ++i)
        out->windows[out->shown++] = windows[i];
      done += take;
    }
    at += stride;
    out->patches += static_cast<uint64_t>(batch);
    out->bytes += static_cast<uint64_t>(batch * item_floats) * sizeof(float);
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

// Forks `procs` processes running `work`; sums their counts (the windows
// shown are process 0's). False when one failed.
bool Measure(const BenchConfig& cfg, int procs, void (*work)(const BenchConfig&, int, int, Counts*), Counts* total) {
  auto* counts = static_cast<Counts*>(
      mmap(nullptr, sizeof(Counts) * procs, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (counts == MAP_FAILED) return false;
  for (int p = 0; p < procs; ++p) new (&counts[p]) Counts();
  std::vector<pid_t> pids;
  for (int p = 0; p < procs; ++p) {
    pid_t pid = fork();
    if (pid == 0) {
      work(cfg, p, procs, &counts[p]);
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
  total->shown = counts[0].shown;
  std::copy(counts[0].windows, counts[0].windows + counts[0].shown, total->windows);
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

// "rgb+mask+depth": the fields measured.
std::string FieldNames(const std::vector<std::string>& fields) {
  std::string out;
  for (const std::string& f : fields) out += (out.empty() ? "" : "+") + f;
  return out;
}

// `patchstore bench` on an image store: the batches of a BatchLoader with these options (RunWorker).
int RunImages(BenchConfig cfg, const std::shared_ptr<Reader>& reader) {
  if (SliceOnlyFlagsGiven(cfg.slice_flags)) {
    std::fprintf(stderr,
                 "patchstore: error: --crop, --context and --flip=independent are for volume stores; '%s' holds "
                 "images (use --patch)\n",
                 cfg.store.c_str());
    return 2;
  }
  if (!ApplySamplerFlags(cfg.sampler_flags, &cfg.sampler)) return 2;
  cfg.sampler.fields = cfg.fields;
  cfg.sampler.num_threads = cfg.threads;
  // This sampler validates the options and finds the eligible samples; each worker process makes its own.
  auto sampler = PatchSampler::Create(reader, cfg.sampler);
  if (!sampler.ok()) {
    std::fprintf(stderr, "patchstore: error: %s\n", sampler.status().message().c_str());
    return 1;
  }
  const PatchSampler& s = **sampler;
  if (s.eligible_samples() == 0) {
    std::fprintf(stderr, "patchstore: error: no window to measure: %s\n", s.SkippedReport().c_str());
    return 1;
  }
  if (!s.SkippedReport().empty()) std::fprintf(stderr, "patchstore: warning: %s\n", s.SkippedReport().c_str());
  int64_t channels = 0;
  for (int64_t c : s.channels()) channels += c;
  const size_t patch_bytes = static_cast<size_t>(channels * s.height() * s.width()) * sizeof(float);
  const double ref = MemcpyGBps(patch_bytes);
  const std::string policy = SamplingPolicyName(cfg.sampler.ResolvedPolicy());
  std::string samples = std::to_string(s.eligible_samples());
  if (s.skipped_samples() != 0) samples += " of " + std::to_string(s.considered_samples());
  std::ostringstream json;
  if (!cfg.json) {
    std::printf("store %s: %s samples; %lld x %lld windows of %s (%lld channels, %.2f MB each; policy %s%s), batch %d, "
                "%d thread(s) per process\n",
                cfg.store.c_str(), samples.c_str(), static_cast<long long>(s.height()),
                static_cast<long long>(s.width()), FieldNames(cfg.fields).c_str(), static_cast<long long>(channels),
                patch_bytes / 1e6, policy.c_str(),
                cfg.sampler.require.empty() ? "" : (", require=" + cfg.sampler.require).c_str(), cfg.batch,
                cfg.threads);
    std::printf("reference: single-thread memcpy of the same bytes: %.2f GB/s (%.0f windows/s)\n", ref,
                ref * 1e9 / patch_bytes);
    std::printf("%10s %14s %10s %16s\n", "processes", "windows/s", "GB/s", "per process GB/s");
  } else {
    json << "{\"store\": " << JsonString(cfg.store) << ", \"kind\": \"frames\", \"patch\": " << cfg.sampler.patch_size
         << ", \"height\": " << s.height() << ", \"width\": " << s.width() << ", \"channels\": " << channels
         << ", \"batch\": " << cfg.batch << ", \"samples\": " << s.eligible_samples()
         << ", \"skipped\": " << s.skipped_samples() << ", \"policy\": " << JsonString(policy)
         << ", \"require\": " << (cfg.sampler.require.empty() ? std::string("null") : JsonString(cfg.sampler.require))
         << ", \"memcpy_gbps\": " << JsonNumber(ref) << ", \"runs\": [";
  }
  Counts shown;  // process 0's first windows of the first run
  bool first = true;
  for (int procs : cfg.processes) {
    Counts t;
    if (!Measure(cfg, procs, RunWorker, &t)) {
      std::fprintf(stderr, "patchstore: error: reader process(es) failed\n");
      return 1;
    }
    if (first) shown = t;
    const double wps = t.patches / t.seconds, gbps = t.bytes / t.seconds / 1e9;
    if (cfg.json) {
      json << (first ? "" : ", ") << "{\"processes\": " << procs << ", \"windows_per_s\": " << JsonNumber(wps)
           << ", \"gbps\": " << JsonNumber(gbps) << "}";
    } else {
      std::printf("%10d %14.0f %10.2f %16.2f\n", procs, wps, gbps, gbps / procs);
    }
    first = false;
  }
  if (cfg.json) {
    json << "], \"first_windows\": [";
    for (int i = 0; i < shown.shown; ++i) {
      const Window& w = shown.windows[i];
      json << (i ? ", " : "") << "{\"id\": " << JsonString(std::string(reader->id(w.sample))) << ", \"y\": " << w.y
           << ", \"x\": " << w.x << ", \"flip\": " << static_cast<int>(w.flip)
           << ", \"rot\": " << static_cast<int>(w.rot) << "}";
    }
    std::printf("%s]}\n", json.str().c_str());
  }
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
  const std::string kind = (*r)->meta().kind;
  if (kind != "volumes" && kind != "frames") {
    std::fprintf(stderr, "patchstore: error: bench measures image and volume stores (this one holds %s)\n",
                 kind.c_str());
    return 1;
  }
  if (cfg.fields.empty())
    for (int f = 0; f < (*r)->field_count(); ++f) cfg.fields.push_back((*r)->field(f).name);
  for (const std::string& f : cfg.fields) {
    auto fi = (*r)->FieldIndex(f);
    if (!fi.ok()) {
      std::fprintf(stderr, "patchstore: error: %s\n", fi.status().message().c_str());
      return 1;
    }
  }
  return kind == "volumes" ? RunVolumes(cfg, *r) : RunImages(cfg, *r);
}

}  // namespace

Runner RegisterBench(CLI::App* app, const bool* quiet) {
  auto cfg = std::make_shared<BenchConfig>();
  auto* cmd = app->add_subcommand("bench", "Measure random-window read throughput on your store and machine");
  cmd->add_option("STORE", cfg->store, kStoreOrSetHelp)->required();
  cmd->add_option("--batch", cfg->batch, "Windows (volume stores: items) per batch")
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
  cmd->add_option("--threads", cfg->threads, "Gather threads per process (as num_threads=)")->check(CLI::Range(1, 256));
  cmd->add_flag("--json", cfg->json, "Machine-readable output");
  // SliceDataset's options for volume stores, then PatchSampler's for image stores: the flags both tables have
  // (--seed, --require, --min-valid, --positive-fraction, --flip, --rot90, --ids) are read into both.
  AddSliceFlags(cmd, &cfg->slice_flags, "Volume stores: ");
  AddSamplerFlags(cmd, &cfg->sampler_flags, "Image stores: ", /*ids=*/true, /*loader=*/false);
  cmd->footer("Examples:\n  patchstore bench frames.ps\n  patchstore bench frames.ps --patch 128 --processes 1,2,4,8 "
              "--field rgb\n  patchstore bench frames.ps --patch 256 --require mask --min-valid 0.1 -k 4 --flip\n"
              "  patchstore bench synthrad.ps --context 2 --crop 256 --batch 32\n"
              "  patchstore bench synthrad.ps --context MR=1 --crop 256 --require MASK --min-valid 0.1\n"
              "Image stores: the batches a BatchLoader with these options gathers (PatchSampler's draws,\n"
              "mask-aware with --require, and its copy; not its read-ahead of later batches): process w of N\n"
              "gathers batches w, w+N, ... of the windows served epoch after epoch, as DataLoader worker w\n"
              "does. Samples with no window to draw are skipped, with a warning. --json adds the first\n"
              "windows of process 0 (first_windows).\n"
              "Volume stores: the items of random positions of a SliceDataset with these options (its draws,\n"
              "mask-aware with --require, and its copy; --patch, -k, --policy, --rank and --world-size do not\n"
              "apply): single slices, then stacks of --context.\n"
              "Run it twice: the first run may read from disk, the second from the page cache.");
  AddExitCodes(cmd, "0 measured, 1 failure (the message says why), 2 bad usage.");
  return [cmd, cfg]() -> int { return cmd->parsed() ? Run(*cfg) : -1; };
}

}  // namespace patchstore::cli
