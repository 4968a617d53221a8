// `patchstore montage`: a contact sheet of exactly the windows the sampler
// serves for a seed, to look at what the model will be fed.
#include <cstdio>

#include <cmath>
#include <cstdlib>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/sampler_flags.h"
#include "cli/slice_flags.h"
#include "cli/validators.h"
#include "patchstore/ingest/montage.h"
#include "patchstore/ingest/volume_montage.h"
#include "patchstore/reader/reader.h"

namespace patchstore::cli {

namespace {

// `patchstore montage` on a volume store: what SliceDataset serves.
int RunVolumeMontage(const MontageOptions& m, const SliceFlags& slices, bool flip_independent,
                     const std::string& window, const std::string& out) {
  VolumeMontageOptions o;
  o.store = m.store;
  o.count = m.count;
  o.field = m.field;
  o.overlay = m.overlay;
  if (!ApplySliceFlags(slices, &o.slices)) return 2;
  if (flip_independent) o.slices.flip = SliceFlip::kIndependent;
  o.epoch = m.epoch;
  bool is_auto = true;
  if (!window.empty()) ParseWindow(window, &o.window_lo, &o.window_hi, &is_auto);
  o.has_window = !is_auto;
  o.tile = m.tile;
  auto r = RenderVolumeMontage(o);
  if (!r.ok()) {
    std::fprintf(stderr, "patchstore: error: %s\n", r.status().message().c_str());
    return 1;
  }
  if (!r->warning.empty()) std::fprintf(stderr, "patchstore: warning: %s\n", r->warning.c_str());
  Status st = WritePng(r->image, out);
  if (!st.ok()) {
    std::fprintf(stderr, "patchstore: error: %s\n", st.message().c_str());
    return 1;
  }
  std::printf("wrote %s (%dx%d): %zu slices of field '%s', window [%.6g, %.6g] in stored units%s\n", out.c_str(),
              r->image.width, r->image.height, r->items.size(), o.field.empty() ? "(first)" : o.field.c_str(),
              r->window_lo, r->window_hi, o.has_window ? "" : " (auto: 1st..99th percentile)");
  return 0;
}

}  // namespace

Runner RegisterMontage(CLI::App* app, const bool* quiet) {
  auto o = std::make_shared<MontageOptions>();
  auto out = std::make_shared<std::string>();
  auto window = std::make_shared<std::string>();
  auto flip_independent = std::make_shared<bool>(false);
  auto flags = std::make_shared<SamplerFlags>();
  auto slices = std::make_shared<SliceFlags>();
  auto no_require = std::make_shared<bool>(false);
  auto* cmd = app->add_subcommand("montage", "Contact sheet of the windows the sampler (image stores) or the slices "
                                             "SliceDataset (volume stores) serves (PNG)");
  cmd->add_option("STORE", o->store, kStoreOrSetHelp)->required();
  cmd->add_option("OUT", *out, "Output PNG file")->required();
  cmd->add_option("--count", o->count, "Number of windows (tiles)")->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("--field", o->field, "Field to show (default: the first field)");
  cmd->add_option("--overlay", o->overlay,
                  "Mask field drawn as a translucent red overlay; in image stores windows must hold at "
                  "least one of its pixels (as require=FIELD)");
  cmd->add_flag("--no-require", *no_require, "Do not require overlay pixels in the windows");
  // The slice table first: the flags both tables have take its spelling (--flip=independent).
  AddSliceFlags(cmd, slices.get(), "Volumes: ");
  AddSamplerFlags(cmd, flags.get(), "", /*ids=*/true, /*loader=*/true);
  cmd->add_option("--window", *window,
                  "LO,HI display range in stored units (after the ingest normalisation), or "
                  "auto: the 1st..99th percentile of the shown values (volumes; the default "
                  "there). Image stores: float fields; default each tile's range");
  cmd->add_flag("--flip-independent", *flip_independent, "Volumes: the same as --flip=independent");
  cmd->add_option("--tile", o->tile, "Tile size in pixels (default: min(patch, 256))")->check(CLI::Range(8, 4096));
  cmd->footer(
      "Examples:\n  patchstore montage frames.ps sheet.png --count 64 --patch 256 --field rgb --overlay mask\n"
      "  patchstore montage frames.ps depth.png --field depth --window 0,10 --seed 3\n"
      "  patchstore montage frames.ps pd.png --patch 128,256 --overlay mask --min-valid 0.1 --loader patchdataset\n"
      "  patchstore montage synthrad.ps ct.png --field CT --crop 256 --flip --rot90 --window -1,1\n"
      "  patchstore montage synthrad.ps mr.png --field MR --context MR=1,CT=0 --crop 128 --require MASK\n"
      "Image stores: the tiles are the first COUNT windows the --loader with these options serves in\n"
      "--epoch (sampler/batchloader: in permutation order; patchdataset: items 0, 1, ... in index order).\n"
      "Samples without a qualifying window are skipped as the loaders skip them, with a warning.\n"
      "Tiles are labelled '<id> y<row> x<col>', the top-left corner of the window in the frame.\n"
      "The overlay must be a mask field; its edge is outlined white inside, black outside.\n"
      "Non-finite values (NaN, +inf, -inf) are drawn magenta (255,0,255), never as a value.\n"
      "Volume stores: COUNT items spread evenly over the SliceDataset with these options (--crop,\n"
      "--context, --flip, --rot90, --seed, --require, --min-valid, --positive-fraction, --epoch, --ids),\n"
      "each the centre slice of its stack as the dataset serves it, labelled '<id> s<slice>' (v/h:\n"
      "flipped, rK: K quarter turns).");
  AddExitCodes(cmd, "0 sheet written, 1 failure (the message says why; no sheet written), 2 bad usage.");
  return [cmd, o, out, window, no_require, slices, flip_independent, flags]() -> int {
    if (!cmd->parsed()) return -1;
    double wlo = 0, whi = 1;
    bool wauto = false;
    if (!window->empty() && !ParseWindow(*window, &wlo, &whi, &wauto)) {
      std::fprintf(stderr,
                   "patchstore: error: --window: must be a finite number pair LO,HI with LO < HI, or auto (got '%s')\n",
                   window->c_str());
      return 2;
    }
    if (!window->empty() && !wauto) {
      o->has_window = true;
      o->window_lo = wlo;
      o->window_hi = whi;
    }
    o->require_overlay = !*no_require;
    if (out->size() < 4 || out->compare(out->size() - 4, 4, ".png") != 0) {
      std::fprintf(stderr, "patchstore: error: montage writes PNG: give an OUT file ending in .png (got '%s')\n",
                   out->c_str());
      return 2;
    }
    {
      auto reader = Reader::Open(o->store);
      if (reader.ok() && (*reader)->meta().kind == "volumes") {
        reader->reset();
        o->epoch = flags->epoch;
        return RunVolumeMontage(*o, *slices, *flip_independent, *window, *out);
      }
    }
    if (SliceOnlyFlagsGiven(*slices) || *flip_independent) {
      std::fprintf(stderr,
                   "patchstore: error: --crop, --context and --flip=independent (--flip-independent) are for "
                   "volume stores; '%s' holds images (windows: --patch H,W; flips: --flip)\n",
                   o->store.c_str());
      return 2;
    }
    if (!ApplySamplerFlags(*flags, &o->sampler, &o->loader, &o->epoch)) return 2;
    auto img = RenderMontage(*o);
    if (!img.ok()) {
      std::fprintf(stderr, "patchstore: error: %s\n", img.status().message().c_str());
      return 1;
    }
    Status st = WritePng(*img, *out);
    if (!st.ok()) {
      std::fprintf(stderr, "patchstore: error: %s\n", st.message().c_str());
      return 1;
    }
    std::vector<std::string> seen;
    PrintWarnings(img->warnings, &seen);
    std::printf("wrote %s (%dx%d): %lld windows served by the %s\n", out->c_str(), img->width, img->height,
                static_cast<long long>(img->windows.size()), LoaderKindName(o->loader));
    return 0;
  };
}

}  // namespace patchstore::cli
