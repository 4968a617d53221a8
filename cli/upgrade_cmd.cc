// `patchstore upgrade STORE` — bring a store written by an older patchstore
// to the current format in place, then add missing mask block counts.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/progress.h"
#include "patchstore/reader/reader.h"
#include "patchstore/store/store.h"

namespace patchstore::cli {
namespace {

int RunUpgrade(const std::string& store, bool quiet) {
  auto r = UpgradeStore(store);
  if (!r.ok()) return Fail(r.status());
  if (*r != kStoreFormatVersion)
    std::printf("upgraded '%s' from store format %u to %u\n", store.c_str(), *r, kStoreFormatVersion);
  ProgressPrinter printer("upgrade: mask block counts", "samples", quiet, /*counts_only=*/true);
  const auto t0 = std::chrono::steady_clock::now();
  InstallInterruptHandler();  // Ctrl-C: stop after the current transaction
  bool interrupted_before = false;
  if (auto snap = Snapshot::Open(store); snap.ok())
    interrupted_before = (*snap)->meta().attributes.count(kUpgradingAttribute) > 0;
  std::vector<MaskBlocksGap> gaps;
  auto blocks = AddMaskBlocks(
      store,
      [&](uint64_t done, uint64_t total) {
        Progress p;
        p.done = done;
        p.total = total;
        p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        printer(p);
        return !Interrupted();
      },
      kAddMaskBlocksBatch, &gaps);
  for (const MaskBlocksGap& g : gaps)
    std::fprintf(stderr,
                 "upgrade: field '%s' of '%s' has mask block counts, but %llu sample%s lack%s them (first: "
                 "'%s'; deleted records or a damaged store): rewriting them all\n",
                 g.field.c_str(), store.c_str(), static_cast<unsigned long long>(g.samples), g.samples == 1 ? "" : "s",
                 g.samples == 1 ? "s" : "", Printable(g.first_id).c_str());
  if (!blocks.ok()) return Fail(blocks.status());
  if (interrupted_before && !blocks->empty()) std::printf("finished the interrupted upgrade of '%s'\n", store.c_str());
  for (const std::string& f : *blocks) {
    const bool rewrote = std::any_of(gaps.begin(), gaps.end(), [&](const MaskBlocksGap& g) { return g.field == f; });
    std::printf("%s mask block counts %s field '%s' of '%s'\n", rewrote ? "rewrote the" : "added",
                rewrote ? "of" : "to", f.c_str(), store.c_str());
  }
  // Upgraded or not, the store must open as readers open it.
  if (auto opened = Reader::Open(store); !opened.ok()) {
    std::cerr << "patchstore: error: '" << store << "' does not open after the upgrade: " << opened.status().message()
              << " (run 'patchstore verify " << store << "')\n";
    return 1;
  }
  if (*r == kStoreFormatVersion && blocks->empty())
    std::printf("'%s' is up to date (store format %u; every mask field has block counts): nothing to do\n",
                store.c_str(), kStoreFormatVersion);
  return 0;
}

}  // namespace

Runner RegisterUpgrade(CLI::App* app, const bool* quiet) {
  auto* cmd = app->add_subcommand("upgrade", "Bring a store written by an older patchstore to the current "
                                             "format, in place (records are kept)");
  auto store = std::make_shared<std::string>();
  cmd->add_option("STORE", *store, "Store directory")->required();
  cmd->footer("Format 1 -> 2 adds the sample index (shapes, mask counts) that lets open, info, ls and "
              "samplers\nwork without reading records. Mask fields written before mask block counts existed "
              "get them\n(FORMAT.md \"Mask block counts\"): samplers then decide candidate windows of stores "
              "larger than\nRAM without reading masks. The format step is one transaction; block counts are "
              "written in\ntransactions of 1,024 samples and used only once all are there. Interrupted "
              "(Ctrl-C stops\nafter the current transaction), an upgrade leaves the store readable as "
              "before; run it\nagain to finish (verify names such a store as one of an interrupted upgrade). A mask "
              "field that has block\ncounts but lacks some of their records gets them all rewritten. The store is "
              "then opened as\nreaders open it: one that does not open is reported (exit 1), never called up "
              "to date.\nReopen readers of the store afterwards.");
  AddExitCodes(cmd, "0 upgraded or already current, 1 failure (the store stays readable as before; the message "
                    "says why), 2 bad usage, 130 interrupted (rerun to finish).");
  return [cmd, store, quiet]() -> int { return cmd->parsed() ? RunUpgrade(*store, *quiet) : -1; };
}

}  // namespace patchstore::cli
