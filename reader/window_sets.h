// reader/window_sets.h — the mask-aware window draw shared by the frames
// sampler (reader/sampler.cc, a window of an image) and the slice sampler
// (reader/slice_sampler.cc, a crop of a volume slice): the candidate
// windows a draw tries, and the exact lists ("runs") of the windows that
// qualify and of the others, built from a mask plane's summed-area table
// (reader/sat.h). Internal; not installed.
//
// A draw of one window of kind K (qualifying or not) from a plane: try the
// candidates t = 0, 1, ... (each uniform over all h x w windows), take the
// first of kind K; when none is, draw uniformly from K's runs. Rejection of
// uniform candidates, then an exact draw: uniform over K's windows either
// way.
//
// Thread-safety: pure functions; a built WindowSet is immutable.
#pragma once

#include <cstdint>
#include <vector>

#include "patchstore/reader/sat.h"
#include "patchstore/reader/transform.h"

namespace patchstore {

// Windows (y, x0 .. x0 + (next start - start) - 1) of one row of window
// positions; `start` counts the windows of the runs before it.
struct WindowRun {
  int32_t y, x0;
  uint64_t start;
};

// A set of window positions, as runs in row-major order.
struct WindowSet {
  std::vector<WindowRun> runs;
  uint64_t total = 0;
  // Window r (0 <= r < total) in row-major order; false when empty.
  bool Draw(uint64_t r, int64_t* y, int64_t* x) const;
  bool Contains(int64_t y, int64_t x) const;
  uint64_t bytes() const { return runs.size() * sizeof(WindowRun); }
};

// Every h x w window of plane `plane` of `sat` into `pos` (at least
// `threshold` valid pixels) or `neg` (fewer). REQUIRES: h <= sat.H, w <=
// sat.W, both sets empty.
void BuildWindowSets(const SatView& sat, int64_t plane, int64_t h, int64_t w, uint64_t threshold, WindowSet* pos,
                     WindowSet* neg);

// Every h x w window of an H x W plane (no mask), one run per row.
void AllWindows(int64_t H, int64_t W, int64_t h, int64_t w, WindowSet* set);

// Candidate t of the draw with key `key` among ny x nx window positions:
// streams key ^ (0x20 + 2t) and key ^ (0x21 + 2t), apart from the streams
// of a draw's other purposes (^1 .. ^7).
inline void CandidateWindow(uint64_t key, int t, int64_t ny, int64_t nx, int64_t* y, int64_t* x) {
  *y = static_cast<int64_t>(
      splitmix::Below(splitmix::Mix(key ^ (0x20u + 2u * static_cast<uint64_t>(t))), static_cast<uint64_t>(ny)));
  *x = static_cast<int64_t>(
      splitmix::Below(splitmix::Mix(key ^ (0x21u + 2u * static_cast<uint64_t>(t))), static_cast<uint64_t>(nx)));
}

}  // namespace patchstore
