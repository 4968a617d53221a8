#include "cli/sampler_flags.h"

#include <algorithm>
#include <cstdio>

namespace patchstore::cli {

void AddSamplerFlags(CLI::App* cmd, SamplerFlags* f, const std::string& when, bool ids) {
  cmd->add_option("--patch", f->patch, when + "window size: P (P x P) or H,W (as patch_size=(H, W)); default 256")
      ->delimiter(',')->expected(1, 2)->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  cmd->add_option("-k,--patches-per-sample", f->patches_per_sample, when + "windows per sample (k)")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("--require", f->require, when + "mask field the windows must hit (default: --overlay)");
  cmd->add_option("--min-valid", f->min_valid, when + "valid mask pixels a window needs (>= 1), or a fraction of "
                  "the window (< 1), as min_valid=")->capture_default_str();
  cmd->add_option("--positive-fraction", f->positive_fraction, when + "fraction of windows from those meeting "
                  "--min-valid, the rest from the others, as positive_fraction= (default: off)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--policy", f->policy, when + "sampling policy: auto (from --require/--positive-fraction), "
                  "uniform, min_valid, positive_fraction")->capture_default_str();
  cmd->add_option("--loader", f->loader, when + "show the windows this loader serves: sampler (PatchSampler), "
                  "batchloader (BatchLoader: the same as sampler) or patchdataset (PatchDataset, items in index "
                  "order)")->capture_default_str()->check(CLI::IsMember({"sampler", "batchloader", "patchdataset"}));
  cmd->add_option("--seed", f->seed, when + "sampler seed (the same seed gives the same windows as in training)")
      ->capture_default_str();
  cmd->add_option("--epoch", f->epoch, when + "epoch");
  cmd->add_option("--rank", f->rank, when + "rank, as rank= (sampler/batchloader)")->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--world-size", f->world_size, when + "world size, as world_size=")->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--flip", f->flip, when + "random flips, as flip=True");
  cmd->add_flag("--rot90", f->rot90, when + "random quarter turns, as rot90=True (square windows)");
  if (ids)
    cmd->add_option("--ids", f->ids, when + "only these samples, as ids=[...] (a train/val split)");
}

bool ApplySamplerFlags(const SamplerFlags& f, MontageOptions* o) {
  SamplerOptions& s = o->sampler;
  if (f.patch.size() == 1) s.patch_size = f.patch[0];
  if (f.patch.size() == 2) {
    s.patch_size = std::max(f.patch[0], f.patch[1]);
    s.patch_h = f.patch[0];
    s.patch_w = f.patch[1];
  }
  s.patches_per_sample = f.patches_per_sample;
  s.require = f.require;
  s.min_valid = f.min_valid;
  s.positive_fraction = f.positive_fraction;
  s.seed = f.seed;
  s.rank = f.rank;
  s.world_size = f.world_size;
  s.flip = f.flip;
  s.rot90 = f.rot90;
  s.ids = f.ids;
  auto policy = ParseSamplingPolicy(f.policy);
  if (!policy.ok()) {
    std::fprintf(stderr, "patchstore: error: --policy: %s\n", policy.status().message().c_str());
    return false;
  }
  s.policy = *policy;
  auto loader = ParseLoaderKind(f.loader);
  if (!loader.ok()) {
    std::fprintf(stderr, "patchstore: error: --loader: %s\n", loader.status().message().c_str());
    return false;
  }
  o->loader = *loader;
  o->epoch = f.epoch;
  return true;
}

void PrintWarnings(const std::vector<std::string>& warnings, std::vector<std::string>* seen) {
  for (const std::string& w : warnings) {
    if (std::find(seen->begin(), seen->end(), w) != seen->end()) continue;
    seen->push_back(w);
    std::fprintf(stderr, "patchstore: warning: %s\n", w.c_str());
  }
}

}  // namespace patchstore::cli
