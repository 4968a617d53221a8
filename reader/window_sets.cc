#include "reader/window_sets.h"

#include <algorithm>
#include <utility>

namespace patchstore {

bool WindowSet::Draw(uint64_t r, int64_t* y, int64_t* x) const {
  if (total == 0) return false;
  // The last run whose start is <= r.
  auto it = std::upper_bound(runs.begin(), runs.end(), r,
                             [](uint64_t v, const WindowRun& run) { return v < run.start; });
  const WindowRun& run = *(it - 1);
  *y = run.y;
  *x = run.x0 + static_cast<int64_t>(r - run.start);
  return true;
}

bool WindowSet::Contains(int64_t y, int64_t x) const {
  // The last run starting at or before (y, x) in row-major order.
  auto it = std::upper_bound(runs.begin(), runs.end(), std::make_pair(y, x),
                             [](const std::pair<int64_t, int64_t>& v, const WindowRun& run) {
                               return v.first < run.y || (v.first == run.y && v.second < run.x0);
                             });
  if (it == runs.begin()) return false;
  const WindowRun& run = *(it - 1);
  const uint64_t end = it == runs.end() ? total : it->start;
  return run.y == y && x < run.x0 + static_cast<int64_t>(end - run.start);
}

void BuildWindowSets(const SatView& sat, int64_t plane, int64_t h, int64_t w, uint64_t threshold, WindowSet* pos,
                     WindowSet* neg) {
  // The window (y, x) qualifies when its h x w valid count, four lookups
  // in the summed-area table, reaches the threshold; a run is a maximal
  // stretch of one row with the same answer.
  const int64_t H = sat.H, W = sat.W;
  for (int64_t y = 0; y + h <= H; ++y) {
    int64_t x = 0;
    while (x + w <= W) {
      const bool q = sat.Count(plane, y, x, h, w) >= threshold;
      int64_t end = x + 1;
      while (end + w <= W && (sat.Count(plane, y, end, h, w) >= threshold) == q) ++end;
      WindowSet& set = q ? *pos : *neg;
      set.runs.push_back({static_cast<int32_t>(y), static_cast<int32_t>(x), set.total});
      set.total += static_cast<uint64_t>(end - x);
      x = end;
    }
  }
}

void AllWindows(int64_t H, int64_t W, int64_t h, int64_t w, WindowSet* set) {
  for (int64_t y = 0; y + h <= H; ++y) {
    set->runs.push_back({static_cast<int32_t>(y), 0, set->total});
    set->total += static_cast<uint64_t>(W - w + 1);
  }
}

}  // namespace patchstore
