// `patchstore ingest hdf5` — 3D volumes from HDF5 files (see ingest/ingest_hdf5.h).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/ingest_run.h"
#include "patchstore/ingest/ingest_hdf5.h"

namespace patchstore::cli {
namespace {

struct Hdf5Args {
  std::vector<std::string> paths;  // FILE.h5 ... STORE
  std::vector<std::string> norm_specs;
  std::string on_error = "stop";
  bool no_sync = false;
  std::string shard;
  Hdf5IngestOptions options;
};

}  // namespace

Runner RegisterIngestHdf5(CLI::App* ingest, const bool* quiet) {
  auto* cmd = ingest
                  ->add_subcommand(
                      "hdf5", "Ingest 3D volumes from HDF5 files (groups of one dataset per patient, or one file per "
                              "patient)")
                  ->fallthrough();
  auto args = std::make_shared<Hdf5Args>();
  Hdf5IngestOptions& o = args->options;
  cmd->add_option("PATHS", args->paths,
                  "FILE.h5 [FILE.h5 ...] STORE: the HDF5 files, then the store directory "
                  "(created if missing)")
      ->required()
      ->expected(2, -1);
  cmd->add_option("--group", o.groups,
                  "PATH or PATH=FIELD (repeat); each becomes a field. In a file where every PATH is a group, each "
                  "group holds one 3D dataset per patient and each dataset name is a volume (a name missing from one "
                  "group is an error naming it; --on-error skip: skipped and reported). In a file where every PATH "
                  "is a 3D dataset, the file is one patient: one volume, id = file stem")
      ->required();
  cmd->add_option("--slice-axis", o.slice_axis,
                  "Source axis that indexes slices: 0, 1, 2 or negative (default -1: the last, for (H,W,S) data)");
  cmd->add_option("--ids", o.ids,
                  "Sample ids: auto (dataset name; FILESTEM/name when several files are given), stem (always "
                  "FILESTEM/name), name (never prefixed). A per-patient file's volume is FILESTEM under every scheme")
      ->check(CLI::IsMember({"auto", "stem", "name"}));
  cmd->add_flag("--strict-ids", o.strict_ids,
                "Refuse (instead of warning) when prefixed ids would store a patient already present under another "
                "file prefix, and refuse an id two files give (--ids name) before anything is written");
  cmd->add_option("--mask", o.mask_fields,
                  "Treat FIELD as a mask: marked as such and stored as {0,1} unless --norm says otherwise. A group "
                  "merely named MASK keeps its values (labels) without this");
  cmd->add_option(
      "--norm", args->norm_specs,
      "FIELD=SPEC: none (default: values unchanged, a CT keeps its HU) | unit | symmetric (uint8/16 "
      "sources) | binary | affine:SCALE,OFFSET, optionally +clamp:LO,HI | range:LO,HI ([LO,HI] onto [-1,1], "
      "clamped; e.g. CT=range:-1024,3000)");
  cmd->add_flag("--allow-external", o.allow_external,
                "Follow HDF5 external links and read external/virtual storage (refused by default: they can read "
                "arbitrary files)");
  cmd->add_option("--encoding", o.encoding,
                  "Record dtype (repeat): float32 (default) | compact (uint8/uint16 datasets kept as they are, "
                  "int8/int16 as int16, others float32; readers still return the same float32, bit for bit) | "
                  "FIELD=float32|compact|float16 for one field (float16: normalised values rounded to nearest, "
                  "relative error <= 2^-11, beyond 65504 inf), e.g. --encoding compact --encoding MR=float16");
  cmd->add_option("--layout", o.layout,
                  "rows only: a slice is read whole, one contiguous range of its (S,H,W) record, so tiles (see "
                  "'ingest images --layout') would not help and are refused")
      ->check(CLI::IsMember({"rows", "tiles"}));
  cmd->add_option("--on-error", args->on_error,
                  "stop (default): stop at the first bad volume, keeping what was committed; skip: record failures "
                  "in the report and go on")
      ->check(CLI::IsMember({"stop", "skip"}));
  cmd->add_option("--report", o.report_path,
                  "Where --on-error skip writes the failures of this run (default STORE/ingest-errors.tsv; a run "
                  "without failures removes it)");
  cmd->add_flag("--no-sync", args->no_sync, "Do not fsync commits (faster; a crash may lose recent batches)");
  auto* shard_opt =
      cmd->add_option("--shard", args->shard,
                      "I/N: ingest only shard I (0..N-1) of N: the volumes whose id hashes to I (xxh3_64 of the id mod "
                      "N), into a store of their own; run N such ingests (any machines, at once) and read the N stores "
                      "as one");
  cmd->footer(
      "Two layouts, judged file by file (one ingest may mix them):\n"
      "  groups:      /MR/patient001 /CT/patient001 /MR/patient002 ...  every --group a group; a volume per\n"
      "               dataset name present in all of them\n"
      "  per patient: /MR /CT /MASK                                     every --group a 3D dataset; the file is\n"
      "               one volume, its id the file stem (data/sub-07.h5 -> sub-07)\n"
      "A file that is neither (a path missing, or groups and datasets mixed) is an error listing what its root\n"
      "holds (--on-error skip: reported, the other files ingested).\n"
      "\n"
      "Every (volume, group) becomes one record (float32, or --encoding) of shape (S,H,W), slice axis first, so a "
      "slice or a stack\n"
      "of neighbouring slices is one contiguous zero-copy view. Chunked and compressed (gzip, shuffle) datasets\n"
      "are streamed chunk by chunk; memory stays bounded.\n"
      "\n"
      "Examples:\n"
      "  patchstore ingest hdf5 synthrad.h5 synthrad.ps --group MR --group CT --group MASK\n"
      "  patchstore ingest hdf5 train.h5 val.h5 ct.ps --group MR --group CT \\\n"
      "      --norm CT=range:-1024,3000 --norm MR=range:0,3000   # ids train/patient001, val/patient042, ...\n"
      "  patchstore ingest hdf5 data/*.h5 v.ps --group MR --group CT --group MASK\n"
      "                                                   # one file per patient: ids = file stems\n"
      "  patchstore ingest hdf5 new.h5 synthrad.ps --group MR --group CT --group MASK --ids name\n"
      "                                                   # add new patients to a store, ids without prefix\n"
      "  patchstore ingest hdf5 vols.h5 vols.ps --group /data/img=image --group /data/seg=mask \\\n"
      "      --mask mask --slice-axis 0                   # (S,H,W) sources\n"
      "Running the same command again resumes: complete volumes are skipped.");
  AddIngestExitCodes(cmd, "volumes");

  return [cmd, args, quiet, shard_opt]() -> int {
    if (!cmd->parsed()) return -1;
    Hdf5IngestOptions& o = args->options;
    o.files.assign(args->paths.begin(), args->paths.end() - 1);
    o.store = args->paths.back();
    for (const std::string& n : args->norm_specs) {
      size_t eq = n.find('=');
      if (eq == std::string::npos || eq == 0) {
        std::cerr << "patchstore: error: --norm takes FIELD=SPEC, got '" << n << "'\n";
        return 2;
      }
      o.norm[n.substr(0, eq)] = n.substr(eq + 1);
    }
    if (!ParseShardFlag(shard_opt, args->shard, &o.shard_index, &o.shard_count)) return 2;
    o.skip_errors = args->on_error == "skip";
    o.durable = !args->no_sync;
    std::string command = "patchstore ingest hdf5";
    for (const std::string& p : args->paths) command += " " + p;
    for (const std::string& g : o.groups) command += " --group " + g;
    command += " --slice-axis " + std::to_string(o.slice_axis);
    if (shard_opt->count() > 0) command += " --shard " + args->shard;
    o.command_line = command;
    return RunIngestCommand("volumes", o.store, *quiet, [&](const ProgressCallback& progress, const auto& cancelled) {
      o.progress = progress;
      o.cancelled = cancelled;
      return IngestHdf5(o);
    });
  };
}

}  // namespace patchstore::cli
