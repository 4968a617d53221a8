// patchstore/reader/sampler.h — exact, deterministic, mask-aware patch
// sampling and whole-batch gathers.
//
// A PatchSampler visits the samples of an image store in a per-epoch
// permutation, cuts `patches_per_sample` (k) square windows from each visit
// and copies them, for every requested field, straight from the memory map
// into caller buffers, on `num_threads` threads.
//
// * With `require` (a 1-channel mask field), every window holds at least
//   `min_valid` valid (non-zero) mask pixels — or, for 0 < min_valid < 1,
//   that fraction of the window — and is drawn uniformly over all such
//   windows of the sample. The qualifying windows are found once per sample
//   and window size with the mask's summed-area table (reader/sat.h) and
//   kept as runs, so a draw is a binary search, whatever the valid area.
// * `positive_fraction` (0..1) draws each window from the qualifying set
//   with that probability and from the non-qualifying set otherwise (as
//   MONAI's RandCropByPosNegLabel); a sample lacking one kind uses the other.
// * Samples with no admissible window (mask empty, image smaller than the
//   window) are skipped and counted, never looped on.
// * Determinism: the permutation depends on (seed, epoch); window j of the
//   visit at global position g on (seed, epoch, g, j) only. Results do not
//   depend on thread or worker counts.
// * Sharding: `rank`/`world_size` split each epoch as
//   torch.utils.data.DistributedSampler does (drop_last=False): the
//   permutation is padded by repeating its start to a multiple of
//   world_size, and rank r takes global positions r, r+world, r+2*world...
//   Shards are disjoint up to that padding, equal in size, and cover all
//   eligible samples.
// * Augmentation: with `flip`, each window is flipped vertically and/or
//   horizontally with probability 1/2 each; with `rot90`, rotated by a
//   uniform multiple of 90 degrees — out = np.rot90(flip(window), k, axes=
//   (-2,-1)) — inside the same copy.
//
// Thread-safety: const methods may be called concurrently; Next() and
// SetEpoch() mutate the cursor and need external synchronisation.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "patchstore/reader/reader.h"
#include "patchstore/reader/transform.h"

namespace patchstore {

struct SamplerOptions {
  std::vector<std::string> fields;  // fields to gather, e.g. {"rgb", "mask", "depth"}
  int64_t patch_size = 256;         // windows are patch_size x patch_size
  int patches_per_sample = 1;       // k
  std::string require;              // mask field, or "" for uniform windows
  double min_valid = 1;             // pixels (>= 1) or fraction of the window (< 1)
  double positive_fraction = -1;    // < 0: off (every window qualifies)
  uint64_t seed = 0;
  int rank = 0, world_size = 1;
  int num_threads = 1;
  bool flip = false, rot90 = false;
  // Memory for the per-sample lists of qualifying windows kept by this
  // sampler (each process keeps its own); the oldest lists are dropped and
  // rebuilt on demand (about 1 ms for a 1920x1080 frame) beyond this.
  uint64_t index_cache_bytes = uint64_t{256} << 20;
};

// One window: which sample, where, and how it is transformed.
// `flip` and `rot` are the fields of the one Transform (reader/transform.h),
// which transform() returns for the copy kernel.
struct Window {
  uint64_t sample = 0;
  int64_t y = 0, x = 0;
  uint8_t flip = 0;  // bit 0: vertical (rows reversed), bit 1: horizontal
  uint8_t rot = 0;   // quarter turns, np.rot90 direction
  bool positive = true;  // drawn from the qualifying set

  Transform transform() const { return Transform{flip, rot}; }
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

  uint64_t eligible_samples() const { return eligible_.size(); }
  uint64_t skipped_samples() const { return skipped_count_; }
  // Ids of skipped samples (the first 1000).
  const std::vector<std::string>& skipped_ids() const { return skipped_ids_; }

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

  // Copies the given windows (from WindowAt/WindowOfSample) into outs[f],
  // (n, C_f, P, P) per field, on num_threads threads.
  Status GatherWindows(const std::vector<Window>& windows, const std::vector<float*>& outs) const;

  // Gathers windows [first, first + n) of `epoch` on this rank (window w is
  // visit w / k, j = w % k) into outs[f], a contiguous (n, C_f, P, P)
  // float32 buffer per field. REQUIRES: first + n <= windows_per_epoch().
  // `windows`, if given, receives the n windows.
  Status Gather(uint64_t epoch, uint64_t first, int64_t n, const std::vector<float*>& outs,
                std::vector<Window>* windows = nullptr) const;

  // Stateful form: the next n windows, continuing into the next epoch when
  // one ends (so a batch may span two epochs).
  Status Next(int64_t n, const std::vector<float*>& outs, std::vector<Window>* windows = nullptr);
  void SetEpoch(uint64_t epoch) {
    epoch_ = epoch;
    cursor_ = 0;
  }
  uint64_t epoch() const { return epoch_; }
  uint64_t cursor() const { return cursor_; }

 private:
  struct Run {
    int32_t y, x0;   // windows (y, x0 .. x0+len-1)
    uint64_t start;  // number of windows in earlier runs
  };
  struct WindowSet {
    std::vector<Run> runs;
    uint64_t total = 0;
    bool Draw(uint64_t r, int64_t* y, int64_t* x) const;
  };
  struct SampleSets {
    WindowSet pos, neg;
  };

  PatchSampler() = default;
  Result<std::shared_ptr<const SampleSets>> Sets(uint64_t sample) const;
  Result<Window> Draw(uint64_t sample, uint64_t key) const;
  std::shared_ptr<const std::vector<uint64_t>> Permutation(uint64_t epoch) const;

  std::shared_ptr<const Reader> reader_;
  SamplerOptions options_;
  std::vector<int> fields_;
  std::vector<int64_t> channels_;
  int mask_field_ = -1;
  uint64_t threshold_ = 0;
  std::vector<uint64_t> eligible_;
  std::vector<bool> is_eligible_;
  uint64_t skipped_count_ = 0;
  std::vector<std::string> skipped_ids_;
  uint64_t epoch_ = 0, cursor_ = 0;

  mutable std::mutex mu_;
  mutable std::unordered_map<uint64_t, std::shared_ptr<const SampleSets>> sets_;
  mutable std::deque<uint64_t> sets_order_;  // insertion order, for eviction
  mutable uint64_t sets_bytes_ = 0;
  mutable uint64_t perm_epoch_ = UINT64_MAX;
  mutable std::shared_ptr<const std::vector<uint64_t>> perm_;
};

}  // namespace patchstore
