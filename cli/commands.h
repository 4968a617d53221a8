// patchstore/cli/commands.h — subcommands defined in their own files.
//
// Each Register* function adds its subcommand (with options and --help text)
// to `parent` and returns a runner that main() calls when that subcommand was
// parsed. Runners return the process exit code (0 ok, 1 failure, 2 usage).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace patchstore::cli {

using Runner = std::function<int()>;

// `patchstore ingest hdf5 FILE.h5 [FILE.h5 ...] STORE --group MR ...`
// `quiet` points at the global --quiet flag.
Runner RegisterIngestHdf5(CLI::App* ingest, const bool* quiet);

}  // namespace patchstore::cli

namespace patchstore::cli {

// `patchstore bench STORE [--patch P] [--batch B] [--processes 1,2,4] ...`:
// read throughput of random windows on the user's own store and machine.
Runner RegisterBench(CLI::App* app, const bool* quiet);

}  // namespace patchstore::cli

namespace patchstore::cli {

// `patchstore montage STORE OUT.png --count 64 [--patch 256] [--field rgb]
// [--overlay mask] [--seed S]`: a contact sheet of the sampler's windows.
Runner RegisterMontage(CLI::App* app, const bool* quiet);

// --window: "LO,HI" (LO < HI, finite) -> true with both set; "auto" -> true
// with *is_auto set; anything else -> false.
bool ParseWindow(const std::string& s, double* lo, double* hi, bool* is_auto);

}  // namespace patchstore::cli

namespace patchstore::cli {

// `patchstore copy SRC DST [--layout rows|tiles] [--tile-size T]
// [--encoding ...]`: a compacted copy of a store (e.g. to replicate it onto
// node-local disk), or one re-laid out and re-encoded from its records
// (ingest/convert.h), verified before it appears under DST.
Runner RegisterCopy(CLI::App* app, const bool* quiet);

}  // namespace patchstore::cli
