// patchstore — the command-line program: ingest, inspect, verify, export.
//
// Exit codes: 0 success; 1 an operation failed (the message says which file,
// sample and cause); 2 bad usage; 3 `verify` found damaged records; 130
// ingest interrupted by Ctrl-C (committed samples kept; rerun to resume).
#include <CLI/CLI.hpp>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "cli/json.h"
#include "cli/progress.h"
#include "cli/sampler_flags.h"
#include "cli/shapes.h"
#include "cli/validators.h"
#include "patchstore/store/copy.h"
#include "patchstore/store/shard.h"
#include "patchstore/ingest/encoding.h"
#include "patchstore/ingest/ingest.h"
#include "patchstore/ingest/montage.h"
#include "patchstore/reader/reader.h"
#include "patchstore/reader/verify.h"
#include "patchstore/store/store.h"

namespace ps = patchstore;
using patchstore::cli::JsonString;

namespace {

// Printable form of an id for terminal output: control bytes escaped.
// " (mask)" and whether its block counts exist (FORMAT.md "Mask block
// counts"), for `info`; "" for other fields.
std::string MaskNote(const ps::FieldMeta& f) {
  if (!f.is_mask) return "";
  if (f.mask_blocks) return " (mask; block counts " + std::to_string(f.mask_blocks) + "x" + std::to_string(f.mask_blocks) + ")";
  if (f.channels == 1 && f.layout == ps::Layout::kCHW && !f.has_sat)
    return " (mask; no block counts: `patchstore upgrade` adds them)";
  return " (mask)";
}

std::string Printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}


// "3x1080x1920" -> [3, 1080, 1920]; "varies" or "-" -> null.
std::string JsonShape(const std::string& shape) {
  if (shape.empty() || shape.find_first_not_of("0123456789x") != std::string::npos) return "null";
  std::string out = "[";
  for (char c : shape) out += c == 'x' ? std::string(", ") : std::string(1, c);
  return out + "]";
}

// "R,G,B" -> ["R", "G", "B"].
std::string JsonList(const std::string& csv) {
  std::string out = "[";
  size_t start = 0;
  while (!csv.empty()) {
    size_t comma = csv.find(',', start);
    out += (start ? ", " : "") + JsonString(csv.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out + "]";
}

// The stores of a shard set named by `path`: a directory that is not a store
// itself but holds stores (sorted by name; the reader puts shards in shard
// order). Empty when `path` is a store or anything else. Staging folders of
// unfinished copies there are skipped and named on stderr (store/copy.h).
std::vector<std::string> StoresIn(const std::string& path) {
  std::vector<std::string> skipped;
  std::vector<std::string> out = ps::StoresInFolder(path, &skipped);
  if (!out.empty() && !skipped.empty())
    std::cerr << "patchstore: warning: " << ps::SkippedStagingWarning(path, skipped) << "\n";
  return out;
}

// A store, or a directory of shards read as one store.
ps::Result<std::shared_ptr<ps::Reader>> OpenStoreOrSet(const std::string& path) {
  std::vector<std::string> set = StoresIn(path);
  if (set.empty()) return ps::Reader::Open(path);
  return ps::Reader::OpenSet(set);
}

int Fail(const ps::Status& st) {
  std::cerr << "patchstore: error: " << st.message() << "\n";
  return 1;
}

std::string CommandLine(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) s += (i ? " " : "") + std::string(argv[i]);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"patchstore: decode images and volumes once into a float32 LMDB store, then read zero-copy "
               "patches from many processes."};
  app.set_version_flag("--version", std::string("patchstore ") + ps::ToolVersion());
  app.require_subcommand(1);
  app.footer("Exit codes: 0 success, 1 failure (the message names file, sample and cause), 2 bad usage, "
             "3 verify found damage, 130 interrupted (rerun to resume).\nRun 'patchstore SUBCOMMAND --help' for each subcommand.");
  bool quiet = false;
  app.add_flag("-q,--quiet", quiet, "No progress output");

  // ---- ingest images
  auto* ingest = app.add_subcommand("ingest", "Decode files once into a store");
  ingest->require_subcommand(1);
  ingest->footer("Run 'patchstore ingest images --help' (PNG, JPEG, TIFF, OpenEXR frames) or\n"
                 "'patchstore ingest hdf5 --help' (3D volumes in HDF5 groups).");
  auto* images = ingest->add_subcommand("images", "Ingest PNG/JPEG/TIFF/OpenEXR frames")->fallthrough();
  ps::ImageIngestOptions io;
  std::vector<std::string> field_specs, norm_specs;
  std::string on_error = "stop";
  bool no_sync = false;
  images->add_option("STORE", io.store, "Store directory (created if missing)")->required();
  images->add_option("--manifest", io.manifest, "CSV manifest: header id,<field>,...; cells are paths relative "
                                                "to the manifest, PATH.exr:CHANNEL picks an EXR channel");
  images->add_option("--root", io.root, "Root folder searched with --field templates");
  images->add_option("--field", field_specs,
                     "NAME=TEMPLATE, e.g. rgb='{video}/render/rgb/{frame}.png'; the first field's matches define "
                     "the samples, ids join the placeholder values with '/'");
  images->add_option("--mask", io.mask_fields, "Treat FIELD as a mask, stored as {0,1} (a field named 'mask' "
                                               "always is)");
  images->add_option("--norm", norm_specs,
                     "FIELD=SPEC: none | symmetric (x/max*2-1, default for 8/16-bit) | unit (x/max) | binary | "
                     "affine:SCALE,OFFSET, optionally +clamp:LO,HI | range:LO,HI ([LO,HI] onto [-1,1], clamped)");
  images->add_option("--layout", io.layout,
                     "rows (default: row-major records, zero-copy views of whole frames; best for stores in the page "
                     "cache) or tiles (every C,H,W field in TxT tiles: a random window of a store larger than RAM "
                     "reads a few contiguous ranges, at most (1+T/h)(1+T/w) of its bytes)")
      ->check(CLI::IsMember({"rows", "tiles"}));
  auto* tile_size_opt = images->add_option("--tile-size", io.tile_size,
                     "T for --layout tiles: a multiple of 8 in 8..4096 (default: " +
                         std::to_string(patchstore::kDefaultTileSize) +
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
  images->add_option("-j,--threads", io.threads, "Decoder threads (default: all cores)")
      ->check(ps::cli::NonNegative());
  images->add_option("--on-error", on_error, "stop (default): stop at the first bad file, keeping what was "
                                             "committed; skip: record failures in the report and go on")
      ->check(CLI::IsMember({"stop", "skip"}));
  images->add_option("--report", io.report_path, "Where --on-error skip writes failures (default "
                                                 "STORE/ingest-errors.tsv)");
  images->add_option("--commit-every", io.batch_samples,
                     "Commit after this many samples (default 256, or every 256 MiB)")
      ->check(CLI::Range(1, 1 << 30));
  bool in_process = false;
  images->add_flag("--in-process", in_process,
                   "Decode in this process instead of in isolated child processes (a hostile file can then "
                   "crash or stall the ingest)");
  images->add_option("--decode-timeout", io.decode_timeout_s, "Seconds one file may take to decode (default 60)")
      ->check(CLI::Range(0.1, 86400.0))
      ->check(ps::cli::FiniteNumber());
  images->add_flag("--no-sync", no_sync, "Do not fsync commits (faster; a crash may lose recent batches)");
  std::string image_shard;
  images->add_option("--shard", image_shard,
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
      "                                                   # a store larger than RAM: ~1/3 of the bytes, windows\n"
      "                                                   # read as a few contiguous ranges\n"
      "Running the same command again resumes: complete samples are skipped (with the same --encoding and\n"
      "--layout: a store keeps those of its first ingest).");

  auto run_hdf5 = ps::cli::RegisterIngestHdf5(ingest, &quiet);
  auto run_bench = ps::cli::RegisterBench(&app, &quiet);
  auto run_montage = ps::cli::RegisterMontage(&app, &quiet);
  auto run_copy = ps::cli::RegisterCopy(&app, &quiet);

  // ---- info / ls / verify
  auto* info = app.add_subcommand("info", "Describe a store: fields, shapes, samples, bytes, sealed");
  std::string info_store;
  bool info_json = false;
  info->add_option("STORE", info_store, "Store directory, or a directory of shards (read as one store)")->required();
  info->add_flag("--json", info_json, "Machine-readable output");
  bool info_all = false;
  info->add_flag("--all", info_all, "Also list every sample's shapes, e.g. each volume's (S,H,W)");

  auto* ls = app.add_subcommand("ls", "List sample ids (one per line, in index order); --json: ids with each "
                                      "sample's shapes");
  std::string ls_store;
  bool ls_json = false;
  ls->add_option("STORE", ls_store, "Store directory, or a directory of shards (read as one store)")->required();
  ls->add_flag("--json", ls_json, "Machine-readable output: [{\"id\": ID, \"shapes\": {FIELD: [dims]}}, ...]");

  auto* verify = app.add_subcommand("verify", "Recompute every checksum; exit 3 and name each damaged record");
  std::string verify_store;
  bool verify_json = false;
  verify->add_option("STORE", verify_store,
                     "Store directory, or a directory of shards (every shard is verified, and the set checked: "
                     "each shard once, no id in two shards)")
      ->required();
  verify->add_flag("--json", verify_json, "Machine-readable output");

  auto* upgrade = app.add_subcommand("upgrade", "Bring a store written by an older patchstore to the current "
                                                "format, in place (records are kept)");
  std::string upgrade_store;
  upgrade->add_option("STORE", upgrade_store, "Store directory")->required();
  upgrade->footer("Format 1 -> 2 adds the sample index (shapes, mask counts) that lets open, info, ls and "
                  "samplers\nwork without reading records. Mask fields written before mask block counts existed "
                  "get them\n(FORMAT.md \"Mask block counts\"): samplers then decide candidate windows of stores "
                  "larger than\nRAM without reading masks. The format step is one transaction; block counts are "
                  "written in\ntransactions of 1,024 samples and used only once all are there. Interrupted "
                  "(Ctrl-C stops\nafter the current transaction), an upgrade leaves the store readable as "
                  "before; run it\nagain to finish (verify names such a store as one of an interrupted upgrade). A mask field "
                  "that has block\ncounts but lacks some of their records gets them all rewritten. The store is "
                  "then opened as\nreaders open it: one that does not open is reported (exit 1), never called up "
                  "to date.\nReopen readers of the store afterwards.");

  // ---- export
  auto* exp = app.add_subcommand("export", "Write records back to images: OUTDIR/<id>/<field>.<ext>");
  ps::ExportOptions eo;
  std::string window;
  exp->add_option("STORE", eo.store, "Store directory")->required();
  exp->add_option("OUTDIR", eo.outdir, "Output folder (created if missing)")->required();
  exp->add_option("--id", eo.ids, "Sample ids to export (default: all)");
  exp->add_option("--field", eo.fields, "Fields to export (default: all)");
  exp->add_option("--format", eo.format, "Images: png or exr (default: png for 8/16-bit sources, exr for float). "
                  "Volumes: png (default; OUTDIR/<id>/<field>/<slice:04>.png, 8-bit) or h5 (OUTDIR/volumes.h5)")
      ->check(CLI::IsMember({"png", "exr", "h5"}));
  exp->add_option("--axis-order", eo.axis_order, "Volumes as h5: source (default: slice axis back where it was in "
                  "the HDF5 input) or shw (slices first, as stored)")->check(CLI::IsMember({"source", "shw"}));
  exp->add_option("--window", window, "LO,HI in stored units (after the ingest normalisation: a CT stored with "
                                     "range:-1024,3000 holds -1..1) mapped to the PNG range, or auto (each record's "
                                     "1st..99th percentile). Float data; volume slices default to each volume's "
                                     "min..max");
  bool boxes = false;
  ps::MontageOptions bo;
  ps::cli::SamplerFlags box_flags;
  exp->add_flag("--boxes", boxes, "Instead of the records, draw the windows the --loader takes from each frame "
                                  "(OUTDIR/<id>/boxes.png)");
  exp->add_option("--overlay", bo.overlay, "With --boxes: mask field to overlay and require");
  ps::cli::AddSamplerFlags(exp, &box_flags, "With --boxes: ", /*ids=*/false);
  exp->footer("PNG output inverts the stored normalisation: an 8/16-bit PNG ingested and exported is "
              "pixel-identical.\nEXR output is float32, bit-exact. Ids become folders; unsafe bytes are "
              "percent-encoded.\nIn PNG output, non-finite values (NaN, +inf, -inf) are magenta (255,0,255), never "
              "a value;\na gray image or slice holding any is written as RGB.");

  // Examples for the top level only (set last: subcommands copy the footer when they are created).
  app.footer(app.get_footer() + "\n" +
             "Examples:\n"
             "  patchstore ingest images frames.ps --root data --field rgb='{video}/render/rgb/{frame}.png' \\\n"
             "      --field mask='{video}/render/masks/{frame}.png' --field depth='{video}/render/depth/{frame}.exr'\n"
             "  patchstore ingest hdf5 synthrad.h5 synthrad.ps --group MR --group CT --group MASK\n"
             "  patchstore info frames.ps\n"
             "  patchstore montage frames.ps sheet.png --count 64 --patch 256 --field rgb --overlay mask\n"
             "  patchstore verify frames.ps\n"
             "  patchstore export frames.ps out/ --id video01/0001");
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

  if (int rc = run_hdf5(); rc >= 0) return rc;
  if (int rc = run_bench(); rc >= 0) return rc;
  if (int rc = run_montage(); rc >= 0) return rc;
  if (int rc = run_copy(); rc >= 0) return rc;

  if (images->parsed()) {
    for (const std::string& f : field_specs) {
      size_t eq = f.find('=');
      if (eq == std::string::npos || eq == 0) {
        std::cerr << "patchstore: error: --field takes NAME=TEMPLATE, got '" << f << "'\n";
        return 2;
      }
      io.field_templates.emplace_back(f.substr(0, eq), f.substr(eq + 1));
    }
    for (const std::string& n : norm_specs) {
      size_t eq = n.find('=');
      if (eq == std::string::npos || eq == 0) {
        std::cerr << "patchstore: error: --norm takes FIELD=SPEC, got '" << n << "'\n";
        return 2;
      }
      io.norm[n.substr(0, eq)] = n.substr(eq + 1);
    }
    if (io.manifest.empty() == io.root.empty()) {
      std::cerr << "patchstore: error: give either --manifest FILE or --root DIR with --field templates\n";
      return 2;
    }
    if (!io.root.empty() && io.field_templates.empty()) {
      std::cerr << "patchstore: error: --root needs at least one --field NAME=TEMPLATE\n";
      return 2;
    }
    if (tile_size_opt->count() > 0 && io.layout != "tiles") {
      std::cerr << "patchstore: error: --tile-size is for --layout tiles (the layout is " << io.layout << ")\n";
      return 2;
    }
    if (!image_shard.empty()) {
      ps::Status st = ps::ParseShardSpec(image_shard, &io.shard_index, &io.shard_count);
      if (!st.ok()) {
        std::cerr << "patchstore: error: --" << st.message() << "\n";
        return 2;
      }
    }
    io.skip_errors = on_error == "skip";
    io.isolate_decoders = !in_process;
    io.durable = !no_sync;
    io.command_line = CommandLine(argc, argv);
    ps::cli::ProgressPrinter printer("ingest", "samples", quiet);
    io.progress = [&](const ps::Progress& p) { printer(p); };
    // Keep large freed blocks in the heap for reuse: LMDB allocates each
    // record's pages with malloc, and fresh pages cost more than the copy.
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    io.cancelled = [] { return ps::cli::Interrupted(); };
    ps::cli::InstallInterruptHandler();
    auto r = ps::IngestImages(io);
    if (!r.ok() && r.status().code() == ps::Code::kAborted) {
      std::cerr << "patchstore: interrupted: " << r.status().message()
                << "\nrun the same command again to resume\n";
      return 130;
    }
    if (!r.ok()) return Fail(r.status());
    const ps::IngestSummary& s = *r;
    std::printf("ingested %llu new samples (%llu already present, %llu failed) of %llu into '%s'\n",
                static_cast<unsigned long long>(s.samples_written),
                static_cast<unsigned long long>(s.samples_present),
                static_cast<unsigned long long>(s.samples_failed),
                static_cast<unsigned long long>(s.samples_total), io.store.c_str());
    std::printf("wrote %s of records in %.2f s (%.0f MB/s decoded)\n", ps::cli::HumanBytes(s.bytes_written).c_str(),
                s.seconds, s.seconds > 0 ? s.bytes_decoded / s.seconds / 1e6 : 0.0);
    if (s.samples_failed && !s.report_error.empty()) {
      // Never claim a report that was not written: list what failed, exit 1.
      for (size_t i = 0; i < s.errors.size(); ++i) std::fprintf(stderr, "  %s\n", s.errors[i].c_str());
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

  if (info->parsed()) {
    auto r = OpenStoreOrSet(info_store);
    if (!r.ok()) return Fail(r.status());
    const auto& reader = *r;
    const ps::StoreMeta& m = reader->meta();
    // Shapes: per field, the shape shared by all samples or "varies".
    std::vector<std::string> shapes(m.fields.size());
    // Per mask field: samples whose mask has no valid pixel (no sampler can
    // draw a masked window from them; loaders skip and report them).
    std::vector<uint64_t> empty_masks(m.fields.size(), 0);
    std::vector<std::string> first_empty(m.fields.size());
    uint64_t payload = 0;
    for (int f = 0; f < reader->field_count(); ++f) {
      std::string shape;
      bool varies = false;
      for (uint64_t s = 0; s < reader->size(); ++s) {
        auto h = reader->Summary(s, f);  // the sample index: no record is read
        if (!h.ok()) continue;
        payload += h->payload_bytes();
        if (h->has_valid_count && h->valid_count == 0 && ++empty_masks[f] == 1) first_empty[f] = std::string(reader->id(s));
        std::string sh;
        for (int d = 0; d < h->rank; ++d) sh += (d ? "x" : "") + std::to_string(h->shape[d]);
        if (shape.empty()) shape = sh;
        else if (sh != shape) varies = true;
      }
      shapes[f] = varies ? "varies" : shape.empty() ? "-" : shape;
    }
    if (info_json) {
      std::ostringstream os;
      os << "{\"path\": " << JsonString(info_store) << ", \"format_version\": " << m.format_version
         << ", \"tool_version\": " << JsonString(m.tool_version) << ", \"kind\": " << JsonString(m.kind)
         << ", \"sealed\": " << (m.sealed ? "true" : "false") << ", \"samples\": " << reader->size()
         << ", \"payload_bytes\": " << payload << ", \"fields\": [";
      for (size_t f = 0; f < m.fields.size(); ++f) {
        const auto& fm = m.fields[f];
        os << (f ? ", " : "") << "{\"name\": " << JsonString(fm.name) << ", \"channels\": " << fm.channels
           << ", \"shape\": " << JsonShape(shapes[f]) << ", \"source_type\": "
           << JsonString(ps::SourceTypeName(fm.source_type)) << ", \"source_format\": "
           << JsonString(fm.source_format) << ", \"normalisation\": " << JsonString(fm.norm.ToString())
           << ", \"channel_names\": " << JsonList(fm.channel_names) << ", \"mask\": "
           << (fm.is_mask ? "true" : "false") << ", \"dtype\": " << JsonString(ps::DTypeName(fm.dtype))
           << ", \"layout\": " << JsonString(fm.tile ? "tiles" : "rows") << ", \"tile_size\": " << fm.tile;
        if (fm.is_mask) os << ", \"empty_masks\": " << empty_masks[f] << ", \"mask_blocks\": " << fm.mask_blocks;
        os << ", \"shape_range\": " << ps::cli::ShapeRangeJson(ps::cli::FieldShapeRange(*reader, static_cast<int>(f)))
           << "}";
      }
      os << "]";
      if (info_all) {
        os << ", \"sample_shapes\": [";
        for (uint64_t i = 0; i < reader->size(); ++i)
          os << (i ? ", " : "") << "{\"id\": " << JsonString(reader->id(i))
             << ", \"shapes\": " << ps::cli::SampleShapesJson(*reader, i, JsonString) << "}";
        os << "]";
      }
      os << "}";
      std::cout << os.str() << "\n";
    } else {
      std::printf("store:          %s\n", info_store.c_str());
      std::printf("format version: %u (written by patchstore %s)\n", m.format_version, m.tool_version.c_str());
      std::printf("kind:           %s\n", m.kind.c_str());
      std::printf("sealed:         %s\n", m.sealed ? "yes" : "no (ingest unfinished or failed)");
      std::printf("samples:        %llu\n", static_cast<unsigned long long>(reader->size()));
      if (reader->store_count() > 1) {
        std::printf("stores:         %zu, read as one (samples in this order):\n", reader->store_count());
        for (size_t i = 0; i < reader->store_count(); ++i) {
          auto snap_meta = reader->store_begin(i + 1) - reader->store_begin(i);
          std::printf("  %s: %llu samples\n", reader->store_path(i).c_str(), static_cast<unsigned long long>(snap_meta));
        }
      }
      std::printf("record bytes:   %s\n", ps::cli::HumanBytes(static_cast<double>(payload)).c_str());
      std::printf("fields:\n");
      for (size_t f = 0; f < m.fields.size(); ++f) {
        const auto& fm = m.fields[f];
        const std::string layout = fm.tile ? "tiles " + std::to_string(fm.tile) : std::string("rows");
        std::printf("  %-10s C=%u shape=%s dtype=%s layout=%s source=%s %s norm=%s channels=%s%s\n", fm.name.c_str(),
                    fm.channels, shapes[f].c_str(), ps::DTypeName(fm.dtype), layout.c_str(),
                    fm.source_format.c_str(), ps::SourceTypeName(fm.source_type), fm.norm.ToString().c_str(),
                    fm.channel_names.c_str(), MaskNote(fm).c_str());
        if (shapes[f] == "varies")
          std::printf("  %-10s shapes: %s%s\n", "", ps::cli::ShapeRangeText(
                          ps::cli::FieldShapeRange(*reader, static_cast<int>(f)), m.kind == "volumes").c_str(),
                      info_all ? "" : "; --all lists each sample");
        if (empty_masks[f] > 0)
          std::printf("  %-10s %llu sample(s) with no valid pixel (first: '%s'): samplers with require=%s skip them\n",
                      "", static_cast<unsigned long long>(empty_masks[f]), Printable(first_empty[f]).c_str(),
                      fm.name.c_str());
      }
      if (info_all) {
        std::printf("samples (%s):\n", m.kind == "volumes" ? "S x H x W per field" : "C x H x W per field");
        for (uint64_t i = 0; i < reader->size(); ++i)
          std::printf("  %s: %s\n", Printable(reader->id(i)).c_str(), ps::cli::SampleShapesText(*reader, i).c_str());
      }
    }
    return 0;
  }

  if (ls->parsed()) {
    auto r = OpenStoreOrSet(ls_store);
    if (!r.ok()) return Fail(r.status());
    const auto& reader = *r;
    if (ls_json) {
      std::cout << "[";
      for (uint64_t i = 0; i < reader->size(); ++i)
        std::cout << (i ? ", " : "") << "{\"id\": " << JsonString(reader->id(i))
                  << ", \"shapes\": " << ps::cli::SampleShapesJson(*reader, i, JsonString) << "}";
      std::cout << "]\n";
    } else {
      for (uint64_t i = 0; i < reader->size(); ++i) std::cout << Printable(reader->id(i)) << "\n";
    }
    return 0;
  }

  if (verify->parsed()) {
    std::vector<std::string> set = StoresIn(verify_store);
    ps::Result<ps::VerifyReport> r = ps::Status::Internal("not verified");
    if (set.empty()) {
      r = ps::VerifyStore(verify_store);
    } else {
      // The set first (each shard once, ids unique), then every store; a
      // problem names its store.
      auto whole = ps::Reader::OpenSet(set);
      if (!whole.ok()) return Fail(whole.status());
      ps::VerifyReport all;
      for (size_t i = 0; i < (*whole)->store_count(); ++i) {
        const std::string& store = (*whole)->store_path(i);
        auto one = ps::VerifyStore(store);
        if (!one.ok()) return Fail(one.status().WithContext("verifying shard '" + store + "'"));
        all.samples += one->samples;
        all.records += one->records;
        all.bytes += one->bytes;
        for (ps::VerifyProblem p : one->problems) {
          p.message = "in '" + store + "': " + p.message;
          all.problems.push_back(std::move(p));
        }
      }
      r = std::move(all);
    }
    if (!r.ok()) return Fail(r.status());
    const ps::VerifyReport& rep = *r;
    if (verify_json) {
      std::cout << "{\"ok\": " << (rep.ok() ? "true" : "false") << ", \"samples\": " << rep.samples
                << ", \"records\": " << rep.records << ", \"bytes\": " << rep.bytes << ", \"problems\": [";
      for (size_t i = 0; i < rep.problems.size(); ++i)
        std::cout << (i ? ", " : "") << "{\"id\": " << JsonString(rep.problems[i].id)
                  << ", \"field\": " << JsonString(rep.problems[i].field)
                  << ", \"message\": " << JsonString(rep.problems[i].message) << "}";
      std::cout << "]}\n";
    } else {
      for (const auto& p : rep.problems)
        std::printf("BAD  '%s' field '%s': %s\n", Printable(p.id).c_str(), Printable(p.field).c_str(),
                    p.message.c_str());
      std::printf("%s: %llu samples, %llu records, %s checked, %zu problem%s\n", rep.ok() ? "OK" : "DAMAGED",
                  static_cast<unsigned long long>(rep.samples), static_cast<unsigned long long>(rep.records),
                  ps::cli::HumanBytes(static_cast<double>(rep.bytes)).c_str(), rep.problems.size(),
                  rep.problems.size() == 1 ? "" : "s");
    }
    return rep.ok() ? 0 : 3;
  }

  if (upgrade->parsed()) {
    auto r = ps::UpgradeStore(upgrade_store);
    if (!r.ok()) return Fail(r.status());
    if (*r != ps::kStoreFormatVersion)
      std::printf("upgraded '%s' from store format %u to %u\n", upgrade_store.c_str(), *r, ps::kStoreFormatVersion);
    ps::cli::ProgressPrinter printer("upgrade: mask block counts", "samples", quiet, /*counts_only=*/true);
    const auto t0 = std::chrono::steady_clock::now();
    ps::cli::InstallInterruptHandler();  // Ctrl-C: stop after the current transaction
    bool interrupted_before = false;
    if (auto snap = ps::Snapshot::Open(upgrade_store); snap.ok())
      interrupted_before = (*snap)->meta().attributes.count(ps::kUpgradingAttribute) > 0;
    std::vector<ps::MaskBlocksGap> gaps;
    auto blocks = ps::AddMaskBlocks(
        upgrade_store,
        [&](uint64_t done, uint64_t total) {
          ps::Progress p;
          p.done = done;
          p.total = total;
          p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          printer(p);
          return !ps::cli::Interrupted();
        },
        ps::kAddMaskBlocksBatch, &gaps);
    for (const ps::MaskBlocksGap& g : gaps)
      std::fprintf(stderr, "upgrade: field '%s' of '%s' has mask block counts, but %llu sample%s lack%s them (first: "
                           "'%s'; deleted records or a damaged store): rewriting them all\n",
                   g.field.c_str(), upgrade_store.c_str(), static_cast<unsigned long long>(g.samples),
                   g.samples == 1 ? "" : "s", g.samples == 1 ? "s" : "", Printable(g.first_id).c_str());
    if (!blocks.ok()) return Fail(blocks.status());
    if (interrupted_before && !blocks->empty())
      std::printf("finished the interrupted upgrade of '%s'\n", upgrade_store.c_str());
    for (const std::string& f : *blocks)
      std::printf("%s mask block counts %s field '%s' of '%s'\n",
                  std::any_of(gaps.begin(), gaps.end(), [&](const ps::MaskBlocksGap& g) { return g.field == f; })
                      ? "rewrote the"
                      : "added",
                  std::any_of(gaps.begin(), gaps.end(), [&](const ps::MaskBlocksGap& g) { return g.field == f; })
                      ? "of"
                      : "to",
                  f.c_str(), upgrade_store.c_str());
    // Upgraded or not, the store must open as readers open it.
    if (auto opened = ps::Reader::Open(upgrade_store); !opened.ok()) {
      std::cerr << "patchstore: error: '" << upgrade_store << "' does not open after the upgrade: "
                << opened.status().message() << " (run 'patchstore verify " << upgrade_store << "')\n";
      return 1;
    }
    if (*r == ps::kStoreFormatVersion && blocks->empty())
      std::printf("'%s' is up to date (store format %u; every mask field has block counts): nothing to do\n",
                  upgrade_store.c_str(), ps::kStoreFormatVersion);
    return 0;
  }

  if (exp->parsed()) {
    if (!window.empty()) {
      bool is_auto = false;
      if (!ps::cli::ParseWindow(window, &eo.window_lo, &eo.window_hi, &is_auto)) {
        std::cerr << "patchstore: error: --window: must be a finite number pair LO,HI with LO < HI, or auto (got '" << window << "')\n";
        return 2;
      }
      eo.has_window = !is_auto;
      eo.window_auto = is_auto;
    }
    if (boxes) {
      if (auto kind = ps::Reader::Open(eo.store); kind.ok() && (*kind)->meta().kind == "volumes") {
        std::cerr << "patchstore: error: export --boxes draws the sampler's windows on the frames of an image "
                     "store; '" << eo.store << "' holds volumes: see what SliceDataset serves with 'patchstore "
                     "montage " << eo.store << " OUT.png [--crop N --flip --rot90 --field F]'\n";
        return 2;
      }
      bo.store = eo.store;
      bo.field = eo.fields.empty() ? "" : eo.fields[0];
      bo.count = 4096;
      if (!ps::cli::ApplySamplerFlags(box_flags, &bo)) return 2;
      std::vector<std::string> ids = eo.ids;
      if (ids.empty()) {
        auto r = ps::Reader::Open(eo.store);
        if (!r.ok()) return Fail(r.status());
        for (uint64_t i = 0; i < (*r)->size(); ++i) ids.emplace_back((*r)->id(i));
      }
      std::vector<std::string> seen;
      int64_t drawn = 0;
      size_t without = 0;
      for (const std::string& id : ids) {
        auto img = ps::RenderBoxes(bo, id);
        if (!img.ok()) return Fail(img.status());
        drawn += static_cast<int64_t>(img->windows.size());
        if (img->windows.empty()) ++without;
        ps::cli::PrintWarnings(img->warnings, &seen);  // the sampler's skip report, once
        const std::string dir = eo.outdir + "/" + ps::SafeRelativePath(id);
        std::error_code ec;
        std::filesystem::create_directories(dir, ec);
        ps::Status st = ps::WritePng(*img, dir + "/boxes.png");
        if (!st.ok()) return Fail(st);
      }
      std::printf("drew %lld windows served by the %s on %zu frames in '%s'%s\n", static_cast<long long>(drawn),
                  ps::LoaderKindName(bo.loader), ids.size() - without, eo.outdir.c_str(),
                  without ? (" (" + std::to_string(without) + " frames have none: boxes.png shows the frame "
                             "alone)").c_str() : "");
      return 0;
    }
    auto r = ps::Export(eo);
    if (!r.ok()) return Fail(r.status());
    for (const std::string& w : r->warnings) std::cerr << "patchstore: warning: " << w << "\n";
    std::printf("exported %llu files (%s) to '%s'\n", static_cast<unsigned long long>(r->files_written),
                ps::cli::HumanBytes(static_cast<double>(r->bytes_written)).c_str(), eo.outdir.c_str());
    return 0;
  }
  return 2;
}
