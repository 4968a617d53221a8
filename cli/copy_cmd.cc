// `patchstore copy SRC DST` — compacting copy of a store, then verify.
//
// The copy is written into a temporary folder next to DST
// (DST.copy-XXXXXX, StagedStore), verified there (every checksum), and
// renamed to DST only when it is complete and verified: an interrupted or
// failed copy never leaves a DST that looks like a store, and the next copy
// to DST removes the staging folder an interrupted one left.
#include <stdlib.h>
#include <sys/stat.h>

#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/progress.h"
#include "patchstore/reader/verify.h"
#include "patchstore/store/copy.h"

namespace patchstore::cli {
namespace {

struct CopyArgs {
  std::string src, dst;
};

int Error(const std::string& message) {
  std::cerr << "patchstore: error: " << message << "\n";
  return 1;
}

}  // namespace

Runner RegisterCopy(CLI::App* app, const bool* quiet) {
  auto* cmd = app->add_subcommand("copy", "Compacted, verified copy of a store (e.g. onto node-local disk)");
  auto args = std::make_shared<CopyArgs>();
  cmd->add_option("SRC", args->src, "Store to copy")->required();
  cmd->add_option("DST", args->dst, "New store directory (must not exist)")->required();
  cmd->footer(
      "The copy holds only live pages (LMDB's compacting copy: free pages are dropped), is verified\n"
      "(every checksum, as 'patchstore verify') in a temporary folder next to DST, and then renamed to\n"
      "DST: an interrupted or failed copy leaves no DST, and the next copy to DST removes the folder an\n"
      "interrupted one left (it names each one it removes or keeps). SRC may be read or even written meanwhile; the\n"
      "copy holds what was committed when it started. Sealed stores stay sealed.\n"
      "\n"
      "Examples:\n"
      "  patchstore copy /shared/frames.ps /local/frames.ps\n"
      "  for i in 0 1 2 3; do patchstore copy /nfs/shards/frames-$i.ps /scratch/shards/frames-$i.ps; done\n"
      "Exit codes: 0 copied and verified, 1 failure (nothing left at DST), 2 bad usage, 3 the copy failed "
      "verification.");
  return [cmd, args, quiet]() -> int {
    if (!cmd->parsed()) return -1;
    namespace fs = std::filesystem;
    std::error_code ec;
    const std::string& dst = args->dst;
    // One staging engine (store/copy.h): path checks, removal of the staging
    // folders of interrupted copies to DST, and the rename when complete.
    std::vector<StagingLeftover> leftovers;
    auto staged_or = StagedStore::Create(args->src, dst, &leftovers);
    for (const StagingLeftover& l : leftovers)
      std::cerr << "copy: " << (l.removed ? "removed" : "kept") << " '" << l.path << "': " << l.note << "\n";
    if (!staged_or.ok()) {
      std::cerr << "patchstore: error: " << staged_or.status().message() << "\n";
      return staged_or.status().code() == Code::kInvalidArgument ? 2 : 1;
    }
    std::unique_ptr<StagedStore> staged = std::move(*staged_or);
    const std::string tmp = staged->path();
    auto cleanup = [&] { staged.reset(); };
    const auto start = std::chrono::steady_clock::now();
    if (!*quiet) std::cerr << "copy: writing a compacted copy of '" << args->src << "'...\n";
    Status st = CopyStoreCompact(args->src, tmp);
    if (!st.ok()) {
      cleanup();
      std::cerr << "patchstore: error: " << st.message() << "\n";
      return 1;
    }
    const uint64_t src_bytes = fs::file_size(fs::path(args->src) / "data.mdb", ec);
    const uint64_t dst_bytes = fs::file_size(fs::path(tmp) / "data.mdb", ec);
    ProgressPrinter printer("verify", "records", *quiet);
    const auto vstart = std::chrono::steady_clock::now();
    auto report = VerifyStore(tmp, [&](uint64_t done, uint64_t total) {
      Progress p;
      p.done = done;
      p.total = total;
      p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - vstart).count();
      printer(p);
    });
    if (!report.ok()) {
      cleanup();
      return Error("verifying the copy of '" + args->src + "': " + report.status().message());
    }
    if (!report->ok()) {
      for (const VerifyProblem& p : report->problems)
        std::fprintf(stderr, "BAD  '%s' field '%s': %s\n", p.id.c_str(), p.field.c_str(), p.message.c_str());
      cleanup();
      std::fprintf(stderr, "patchstore: error: the copy of '%s' failed verification (%zu problems; is the source "
                           "damaged? run 'patchstore verify %s'); nothing written to '%s'\n",
                   args->src.c_str(), report->problems.size(), args->src.c_str(), dst.c_str());
      return 3;
    }
    if (Status cst = staged->Commit(); !cst.ok()) {
      cleanup();
      return Error(cst.message());
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("copied '%s' to '%s': %llu samples, %llu records verified, %s (source %s) in %.2f s\n",
                args->src.c_str(), dst.c_str(), static_cast<unsigned long long>(report->samples),
                static_cast<unsigned long long>(report->records), HumanBytes(static_cast<double>(dst_bytes)).c_str(),
                HumanBytes(static_cast<double>(src_bytes)).c_str(), secs);
    return 0;
  };
}

}  // namespace patchstore::cli
