#include "cli/sampler_flags.h"

#include <algorithm>
#include <cstdio>
#include <type_traits>

#include "patchstore/reader/order.h"

namespace patchstore::cli {
namespace {

// One flag of the option table, by the member's type.
template <class T>
void AddFlag(CLI::App* cmd, const std::string& flag, T* member, const std::string& help) {
  if constexpr (std::is_same_v<T, bool>) {
    cmd->add_flag(flag, *member, help);
  } else if constexpr (std::is_same_v<T, SamplingPolicy>) {
    cmd->add_option_function<std::string>(
           flag,
           [member](const std::string& name) {
             auto p = ParseSamplingPolicy(name);
             if (!p.ok()) throw CLI::ValidationError(p.status().message());
             *member = *p;
           },
           help)
        ->default_str(SamplingPolicyName(*member));
  } else if constexpr (std::is_same_v<T, SampleOrder>) {
    cmd->add_option_function<std::string>(
           flag,
           [member](const std::string& name) {
             auto p = ParseSampleOrder(name);
             if (!p.ok()) throw CLI::ValidationError(p.status().message());
             *member = *p;
           },
           help)
        ->default_str(SampleOrderName(*member));
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    cmd->add_option(flag, *member, help);
  } else {
    cmd->add_option(flag, *member, help)->capture_default_str();
  }
}

}  // namespace

void AddSamplerFlags(CLI::App* cmd, SamplerFlags* f, const std::string& when, bool ids) {
  SamplerOptions* o = &f->options;
#define PATCHSTORE_FLAG_ROW(member, python, flag, doc)                                                          \
  if (std::string(flag).empty() || (!ids && std::string(#member) == "ids")) {                                   \
  } else if (std::string(#member) == "patch_size") {                                                            \
    cmd->add_option(flag, f->patch, when + doc + " (as " python "=); default " + std::to_string(o->patch_size)) \
        ->delimiter(',')                                                                                        \
        ->expected(1, 2);                                                                                       \
  } else {                                                                                                      \
    AddFlag(cmd, flag, &o->member, when + doc + " (as " python "=)");                                           \
  }
  PATCHSTORE_SAMPLER_OPTIONS(PATCHSTORE_FLAG_ROW)
#undef PATCHSTORE_FLAG_ROW
  cmd->add_option("--loader", f->loader,
                  when + "show the windows this loader serves: sampler (PatchSampler), "
                         "batchloader (BatchLoader: the same as sampler) or patchdataset (PatchDataset, items in index "
                         "order)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sampler", "batchloader", "patchdataset"}));
  cmd->add_option("--epoch", f->epoch, when + "epoch")->capture_default_str();
}

bool ApplySamplerFlags(const SamplerFlags& f, MontageOptions* o) {
  o->sampler = f.options;
  SamplerOptions& s = o->sampler;
  if (f.patch.size() == 1) s.patch_size = f.patch[0];
  if (f.patch.size() == 2) {
    s.patch_size = std::max(f.patch[0], f.patch[1]);
    s.patch_h = f.patch[0];
    s.patch_w = f.patch[1];
  }
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
