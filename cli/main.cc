// patchstore — the command-line program: ingest, inspect, verify, export.
//
// Exit codes: 0 success; 1 an operation failed (the message says which file,
// sample and cause); 2 bad usage; 3 `verify` found damaged records; 130
// ingest interrupted by Ctrl-C (committed samples kept; rerun to resume).
//
// Each subcommand lives in its own cli/*_cmd.cc behind cli/commands.h; this
// file holds the app, the global flags, the registration order (the order
// of --help) and the dispatch.
//
// A reader-only build (CMake PATCHSTORE_INGEST=OFF, or AUTO without the codec
// libraries; PATCHSTORE_WITH_INGEST=0 here) has the commands that need no
// codec. `ingest`, `montage` and `export` are listed apart in its --help as
// not in this build, and say so when called (exit 2).
#include <CLI/CLI.hpp>

#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "patchstore/store/store.h"

namespace cli = patchstore::cli;

namespace {
const std::string kFooter =
    "Exit codes: 0 success, 1 failure (the message names file, sample and cause), 2 bad usage, 3 verify found "
    "damage, 130 interrupted (rerun to resume).\nRun 'patchstore SUBCOMMAND --help' for each subcommand.";
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"patchstore: decode images and volumes once into an LMDB store (float32, or compact and float16 "
               "encodings read back as float32), then read zero-copy patches and slices from many processes.",
               "patchstore"};
  app.set_version_flag("--version", std::string("patchstore ") + patchstore::ToolVersion());
  app.require_subcommand(1);
  bool quiet = false;
  app.add_flag("-q,--quiet", quiet, "No progress output");

#if PATCHSTORE_WITH_INGEST
  std::vector<cli::Runner> runners = cli::RegisterIngest(&app, &quiet, cli::CommandLine(argc, argv));
  runners.insert(runners.end(), {
                                    cli::RegisterBench(&app, &quiet),
                                    cli::RegisterMontage(&app, &quiet),
                                    cli::RegisterCopy(&app, &quiet),
                                    cli::RegisterInfo(&app, &quiet),
                                    cli::RegisterLs(&app, &quiet),
                                    cli::RegisterVerify(&app, &quiet),
                                    cli::RegisterUpgrade(&app, &quiet),
                                    cli::RegisterExport(&app, &quiet),
                                });

  // The top level's footer is set last: subcommands copy the footer when they are created.
  app.footer(kFooter + "\n" +
             "Examples:\n"
             "  patchstore ingest images frames.ps --root data --field rgb='{video}/render/rgb/{frame}.png' \\\n"
             "      --field mask='{video}/render/masks/{frame}.png' --field depth='{video}/render/depth/{frame}.exr'\n"
             "  patchstore ingest hdf5 synthrad.h5 synthrad.ps --group MR --group CT --group MASK\n"
             "  patchstore info frames.ps\n"
             "  patchstore montage frames.ps sheet.png --count 64 --patch 256 --field rgb --overlay mask\n"
             "  patchstore verify frames.ps\n"
             "  patchstore export frames.ps out/ --id video01/0001");
#else
  const std::vector<cli::Runner> runners = {
      cli::RegisterBench(&app, &quiet),
      cli::RegisterCopy(&app, &quiet),
      cli::RegisterInfo(&app, &quiet),
      cli::RegisterLs(&app, &quiet),
      cli::RegisterVerify(&app, &quiet),
      cli::RegisterUpgrade(&app, &quiet),
      cli::RegisterWithoutIngest(&app, "ingest", "Decode files once into a store"),
      cli::RegisterWithoutIngest(&app, "montage", "Contact sheet of the windows a loader serves"),
      cli::RegisterWithoutIngest(&app, "export", "Records back to PNG/EXR/HDF5 files"),
  };
  app.footer(kFooter + "\n" +
             "This program reads stores only: it was built without ingest (no OpenCV, libtiff, OpenEXR or HDF5).\n"
             "Examples:\n"
             "  patchstore info frames.ps\n"
             "  patchstore verify frames.ps\n"
             "  patchstore copy /shared/frames.ps /local/frames.ps\n"
             "  patchstore bench frames.ps --patch 256");
#endif
  if (argc == 1) {  // bare `patchstore`: what it is, its subcommands and examples (not just "subcommand required")
    std::cout << app.help();
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  for (const cli::Runner& run : runners)
    if (int rc = run(); rc >= 0) return rc;
  return 2;
}
