// reader/sampling_policy.h — the sampling policies of
// PatchSampler (internal; not installed).
//
// A policy decides, for one sample, which windows qualify and which set a
// draw takes its window from. PatchSampler keeps everything else: the
// eligible samples, the per-epoch permutation, the window lists ("runs" of
// qualifying and non-qualifying windows found with the mask's summed-area
// table), the counter-based generator and the copy. A policy sees only
// numbers (valid counts, set sizes, a 64-bit draw key), so it is a few lines.
//
// Adding a policy (see also sampler.h, "Adding a sampling policy"):
//   1. an enum value in SamplingPolicy (sampler.h) and its name in
//      SamplingPolicyName / ParseSamplingPolicy (sampling_policy.cc);
//   2. a class below deriving from WindowPolicy, returned by MakeWindowPolicy;
//   3. the bindings take the policy by name (bindings/src/sampler_py.cc), so
//      Python and the CLI (--policy) need no change;
//   4. a test in tests/reader/sampler_test.cc.
//
// Thread-safety: policies are immutable after MakeWindowPolicy.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "patchstore/reader/sampler.h"
#include "patchstore/store/status.h"

namespace patchstore {

class WindowPolicy {
 public:
  virtual ~WindowPolicy() = default;

  // Whether windows are classified by the `require` mask (the sampler then
  // reads the mask's summed-area table to build the window lists).
  virtual bool uses_mask() const = 0;

  // Eligibility from the mask's whole valid count alone (no record read):
  // kYes / kNo when the count decides, kUnknown when the window lists must.
  // `threshold`: the valid pixels a window needs (min_valid made a count).
  enum class Verdict { kYes, kNo, kUnknown };
  virtual Verdict FromValidCount(uint64_t valid_count, uint64_t threshold) const = 0;

  // Eligibility from the sizes of the qualifying (`pos`) and other (`neg`)
  // window sets of a sample whose window fits.
  virtual bool Eligible(uint64_t pos, uint64_t neg) const = 0;

  // True: draw this window from the qualifying set. `u` is a uniform
  // 64-bit value of the draw (a function of seed, epoch, position, j). The
  // sampler falls back to the other set when the chosen one is empty.
  virtual bool WantQualifying(uint64_t u) const = 0;

  // "no 64x32 window with >= 3 valid pixels of 'mask'": why a sample was
  // skipped, for warnings (h x w: the window).
  virtual std::string SkipReason(const SamplerOptions& o, uint64_t threshold) const = 0;
};

// The policy of `options` (kAuto resolved: ResolveSamplingPolicy), or
// InvalidArgument naming `where` when the options do not fit it (e.g.
// positive_fraction without require).
Result<std::shared_ptr<const WindowPolicy>> MakeWindowPolicy(const SamplerOptions& options, const std::string& where);

}  // namespace patchstore
