// `patchstore ls STORE [--json]` — the sample ids in index order (with each
// sample's shapes in --json), from the sample index.
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/json.h"
#include "cli/shapes.h"
#include "patchstore/reader/reader.h"

namespace patchstore::cli {
namespace {

struct LsArgs {
  std::string store;
  bool json = false;
};

int RunLs(const LsArgs& a) {
  auto r = OpenStoreOrSet(a.store);
  if (!r.ok()) return Fail(r.status());
  const auto& reader = *r;
  if (a.json) {
    const bool volumes = reader->meta().kind == "volumes";
    std::cout << "[";
    for (uint64_t i = 0; i < reader->size(); ++i)
      std::cout << (i ? ", " : "") << "{\"id\": " << JsonString(reader->id(i))
                << ", \"shapes\": " << SampleShapesJson(*reader, i, JsonString)
                << (volumes ? ", \"geometry\": " + SampleGeometryJson(*reader, i) : std::string()) << "}";
    std::cout << "]\n";
  } else {
    for (uint64_t i = 0; i < reader->size(); ++i) std::cout << Printable(reader->id(i)) << "\n";
  }
  return 0;
}

}  // namespace

Runner RegisterLs(CLI::App* app, const bool* /*quiet*/) {
  auto* cmd = app->add_subcommand("ls", "List sample ids (one per line, in index order); --json: ids with each "
                                        "sample's shapes");
  auto args = std::make_shared<LsArgs>();
  cmd->add_option("STORE", args->store, kStoreOrSetHelp)->required();
  cmd->add_flag("--json", args->json,
                "Machine-readable output: [{\"id\": ID, \"shapes\": {FIELD: [dims]}, \"geometry\": "
                "{\"spacing\": ..., \"origin\": ..., \"direction\": ..., \"affine_ras\": ...} or null}, ...]");
  AddExitCodes(cmd, "0 listed, 1 the store could not be read (the message says why), 2 bad usage.");
  return [cmd, args]() -> int { return cmd->parsed() ? RunLs(*args) : -1; };
}

}  // namespace patchstore::cli
