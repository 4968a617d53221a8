// patchstore/ingest/montage.h — pictures of what the sampler serves.
//
// RenderMontage draws a contact sheet of exactly the windows a loader (a
// LoaderKind: PatchSampler, BatchLoader or PatchDataset) built with the
// same SamplerOptions serves first in `epoch` (PatchSampler::ServedWindows,
// gathered by PatchSampler::GatherWindows as the loaders do), each tile
// labelled with its sample id and position, a mask field drawn as a
// translucent red overlay. RenderBoxes draws the windows that loader takes
// from one frame as rectangles on the whole frame. Samples without a
// qualifying window are skipped as the loaders skip them, and reported
// (Image8::warnings, PatchSampler::SkippedReport).
//
// Display mapping: integer-sourced fields invert their stored
// normalisation (as export does); float fields map [lo, hi] (window, or
// the tile's own finite range) to 0..255. A pixel with a non-finite value
// (NaN, +inf, -inf) in any displayed channel is drawn in kNonFiniteRgb,
// never as a value. The overlay field must be a mask (FieldMeta::is_mask);
// besides the translucent red, its edge is outlined white inside the mask
// and black just outside, so it shows on any image.
//
// Thread-safety: reentrant. Errors: as Reader and PatchSampler.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "patchstore/reader/sampler.h"
#include "patchstore/store/status.h"

namespace patchstore {

// The colour of non-finite values in montages and PNG export: magenta.
// (A gray field can never show it as a value.)
inline constexpr uint8_t kNonFiniteRgb[3] = {255, 0, 255};

// An 8-bit RGB image, row-major, height x width x 3.
struct Image8 {
  int height = 0, width = 0;
  std::vector<uint8_t> rgb;
  std::vector<Window> windows;        // the windows drawn (tiles, or boxes), in order
  std::vector<std::string> warnings;  // e.g. the sampler's SkippedReport
};

struct MontageOptions {
  std::string store;
  int count = 64;
  // The loader's options, as given to it: window size (patch_size or
  // patch_h x patch_w), k, require, min_valid, positive_fraction, policy,
  // seed, flips, ids/samples subset, rank/world_size. `fields` is ignored:
  // the montage gathers `field` (and `overlay`), which draws the same
  // windows (all fields of a sample have one size).
  SamplerOptions sampler;
  LoaderKind loader = LoaderKind::kSampler;  // whose order of windows is shown
  std::string field;                         // "" = the first field of the store
  std::string overlay;                       // mask field drawn over the tiles, "" = none
  bool require_overlay = true;               // use `overlay` as sampler.require when that is empty
  uint64_t epoch = 0;
  bool has_window = false;
  double window_lo = 0, window_hi = 1;
  int tile = 0;  // tile size in the sheet; 0 = min(patch_size, 256)
};

// Limits checked before any memory is taken: the sheet's pixels and the
// float32 windows gathered to draw it.
constexpr int64_t kMaxMontagePixels = int64_t{1} << 29;
constexpr int64_t kMaxMontageWindowBytes = int64_t{4} << 30;

// InvalidArgument naming the size and the limit when `options` (count,
// patch, tile, window) ask for more than the limits above; `values_per_window`
// is the channel count of one gathered window (all fields together).
Status CheckMontageSize(const MontageOptions& options, int64_t values_per_window);

// Errors: as Reader and PatchSampler; InvalidArgument from CheckMontageSize.
Result<Image8> RenderMontage(const MontageOptions& options);

// Draws the windows (at most `count`) that the loader (options as above)
// takes from sample `id` in `epoch` on the whole frame of `field`. A sample
// without a qualifying window gets no box and a warning in Image8::warnings.
// InvalidArgument for patches_per_sample outside 1..4096 (the CLI's -k once
// checked it; the option table leaves picture limits to the picture).
Result<Image8> RenderBoxes(const MontageOptions& options, const std::string& id);

// Encodes `image` as PNG at `path` (written atomically).
Status WritePng(const Image8& image, const std::string& path);

}  // namespace patchstore
