#include "cli/slice_flags.h"

#include <cstdio>
#include <type_traits>

namespace patchstore::cli {
namespace {

// One flag of the option table, by the member's type (the types with a CLI
// spelling of their own are SliceFlags' strings, set in AddSliceFlags).
template <class T>
void AddFlag(CLI::App* cmd, const std::string& flag, T* member, const std::string& help) {
  if constexpr (std::is_same_v<T, bool>) {
    cmd->add_flag(flag, *member, help);
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    cmd->add_option(flag, *member, help);
  } else if constexpr (std::is_arithmetic_v<T> || std::is_same_v<T, std::string>) {
    cmd->add_option(flag, *member, help)->capture_default_str();
  }
}

}  // namespace

void AddSliceFlags(CLI::App* cmd, SliceFlags* f, const std::string& when) {
  SliceOptions* o = &f->options;
  f->context = std::to_string(o->context.all);
#define PATCHSTORE_SLICE_FLAG_ROW(member, python, flag, doc)                                          \
  if (std::string(flag).empty()) {                                                                    \
  } else if (std::string(#member) == "context") {                                                     \
    cmd->add_option(flag, f->context, when + doc + " (as " python "=)")->capture_default_str();       \
  } else if (std::string(#member) == "crop") {                                                        \
    cmd->add_option(flag, f->crop, when + doc + " (as " python "=)")->delimiter(',')->expected(1, 2); \
  } else if (std::string(#member) == "flip") {                                                        \
    cmd->add_flag(std::string(flag) + "{both}", f->flip, when + doc + " (as " python "=)");           \
  } else {                                                                                            \
    AddFlag(cmd, flag, &o->member, when + doc + " (as " python "=)");                                 \
  }
  PATCHSTORE_SLICE_OPTIONS(PATCHSTORE_SLICE_FLAG_ROW)
#undef PATCHSTORE_SLICE_FLAG_ROW
}

bool ApplySliceFlags(const SliceFlags& f, SliceOptions* out) {
  std::vector<std::string> fields = std::move(out->fields);
  *out = f.options;
  out->fields = std::move(fields);
  auto context = ParseSliceContext(f.context);
  if (!context.ok()) {
    std::fprintf(stderr, "patchstore: error: %s\n", context.status().message().c_str());
    return false;
  }
  out->context = *context;
  if (f.crop.size() == 1) out->crop = {f.crop[0], f.crop[0]};
  if (f.crop.size() == 2) out->crop = {f.crop[0], f.crop[1]};
  auto flip = ParseSliceFlip(f.flip);
  if (!flip.ok()) {
    std::fprintf(stderr, "patchstore: error: %s\n", flip.status().message().c_str());
    return false;
  }
  out->flip = *flip;
  return true;
}

bool SliceOnlyFlagsGiven(const SliceFlags& f) {
  auto context = ParseSliceContext(f.context);
  return !f.crop.empty() || f.flip == "independent" || !context.ok() || context->all != 0 || !context->fields.empty();
}

}  // namespace patchstore::cli
