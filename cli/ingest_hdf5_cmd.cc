// `patchstore ingest hdf5` — placeholder until HDF5 ingest lands.
#include <iostream>

#include "cli/commands.h"

namespace patchstore::cli {

Runner RegisterIngestHdf5(CLI::App* ingest, const bool* quiet) {
  auto* cmd = ingest->add_subcommand("hdf5", "Ingest 3D volumes from HDF5 files (not yet available)");
  cmd->allow_extras();
  return [cmd]() -> int {
    if (!cmd->parsed()) return -1;
    std::cerr << "patchstore: error: 'ingest hdf5' is not available in this build yet\n";
    return 1;
  };
}

}  // namespace patchstore::cli
