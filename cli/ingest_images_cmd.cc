// `patchstore ingest images` — PNG/JPEG/TIFF/OpenEXR frames (see ingest/ingest.h).

#include <cstdio>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/ingest_run.h"
#include "cli/validators.h"
#include "ingest/encoding.h"
#include "patchstore/ingest/ingest.h"

namespace patchstore::cli {
namespace {

struct ImagesArgs {
  ImageIngestOptions options;
  std::vector<std::string> field_specs, norm_specs;
  std::string on_error = "stop";
  bool no_sync = false;
  bool in_process = false;
  std::string shard;
  CLI::Option* tile_size = nullptr;
  CLI::Option* shard_opt = nullptr;
  std::string command_line;
};

int RunImages(ImagesArgs& a, bool quiet) {
  ImageIngestOptions& io = a.options;
  auto add_template = [&](std::string name, std::string value) {
    io.field_templates.emplace_back(std::move(name), std::move(value));
  };
  auto add_norm = [&](std::string name, std::string value) { io.norm[name] = std::move(value); };
  if (!ParseAssignments(a.field_specs, "field", "NAME=TEMPLATE", add_template) ||
      !ParseAssignments(a.norm_specs, "norm", "FIELD=SPEC", add_norm) ||
      !CheckSourceFlags(io.manifest, io.root, io.field_templates.size()))
    return 2;
  if (a.tile_size->count() > 0 && io.layout != "tiles") {
    std::cerr << "patchstore: error: --tile-size is for --layout tiles (the layout is " << io.layout << ")\n";
    return 2;
  }
  if (!ParseShardFlag(a.shard_opt, a.shard, &io.shard_index, &io.shard_count)) return 2;
  io.skip_errors = a.on_error == "skip";
  io.isolate_decoders = !a.in_process;
  io.durable = !a.no_sync;
  io.command_line = a.command_line;
  return RunIngestCommand("samples", io.store, quiet, [&](const ProgressCallback& progress, const auto& cancelled) {
    io.progress = progress;
    io.cancelled = cancelled;
    return IngestImages(io);
  });
}

}  // namespace

Runner RegisterIngestImages(CLI::App* ingest, const bool* quiet, std::string command_line) {
  auto* images = ingest->add_subcommand("images", "Ingest PNG/JPEG/TIFF/OpenEXR frames")->fallthrough();
  auto args = std::make_shared<ImagesArgs>();
  args->command_line = std::move(command_line);
  ImageIngestOptions& io = args->options;
  images->add_option("STORE", io.store, "Store directory (created if missing)")->required();
  images->add_option("--manifest", io.manifest,
                     "CSV manifest: header id,<field>,...; cells are paths relative "
                     "to the manifest, PATH.exr:CHANNEL picks an EXR channel");
  images->add_option("--root", io.root, "Root folder searched with --field templates");
  images->add_option("--field", args->field_specs,
                     "NAME=TEMPLATE, e.g. rgb='{video}/render/rgb/{frame}.png'; the first field's matches define "
                     "the samples, ids join the placeholder values with '/'");
  images->add_option("--mask", io.mask_fields,
                     "Treat FIELD as a mask, stored as {0,1} (a field named 'mask' "
                     "always is)");
  images->add_option("--norm", args->norm_specs,
                     "FIELD=SPEC: none | symmetric (x/max*2-1, default for 8/16-bit) | unit (x/max) | binary | "
                     "affine:SCALE,OFFSET, optionally +clamp:LO,HI | range:LO,HI ([LO,HI] onto [-1,1], clamped)");
  images
      ->add_option("--layout", io.layout,
                   "rows (default: row-major records, zero-copy views of whole frames; best for stores in the page "
                   "cache) or tiles (every C,H,W field in TxT tiles: a random window of a store larger than RAM "
                   "reads a few contiguous ranges, at most (1+T/h)(1+T/w) of its bytes)")
      ->check(CLI::IsMember({"rows", "tiles"}));
  args->tile_size =
      images
          ->add_option("--tile-size", io.tile_size,
                       "T for --layout tiles: a multiple of 8 in 8..4096 (default: " +
                           std::to_string(kDefaultTileSize) +
                           " for a new store, a resumed store keeps its own; with 64 a 256x256 window reads ~5 "
                           "contiguous ranges per field, at most 1.56x its bytes; 32 suits windows of 128x128 and "
                           "smaller)")
          ->check(CLI::Range(8, 4096));
  images->add_option("--encoding", io.encoding,
                     "Record dtype (repeat): float32 (default: normalised float32) | compact (every field in the "
                     "smallest type holding its source exactly: uint8 for 8-bit PNG/JPEG/TIFF and masks, uint16 for "
                     "16-bit, float32 for EXR; readers still return the same float32, bit for bit) | FIELD=float32|"
                     "compact|float16 for one field (float16: normalised values rounded to nearest, relative error "
                     "<= 2^-11, absolute <= 2^-25 below 2^-14, beyond 65504 inf), e.g. --encoding compact "
                     "--encoding depth=float16");
  images->add_option("-j,--threads", io.threads, "Decoder threads (default: all cores)")->check(NonNegative());
  images
      ->add_option("--on-error", args->on_error,
                   "stop (default): stop at the first bad file, keeping what was "
                   "committed; skip: record failures in the report and go on")
      ->check(CLI::IsMember({"stop", "skip"}));
  images->add_option("--report", io.report_path,
                     "Where --on-error skip writes the failures of this run (default STORE/ingest-errors.tsv; a "
                     "run without failures removes it)");
  images
      ->add_option("--commit-every", io.batch_samples, "Commit after this many samples (default 256, or every 256 MiB)")
      ->check(CLI::Range(1, 1 << 30));
  images->add_flag("--in-process", args->in_process,
                   "Decode in this process instead of in isolated child processes (a hostile file can then "
                   "crash or stall the ingest)");
  images->add_option("--decode-timeout", io.decode_timeout_s, "Seconds one file may take to decode (default 60)")
      ->check(CLI::Range(0.1, 86400.0))
      ->check(FiniteNumber());
  images->add_flag("--no-sync", args->no_sync, "Do not fsync commits (faster; a crash may lose recent batches)");
  args->shard_opt =
      images->add_option("--shard", args->shard,
                         "I/N: ingest only shard I (0..N-1) of N: the samples whose id hashes to I (xxh3_64 of the id "
                         "mod N), into a store of their own; run N such ingests (any machines, at once) and read the "
                         "N stores as one");
  images->footer(
      "Examples:\n"
      "  patchstore ingest images frames.ps --manifest data/manifest.csv\n"
      "  patchstore ingest images frames.ps --root data \\\n"
      "      --field rgb='{video}/render/rgb/{frame}.png' \\\n"
      "      --field mask='{video}/render/masks/{frame}.png' \\\n"
      "      --field depth='{video}/render/depth/{frame}.exr'\n"
      "  for i in 0 1 2; do patchstore ingest images shards/frames-$i.ps --manifest data/manifest.csv \\\n"
      "      --shard $i/3 & done; wait                   # 3 shards in parallel\n"
      "  patchstore ingest images big.ps --manifest data/manifest.csv --layout tiles --encoding compact\n"
      "                                                   # a store larger than RAM: 8-bit fields in a quarter\n"
      "                                                   # of the bytes, windows read as a few contiguous ranges\n"
      "Running the same command again resumes: complete samples are skipped (with the same --encoding and\n"
      "--layout: a store keeps those of its first ingest).");
  AddIngestExitCodes(images, "samples");
  return [images, args, quiet]() -> int { return images->parsed() ? RunImages(*args, *quiet) : -1; };
}

}  // namespace patchstore::cli
