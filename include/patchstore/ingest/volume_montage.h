// patchstore/ingest/volume_montage.h — pictures of what SliceDataset serves.
//
// RenderVolumeMontage draws a contact sheet of the slices that a
// patchstore.torch.SliceDataset with the same options serves: `count` items
// spread evenly over the dataset (item j*N/count of N, so every volume
// shows up), each tile the CENTRE slice of the item's stack after the
// item's crop, flips and quarter turn — the items of the one slice sampler
// (reader/slice_sampler.h SliceSampler, with `slices`: the same volumes,
// slices, mask-aware draws and crops as the dataset) — as 8-bit gray:
// window [lo, hi] in STORED units (after any ingest normalisation) onto
// 0..255, round(clip((v - lo) / (hi - lo), 0, 1) * 255). Without a window,
// [lo, hi] are the 1st and 99th percentiles of the finite values of all
// shown tiles (the "auto" window). Tiles are labelled "<id> s<slice>", the
// shown field's context ("+-C") and the item's flips/turn; a mask field may
// be drawn as a translucent red overlay. Tiles are `tile` pixels square
// (resized with INTER_AREA when the plane differs; equal-sized square
// planes are copied as they are).
//
// Thread-safety: reentrant. Errors: as Reader and SliceSampler::Create
// (NotFound for an unknown field or id, InvalidArgument for an image store,
// bad options, a crop larger than the slices of every volume or rot90 with
// non-square planes). Volumes that give no item are left out as
// SliceDataset leaves them out, named in `warning`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "patchstore/ingest/montage.h"
#include "patchstore/reader/slice_sampler.h"
#include "patchstore/reader/volume.h"
#include "patchstore/store/status.h"

namespace patchstore {

struct VolumeMontageOptions {
  std::string store;
  int count = 64;
  std::string field;    // "" = the first field
  std::string overlay;  // mask field drawn over the tiles, "" = none
  // SliceDataset's options (fields empty: every field of the store, so
  // that context may name any of them; the shown field's context is a
  // label only: the centre slice of each stack is shown).
  SliceOptions slices;
  uint64_t epoch = 0;
  bool has_window = false;  // else the auto window (1st..99th percentile)
  double window_lo = 0, window_hi = 1;
  int tile = 0;  // 0: the plane size (square planes up to 256), else 256
  bool labels = true;
};

struct VolumeMontage {
  Image8 image;
  double window_lo = 0, window_hi = 0;  // the window used (stored units)
  std::vector<uint64_t> items;          // the dataset items shown, in tile order
  // Non-empty when volumes were left out because they give no item (no
  // slice, or slices smaller than the crop), as SliceDataset leaves them out.
  std::string warning;
};

Result<VolumeMontage> RenderVolumeMontage(const VolumeMontageOptions& options);

}  // namespace patchstore
