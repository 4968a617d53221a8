// patchstore/reader/sampler.h — exact, deterministic, mask-aware patch
// sampling and whole-batch gathers.
//
// A PatchSampler visits the samples of an image store in a per-epoch
// permutation, cuts `patches_per_sample` (k) windows of h x w pixels
// (patch_h x patch_w; patch_size x patch_size by default) from each visit
// and copies them, for every requested field, straight from the memory map
// into caller buffers, on `num_threads` threads.
//
// * Policies (SamplingPolicy, chosen by `policy`, or from `require` and
//   `positive_fraction` with kAuto):
//   - kUniform: every window that fits, uniformly.
//   - kMinValid (`require`, a 1-channel mask field): every window holds at
//     least `min_valid` valid (non-zero) mask pixels — or, for
//     0 < min_valid < 1, that fraction of the h x w window — and is drawn
//     uniformly over all such windows of the sample. How a draw finds one
//     (MaskIndex; the windows drawn are the same either way): it tries up
//     to kWindowTries candidates, each uniform over all h x w windows of
//     the sample, and takes the first that qualifies — checked in the
//     sample's window lists when they are built, else by the mask's block
//     counts where their bounds decide it (a few KB per sample written by
//     the writer, reader/sat.h MaskBlocksView: most candidates), else by
//     counting the candidate's own mask pixels (the bytes the gather reads
//     anyway), so a store larger than RAM never reads a whole mask to draw
//     and reads rejected candidates' masks only near mask edges (block
//     counts accept a candidate only when it holds whole 32x32 blocks
//     with valid pixels: windows under about 64 pixels are only
//     rejected by them); only when
//     every candidate fails (a small valid area) does it draw from the
//     window lists, built once per sample from the mask's summed-area
//     table (reader/sat.h, exact for any h x w) and kept as runs (a draw is
//     then a binary search, whatever the valid area). Rejection of uniform
//     candidates, then an exact draw from the lists: uniform either way.
//     With kAuto, masks with block counts (every store written since
//     they exist) use candidates, and build lists only for a draw no
//     candidate fits; masks without them build the lists on a sample's
//     first draw when the whole mask is in memory or row-major.
//   - kPositiveFraction (`positive_fraction` in 0..1): each window comes from
//     the qualifying set with that probability and from the non-qualifying
//     set otherwise (as MONAI's RandCropByPosNegLabel); a sample lacking one
//     kind uses the other.
// * Subsets: `ids` (sample ids) and/or `samples` (indices) restrict the
//   sampler to those samples (a train/val split); the rest of the store is
//   not visited and not counted as skipped.
// * Samples with no qualifying window (mask empty or below min_valid, image
//   smaller than the window) are skipped and counted (skipped_samples,
//   skipped_ids, SkippedReport), never looped on and never replaced by
//   another sample: every loader serves eligible samples only.
// * Determinism: the permutation depends on (seed, epoch); window j of the
//   visit at global position g on (seed, epoch, g, j) only. Results do not
//   depend on thread or worker counts. Square windows are drawn exactly as
//   before rectangles existed (patch_h = patch_w = 0).
// * Sharding: `rank`/`world_size` split each epoch as
//   torch.utils.data.DistributedSampler does (drop_last=False): the
//   permutation is padded by repeating its start to a multiple of
//   world_size, and rank r takes global positions r, r+world, r+2*world...
//   Shards are disjoint up to that padding, equal in size, and cover all
//   eligible samples.
// * Augmentation: with `flip`, each window is flipped vertically and/or
//   horizontally with probability 1/2 each; with `rot90`, rotated by a
//   uniform multiple of 90 degrees — out = np.rot90(flip(window), k, axes=
//   (-2,-1)) — inside the same copy. rot90 needs a square window (a quarter
//   turn of an h x w window is w x h, and a batch has one shape): Create
//   refuses rot90 with h != w (InvalidArgument).
// * Loaders: LoaderKind names the order in which a loader serves windows —
//   the permutation order (PatchSampler, BatchLoader) or item order
//   (PatchDataset: item i = the i-th eligible sample, window j of it from
//   WindowOfSample). ServedWindows gives the windows a loader serves, so
//   montage and `export --boxes` show exactly those.
// * Order (`order`, reader/order.h): kRandom (default) permutes the eligible
//   samples uniformly per epoch; kLocality visits them in shuffled blocks of
//   storage order whose record bytes (of the gathered fields and the mask)
//   fit locality_budget_bytes / 2, for stores larger than the page cache.
//   Eligibility and the windows drawn from a visit do not depend on it.
// * Batch prefetch (`prefetch_next`, on by default): Next() — and the
//   Python binding's next(), and BatchLoader through PrefetchAhead — after
//   copying batch n keeps batches n+1 .. n+D (D = `prefetch_batches`,
//   default 4) requested: it computes their windows (deterministic, so the
//   same ones it will serve) and requests exactly their byte ranges from
//   the disk (madvise WILLNEED, Reader::PrefetchPatch), only batch n+D
//   once the others were requested by earlier calls. Drawing a batch reads
//   the mask bytes of its candidate windows, all of a round's candidates
//   requested at once (DrawMany); the batch after the last one requested is
//   drawn too, while the disk reads, so its candidates' masks are in memory
//   by its turn.
//   Memory: no buffer of its own — page-cache pages of D batches' windows
//   (D x n x sum_f C_f x h x w x stored bytes, rounded out to pages) and
//   their candidates' mask windows, plus the window list (D x n Windows)
//   while it runs. The windows served are identical with it on or off.
//   Each draw decided by counting candidate masks is computed once:
//   DrawMany keeps the windows of recent ones (up to kDrawMemo, about 3 MB)
//   for the Gather and PrefetchAhead calls that ask for the same draws
//   again, so candidate masks are counted once, not three times per window.
//
// Adding a sampling policy: one enum value below (and its name in
// reader/sampling_policy.cc), one class deriving from WindowPolicy in
// reader/sampling_policy.cc returned by MakeWindowPolicy, and a test in
// tests/reader/sampler_test.cc; the bindings and CLI take it by name.
//
// Thread-safety: const methods may be called concurrently; Next() and
// SetEpoch() mutate the cursor and need external synchronisation.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "patchstore/reader/order.h"
#include "patchstore/reader/reader.h"
#include "patchstore/reader/transform.h"

namespace patchstore {

class WindowPolicy;  // reader/sampling_policy.h (internal)

enum class SamplingPolicy : uint8_t {
  kAuto = 0,              // kUniform without `require`, kPositiveFraction when positive_fraction >= 0,
                          // else kMinValid
  kUniform = 1,           // every window that fits
  kMinValid = 2,          // windows with >= min_valid valid pixels of `require`
  kPositiveFraction = 3,  // positive_fraction of the draws from those, the rest from the others
};

// How a mask-aware draw checks its candidate windows (see the header). The
// windows drawn are identical for every value; only the bytes read and the
// CPU differ.
enum class MaskIndex : uint8_t {
  kAuto = 0,     // kWindows for masks with block counts; for masks without them, build a
                 // sample's window lists on its first draw when its mask is already in memory, or
                 // row-major (a counted candidate reads a page per row); else kWindows
  kBuild = 1,    // always build them on the first draw (reads the whole mask)
  kWindows = 2,  // only when every candidate fails; candidates are decided by the mask's block
                 // counts where they can be, else by counting their own mask pixels
};

// "auto", "uniform", "min_valid", "positive_fraction".
const char* SamplingPolicyName(SamplingPolicy policy);
// The policy of a name above; InvalidArgument listing the names otherwise.
Result<SamplingPolicy> ParseSamplingPolicy(const std::string& name);

// Batches PatchSampler::PrefetchAhead keeps requested by default
// (SamplerOptions::prefetch_batches; measured in bench/scale/windows.py).
constexpr int kDefaultPrefetchBatches = 4;

// The sampling options a user sets, one row each: the single list from
// which the Python binding (SamplerOptions properties, SAMPLER_OPTIONS,
// patchstore.SamplerConfig and every loader's keywords), the CLI flag set
// (cli/sampler_flags.cc) and the messages of SamplerOptions::Validate take
// their names, flags and docs; the defaults are the member initialisers of
// SamplerOptions below (the only place they are written).
//   X(member, Python keyword, CLI flag ("" = none), one-line doc)
// A CLI flag is given where the option changes which windows are served
// (montage and `export --boxes` show them); the loaders' speed options
// (threads, read-ahead, order) have none. Adding an option: a member with
// its default below, a row here, its rule in Validate (reader/sampler.cc),
// its use, and its field in SamplerConfig's stub
// (bindings/patchstore/_patchstore.pyi); see
// docs/architecture/adding-an-option.md.
#define PATCHSTORE_SAMPLER_OPTIONS(X)                                                                              \
  X(patch_size, "patch_size", "--patch", "window size: P (P x P) or (h, w) (CLI: H,W)")                            \
  X(patches_per_sample, "patches_per_sample", "-k,--patches-per-sample", "windows cut from each sample visit (k)") \
  X(require, "require", "--require", "1-channel mask field every window must hit (None: uniform windows)")         \
  X(min_valid, "min_valid", "--min-valid",                                                                         \
    "valid mask pixels a window needs (>= 1), or that fraction of the window (< 1)")                               \
  X(positive_fraction, "positive_fraction", "--positive-fraction",                                                 \
    "fraction of windows drawn from those meeting min_valid, the rest from the others (None, CLI -1: off)")        \
  X(policy, "policy", "--policy",                                                                                  \
    "sampling policy: auto (from require / positive_fraction), uniform, min_valid, positive_fraction")             \
  X(seed, "seed", "--seed", "seed of the permutation and the windows (the same seed gives the same windows)")      \
  X(rank, "rank", "--rank", "this process's shard of each epoch (as DistributedSampler)")                          \
  X(world_size, "world_size", "--world-size", "number of shards of each epoch")                                    \
  X(flip, "flip", "--flip", "random vertical and horizontal flips")                                                \
  X(rot90, "rot90", "--rot90", "random quarter turns (square windows only)")                                       \
  X(ids, "ids", "--ids", "only these samples (ids, or in Python also store indices), e.g. a train/val split")      \
  X(num_threads, "num_threads", "", "gather threads (Python: 0 = all cores)")                                      \
  X(prefetch_batches, "prefetch", "",                                                                              \
    "batches whose windows are read ahead after each batch, 1..64 (Python False or 0: off)")                       \
  X(order, "order", "", "visit order: random, or locality (needs cache_budget)")                                   \
  X(locality_budget_bytes, "cache_budget", "",                                                                     \
    "page cache an epoch of order locality may count on: bytes, or a size such as 8GB")                            \
  X(index_cache_bytes, "index_cache_bytes", "",                                                                    \
    "memory for the per-sample window lists this sampler keeps (bytes); the oldest are rebuilt on demand beyond it")

struct SamplerOptions {
  std::vector<std::string> fields;   // fields to gather, e.g. {"rgb", "mask", "depth"}
  int64_t patch_size = 256;          // windows are patch_size x patch_size, unless:
  int64_t patch_h = 0, patch_w = 0;  // window height / width; 0 = patch_size
  int patches_per_sample = 1;        // k
  std::string require;               // mask field, or "" for uniform windows
  double min_valid = 1;              // pixels (>= 1) or fraction of the window (< 1)
  double positive_fraction = -1;     // < 0: off (every window qualifies)
  uint64_t seed = 0;
  int rank = 0, world_size = 1;
  int num_threads = 1;
  bool flip = false, rot90 = false;
  SamplingPolicy policy = SamplingPolicy::kAuto;
  // Subset (e.g. a train/val split): sample ids and/or store indices; both
  // empty = every sample. NotFound for an unknown id, OutOfRange for an
  // index past the store, InvalidArgument for a sample named twice.
  std::vector<std::string> ids;
  std::vector<uint64_t> samples;
  // Memory for the per-sample lists of qualifying windows kept by this
  // sampler (each process keeps its own); the oldest lists are dropped and
  // rebuilt on demand (about 1 ms for a 1920x1080 frame) beyond this.
  uint64_t index_cache_bytes = uint64_t{256} << 20;
  // Read-ahead of the next batches' windows after each Next() (see above).
  bool prefetch_next = true;
  // How many batches ahead PrefetchAhead keeps requested (1..64): with
  // more, the disk reads several batches at once while the loader copies
  // (more reads in flight), at the cost of that many batches' windows in
  // the page cache.
  int prefetch_batches = kDefaultPrefetchBatches;
  // The per-epoch order of the visits (reader/order.h); kLocality needs
  // locality_budget_bytes > 0 (InvalidArgument otherwise): the page cache
  // the epoch may count on, e.g. half of the RAM left to the page cache.
  SampleOrder order = SampleOrder::kRandom;
  uint64_t locality_budget_bytes = 0;
  // How candidate windows are checked against the mask (MaskIndex).
  MaskIndex mask_index = MaskIndex::kAuto;

  int64_t height() const { return patch_h > 0 ? patch_h : patch_size; }
  int64_t width() const { return patch_w > 0 ? patch_w : patch_size; }
  // The policy kAuto stands for with these options.
  SamplingPolicy ResolvedPolicy() const;

  // The only check of the option values (PatchSampler::Create calls it;
  // the bindings call it before building anything): InvalidArgument naming
  // the option as a user spells it, e.g. "positive_fraction
  // (--positive-fraction) must be in [0, 1] (None, CLI -1: off), got 1.5".
  // What needs the store (fields, require naming a 1-channel mask, ids) is
  // checked by Create.
  Status Validate() const;
};

// "positive_fraction (--positive-fraction)", "num_threads": how a user
// spells the option of `member` (a member name of the table above), for
// messages.
std::string SamplerOptionSpelling(const std::string& member);

// The order in which a loader serves windows (ServedWindows).
enum class LoaderKind : uint8_t {
  kSampler = 0,       // patchstore.PatchSampler: permutation order (WindowAt)
  kBatchLoader = 1,   // patchstore.torch.BatchLoader: the same windows as kSampler
  kPatchDataset = 2,  // patchstore.torch.PatchDataset: item i = eligible sample i (WindowOfSample)
};
// "sampler", "batchloader", "patchdataset".
const char* LoaderKindName(LoaderKind kind);
Result<LoaderKind> ParseLoaderKind(const std::string& name);

// One window: which sample, where, and how it is transformed.
// `flip` and `rot` are the fields of the one Transform (reader/transform.h),
// which transform() returns for the copy kernel.
struct Window {
  uint64_t sample = 0;
  int64_t y = 0, x = 0;
  uint8_t flip = 0;      // bit 0: vertical (rows reversed), bit 1: horizontal
  uint8_t rot = 0;       // quarter turns, np.rot90 direction
  bool positive = true;  // drawn from the qualifying set

  Transform transform() const { return Transform{flip, rot}; }
};

// Where a gather writes one field's windows: `data` holds float32 values
// (Output::kFloat32) or elements of the field's stored dtype
// (Output::kStored, reader/reader.h).
struct GatherTarget {
  void* data = nullptr;
  Output output = Output::kFloat32;
};

class PatchSampler {
 public:
  // Validates the options against the store and finds the eligible samples.
  // Errors: NotFound (field), InvalidArgument (sizes, a non-mask `require`,
  // a volume store).
  static Result<std::unique_ptr<PatchSampler>> Create(std::shared_ptr<const Reader> reader,
                                                      const SamplerOptions& options);

  const SamplerOptions& options() const { return options_; }
  const std::vector<int>& field_indices() const { return fields_; }
  // Channels of each gathered field, in options().fields order.
  const std::vector<int64_t>& channels() const { return channels_; }

  int64_t height() const { return options_.height(); }
  int64_t width() const { return options_.width(); }

  uint64_t eligible_samples() const { return eligible_.size(); }
  // The eligible samples (store indices), ascending: PatchDataset's item i
  // is sample eligible_list()[i].
  const std::vector<uint64_t>& eligible_list() const { return eligible_; }
  // Samples considered: the subset's size, or the store's.
  uint64_t considered_samples() const { return eligible_.size() + skipped_count_; }
  uint64_t skipped_samples() const { return skipped_count_; }
  // Ids of skipped samples (the first 1000).
  const std::vector<std::string>& skipped_ids() const { return skipped_ids_; }
  // "" when nothing is skipped; otherwise one line for a warning, the same
  // for every loader and tool: "skipping 2 of 10 samples of 'f.ps' (no
  // 64x64 window with >= 1 valid pixel of 'mask', or smaller than 64x64):
  // 'a', 'b'" (the first 20 ids).
  std::string SkippedReport() const;

  // How the candidate windows of mask-aware draws were decided since
  // Create (in this process): from the window lists, from the mask's block
  // counts, or by counting the candidate's mask pixels (the only way that
  // reads the mask). For benchmarks and tests; draws are the same whatever
  // decides them.
  struct CandidateStats {
    uint64_t by_lists = 0, by_blocks = 0, by_counting = 0;
  };
  CandidateStats candidate_stats() const {
    return {stats_lists_.load(std::memory_order_relaxed), stats_blocks_.load(std::memory_order_relaxed),
            stats_counting_.load(std::memory_order_relaxed)};
  }
  // Windows whose byte ranges PrefetchAhead has requested so far.
  uint64_t prefetched_windows() const { return stats_prefetched_.load(std::memory_order_relaxed); }

  // Sample visits per epoch on this rank: ceil(eligible / world_size).
  uint64_t visits_per_epoch() const;
  uint64_t windows_per_epoch() const { return visits_per_epoch() * options_.patches_per_sample; }

  // The sample of the visit at rank-local position p of `epoch`.
  uint64_t SampleAt(uint64_t epoch, uint64_t p) const;
  // Window j of that visit.
  Result<Window> WindowAt(uint64_t epoch, uint64_t p, int j) const;

  // Window j for sample index `sample` itself (not a permutation position),
  // a function of (seed, epoch, sample, j): for map-style datasets whose
  // item i is sample i. OutOfRange if the sample is not eligible.
  Result<Window> WindowOfSample(uint64_t epoch, uint64_t sample, int j) const;
  bool eligible(uint64_t sample) const;
  // Whether the sample is in the subset (every sample without one).
  bool considered(uint64_t sample) const { return sample < is_considered_.size() && is_considered_[sample]; }

  // Windows [first, first + n) that a loader of `kind` serves from `epoch`
  // on (continuing into later epochs, as a loader iterated epoch after
  // epoch): kSampler/kBatchLoader in permutation order (window w of an
  // epoch is WindowAt(w / k, w % k)); kPatchDataset in item order (item i,
  // window j = WindowOfSample(eligible_list()[i], j)). OutOfRange when no
  // sample is eligible.
  Result<std::vector<Window>> ServedWindows(LoaderKind kind, uint64_t epoch, uint64_t first, int64_t n) const;
  // The windows a loader of `kind` takes from `sample` in `epoch`, in the
  // order served (kPatchDataset: the k windows of its item; the others: the
  // k windows of each visit of the permutation that reaches it, more than
  // one visit only through rank padding). Empty if the sample is skipped.
  Result<std::vector<Window>> ServedWindowsOfSample(LoaderKind kind, uint64_t epoch, uint64_t sample) const;

  // Copies the given windows (from WindowAt/WindowOfSample) into outs[f],
  // (n, C_f, h, w) per field, on num_threads threads.
  Status GatherWindows(const std::vector<Window>& windows, const std::vector<float*>& outs) const;
  // The same into outs[f].data as float32 or, with outs[f].output kStored,
  // as the field's stored dtype (Output in reader/reader.h): n * C_f * h * w
  // elements of field_dtype(f) per field.
  Status GatherWindowsTo(const std::vector<Window>& windows, const std::vector<GatherTarget>& outs) const;

  // Gathers windows [first, first + n) of `epoch` on this rank (window w is
  // visit w / k, j = w % k) into outs[f], a contiguous (n, C_f, h, w)
  // float32 buffer per field (h x w windows). REQUIRES: first + n <= windows_per_epoch().
  // `windows`, if given, receives the n windows.
  Status Gather(uint64_t epoch, uint64_t first, int64_t n, const std::vector<float*>& outs,
                std::vector<Window>* windows = nullptr) const;
  Status GatherTo(uint64_t epoch, uint64_t first, int64_t n, const std::vector<GatherTarget>& outs,
                  std::vector<Window>* windows = nullptr) const;
  // The stored dtype of gathered field f (0 <= f < fields().size()).
  DType field_dtype(size_t f) const;

  // Read-ahead for a loader that will gather windows [first, first + n) of
  // `epoch` next, then the batches of n windows `stride` apart (0: n, i.e.
  // contiguous; a DataLoader worker's own batches are further apart),
  // continuing into later epochs: keeps prefetch_batches such batches
  // requested. For the batches not requested by the previous call (one
  // that moves forward batch by batch requests one new batch; any other
  // call, all of them): the masks of the samples they visit first, then
  // their windows' byte ranges in every field (Reader::PrefetchPatch), then
  // the masks of the visits of the n windows after each. Draws the windows
  // (building window lists as Gather would; the same windows). Never fails:
  // an error is left for the gather to report. Only starts reads and
  // returns.
  void PrefetchAhead(uint64_t epoch, uint64_t first, int64_t n, uint64_t stride = 0) const;
  // Read-ahead of the masks of those samples whose window lists are not
  // built yet (building them reads the whole mask). No-op without a mask.
  void PrefetchMasks(const std::vector<uint64_t>& samples) const;
  // Candidate windows a mask-aware draw tries before it draws from the
  // sample's window lists.
  static constexpr int kWindowTries = 16;
  // Draws whose windows DrawMany remembers (then forgets all at once).
  static constexpr size_t kDrawMemo = size_t{1} << 16;
  // The windows of draws (sample, key) as Draw gives them one by one, with
  // each round of candidates' mask bytes requested at once (many reads in
  // flight when the store is not in the page cache).
  Status DrawMany(const std::vector<std::pair<uint64_t, uint64_t>>& draws, std::vector<Window>* out) const;
  // The record bytes a visit of sample `sample` reads (the gathered fields
  // and the mask, headers included): what the locality order counts.
  uint64_t SampleBytes(uint64_t sample) const;

  // Stateful form: the next n windows, continuing into the next epoch when
  // one ends (so a batch may span two epochs); then, with prefetch_next,
  // PrefetchAhead for the n windows after them.
  Status Next(int64_t n, const std::vector<float*>& outs, std::vector<Window>* windows = nullptr);
  void SetEpoch(uint64_t epoch) {
    epoch_ = epoch;
    cursor_ = 0;
  }
  uint64_t epoch() const { return epoch_; }
  uint64_t cursor() const { return cursor_; }

 private:
  struct SampleSets;  // the sample's qualifying and other windows (reader/window_sets.h)

  PatchSampler() = default;
  Result<std::shared_ptr<const SampleSets>> Sets(uint64_t sample) const;
  Result<Window> Draw(uint64_t sample, uint64_t key) const;
  // The (sample, key) of window j of the visit at position p of `epoch`.
  std::pair<uint64_t, uint64_t> VisitDraw(uint64_t epoch, uint64_t p, int j) const;
  // The ny x nx window positions of `sample` (from the field's summary);
  // either is <= 0 when the window does not fit.
  void WindowPositions(uint64_t sample, int field, int64_t* ny, int64_t* nx) const;
  // Whether window (y, x) of `sample` qualifies (>= threshold_ valid mask
  // pixels), by counting the window's own mask pixels.
  Result<bool> WindowQualifies(uint64_t sample, int64_t y, int64_t x) const;
  // The sample's window lists if built (null otherwise); builds them when
  // the options say a first draw should.
  Result<std::shared_ptr<const SampleSets>> ListsForDraw(uint64_t sample) const;
  std::shared_ptr<const std::vector<uint64_t>> Permutation(uint64_t epoch) const;

  std::shared_ptr<const Reader> reader_;
  SamplerOptions options_;
  std::vector<int> fields_;
  std::vector<int64_t> channels_;
  int mask_field_ = -1;
  uint64_t threshold_ = 0;
  std::shared_ptr<const WindowPolicy> policy_;
  std::vector<uint64_t> eligible_;
  std::vector<uint64_t> eligible_bytes_;  // SampleBytes of eligible_[i], for kLocality
  std::vector<bool> is_eligible_, is_considered_;
  uint64_t skipped_count_ = 0;
  std::vector<std::string> skipped_ids_;
  uint64_t epoch_ = 0, cursor_ = 0;

  mutable std::mutex mu_;
  mutable std::unordered_map<uint64_t, std::shared_ptr<const SampleSets>> sets_;
  mutable std::deque<uint64_t> sets_order_;  // insertion order, for eviction
  mutable uint64_t sets_bytes_ = 0;
  mutable uint64_t perm_epoch_ = UINT64_MAX;
  mutable std::shared_ptr<const std::vector<uint64_t>> perm_;
  // DrawMany's windows of mask-aware draws, by Mix(sample) ^ key (each
  // entry holds its draw, so a collision is a miss), under mu_.
  struct MemoWindow {
    uint64_t sample = 0, key = 0;
    int64_t y = 0, x = 0;
    bool positive = false;
  };
  mutable std::unordered_map<uint64_t, MemoWindow> draw_memo_;
  mutable std::atomic<size_t> draw_memo_size_{0};  // draw_memo_.size(), read without mu_
  mutable std::atomic<uint64_t> stats_lists_{0}, stats_blocks_{0}, stats_counting_{0};  // candidate_stats()
  mutable std::atomic<uint64_t> stats_prefetched_{0};                                   // prefetched_windows()
  // The batches PrefetchAhead requested last: starts lo, lo + stride, ...
  // below hi, as epoch * windows per epoch + window, of n windows each
  // (under prefetch_mu_).
  mutable std::mutex prefetch_mu_;
  mutable uint64_t prefetched_lo_ = 0, prefetched_hi_ = 0, prefetched_stride_ = 0;
  mutable int64_t prefetched_n_ = 0;
  void RequestWindows(uint64_t epoch, uint64_t first, int64_t n, int64_t after) const;
};

}  // namespace patchstore
