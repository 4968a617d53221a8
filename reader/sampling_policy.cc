#include "reader/sampling_policy.h"

#include <cstdio>

#include "patchstore/reader/transform.h"

namespace patchstore {
namespace {

struct PolicyName {
  SamplingPolicy policy;
  const char* name;
};
constexpr PolicyName kPolicyNames[] = {
    {SamplingPolicy::kAuto, "auto"},
    {SamplingPolicy::kUniform, "uniform"},
    {SamplingPolicy::kMinValid, "min_valid"},
    {SamplingPolicy::kPositiveFraction, "positive_fraction"},
};

std::string Size(const SamplerOptions& o) { return std::to_string(o.height()) + "x" + std::to_string(o.width()); }

std::string Need(const SamplerOptions& o, uint64_t threshold) {
  return "no " + Size(o) + " window with >= " + std::to_string(threshold) + " valid pixel" +
         (threshold == 1 ? "" : "s") + " of '" + o.require + "', or smaller than " + Size(o);
}

// Every window that fits.
class UniformPolicy final : public WindowPolicy {
 public:
  bool uses_mask() const override { return false; }
  Verdict FromValidCount(uint64_t, uint64_t) const override { return Verdict::kYes; }
  bool Eligible(uint64_t pos, uint64_t) const override { return pos > 0; }
  bool WantQualifying(uint64_t) const override { return true; }
  std::string SkipReason(const SamplerOptions& o, uint64_t) const override { return "smaller than " + Size(o); }
};

// Windows with at least `threshold` valid mask pixels, uniformly.
class MinValidPolicy final : public WindowPolicy {
 public:
  bool uses_mask() const override { return true; }
  Verdict FromValidCount(uint64_t valid, uint64_t threshold) const override {
    if (valid < threshold) return Verdict::kNo;  // no window holds more than the whole mask
    if (threshold == 1) return Verdict::kYes;    // any window over a valid pixel
    return Verdict::kUnknown;
  }
  bool Eligible(uint64_t pos, uint64_t) const override { return pos > 0; }
  bool WantQualifying(uint64_t) const override { return true; }
  std::string SkipReason(const SamplerOptions& o, uint64_t threshold) const override { return Need(o, threshold); }
};

// A fraction of the draws from the qualifying windows, the rest from the others.
class PositiveFractionPolicy final : public WindowPolicy {
 public:
  explicit PositiveFractionPolicy(double fraction) : fraction_(fraction) {}
  bool uses_mask() const override { return true; }
  Verdict FromValidCount(uint64_t, uint64_t) const override { return Verdict::kYes; }  // any window will do
  bool Eligible(uint64_t pos, uint64_t neg) const override { return pos + neg > 0; }
  bool WantQualifying(uint64_t u) const override { return splitmix::Unit(u) < fraction_; }
  std::string SkipReason(const SamplerOptions& o, uint64_t) const override { return "smaller than " + Size(o); }

 private:
  double fraction_;
};

}  // namespace

const char* SamplingPolicyName(SamplingPolicy policy) {
  for (const PolicyName& p : kPolicyNames)
    if (p.policy == policy) return p.name;
  return "unknown";
}

Result<SamplingPolicy> ParseSamplingPolicy(const std::string& name) {
  std::string names;
  for (const PolicyName& p : kPolicyNames) {
    if (name == p.name) return p.policy;
    names += std::string(names.empty() ? "" : ", ") + p.name;
  }
  return Status::InvalidArgument("unknown sampling policy '" + name + "' (policies: " + names + ")");
}

SamplingPolicy SamplerOptions::ResolvedPolicy() const {
  if (policy != SamplingPolicy::kAuto) return policy;
  if (require.empty()) return SamplingPolicy::kUniform;
  return positive_fraction >= 0 ? SamplingPolicy::kPositiveFraction : SamplingPolicy::kMinValid;
}

Result<std::shared_ptr<const WindowPolicy>> MakeWindowPolicy(const SamplerOptions& o, const std::string& where) {
  const SamplingPolicy p = o.ResolvedPolicy();
  const std::string at = where.empty() ? std::string() : where + ": ";
  const std::string named = std::string("policy '") + SamplingPolicyName(p) + "'";
  switch (p) {
    case SamplingPolicy::kUniform:
      if (!o.require.empty()) return Status::InvalidArgument(at + named + " takes no require='" + o.require + "'");
      if (o.positive_fraction >= 0) return Status::InvalidArgument(at + "positive_fraction needs require=<mask field>");
      return std::shared_ptr<const WindowPolicy>(std::make_shared<UniformPolicy>());
    case SamplingPolicy::kMinValid:
      if (o.require.empty()) return Status::InvalidArgument(at + named + " needs require=<mask field>");
      if (o.positive_fraction >= 0)
        return Status::InvalidArgument(at + named +
                                       " takes no positive_fraction (policy "
                                       "'positive_fraction' does)");
      return std::shared_ptr<const WindowPolicy>(std::make_shared<MinValidPolicy>());
    case SamplingPolicy::kPositiveFraction:
      if (o.require.empty()) return Status::InvalidArgument(at + "positive_fraction needs require=<mask field>");
      if (!(o.positive_fraction >= 0 && o.positive_fraction <= 1))
        return Status::InvalidArgument(at + named + " needs positive_fraction in [0, 1]");
      return std::shared_ptr<const WindowPolicy>(std::make_shared<PositiveFractionPolicy>(o.positive_fraction));
    case SamplingPolicy::kAuto: break;
  }
  return Status::InvalidArgument(at + "unknown sampling policy " + std::to_string(static_cast<int>(p)));
}

}  // namespace patchstore
