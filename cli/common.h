// patchstore/cli/common.h — helpers several subcommands share: opening a
// store or a directory of shards, error exits, printable ids, --window.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "patchstore/reader/reader.h"

namespace CLI {
class App;
}

namespace patchstore::cli {

// Ends the --help of `cmd` with "Exit codes: CODES" after its own footer.
void AddExitCodes(CLI::App* cmd, const std::string& codes);

// The STORE argument of the commands that read a store or a shard set.
inline constexpr const char* kStoreOrSetHelp = "Store directory, or a directory of shards (read as one store)";

// `s` for terminal output: control bytes (< 0x20, 0x7f) escaped as \xNN.
std::string Printable(std::string_view s);

// Prints "patchstore: error: MESSAGE" on stderr and returns 1 (the exit code
// of a failed operation).
int Fail(const Status& st);
int Fail(const std::string& message);

// The stores of a shard set named by `path`: a directory that is not a store
// itself but holds stores (sorted by name; the reader puts shards in shard
// order). Empty when `path` is a store or anything else.
std::vector<std::string> StoresIn(const std::string& path);

// A store, or a directory of shards (StoresIn) read as one store.
Result<std::shared_ptr<Reader>> OpenStoreOrSet(const std::string& path);

// argv joined with spaces: the command line a store records for its ingest.
std::string CommandLine(int argc, char** argv);

// --window: "LO,HI" (LO < HI, finite) -> true with both set; "auto" -> true
// with *is_auto set; anything else -> false.
bool ParseWindow(const std::string& s, double* lo, double* hi, bool* is_auto);

}  // namespace patchstore::cli
