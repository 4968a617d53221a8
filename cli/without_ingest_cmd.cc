// The commands a reader-only build lacks (CMake PATCHSTORE_INGEST=OFF, or
// AUTO without the codec libraries): listed under their own heading in
// --help, and when called they say why.
#include <iostream>

#include "cli/commands.h"

namespace patchstore::cli {

Runner RegisterWithoutIngest(CLI::App* app, const std::string& name, const std::string& what) {
  auto* cmd = app->add_subcommand(name, what + " (needs ingest: not in this build)");
  cmd->group("Not in this reader-only build");
  cmd->prefix_command();  // every argument after the name is accepted, unparsed
  return [cmd, name]() -> int {
    if (!cmd->parsed()) return -1;
    std::cerr << "patchstore: error: '" << name
              << "' is not in this program: it was built without ingest (CMake PATCHSTORE_INGEST=OFF, or OpenCV, "
                 "libtiff, OpenEXR or HDF5 missing when it was built). Reading commands (bench, copy, info, ls, "
                 "upgrade, verify) work; build patchstore with those libraries for ingest, montage and export.\n";
    return 2;
  };
}

}  // namespace patchstore::cli
