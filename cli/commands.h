// patchstore/cli/commands.h — the subcommands, each in its own cli/*_cmd.cc.
//
// Each Register* function adds its subcommand (with options and --help text)
// to `parent` (the app, or `ingest` for the ingest subcommands) and returns a
// runner that main() calls after parsing: -1 when that subcommand was not
// parsed, else the process exit code (0 ok, 1 failure, 2 usage; 3 and 130 as
// the command's --help says). `quiet` points at the global --quiet flag.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace patchstore::cli {

using Runner = std::function<int()>;

// `ingest` and its subcommands (images, hdf5, volumes); their runners.
std::vector<Runner> RegisterIngest(CLI::App* app, const bool* quiet, const std::string& command_line);
// `ingest images STORE --manifest CSV | --root DIR --field ...`: frames (the store records `command_line`).
Runner RegisterIngestImages(CLI::App* ingest, const bool* quiet, std::string command_line);
// `ingest hdf5 FILE.h5 [FILE.h5 ...] STORE --group MR ...`: 3D volumes.
Runner RegisterIngestHdf5(CLI::App* ingest, const bool* quiet);
// `ingest volumes STORE --root DIR --field MR='{patient}/mr.nii.gz' ...`: NIfTI/MHA/NRRD/DICOM through ITK.
Runner RegisterIngestVolumes(CLI::App* ingest, const bool* quiet, std::string command_line);
// `bench STORE [--patch P] [--processes 1,2,4] ...`: read throughput on this store and machine.
Runner RegisterBench(CLI::App* app, const bool* quiet);
// `montage STORE OUT.png [--count 64] [--overlay mask] ...`: a contact sheet of the served windows.
Runner RegisterMontage(CLI::App* app, const bool* quiet);
// `copy SRC DST [--layout rows|tiles] [--tile-size T] [--encoding ...]`: a compacted copy of a store, or one
// re-laid out and re-encoded from its records (ingest/convert.h); verified before it appears under DST.
Runner RegisterCopy(CLI::App* app, const bool* quiet);
// `info STORE [--json] [--all]`: fields, shapes, samples, bytes, sealed.
Runner RegisterInfo(CLI::App* app, const bool* quiet);
// `ls STORE [--json]`: sample ids in index order (--json: with their shapes).
Runner RegisterLs(CLI::App* app, const bool* quiet);
// `verify STORE [--json]`: every checksum of a store or shard set; exit 3 on damage.
Runner RegisterVerify(CLI::App* app, const bool* quiet);
// `upgrade STORE`: an older store to the current format, in place; adds mask block counts.
Runner RegisterUpgrade(CLI::App* app, const bool* quiet);
// `export STORE OUTDIR [--boxes]`: records back to PNG/EXR/HDF5, or the windows a loader takes.
Runner RegisterExport(CLI::App* app, const bool* quiet);
// In a reader-only build: command `name` of the full program, listed apart in --help; called (with any
// arguments), it says that this build has no ingest and exits 2.
Runner RegisterWithoutIngest(CLI::App* app, const std::string& name, const std::string& what);

}  // namespace patchstore::cli
