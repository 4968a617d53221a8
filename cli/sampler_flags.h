// patchstore/cli/sampler_flags.h — the sampler options of `montage`,
// `export --boxes` and `bench` on image stores: one flag per row of the
// option table (PATCHSTORE_SAMPLER_OPTIONS, reader/sampler.h) that has a CLI
// flag, with the loaders' meaning, docs and C++ defaults, and (montage,
// export) the loader kind whose windows are shown (--loader
// sampler|batchloader|patchdataset). No flag is written here by hand except
// --patch (P or H,W), --loader and --epoch; values are checked by
// SamplerOptions::Validate, not here. A flag the command already has
// (montage and bench add the slice table's first, cli/slice_flags.h) is
// shared: its help gains the images' meaning, and its value is read into
// both tables. Needs the reader only (bench is in reader-only builds).
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <utility>
#include <vector>

#include "patchstore/reader/sampler.h"

namespace patchstore::cli {

struct SamplerFlags {
  SamplerOptions options;      // the table's flags write here (defaults: SamplerOptions')
  std::vector<int64_t> patch;  // --patch: P or H,W
  std::string loader = "sampler";
  uint64_t epoch = 0;
  // Rows whose flag another table registered first: (C++ member, that option).
  std::vector<std::pair<std::string, CLI::Option*>> shared;
};

// Adds the table's flags (--patch, -k, --require, --min-valid,
// --positive-fraction, --policy, --seed, --rank, --world-size, --flip,
// --rot90, and --ids when `ids` is true) to `cmd`, and --loader and --epoch
// when `loader` is true. `when` prefixes the help ("With --boxes: ").
void AddSamplerFlags(CLI::App* cmd, SamplerFlags* flags, const std::string& when, bool ids, bool loader);

// Fills *sampler from the parsed flags (its fields are left as they are),
// and *loader and *epoch where given; false with a message on stderr for an
// unknown --loader or a shared flag's value the images have no spelling for
// (--flip=independent). The values themselves are for Validate.
bool ApplySamplerFlags(const SamplerFlags& flags, SamplerOptions* sampler, LoaderKind* loader = nullptr,
                       uint64_t* epoch = nullptr);

// Prints Image8 warnings as "patchstore: warning: ..." lines, each once.
void PrintWarnings(const std::vector<std::string>& warnings, std::vector<std::string>* seen);

}  // namespace patchstore::cli
