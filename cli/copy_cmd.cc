// `patchstore copy SRC DST [--layout rows|tiles] [--tile-size T]
// [--encoding ...]` — a compacted copy of a store, or one re-laid out and
// re-encoded from its records (ingest/convert.h), then verified.
//
// The copy is written into a temporary folder next to DST
// (DST.copy-XXXXXX), verified there (every checksum), and renamed to DST
// only when it is complete and verified: an interrupted or failed copy never
// leaves a DST that looks like a store.
#include <malloc.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/progress.h"
#include "cli/validators.h"
#include "ingest/encoding.h"
#include "patchstore/ingest/convert.h"
#include "patchstore/store/copy.h"

namespace patchstore::cli {

Runner RegisterCopy(CLI::App* app, const bool* quiet) {
  auto* cmd = app->add_subcommand(
      "copy", "Compacted, verified copy of a store (e.g. onto node-local disk), or one in another layout/encoding");
  auto o = std::make_shared<CopyOptions>();
  cmd->add_option("SRC", o->src, "Store to copy")->required();
  cmd->add_option("DST", o->dst, "New store directory (must not exist)")->required();
  cmd->add_option("--layout", o->layout,
                  "Convert every C,H,W field to rows (row-major records) or tiles (TxT tiles), as ingest's "
                  "--layout; frames only (default: each field keeps its own)")
      ->check(CLI::IsMember({"rows", "tiles"}));
  cmd->add_option("--tile-size", o->tile_size,
                  "T for --layout tiles: a multiple of 8 in 8..4096 (default: the source's tile edge when it is "
                  "tiled, else " +
                      std::to_string(kDefaultTileSize) + ")")
      ->check(CLI::Range(8, 4096));
  cmd->add_option("--encoding", o->encoding,
                  "Record dtype (repeat), as ingest's --encoding: float32 | compact for every field, "
                  "FIELD=float32|compact|float16 for one; fields no spec names keep theirs. Exact encodings read "
                  "back bit for bit; a value the new dtype cannot hold stops the copy, naming sample and field");
  cmd->add_option("-j,--threads", o->threads, "Converter threads (default: all cores)")->check(NonNegative());
  auto no_sync = std::make_shared<bool>(false);
  cmd->add_flag("--no-sync", *no_sync,
                "Do not fsync the conversion's commits (faster; the copy is still verified before it is renamed, "
                "but a machine crash soon after may lose it)");
  cmd->footer(
      "Without --layout, --tile-size or --encoding the copy holds only live pages (LMDB's compacting copy: free\n"
      "pages are dropped). With them it is written from the records, without the sources: each record read\n"
      "(checksum checked) and encoded again by the ingest's encoder, with every sample's id and metadata, the\n"
      "store's attributes, its mask block counts and sample index. Either way it is verified (every checksum,\n"
      "as 'patchstore verify') in a temporary folder next to DST, and then renamed to DST: an interrupted or\n"
      "failed copy leaves no DST. SRC may be read or even written meanwhile; the copy holds what was committed\n"
      "when it started. Sealed stores stay sealed.\n"
      "\n"
      "Examples:\n"
      "  patchstore copy /shared/frames.ps /local/frames.ps\n"
      "  for i in 0 1 2 3; do patchstore copy /nfs/shards/frames-$i.ps /scratch/shards/frames-$i.ps; done\n"
      "  patchstore copy frames.ps frames-tiles.ps --layout tiles --encoding compact\n"
      "  patchstore copy frames.ps frames-half.ps --layout tiles --encoding compact --encoding depth=float16\n"
      "  patchstore copy volumes.ps volumes-compact.ps --encoding compact\n"
      "Exit codes: 0 copied and verified, 1 failure (nothing left at DST), 2 bad usage, 3 the copy failed "
      "verification, 130 interrupted (nothing left at DST).");
  return [cmd, o, quiet, no_sync]() -> int {
    if (!cmd->parsed()) return -1;
    ProgressPrinter printer("copy", "samples", *quiet);
    ProgressPrinter verify_printer("verify", "records", *quiet, /*counts_only=*/true);  // no byte count
    CopyOptions opts = *o;
    opts.durable = !*no_sync;
    opts.progress = [&](const Progress& p) { printer(p); };
    opts.notice = [](const std::string& line) { std::cerr << line << "\n"; };  // shown even with --quiet
    const auto vstart = std::chrono::steady_clock::now();
    opts.verify_progress = [&](uint64_t done, uint64_t total) {
      Progress p;
      p.done = done;
      p.total = total;
      p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - vstart).count();
      verify_printer(p);
    };
    if (!opts.layout.empty() || !opts.encoding.empty() || opts.tile_size != 0) {
      // As for ingest: keep large freed blocks (converted records, LMDB's
      // dirty pages) in the heap for reuse; fresh pages cost more than the copy.
      mallopt(M_MMAP_THRESHOLD, 32 << 20);
      mallopt(M_TRIM_THRESHOLD, 1 << 30);
      // Ctrl-C stops a conversion after its current sample; nothing is left at DST.
      InstallInterruptHandler();
      opts.cancelled = [] { return Interrupted(); };
      opts.command_line = "patchstore copy " + opts.src + " " + opts.dst +
                          (opts.layout.empty() ? "" : " --layout " + opts.layout) +
                          (opts.tile_size ? " --tile-size " + std::to_string(opts.tile_size) : "");
      for (const std::string& e : opts.encoding) opts.command_line += " --encoding " + e;
    }
    // Paths that can never make a copy (empty, DST inside SRC or SRC inside
    // DST, the same folder) are usage errors; CopyStore checks them again.
    if (Status pst = CheckCopyPaths(opts.src, opts.dst); !pst.ok() && pst.code() == Code::kInvalidArgument) {
      std::cerr << "patchstore: error: " << pst.message() << "\n";
      return 2;
    }
    std::vector<VerifyProblem> problems;
    auto r = CopyStore(opts, &problems);
    if (!r.ok()) {
      for (const VerifyProblem& p : problems)
        std::fprintf(stderr, "BAD  '%s' field '%s': %s\n", p.id.c_str(), p.field.c_str(), p.message.c_str());
      if (r.status().code() == Code::kAborted) {
        std::cerr << "patchstore: interrupted: the copy to '" << opts.dst << "' stopped; nothing written there\n";
        return 130;
      }
      std::cerr << "patchstore: error: " << r.status().message() << "\n";
      return problems.empty() ? 1 : 3;
    }
    std::printf("copied '%s' to '%s': %llu samples, %llu records verified, %s (source %s) in %.2f s\n",
                opts.src.c_str(), opts.dst.c_str(), static_cast<unsigned long long>(r->samples),
                static_cast<unsigned long long>(r->records), HumanBytes(static_cast<double>(r->dst_bytes)).c_str(),
                HumanBytes(static_cast<double>(r->src_bytes)).c_str(), r->seconds);
    return 0;
  };
}

}  // namespace patchstore::cli
