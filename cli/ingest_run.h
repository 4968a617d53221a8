// cli/ingest_run.h — what `ingest images`, `ingest hdf5` and `ingest volumes`
// share around the one ingest driver (ingest/driver.h): the --shard flag,
// progress, Ctrl-C, the summary they print and their exit codes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "patchstore/ingest/ingest.h"
#include "patchstore/store/status.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace patchstore::cli {

// --shard I/N when given (even as "", an unset variable: checked, never
// ignored): false with the error printed (exit 2).
bool ParseShardFlag(const CLI::Option* option, const std::string& text, uint32_t* index, uint32_t* count);

// Each "NAME=VALUE" of a repeated flag (e.g. --field, --norm), split at its
// first '=' and passed to `add`; false with the error printed (exit 2) at the
// first without a NAME or '=': "--FLAG takes FORM, got '...'".
bool ParseAssignments(const std::vector<std::string>& specs, const std::string& flag, const std::string& form,
                      const std::function<void(std::string name, std::string value)>& add);

// The sources of `ingest images` and `ingest volumes`: either --manifest, or
// --root with at least one --field template; false with the error printed.
bool CheckSourceFlags(const std::string& manifest, const std::string& root, size_t field_templates);

// Ends the --help of an ingest command with the exit codes RunIngestCommand
// returns; `noun` as there.
void AddIngestExitCodes(CLI::App* cmd, const std::string& noun);

// Runs one ingest: progress on stderr (unless `quiet`), Ctrl-C stops it after
// its current commit, then the summary. `noun` counts the units ("samples",
// "volumes"). Returns the exit code: 0 done (units skipped with --on-error
// skip are listed and written to the failure report), 1 failure, 2 bad usage
// (an argument the ingest refused before reading), 130 interrupted.
using IngestCall =
    std::function<Result<IngestSummary>(const ProgressCallback& progress, const std::function<bool()>& cancelled)>;
int RunIngestCommand(const std::string& noun, const std::string& store, bool quiet, const IngestCall& ingest);

}  // namespace patchstore::cli
