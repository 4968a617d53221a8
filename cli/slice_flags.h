// patchstore/cli/slice_flags.h — the slice options of `montage` and `bench`
// on volume stores: one flag per row of the slice option table
// (PATCHSTORE_SLICE_OPTIONS, reader/slice_sampler.h) that has a CLI flag,
// with SliceDataset's meaning, the table's docs and the C++ defaults. No
// flag is written here by hand; values are checked by
// SliceOptions::Validate, not here.
//
// A command may take the frames sampler's flags too (montage, bench): the slice
// flags are added first, and a sampler flag of the same name (--flip,
// --rot90, --seed, --require, --min-valid, --positive-fraction, --ids) is
// then the same option, read into both tables (cli/sampler_flags.h).
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "patchstore/reader/slice_sampler.h"

namespace patchstore::cli {

struct SliceFlags {
  SliceOptions options;       // the table's plain flags write here (defaults: SliceOptions')
  std::string context;        // --context: C or FIELD=C,...
  std::vector<int64_t> crop;  // --crop: S or H,W
  std::string flip;           // --flip: "both" bare, or --flip=independent
};

// Adds the table's flags to `cmd`; `when` prefixes their help ("Volumes: ").
void AddSliceFlags(CLI::App* cmd, SliceFlags* flags, const std::string& when);

// Fills *out from the parsed flags (fields: left as they are). False with a
// message on stderr for a value that has no C++ spelling (--context x,
// --flip=sideways); the values themselves are for Validate.
bool ApplySliceFlags(const SliceFlags& flags, SliceOptions* out);

// Whether any of the table's flags that only slices have (--context,
// --crop, --flip=independent) was given: montage refuses them for images.
bool SliceOnlyFlagsGiven(const SliceFlags& flags);

}  // namespace patchstore::cli
