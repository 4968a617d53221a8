// patchstore/ingest/montage.h — pictures of what the sampler serves.
//
// RenderMontage draws a contact sheet of exactly the windows a PatchSampler
// with the same options would serve first in epoch 0 (the same code path:
// PatchSampler::Gather), each tile labelled with its sample id and position,
// a mask field drawn as a translucent red overlay. RenderBoxes draws the
// windows sampled from one frame as rectangles on the whole frame.
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

#include "patchstore/store/status.h"

namespace patchstore {

// The colour of non-finite values in montages and PNG export: magenta.
// (A gray field can never show it as a value.)
inline constexpr uint8_t kNonFiniteRgb[3] = {255, 0, 255};

// An 8-bit RGB image, row-major, height x width x 3.
struct Image8 {
  int height = 0, width = 0;
  std::vector<uint8_t> rgb;
};

struct MontageOptions {
  std::string store;
  int count = 64;
  int64_t patch_size = 256;
  std::string field;            // "" = the first field of the store
  std::string overlay;          // mask field drawn over the tiles, "" = none
  std::string require;          // as PatchSampler (default: the overlay field)
  bool require_overlay = true;  // use `overlay` as `require` when require is empty
  int patches_per_sample = 1;
  uint64_t seed = 0;
  uint64_t epoch = 0;
  bool flip = false, rot90 = false;
  bool has_window = false;
  double window_lo = 0, window_hi = 1;
  int tile = 0;                 // tile size in the sheet; 0 = min(patch_size, 256)
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

// Draws the first `count` windows that the sampler (options as above) would
// take from sample `id` in epoch 0 on the whole frame of `field`.
Result<Image8> RenderBoxes(const MontageOptions& options, const std::string& id);

// Encodes `image` as PNG at `path` (written atomically).
Status WritePng(const Image8& image, const std::string& path);

}  // namespace patchstore
