#include "patchstore/reader/sampler.h"

#include "patchstore/reader/transform.h"
#include "reader/parallel.h"
#include "reader/sampling_policy.h"
#include "reader/window_sets.h"
#include "store/numbers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <unordered_set>

namespace patchstore {
namespace {

// "inf", "1e+30", "3.5": a double as a user typed it, for messages.
std::string FormatNumber(double v) { return FormatG(v); }

// The one counter-based generator (reader/transform.h); Hash is its key of
// up to five coordinates (missing ones are 0, as the sequence was pinned).
using splitmix::Below;
using splitmix::Mix;
uint64_t Hash(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0, uint64_t e = 0) {
  return splitmix::Key(a, b, c, d, e);
}

}  // namespace

std::string SamplerOptionSpelling(const std::string& member) {
  struct Row {
    const char* member;
    const char* python;
    const char* cli;
  };
#define PATCHSTORE_SPELLING_ROW(m, py, cli, doc) {#m, py, cli},
  static const Row kRows[] = {PATCHSTORE_SAMPLER_OPTIONS(PATCHSTORE_SPELLING_ROW)};
#undef PATCHSTORE_SPELLING_ROW
  for (const Row& r : kRows) {
    if (member != r.member) continue;
    std::string cli = r.cli;
    for (size_t c = cli.find(','); c != std::string::npos; c = cli.find(',', c + 2)) cli.insert(c + 1, " ");
    return cli.empty() ? std::string(r.python) : std::string(r.python) + " (" + cli + ")";
  }
  return member;
}

Status SamplerOptions::Validate() const {
  auto bad = [](const std::string& member, const std::string& rule) {
    return Status::InvalidArgument(SamplerOptionSpelling(member) + " " + rule);
  };
  if (fields.empty()) return Status::InvalidArgument("no fields given");
  constexpr int64_t kMaxSide = int64_t{1} << 31;
  if (patch_h < 0 || patch_w < 0 || !(height() >= 1 && height() < kMaxSide && width() >= 1 && width() < kMaxSide))
    return bad("patch_size",
               "must be P or (h, w) with sides in [1, 2**31), got " +
                   (patch_h || patch_w ? "(" + std::to_string(patch_h) + ", " + std::to_string(patch_w) + ")"
                                       : std::to_string(patch_size)));
  if (rot90 && height() != width())
    return Status::InvalidArgument(SamplerOptionSpelling("rot90") + " needs a square window (a quarter turn of a " +
                                   std::to_string(height()) + "x" + std::to_string(width()) + " window is " +
                                   std::to_string(width()) + "x" + std::to_string(height()) +
                                   ", and a batch has one shape); use flip, or a square patch_size");
  if (patches_per_sample < 1)
    return bad("patches_per_sample", "must be positive, got " + std::to_string(patches_per_sample));
  if (!(min_valid > 0))
    return bad("min_valid",
               "must be positive (pixels >= 1, or a fraction of the window < 1), got " + FormatNumber(min_valid));
  // A count above the window's pixel count can never be met (and inf or
  // 1e30 would overflow the integer threshold): refuse it.
  const int64_t h = height(), w = width();
  if (!(min_valid <= static_cast<double>(h) * static_cast<double>(w)))
    return bad("min_valid", FormatNumber(min_valid) + " asks for more valid pixels than a " + std::to_string(h) + "x" +
                                std::to_string(w) + " window holds (" + std::to_string(h * w) + ")");
  if (!(positive_fraction == -1 || (positive_fraction >= 0 && positive_fraction <= 1)))
    return bad("positive_fraction", "must be in [0, 1] (None, CLI -1: off), got " + FormatNumber(positive_fraction));
  if (world_size < 1 || rank < 0 || rank >= world_size)
    return Status::InvalidArgument("need 0 <= rank < world_size, got " + SamplerOptionSpelling("rank") + " " +
                                   std::to_string(rank) + ", " + SamplerOptionSpelling("world_size") + " " +
                                   std::to_string(world_size));
  if (num_threads < 1 || num_threads > 4096)
    return bad("num_threads", "must be in [1, 4096] (Python 0: all cores), got " + std::to_string(num_threads));
  if (prefetch_next && (prefetch_batches < 1 || prefetch_batches > 64))
    return bad("prefetch_batches",
               "must be a number of batches in 1..64 (False or 0: off), got " + std::to_string(prefetch_batches));
  if (index_cache_bytes == 0) return bad("index_cache_bytes", "must be positive, got 0");
  if (order == SampleOrder::kLocality && locality_budget_bytes == 0)
    return Status::InvalidArgument(SamplerOptionSpelling("order") + " 'locality' needs " +
                                   SamplerOptionSpelling("locality_budget_bytes") +
                                   " (bytes, or a size such as '8GB'): the page cache an epoch may count on, e.g. "
                                   "half of the RAM free for it");
  // The policy's own rules (require / positive_fraction for each policy).
  auto policy = MakeWindowPolicy(*this, "");
  if (!policy.ok()) return policy.status();
  return Status::OK();
}

struct PatchSampler::SampleSets {
  WindowSet pos, neg;
  uint64_t bytes() const { return pos.bytes() + neg.bytes() + sizeof(SampleSets) + 64; }
};

Result<std::unique_ptr<PatchSampler>> PatchSampler::Create(std::shared_ptr<const Reader> reader,
                                                           const SamplerOptions& o) {
  auto s = std::unique_ptr<PatchSampler>(new PatchSampler());
  s->reader_ = reader;
  s->options_ = o;
  const std::string where = "creating a sampler on '" + reader->path() + "'";
  if (reader->meta().kind != "frames")
    return Status::InvalidArgument(where + ": PatchSampler reads image stores (this one holds " + reader->meta().kind +
                                   ")");
  PS_RETURN_IF_ERROR(o.Validate().WithContext(where));
  for (const std::string& f : o.fields) {
    auto fi = reader->FieldIndex(f);
    if (!fi.ok()) return fi.status().WithContext(where);
    s->fields_.push_back(*fi);
    s->channels_.push_back(reader->field(*fi).channels);
  }
  const int64_t ph = o.height(), pw = o.width();
  PS_ASSIGN_OR_RETURN(s->policy_, MakeWindowPolicy(o, where));
  if (!s->policy_->uses_mask() && !o.require.empty())
    return Status::InvalidArgument(where + ": require='" + o.require + "' with a policy that reads no mask");
  if (s->policy_->uses_mask()) {
    auto mf = reader->FieldIndex(o.require);
    if (!mf.ok()) return mf.status().WithContext(where);
    if (reader->field(*mf).channels != 1)
      return Status::InvalidArgument(where + ": require='" + o.require + "' must name a 1-channel mask field");
    s->mask_field_ = *mf;
    s->threshold_ = o.min_valid < 1 ? static_cast<uint64_t>(std::ceil(o.min_valid * static_cast<double>(ph * pw)))
                                    : static_cast<uint64_t>(std::ceil(o.min_valid));
    if (s->threshold_ == 0) s->threshold_ = 1;
  }
  // The samples considered: a subset (ids and/or indices), or all.
  std::vector<uint64_t> considered;
  if (o.ids.empty() && o.samples.empty()) {
    considered.resize(reader->size());
    for (uint64_t i = 0; i < reader->size(); ++i) considered[i] = i;
  } else {
    for (const std::string& id : o.ids) {
      auto i = reader->Find(id);
      if (!i.ok()) return i.status().WithContext(where + " (ids subset)");
      considered.push_back(*i);
    }
    for (uint64_t i : o.samples) {
      if (i >= reader->size())
        return Status::OutOfRange(where + ": subset sample index " + std::to_string(i) + " outside [0, " +
                                  std::to_string(reader->size()) + ")");
      considered.push_back(i);
    }
    std::sort(considered.begin(), considered.end());
    for (size_t k = 1; k < considered.size(); ++k)
      if (considered[k] == considered[k - 1])
        return Status::InvalidArgument(where + ": the subset names sample '" + std::string(reader->id(considered[k])) +
                                       "' (index " + std::to_string(considered[k]) + ") twice");
  }
  s->is_eligible_.assign(reader->size(), false);
  s->is_considered_.assign(reader->size(), false);
  for (uint64_t i : considered) s->is_considered_[i] = true;
  // Eligibility, from the store's sample index alone (no record is read):
  // sizes from the summaries, and with `require` the mask's valid count —
  // exact for min_valid = 1 (a window holds a valid pixel iff the mask has
  // one and the window fits), a necessary condition otherwise, completed
  // by the sample's window lists only where the count does not decide.
  for (uint64_t i : considered) {
    bool ok = true;
    int64_t H = -1, W = -1;
    for (int f : s->fields_) {
      auto h = reader->Summary(i, f);
      if (!h.ok()) return h.status().WithContext(where);
      if (H < 0) {
        H = static_cast<int64_t>(h->shape[1]);
        W = static_cast<int64_t>(h->shape[2]);
      } else if (static_cast<int64_t>(h->shape[1]) != H || static_cast<int64_t>(h->shape[2]) != W) {
        return Status::Corruption(where + ": fields of " + reader->Describe(i, f) + " differ in size");
      }
    }
    if (H >= (int64_t{1} << 31) || W >= (int64_t{1} << 31))
      return Status::InvalidArgument(where + ": " + reader->Describe(i, s->fields_[0]) +
                                     " is larger than 2^31 pixels "
                                     "on a side");
    if (H < ph || W < pw) ok = false;
    if (ok && s->mask_field_ >= 0) {
      auto ms = reader->Summary(i, s->mask_field_);
      if (!ms.ok()) return ms.status().WithContext(where);
      WindowPolicy::Verdict v = WindowPolicy::Verdict::kUnknown;
      if (ms->has_valid_count) v = s->policy_->FromValidCount(ms->valid_count, s->threshold_);
      if (v == WindowPolicy::Verdict::kUnknown) {
        auto sets = s->Sets(i);
        if (!sets.ok()) return sets.status().WithContext(where);
        ok = s->policy_->Eligible((*sets)->pos.total, (*sets)->neg.total);
      } else {
        ok = v == WindowPolicy::Verdict::kYes;
      }
    }
    s->is_eligible_[i] = ok;
    if (ok) {
      s->eligible_.push_back(i);
      if (o.order == SampleOrder::kLocality) s->eligible_bytes_.push_back(s->SampleBytes(i));
    } else {
      ++s->skipped_count_;
      if (s->skipped_ids_.size() < 1000) s->skipped_ids_.emplace_back(reader->id(i));
    }
  }
  return s;
}

Result<std::shared_ptr<const PatchSampler::SampleSets>> PatchSampler::Sets(uint64_t sample) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sets_.find(sample);
    if (it != sets_.end()) return it->second;
  }
  auto sets = std::make_shared<SampleSets>();
  const int64_t ph = options_.height(), pw = options_.width();
  if (mask_field_ < 0) {
    auto h = reader_->Summary(sample, fields_[0]);
    if (!h.ok()) return h.status();
    AllWindows(static_cast<int64_t>(h->shape[1]), static_cast<int64_t>(h->shape[2]), ph, pw, &sets->pos);
  } else {
    // Not cached in the Reader: this sampler keeps the (much smaller) runs.
    // The table goes into a buffer this thread keeps (the size of the
    // largest mask's table, e.g. 8.3 MB for 1920x1080), not fresh pages.
    thread_local std::vector<uint32_t> table;
    PS_ASSIGN_OR_RETURN(SatView sat, reader_->Sat(sample, mask_field_, /*cache=*/false, &table));
    BuildWindowSets(sat, 0, ph, pw, threshold_, &sets->pos, &sets->neg);
  }
  const uint64_t bytes = sets->bytes();
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = sets_.emplace(sample, std::move(sets));
  if (inserted) {
    sets_order_.push_back(sample);
    sets_bytes_ += bytes;
    // Bound the cache: drop the oldest lists (holders keep theirs alive).
    while (sets_bytes_ > options_.index_cache_bytes && sets_order_.size() > 1) {
      auto old = sets_.find(sets_order_.front());
      if (old != sets_.end()) {
        const uint64_t b = old->second->bytes();
        sets_bytes_ -= std::min(sets_bytes_, b);
        sets_.erase(old);
      }
      sets_order_.pop_front();
    }
  }
  return it->second;
}

uint64_t PatchSampler::visits_per_epoch() const {
  const uint64_t n = eligible_.size(), w = static_cast<uint64_t>(options_.world_size);
  return (n + w - 1) / w;
}

std::shared_ptr<const std::vector<uint64_t>> PatchSampler::Permutation(uint64_t epoch) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (perm_ && perm_epoch_ == epoch) return perm_;
  auto perm = std::make_shared<std::vector<uint64_t>>(eligible_);
  if (options_.order == SampleOrder::kLocality) {
    // Blocks of storage order (eligible_ is ascending: store order) within the budget.
    std::vector<uint64_t> order;
    Status st = LocalityOrder(eligible_bytes_.data(), eligible_bytes_.size(), options_.locality_budget_bytes,
                              options_.seed, epoch, &order);
    if (st.ok())  // Create checked the budget
      for (size_t i = 0; i < order.size(); ++i) (*perm)[i] = eligible_[order[i]];
  } else {
    splitmix::Shuffle(perm->data(), perm->size(), options_.seed, epoch, 0x5045524dULL);  // 'PERM'
  }
  perm_ = perm;
  perm_epoch_ = epoch;
  return perm_;
}

uint64_t PatchSampler::SampleAt(uint64_t epoch, uint64_t p) const {
  auto perm = Permutation(epoch);
  const uint64_t global = p * static_cast<uint64_t>(options_.world_size) + static_cast<uint64_t>(options_.rank);
  return (*perm)[global % perm->size()];  // padding repeats the start, as DistributedSampler does
}

void PatchSampler::WindowPositions(uint64_t sample, int field, int64_t* ny, int64_t* nx) const {
  const RecordSummary& s = reader_->summary(sample, field);
  *ny = static_cast<int64_t>(s.shape[1]) - options_.height() + 1;
  *nx = static_cast<int64_t>(s.shape[2]) - options_.width() + 1;
}

Result<std::shared_ptr<const PatchSampler::SampleSets>> PatchSampler::ListsForDraw(uint64_t sample) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sets_.find(sample);
    if (it != sets_.end()) return it->second;
  }
  // kAuto: a mask with block counts: candidates are decided by them (most
  // of them, from a few kilobytes) or by counting their mask pixels; lists
  // are built only for a draw no candidate fits. Building them reads the
  // whole mask and costs milliseconds (a summed-area table of the frame),
  // far more than the draws they would speed up unless the sample is drawn
  // hundreds of times while they stay cached (and the lists of a store
  // larger than the cache budget do not stay). A mask without them: in
  // memory, build the lists; out of memory, count candidates' mask pixels:
  // a few tile rows of a tiled mask, but a page per row of a row-major
  // one, whose whole mask is then cheaper to read once (one sequential read).
  const bool build = options_.mask_index == MaskIndex::kBuild ||
                     (options_.mask_index == MaskIndex::kAuto && reader_->MaskBlockEdge(sample, mask_field_) == 0 &&
                      (reader_->summary(sample, mask_field_).tile == 0 ||
                       reader_->RecordResident(sample, mask_field_)));
  if (!build) return std::shared_ptr<const SampleSets>();
  return Sets(sample);
}

Result<bool> PatchSampler::WindowQualifies(uint64_t sample, int64_t y, int64_t x) const {
  const int64_t ph = options_.height(), pw = options_.width();
  PS_ASSIGN_OR_RETURN(WindowSource src, reader_->Window(sample, mask_field_, y, x, ph, pw));
  // The normalised values, counted as the summed-area table counts them
  // (reader/sat.h).
  return CountNonZero(src) >= threshold_;
}

Status PatchSampler::DrawMany(const std::vector<std::pair<uint64_t, uint64_t>>& draws, std::vector<Window>* out) const {
  const size_t n = draws.size();
  out->assign(n, Window{});
  // Working vectors, kept per thread: a one-window Draw (WindowAt, a
  // PatchDataset item) allocates nothing once warm. Released views and
  // lists at exit; a nested call (none today) would use fresh ones.
  struct Scratch {
    std::vector<uint8_t> want, found, counted;
    std::vector<size_t> pending, next;
    std::vector<std::pair<int64_t, int64_t>> positions, at;
    std::vector<std::shared_ptr<const SampleSets>> lists_of;
    std::vector<MaskBlocksView> blocks_of;
    std::vector<int8_t> decided;
    bool busy = false;
  };
  thread_local Scratch kept;
  Scratch fresh;
  Scratch& sc = kept.busy ? fresh : kept;
  struct Release {
    Scratch& sc;
    ~Release() {
      sc.lists_of.clear();
      sc.blocks_of.clear();
      sc.busy = false;
    }
  } release{sc};
  sc.busy = true;
  std::vector<uint8_t>& want = sc.want;
  want.assign(n, 0);
  std::vector<size_t>& pending = sc.pending;  // draws still trying candidates
  pending.clear();
  const int64_t ph = options_.height(), pw = options_.width();
  std::vector<uint8_t>& found = sc.found;
  found.assign(n, 0);
  auto memo_key = [](uint64_t sample, uint64_t key) { return Mix(sample) ^ key; };
  // Only draws decided by counting are remembered: a draw from the lists
  // costs less than the lookup, so list-only samplers never take the lock.
  std::unique_lock<std::mutex> memo_lock(mu_, std::defer_lock);
  if (mask_field_ >= 0 && draw_memo_size_.load(std::memory_order_relaxed) > 0) memo_lock.lock();
  for (size_t i = 0; i < n; ++i) {
    Window& w = (*out)[i];
    w.sample = draws[i].first;
    want[i] = policy_->WantQualifying(Mix(draws[i].second ^ 1)) ? 1 : 0;
    if (mask_field_ >= 0) {
      // Drawn before (PrefetchAhead drew the batches that Gather draws now).
      auto it = memo_lock.owns_lock() ? draw_memo_.find(memo_key(draws[i].first, draws[i].second)) : draw_memo_.end();
      if (it != draw_memo_.end() && it->second.sample == draws[i].first && it->second.key == draws[i].second) {
        w.y = it->second.y;
        w.x = it->second.x;
        w.positive = it->second.positive;
        found[i] = 1;
      } else {
        pending.push_back(i);
      }
      continue;
    }
    // Every window qualifies: candidate 0 (so a mask valid everywhere draws
    // the same windows as no mask).
    int64_t ny = 0, nx = 0;
    WindowPositions(w.sample, fields_[0], &ny, &nx);
    if (ny > 0 && nx > 0) {
      CandidateWindow(draws[i].second, 0, ny, nx, &w.y, &w.x);
      found[i] = 1;
    }
  }
  if (memo_lock.owns_lock()) memo_lock.unlock();
  std::vector<uint8_t>& counted = sc.counted;  // decided by counting a candidate's mask: remembered at the end
  counted.assign(n, 0);
  // Per pending draw, once: its window positions and its lists (null: its
  // candidates are checked by counting).
  std::vector<std::pair<int64_t, int64_t>>& positions = sc.positions;
  positions.assign(n, {0, 0});
  std::vector<std::shared_ptr<const SampleSets>>& lists_of = sc.lists_of;
  lists_of.assign(n, nullptr);
  std::vector<MaskBlocksView>& blocks_of = sc.blocks_of;  // data null: none
  blocks_of.assign(n, MaskBlocksView{});
  for (size_t i : pending) {
    WindowPositions(draws[i].first, mask_field_, &positions[i].first, &positions[i].second);
    if (positions[i].first <= 0 || positions[i].second <= 0)
      return Status::OutOfRange("sampling " + reader_->Describe(draws[i].first, fields_[0]) + ": no admissible window");
    PS_ASSIGN_OR_RETURN(lists_of[i], ListsForDraw(draws[i].first));
    if (!lists_of[i]) reader_->PrefetchMaskBlocks(draws[i].first, mask_field_);
  }
  for (size_t i : pending) {
    if (lists_of[i] || reader_->MaskBlockEdge(draws[i].first, mask_field_) == 0) continue;
    PS_ASSIGN_OR_RETURN(blocks_of[i], reader_->MaskBlocks(draws[i].first, mask_field_));
  }
  std::vector<std::pair<int64_t, int64_t>>& at = sc.at;
  std::vector<int8_t>& decided = sc.decided;  // per candidate: 1 qualifies, 0 does not, -1 count its mask
  std::vector<size_t>& next = sc.next;
  uint64_t by_lists = 0, by_blocks = 0, by_counting = 0;
  for (int t = 0; t < kWindowTries && !pending.empty(); ++t) {
    // Candidate t of every pending draw, decided from the lists or the
    // mask's block counts where they tell; the mask bytes of the others are
    // requested together, so the disk sees them all at once, then counted.
    at.resize(pending.size());
    decided.assign(pending.size(), -1);
    for (size_t k = 0; k < pending.size(); ++k) {
      const size_t i = pending[k];
      CandidateWindow(draws[i].second, t, positions[i].first, positions[i].second, &at[k].first, &at[k].second);
      if (lists_of[i]) {
        decided[k] = lists_of[i]->pos.Contains(at[k].first, at[k].second) ? 1 : 0;
        ++by_lists;
        continue;
      }
      if (blocks_of[i].data != nullptr) {
        uint64_t lo = 0, hi = 0;
        blocks_of[i].Bounds(at[k].first, at[k].second, ph, pw, &lo, &hi);
        if (lo >= threshold_) decided[k] = 1;
        else if (hi < threshold_) decided[k] = 0;
        by_blocks += decided[k] >= 0;
      }
      if (decided[k] < 0) reader_->PrefetchPatch(draws[i].first, mask_field_, at[k].first, at[k].second, ph, pw);
    }
    next.clear();
    for (size_t k = 0; k < pending.size(); ++k) {
      const size_t i = pending[k];
      bool q = decided[k] > 0;
      if (decided[k] < 0) {
        PS_ASSIGN_OR_RETURN(q, WindowQualifies(draws[i].first, at[k].first, at[k].second));
        counted[i] = 1;
        ++by_counting;
      }
      if (q == (want[i] != 0)) {
        (*out)[i].y = at[k].first;
        (*out)[i].x = at[k].second;
        (*out)[i].positive = q;
        found[i] = 1;
      } else {
        next.push_back(i);
      }
    }
    pending.swap(next);
  }
  if (by_lists) stats_lists_.fetch_add(by_lists, std::memory_order_relaxed);
  if (by_blocks) stats_blocks_.fetch_add(by_blocks, std::memory_order_relaxed);
  if (by_counting) stats_counting_.fetch_add(by_counting, std::memory_order_relaxed);
  for (size_t i = 0; i < n; ++i) {
    Window& w = (*out)[i];
    const uint64_t key = draws[i].second;
    if (!found[i]) {
      // No candidate fitted (or no mask): an exact draw from the lists.
      PS_ASSIGN_OR_RETURN(auto sets, Sets(w.sample));
      const WindowSet* set = want[i] ? &sets->pos : &sets->neg;
      if (set->total == 0) set = want[i] ? &sets->neg : &sets->pos;
      w.positive = set == &sets->pos;
      if (!set->Draw(Below(Mix(key ^ 2), set->total), &w.y, &w.x))
        return Status::OutOfRange("sampling " + reader_->Describe(w.sample, fields_[0]) + ": no admissible window");
    }
    const uint64_t aug = Mix(key ^ 3);
    if (options_.flip) w.flip = static_cast<uint8_t>(aug & 3);
    if (options_.rot90) w.rot = static_cast<uint8_t>((aug >> 2) & 3);
  }
  const size_t remember = static_cast<size_t>(std::count(counted.begin(), counted.end(), 1));
  if (remember > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    if (draw_memo_.size() + remember > kDrawMemo) draw_memo_.clear();
    for (size_t i = 0; i < n; ++i) {
      if (!counted[i]) continue;
      const Window& w = (*out)[i];
      draw_memo_[memo_key(w.sample, draws[i].second)] = MemoWindow{w.sample, draws[i].second, w.y, w.x, w.positive};
    }
    draw_memo_size_.store(draw_memo_.size(), std::memory_order_relaxed);
  }
  return Status::OK();
}

Result<Window> PatchSampler::Draw(uint64_t sample, uint64_t key) const {
  // Per thread, as DrawMany's vectors (DrawMany never calls Draw).
  thread_local std::vector<std::pair<uint64_t, uint64_t>> one(1);
  thread_local std::vector<Window> out;
  one[0] = {sample, key};
  PS_RETURN_IF_ERROR(DrawMany(one, &out));
  return out[0];
}

std::pair<uint64_t, uint64_t> PatchSampler::VisitDraw(uint64_t epoch, uint64_t p, int j) const {
  const uint64_t global = p * static_cast<uint64_t>(options_.world_size) + static_cast<uint64_t>(options_.rank);
  return {SampleAt(epoch, p), Hash(options_.seed, epoch, global, static_cast<uint64_t>(j), 0x57494e44ULL)};
}

Result<Window> PatchSampler::WindowAt(uint64_t epoch, uint64_t p, int j) const {
  if (eligible_.empty())
    return Status::OutOfRange("sampling from '" + reader_->path() + "': no sample has an admissible window (" +
                              std::to_string(skipped_count_) + " skipped)");
  const auto d = VisitDraw(epoch, p, j);
  return Draw(d.first, d.second);
}

bool PatchSampler::eligible(uint64_t sample) const { return sample < is_eligible_.size() && is_eligible_[sample]; }

Result<Window> PatchSampler::WindowOfSample(uint64_t epoch, uint64_t sample, int j) const {
  if (!eligible(sample))
    return Status::OutOfRange("sampling " + reader_->Describe(sample, fields_[0]) +
                              ": the sample has no admissible window");
  const uint64_t key = Hash(options_.seed, epoch, sample, static_cast<uint64_t>(j), 0x53414d50ULL);
  return Draw(sample, key);
}

std::string PatchSampler::SkippedReport() const {
  if (skipped_count_ == 0) return "";
  std::string out = "skipping " + std::to_string(skipped_count_) + " of " + std::to_string(considered_samples()) +
                    " samples of '" + reader_->path() + "' (" + policy_->SkipReason(options_, threshold_) + "): ";
  const size_t shown = std::min<size_t>(skipped_ids_.size(), 20);
  for (size_t i = 0; i < shown; ++i) out += (i ? ", '" : "'") + skipped_ids_[i] + "'";
  if (skipped_count_ > shown) out += ", ...";
  return out;
}

const char* LoaderKindName(LoaderKind kind) {
  switch (kind) {
    case LoaderKind::kSampler: return "sampler";
    case LoaderKind::kBatchLoader: return "batchloader";
    case LoaderKind::kPatchDataset: return "patchdataset";
  }
  return "unknown";
}

Result<LoaderKind> ParseLoaderKind(const std::string& name) {
  for (LoaderKind k : {LoaderKind::kSampler, LoaderKind::kBatchLoader, LoaderKind::kPatchDataset})
    if (name == LoaderKindName(k)) return k;
  return Status::InvalidArgument("unknown loader '" + name + "' (loaders: sampler, batchloader, patchdataset)");
}

Result<std::vector<Window>> PatchSampler::ServedWindows(LoaderKind kind, uint64_t epoch, uint64_t first,
                                                        int64_t n) const {
  if (n < 0) return Status::InvalidArgument("served windows: negative count");
  if (eligible_.empty())
    return Status::OutOfRange("sampling from '" + reader_->path() + "': no sample has an admissible window (" +
                              std::to_string(skipped_count_) + " skipped)");
  const uint64_t k = static_cast<uint64_t>(options_.patches_per_sample);
  // Windows per epoch of this loader: visits x k, or items x k.
  const uint64_t per_epoch = (kind == LoaderKind::kPatchDataset ? eligible_.size() : visits_per_epoch()) * k;
  std::vector<Window> out;
  out.reserve(static_cast<size_t>(n));
  epoch += first / per_epoch;
  uint64_t w = first % per_epoch;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t item = w / k;
    const int j = static_cast<int>(w % k);
    if (kind == LoaderKind::kPatchDataset) {
      PS_ASSIGN_OR_RETURN(Window win, WindowOfSample(epoch, eligible_[item], j));
      out.push_back(win);
    } else {
      PS_ASSIGN_OR_RETURN(Window win, WindowAt(epoch, item, j));
      out.push_back(win);
    }
    if (++w == per_epoch) {
      ++epoch;
      w = 0;
    }
  }
  return out;
}

Result<std::vector<Window>> PatchSampler::ServedWindowsOfSample(LoaderKind kind, uint64_t epoch,
                                                                uint64_t sample) const {
  std::vector<Window> out;
  if (!eligible(sample)) return out;
  const int k = options_.patches_per_sample;
  if (kind == LoaderKind::kPatchDataset) {
    for (int j = 0; j < k; ++j) {
      PS_ASSIGN_OR_RETURN(Window w, WindowOfSample(epoch, sample, j));
      out.push_back(w);
    }
    return out;
  }
  for (uint64_t p = 0; p < visits_per_epoch(); ++p) {
    if (SampleAt(epoch, p) != sample) continue;
    for (int j = 0; j < k; ++j) {
      PS_ASSIGN_OR_RETURN(Window w, WindowAt(epoch, p, j));
      out.push_back(w);
    }
  }
  return out;
}

namespace {
std::vector<GatherTarget> FloatTargets(const std::vector<float*>& outs) {
  std::vector<GatherTarget> t(outs.size());
  for (size_t f = 0; f < outs.size(); ++f) t[f].data = outs[f];
  return t;
}
}  // namespace

DType PatchSampler::field_dtype(size_t f) const { return reader_->meta().fields[fields_[f]].dtype; }

Status PatchSampler::Gather(uint64_t epoch, uint64_t first, int64_t n, const std::vector<float*>& outs,
                            std::vector<Window>* windows) const {
  return GatherTo(epoch, first, n, FloatTargets(outs), windows);
}

Status PatchSampler::GatherWindows(const std::vector<Window>& wins, const std::vector<float*>& outs) const {
  return GatherWindowsTo(wins, FloatTargets(outs));
}

Status PatchSampler::GatherTo(uint64_t epoch, uint64_t first, int64_t n, const std::vector<GatherTarget>& outs,
                              std::vector<Window>* windows) const {
  if (outs.size() != fields_.size())
    return Status::InvalidArgument("gather: " + std::to_string(outs.size()) + " buffers for " +
                                   std::to_string(fields_.size()) + " fields");
  if (n < 0) return Status::InvalidArgument("gather: negative count");
  const uint64_t k = static_cast<uint64_t>(options_.patches_per_sample);
  std::vector<Window> wins;
  if (n > 0 && eligible_.empty())
    return Status::OutOfRange("sampling from '" + reader_->path() + "': no sample has an admissible window (" +
                              std::to_string(skipped_count_) + " skipped)");
  if (mask_field_ >= 0 && options_.mask_index == MaskIndex::kBuild && n > 0) {
    // Lists of samples visited for the first time need their whole mask:
    // start reading all of them before drawing any.
    std::vector<uint64_t> visit;
    for (uint64_t p = first / k; p <= (first + static_cast<uint64_t>(n) - 1) / k; ++p)
      visit.push_back(SampleAt(epoch, p));
    PrefetchMasks(visit);
  }
  std::vector<std::pair<uint64_t, uint64_t>> draws(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t w = first + static_cast<uint64_t>(i);
    draws[i] = VisitDraw(epoch, w / k, static_cast<int>(w % k));
  }
  PS_RETURN_IF_ERROR(DrawMany(draws, &wins));
  PS_RETURN_IF_ERROR(GatherWindowsTo(wins, outs));
  if (windows) *windows = std::move(wins);
  return Status::OK();
}

Status PatchSampler::GatherWindowsTo(const std::vector<Window>& wins, const std::vector<GatherTarget>& outs) const {
  if (outs.size() != fields_.size())
    return Status::InvalidArgument("gather: " + std::to_string(outs.size()) + " buffers for " +
                                   std::to_string(fields_.size()) + " fields");
  const int64_t ph = options_.height(), pw = options_.width();
  const int64_t n = static_cast<int64_t>(wins.size());
  // Resolve every record before copying, so an error leaves no half batch.
  std::vector<std::vector<WindowSource>> srcs(fields_.size(), std::vector<WindowSource>(static_cast<size_t>(n)));
  for (size_t f = 0; f < fields_.size(); ++f)
    for (int64_t i = 0; i < n; ++i) {
      if (wins[i].rot > 3) return Status::InvalidArgument("gather: rotation must be 0..3");
      if (wins[i].rot != 0 && ph != pw)
        return Status::InvalidArgument("gather: a quarter turn needs a square window (this sampler's are " +
                                       std::to_string(ph) + "x" + std::to_string(pw) + ")");
      PS_ASSIGN_OR_RETURN(srcs[f][i], reader_->Window(wins[i].sample, fields_[f], wins[i].y, wins[i].x, ph, pw));
    }
  // With the store out of the page cache, every row of every window is a
  // page fault: ask for all of them at once so the disk sees many requests
  // in flight instead of one synchronous read per row. Tiled windows: one
  // range per tile row.
  for (size_t f = 0; f < fields_.size(); ++f) reader_->PrefetchWindows(srcs[f]);
  // A batch larger than the last-level cache: row-major windows written with
  // non-temporal stores (CopyWindow's `stream`), as memcpy does for copies
  // that size.
  int64_t out_bytes = 0;
  std::vector<int64_t> item_bytes(fields_.size());
  for (size_t f = 0; f < fields_.size(); ++f) {
    const size_t es = outs[f].output == Output::kStored ? DTypeSize(field_dtype(f)) : sizeof(float);
    item_bytes[f] = channels_[f] * ph * pw * static_cast<int64_t>(es);
    out_bytes += n * item_bytes[f];
  }
  const bool stream = out_bytes > StreamThresholdBytes();
  auto work = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      for (size_t f = 0; f < fields_.size(); ++f)
        CopyWindow(srcs[f][i], wins[i].transform(), static_cast<uint8_t*>(outs[f].data) + i * item_bytes[f],
                   outs[f].output, stream);
  };
  ParallelBlocks(n, options_.num_threads, work);
  return Status::OK();
}

uint64_t PatchSampler::SampleBytes(uint64_t sample) const {
  uint64_t total = 0;
  auto add = [&](int f) {
    const RecordSummary& s = reader_->summary(sample, f);
    if (!s.present) return;
    uint64_t b = DTypeSize(s.dtype);
    for (int d = 0; d < s.rank && d < 3; ++d) b *= s.shape[d];
    total += b + kRecordHeaderSize;
  };
  for (int f : fields_) add(f);
  if (mask_field_ >= 0 && std::find(fields_.begin(), fields_.end(), mask_field_) == fields_.end()) add(mask_field_);
  return total;
}

void PatchSampler::PrefetchMasks(const std::vector<uint64_t>& samples) const {
  if (mask_field_ < 0 || samples.empty()) return;
  std::vector<uint64_t> fresh;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t s : samples)
      if (!sets_.count(s)) fresh.push_back(s);
  }
  for (uint64_t s : fresh) reader_->Prefetch(s, mask_field_);
}

void PatchSampler::PrefetchAhead(uint64_t epoch, uint64_t first, int64_t n, uint64_t stride) const {
  const uint64_t per = windows_per_epoch();
  if (n <= 0 || per == 0) return;
  if (stride == 0) stride = static_cast<uint64_t>(n);
  const uint64_t depth = static_cast<uint64_t>(std::clamp(options_.prefetch_batches, 1, 64));
  if (stride > UINT64_MAX / 128 / per || epoch > UINT64_MAX / 4 / per) {
    RequestWindows(epoch, first, n, n);  // beyond the bookkeeping's range: this batch alone
    return;
  }
  // Batches as positions epoch * per + window: this call wants batches
  // at, at + stride, ..., at + (depth - 1) * stride.
  const uint64_t at = epoch * per + first, end = at + depth * stride;
  uint64_t from;
  {
    std::lock_guard<std::mutex> lock(prefetch_mu_);
    // Moving forward through the batches the last call requested (same n
    // and stride): only the batches after them. Anything else (a seek, a
    // new epoch set, another loader): all of them.
    const bool onward = n == prefetched_n_ && stride == prefetched_stride_ && at >= prefetched_lo_ &&
                        at <= prefetched_hi_ && (at - prefetched_lo_) % stride == 0;
    from = onward ? std::max(at, prefetched_hi_) : at;
    prefetched_lo_ = at;
    prefetched_hi_ = std::max(end, from);
    prefetched_n_ = n;
    prefetched_stride_ = stride;
  }
  if (stride == static_cast<uint64_t>(n)) {  // contiguous batches: one request
    if (from < end) RequestWindows(from / per, from % per, static_cast<int64_t>(end - from), n);
    return;
  }
  for (uint64_t b = from; b < end; b += stride) RequestWindows(b / per, b % per, n, n);
}

void PatchSampler::RequestWindows(uint64_t epoch, uint64_t first, int64_t n, int64_t after) const {
  const uint64_t per = windows_per_epoch();
  const uint64_t k = static_cast<uint64_t>(options_.patches_per_sample);
  epoch += first / per;
  first %= per;
  // The draws of windows [first, first + n) and of the `after` ones after
  // them. With MaskIndex::kBuild, the visits of those later ones (their
  // lists need whole masks).
  std::vector<std::pair<uint64_t, uint64_t>> draws, later;
  draws.reserve(static_cast<size_t>(n));
  uint64_t e = epoch, w = first;
  for (int64_t i = 0; i < (mask_field_ >= 0 ? n + after : n); ++i) {
    (i < n ? draws : later).push_back(VisitDraw(e, w / k, static_cast<int>(w % k)));
    if (++w == per) {
      ++e;
      w = 0;
    }
  }
  // The samples of those draws, each run of repeats once (a visit's k windows).
  auto samples = [](const std::vector<std::pair<uint64_t, uint64_t>>& ds) {
    std::vector<uint64_t> out;
    for (const auto& d : ds)
      if (out.empty() || out.back() != d.first) out.push_back(d.first);
    return out;
  };
  const bool whole_masks = mask_field_ >= 0 && options_.mask_index == MaskIndex::kBuild;
  if (whole_masks) PrefetchMasks(samples(draws));
  std::vector<Window> wins;
  if (!DrawMany(draws, &wins).ok()) return;  // the gather will report it
  const int64_t ph = options_.height(), pw = options_.width();
  for (const Window& win : wins)
    for (int f : fields_) reader_->PrefetchPatch(win.sample, f, win.y, win.x, ph, pw);
  stats_prefetched_.fetch_add(wins.size(), std::memory_order_relaxed);
  if (whole_masks) {
    PrefetchMasks(samples(later));
  } else if (mask_field_ >= 0) {
    // Draw the windows after them too, while the disk reads these: their
    // candidates' mask bytes are then in memory when their turn comes, so a
    // draw's rounds of candidates do not wait on the disk in turn with the
    // windows. The windows themselves are drawn again then (the same ones).
    (void)DrawMany(later, &wins);
  }
}

Status PatchSampler::Next(int64_t n, const std::vector<float*>& outs, std::vector<Window>* windows) {
  const uint64_t per_epoch = windows_per_epoch();
  if (per_epoch == 0)
    return Status::OutOfRange("sampling from '" + reader_->path() + "': no sample has an admissible window");
  if (windows) windows->clear();
  int64_t done = 0;
  std::vector<float*> shifted(outs.size());
  while (done < n) {
    const int64_t take = static_cast<int64_t>(std::min<uint64_t>(static_cast<uint64_t>(n - done), per_epoch - cursor_));
    for (size_t f = 0; f < outs.size(); ++f) shifted[f] = outs[f] + done * channels_[f] * height() * width();
    std::vector<Window> part;
    PS_RETURN_IF_ERROR(Gather(epoch_, cursor_, take, shifted, windows ? &part : nullptr));
    if (windows) windows->insert(windows->end(), part.begin(), part.end());
    done += take;
    cursor_ += static_cast<uint64_t>(take);
    if (cursor_ == per_epoch) {
      ++epoch_;
      cursor_ = 0;
    }
  }
  if (options_.prefetch_next) PrefetchAhead(epoch_, cursor_, n);
  return Status::OK();
}

}  // namespace patchstore
