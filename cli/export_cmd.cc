// `patchstore export STORE OUTDIR` — records back to image files (PNG, EXR)
// or volumes to HDF5; with --boxes, the windows a loader takes from each frame.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/progress.h"
#include "cli/sampler_flags.h"
#include "patchstore/ingest/ingest.h"
#include "patchstore/ingest/montage.h"
#include "patchstore/reader/reader.h"

namespace patchstore::cli {
namespace {

struct ExportArgs {
  ExportOptions export_options;
  std::string window;
  bool boxes = false;
  MontageOptions box_options;
  SamplerFlags box_flags;
};

// --boxes: OUTDIR/<id>/boxes.png for each frame.
int RunBoxes(ExportArgs& a) {
  const ExportOptions& eo = a.export_options;
  MontageOptions& bo = a.box_options;
  if (auto kind = Reader::Open(eo.store); kind.ok() && (*kind)->meta().kind == "volumes") {
    std::cerr << "patchstore: error: export --boxes draws the sampler's windows on the frames of an image "
                 "store; '"
              << eo.store
              << "' holds volumes: see what SliceDataset serves with 'patchstore "
                 "montage "
              << eo.store << " OUT.png [--crop N --flip --rot90 --field F]'\n";
    return 2;
  }
  bo.store = eo.store;
  bo.field = eo.fields.empty() ? "" : eo.fields[0];
  bo.count = 4096;
  if (!ApplySamplerFlags(a.box_flags, &bo.sampler, &bo.loader, &bo.epoch)) return 2;
  std::vector<std::string> ids = eo.ids;
  if (ids.empty()) {
    auto r = Reader::Open(eo.store);
    if (!r.ok()) return Fail(r.status());
    for (uint64_t i = 0; i < (*r)->size(); ++i) ids.emplace_back((*r)->id(i));
  }
  std::vector<std::string> seen;
  int64_t drawn = 0;
  size_t without = 0;
  for (const std::string& id : ids) {
    auto img = RenderBoxes(bo, id);
    if (!img.ok()) return Fail(img.status());
    drawn += static_cast<int64_t>(img->windows.size());
    if (img->windows.empty()) ++without;
    PrintWarnings(img->warnings, &seen);  // the sampler's skip report, once
    const std::string dir = eo.outdir + "/" + SafeRelativePath(id);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    Status st = WritePng(*img, dir + "/boxes.png");
    if (!st.ok()) return Fail(st);
  }
  std::printf("drew %lld window%s served by the %s on %zu frames in '%s'%s\n", static_cast<long long>(drawn),
              drawn == 1 ? "" : "s", LoaderKindName(bo.loader), ids.size() - without, eo.outdir.c_str(),
              without ? (" (" + std::to_string(without) +
                         " frames have none: boxes.png shows the frame "
                         "alone)")
                            .c_str()
                      : "");
  return 0;
}

int RunExport(ExportArgs& a) {
  ExportOptions& eo = a.export_options;
  if (!a.window.empty()) {
    bool is_auto = false;
    if (!ParseWindow(a.window, &eo.window_lo, &eo.window_hi, &is_auto)) {
      std::cerr << "patchstore: error: --window: must be a finite number pair LO,HI with LO < HI, or auto (got '"
                << a.window << "')\n";
      return 2;
    }
    eo.has_window = !is_auto;
    eo.window_auto = is_auto;
  }
  if (a.boxes) return RunBoxes(a);
  auto r = Export(eo);
  if (!r.ok()) return Fail(r.status());
  for (const std::string& w : r->warnings) std::cerr << "patchstore: warning: " << w << "\n";
  std::printf("exported %llu files (%s) to '%s'\n", static_cast<unsigned long long>(r->files_written),
              HumanBytes(static_cast<double>(r->bytes_written)).c_str(), eo.outdir.c_str());
  return 0;
}

}  // namespace

Runner RegisterExport(CLI::App* app, const bool* /*quiet*/) {
  auto* exp = app->add_subcommand("export", "Write records back to images: OUTDIR/<id>/<field>.<ext>");
  auto args = std::make_shared<ExportArgs>();
  ExportOptions& eo = args->export_options;
  exp->add_option("STORE", eo.store, "Store directory")->required();
  exp->add_option("OUTDIR", eo.outdir, "Output folder (created if missing)")->required();
  exp->add_option("--id", eo.ids, "Sample ids to export (default: all)");
  exp->add_option("--field", eo.fields, "Fields to export (default: all)");
  exp->add_option("--format", eo.format,
                  "Images: png or exr (default: png for 8/16-bit sources, exr for float). "
                  "Volumes: png (default; OUTDIR/<id>/<field>/<slice:04>.png, 8-bit), h5 (OUTDIR/volumes.h5), "
                  "nifti (OUTDIR/<id>/<field>.nii.gz) or mha (OUTDIR/<id>/<field>.mha): float32, the stored values "
                  "voxel for voxel, with the stored geometry (NIfTI and MetaImage need a build with ITK)")
      ->check(CLI::IsMember({"png", "exr", "h5", "nifti", "mha"}));
  exp->add_option("--axis-order", eo.axis_order,
                  "Volumes as h5: source (default: slice axis back where it was in "
                  "the HDF5 input) or shw (slices first, as stored)")
      ->check(CLI::IsMember({"source", "shw"}));
  exp->add_option("--window", args->window,
                  "LO,HI in stored units (after the ingest normalisation: a CT stored with "
                  "range:-1024,3000 holds -1..1) mapped to the PNG range, or auto (each "
                  "record's 1st..99th percentile). Float data; volume slices default to "
                  "each volume's min..max");
  exp->add_flag("--boxes", args->boxes,
                "Instead of the records, draw the windows the --loader takes from each frame "
                "(OUTDIR/<id>/boxes.png)");
  exp->add_option("--overlay", args->box_options.overlay, "With --boxes: mask field to overlay and require");
  AddSamplerFlags(exp, &args->box_flags, "With --boxes: ", /*ids=*/false, /*loader=*/true);
  exp->footer("PNG output inverts the stored normalisation: an 8/16-bit PNG ingested and exported is "
              "pixel-identical.\nEXR output is float32, bit-exact. Ids become folders; unsafe bytes are "
              "percent-encoded.\nIn PNG output, non-finite values (NaN, +inf, -inf) are magenta (255,0,255), never "
              "a value;\na gray image or slice holding any is written as RGB.");
  AddExitCodes(exp, "0 written, 1 failure (the message names the sample and file), 2 bad usage.");
  return [exp, args]() -> int { return exp->parsed() ? RunExport(*args) : -1; };
}

}  // namespace patchstore::cli
