#include "cli/ingest_run.h"

#include <malloc.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <iostream>

#include "cli/common.h"
#include "cli/progress.h"
#include "store/shard.h"

namespace patchstore::cli {

bool ParseShardFlag(const CLI::Option* option, const std::string& text, uint32_t* index, uint32_t* count) {
  if (option->count() == 0) return true;
  Status st = ParseShardSpec(text, index, count);
  if (!st.ok()) std::cerr << "patchstore: error: --" << st.message() << "\n";
  return st.ok();
}

bool ParseAssignments(const std::vector<std::string>& specs, const std::string& flag, const std::string& form,
                      const std::function<void(std::string name, std::string value)>& add) {
  for (const std::string& spec : specs) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::cerr << "patchstore: error: --" << flag << " takes " << form << ", got '" << spec << "'\n";
      return false;
    }
    add(spec.substr(0, eq), spec.substr(eq + 1));
  }
  return true;
}

bool CheckSourceFlags(const std::string& manifest, const std::string& root, size_t field_templates) {
  if (manifest.empty() == root.empty()) {
    std::cerr << "patchstore: error: give either --manifest FILE or --root DIR with --field templates\n";
    return false;
  }
  if (!root.empty() && field_templates == 0) {
    std::cerr << "patchstore: error: --root needs at least one --field NAME=TEMPLATE\n";
    return false;
  }
  return true;
}

void AddIngestExitCodes(CLI::App* cmd, const std::string& noun) {
  AddExitCodes(cmd, "0 done (" + noun + " skipped with --on-error skip are listed), 1 failure, 2 bad usage,\n" +
                        "130 interrupted by Ctrl-C (what was committed stays; rerun to resume).");
}

int RunIngestCommand(const std::string& noun, const std::string& store, bool quiet, const IngestCall& ingest) {
  ProgressPrinter printer("ingest", noun, quiet);
  // Keep large freed blocks in the heap for reuse: LMDB allocates each
  // record's pages with malloc, and fresh pages cost more than the copy.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  InstallInterruptHandler();
  auto r = ingest([&](const Progress& p) { printer(p); }, [] { return Interrupted(); });
  std::signal(SIGINT, SIG_DFL);
  if (!r.ok() && r.status().code() == Code::kAborted) {
    std::cerr << "patchstore: interrupted: " << r.status().message() << "\nrun the same command again to resume\n";
    return 130;
  }
  if (!r.ok()) {
    const Status& st = r.status();
    std::cerr << "patchstore: error: " << st.message() << "\n";
    // The ingest's own argument checks ("ingest: ...", "ingest hdf5: ...")
    // are usage errors, as CLI11's are.
    bool usage = false;
    for (const char* prefix : {"ingest: ", "ingest images: ", "ingest hdf5: ", "ingest volumes: "})
      usage = usage || st.message().rfind(prefix, 0) == 0;
    // The driver's "ingest into 'S' stopped after N new ...": what is next.
    if (st.message().rfind("ingest into '", 0) == 0 && st.message().find("' stopped after ") != std::string::npos)
      std::cerr << "patchstore: what was committed stays in '" << store
                << "'; fix the cause (or pass --on-error skip to record failures and go on) and run the same "
                   "command again to resume\n";
    return st.code() == Code::kInvalidArgument && usage ? 2 : 1;
  }
  const IngestSummary& s = *r;
  for (const std::string& w : s.warnings) std::cerr << "patchstore: warning: " << w << "\n";
  if (s.samples_total > 0 && s.samples_present == s.samples_total) {
    std::printf("all %llu %s already in '%s': nothing to do (store sealed)\n",
                static_cast<unsigned long long>(s.samples_total), noun.c_str(), store.c_str());
    return 0;
  }
  std::printf("ingested %llu new %s (%llu already present, %llu failed) of %llu into '%s'\n",
              static_cast<unsigned long long>(s.samples_written), noun.c_str(),
              static_cast<unsigned long long>(s.samples_present), static_cast<unsigned long long>(s.samples_failed),
              static_cast<unsigned long long>(s.samples_total), store.c_str());
  std::printf("wrote %s of records in %.2f s (%.0f MB/s decoded)\n",
              HumanBytes(static_cast<double>(s.bytes_written)).c_str(), s.seconds,
              s.seconds > 0 ? s.bytes_decoded / s.seconds / 1e6 : 0.0);
  if (s.samples_failed && !s.report_error.empty()) {
    // Never claim a report that was not written: list what failed, exit 1.
    for (const std::string& e : s.errors) std::fprintf(stderr, "  %s\n", e.c_str());
    std::fprintf(stderr, "patchstore: error: %llu failures, but the failure report was not written: %s\n",
                 static_cast<unsigned long long>(s.samples_failed), s.report_error.c_str());
    return 1;
  }
  if (s.samples_failed) {
    std::printf("failures written to %s; fix the files and run the same command again to finish\n",
                s.report_path.c_str());
    for (size_t i = 0; i < s.errors.size() && i < 5; ++i) std::printf("  %s\n", s.errors[i].c_str());
  } else {
    std::printf("store sealed\n");
  }
  return 0;
}

}  // namespace patchstore::cli
