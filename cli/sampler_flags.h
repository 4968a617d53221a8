// patchstore/cli/sampler_flags.h — the sampler options of `montage` and
// `export --boxes`, one set of flags with the loaders' meaning
// (SamplerOptions, reader/sampler.h) and the loader kind whose windows are
// shown (--loader sampler|batchloader|patchdataset).
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "patchstore/ingest/montage.h"

namespace patchstore::cli {

struct SamplerFlags {
  std::vector<int64_t> patch;  // P or H,W
  int patches_per_sample = 1;
  std::string require, policy = "auto", loader = "sampler";
  double min_valid = 1, positive_fraction = -1;
  uint64_t seed = 0, epoch = 0;
  int rank = 0, world_size = 1;
  bool flip = false, rot90 = false;
  std::vector<std::string> ids;
};

// Adds --patch, -k, --require, --min-valid, --positive-fraction, --policy,
// --loader, --seed, --epoch, --rank, --world-size, --flip, --rot90 and (when
// `ids` is true) --ids to `cmd`. `when` prefixes the help ("With --boxes: ").
void AddSamplerFlags(CLI::App* cmd, SamplerFlags* flags, const std::string& when, bool ids);

// Fills o->sampler, o->loader and o->epoch; false with a message on stderr
// for an unknown --policy or --loader.
bool ApplySamplerFlags(const SamplerFlags& flags, MontageOptions* o);

// Prints Image8 warnings as "patchstore: warning: ..." lines, each once.
void PrintWarnings(const std::vector<std::string>& warnings, std::vector<std::string>* seen);

}  // namespace patchstore::cli
