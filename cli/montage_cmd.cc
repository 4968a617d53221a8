// `patchstore montage`: a contact sheet of exactly the windows the sampler
// serves for a seed, to look at what the model will be fed.
#include <cstdio>

#include "cli/commands.h"
#include "cli/validators.h"
#include "ingest/montage.h"

namespace patchstore::cli {

Runner RegisterMontage(CLI::App* app, const bool* quiet) {
  auto o = std::make_shared<MontageOptions>();
  auto out = std::make_shared<std::string>();
  auto window = std::make_shared<std::vector<double>>();
  auto no_require = std::make_shared<bool>(false);
  auto* cmd = app->add_subcommand("montage", "Contact sheet of the windows the sampler serves (PNG)");
  cmd->add_option("STORE", o->store)->required();
  cmd->add_option("OUT", *out, "Output PNG file")->required();
  cmd->add_option("--count", o->count, "Number of windows (tiles)")->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("--patch", o->patch_size, "Window size P (P x P)")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--field", o->field, "Field to show (default: the first field)");
  cmd->add_option("--overlay", o->overlay, "Mask field drawn as a translucent red overlay; windows must hold at "
                                           "least one of its pixels (as require=FIELD)");
  cmd->add_flag("--no-require", *no_require, "Do not require overlay pixels in the windows");
  cmd->add_option("--require", o->require, "Mask field the windows must hit (default: --overlay)");
  cmd->add_option("-k,--patches-per-sample", o->patches_per_sample, "Windows per sample visit")->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--seed", o->seed, "Sampler seed (the same seed gives the same windows as in training)")->capture_default_str();
  cmd->add_option("--epoch", o->epoch, "Sampler epoch");
  cmd->add_flag("--flip", o->flip, "Random flips, as the sampler's flip=True");
  cmd->add_flag("--rot90", o->rot90, "Random quarter turns, as the sampler's rot90=True");
  cmd->add_option("--window", *window, "LO,HI display range for float fields (default: each tile's range)")
      ->delimiter(',')->expected(2)->check(FiniteNumber());
  cmd->add_option("--tile", o->tile, "Tile size in pixels (default: min(patch, 256))")->check(CLI::Range(8, 4096));
  cmd->footer("Examples:\n  patchstore montage frames.ps sheet.png --count 64 --patch 256 --field rgb --overlay mask\n"
              "  patchstore montage frames.ps depth.png --field depth --window 0,10 --seed 3\n"
              "Tiles are labelled '<id> y<row> x<col>', the top-left corner of the window in the frame.");
  return [cmd, o, out, window, no_require]() -> int {
    if (!cmd->parsed()) return -1;
    if (window->size() == 2) {
      o->has_window = true;
      o->window_lo = (*window)[0];
      o->window_hi = (*window)[1];
    }
    o->require_overlay = !*no_require;
    if (out->size() < 4 || out->compare(out->size() - 4, 4, ".png") != 0) {
      std::fprintf(stderr, "patchstore: error: montage writes PNG: give an OUT file ending in .png (got '%s')\n",
                   out->c_str());
      return 2;
    }
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
    std::printf("wrote %s (%dx%d)\n", out->c_str(), img->width, img->height);
    return 0;
  };
}

}  // namespace patchstore::cli
