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

// The long name of a row's flag ("-k,--patches-per-sample" -> "--patches-per-sample").
std::string LongName(const std::string& flag) {
  const size_t c = flag.rfind(',');
  return c == std::string::npos ? flag : flag.substr(c + 1);
}

// A shared flag's value (given on the command line) into a member of the
// sampler's table: the strings CLI11 kept, converted by the member's type.
template <class T>
bool ReadShared(CLI::Option* opt, T* member, const std::string& flag) {
  if (opt->count() == 0) return true;  // not given: the sampler's default
  try {
    if constexpr (std::is_same_v<T, bool>) {
      const std::string v = opt->results().empty() ? std::string("true") : opt->results().back();
      if (v == "independent") {
        std::fprintf(stderr,
                     "patchstore: error: %s=independent is for volume stores (image windows flip each "
                     "axis on its own with %s)\n",
                     flag.c_str(), flag.c_str());
        return false;
      }
      *member = !(v == "false" || v == "0" || v.empty());
    } else if constexpr (std::is_arithmetic_v<T> || std::is_same_v<T, std::string> ||
                         std::is_same_v<T, std::vector<std::string>>) {
      *member = opt->as<T>();
    } else {
      std::fprintf(stderr, "patchstore: error: %s: not a shared flag\n", flag.c_str());
      return false;
    }
  } catch (const CLI::Error& e) {
    std::fprintf(stderr, "patchstore: error: %s: %s\n", flag.c_str(), e.what());
    return false;
  }
  return true;
}

// The help of a flag the slice table added first ("Volumes: ... (as NAME=)")
// and this table shares: "Volumes: .... Images: DOC", then "(as NAME=)" once
// when the Python keyword is the same.
std::string SharedDescription(std::string first, const std::string& doc, const std::string& python) {
  const std::string as = " (as " + python + "=)";
  const bool same = first.size() >= as.size() && first.compare(first.size() - as.size(), as.size(), as) == 0;
  if (same) first.resize(first.size() - as.size());
  return first + ". Images: " + doc + as;
}

}  // namespace

void AddSamplerFlags(CLI::App* cmd, SamplerFlags* f, const std::string& when, bool ids, bool loader) {
  SamplerOptions* o = &f->options;
#define PATCHSTORE_FLAG_ROW(member, python, flag, doc)                                                          \
  if (std::string(flag).empty() || (!ids && std::string(#member) == "ids")) {                                   \
  } else if (CLI::Option* other = cmd->get_option_no_throw(LongName(flag))) {                                   \
    other->description(SharedDescription(other->get_description(), doc, python));                               \
    f->shared.emplace_back(#member, other);                                                                     \
  } else if (std::string(#member) == "patch_size") {                                                            \
    cmd->add_option(flag, f->patch, when + doc + " (as " python "=); default " + std::to_string(o->patch_size)) \
        ->delimiter(',')                                                                                        \
        ->expected(1, 2)                                                                                        \
        ->type_name("P|H,W");                                                                                   \
  } else {                                                                                                      \
    AddFlag(cmd, flag, &o->member, when + doc + " (as " python "=)");                                           \
  }
  PATCHSTORE_SAMPLER_OPTIONS(PATCHSTORE_FLAG_ROW)
#undef PATCHSTORE_FLAG_ROW
  if (!loader) return;
  cmd->add_option("--loader", f->loader,
                  when + "show the windows this loader serves: sampler (PatchSampler), "
                         "batchloader (BatchLoader: the same as sampler) or patchdataset (PatchDataset, items in index "
                         "order)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sampler", "batchloader", "patchdataset"}));
  cmd->add_option("--epoch", f->epoch, when + "epoch")->capture_default_str();
}

bool ApplySamplerFlags(const SamplerFlags& f, SamplerOptions* sampler, LoaderKind* loader, uint64_t* epoch) {
  std::vector<std::string> fields = std::move(sampler->fields);
  *sampler = f.options;
  sampler->fields = std::move(fields);
  SamplerOptions& s = *sampler;
  if (f.patch.size() == 1) s.patch_size = f.patch[0];
  if (f.patch.size() == 2) {
    s.patch_size = std::max(f.patch[0], f.patch[1]);
    s.patch_h = f.patch[0];
    s.patch_w = f.patch[1];
  }
  for (const auto& [member, opt] : f.shared) {
    bool ok = true;
#define PATCHSTORE_SHARED_ROW(m, python, flag, doc) \
  if (member == #m) ok = ReadShared(opt, &s.m, LongName(flag));
    PATCHSTORE_SAMPLER_OPTIONS(PATCHSTORE_SHARED_ROW)
#undef PATCHSTORE_SHARED_ROW
    if (!ok) return false;
  }
  if (loader != nullptr) {
    auto kind = ParseLoaderKind(f.loader);
    if (!kind.ok()) {
      std::fprintf(stderr, "patchstore: error: --loader: %s\n", kind.status().message().c_str());
      return false;
    }
    *loader = *kind;
  }
  if (epoch != nullptr) *epoch = f.epoch;
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
