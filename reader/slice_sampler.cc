#include "patchstore/reader/slice_sampler.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "patchstore/reader/sat.h"
#include "patchstore/reader/transform.h"
#include "reader/parallel.h"
#include "reader/sampling_policy.h"
#include "reader/window_sets.h"

namespace patchstore {
namespace {

constexpr uint64_t kSliceTag = 0x534C4943;  // "SLIC", as DrawSliceTransform
constexpr int64_t kMaxContext = int64_t{1} << 16;
constexpr int64_t kMaxSide = int64_t{1} << 31;

std::string FormatNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string Size(int64_t h, int64_t w) { return std::to_string(h) + "x" + std::to_string(w); }

std::string FieldList(const std::vector<std::string>& fields) {
  std::string out;
  for (const std::string& f : fields) out += (out.empty() ? "" : ", ") + f;
  return out;
}

// The frames sampler's options that carry the mask rule of `o`: its
// policies (MakeWindowPolicy) are the slice sampler's too.
SamplerOptions WindowRule(const SliceOptions& o) {
  SamplerOptions s;
  s.fields = {"-"};
  s.require = o.require;
  s.min_valid = o.min_valid;
  s.positive_fraction = o.positive_fraction;
  return s;
}

// One slice of a volume record located by Reader::Window(0, 0, H, W): a
// 1-channel plane, its window [y, y+h) x [x, x+w).
WindowSource SlicePlane(WindowSource v, int64_t slice, int64_t y, int64_t x, int64_t h, int64_t w) {
  v.payload += static_cast<size_t>(slice * v.H * v.W) * DTypeSize(v.dtype);
  v.C = 1;
  v.y = y;
  v.x = x;
  v.h = h;
  v.w = w;
  return v;
}

// The summed-area table of a row-major plane (as reader/sat.h counts:
// the normalised value non-zero and not NaN) into *table, (H+1) x (W+1).
SatView PlaneSat(const WindowSource& p, std::vector<uint32_t>* table) {
  table->assign(static_cast<size_t>((p.H + 1) * (p.W + 1)), 0);
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(p.W));
  VisitDType(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* src = reinterpret_cast<const T*>(p.payload);
    for (int64_t y = 0; y < p.H; ++y) {
      ConvertRun(src + y * p.W, p.W, row.data(), p.lut);
      SatRow(row.data(), p.W, table->data() + y * (p.W + 1), table->data() + (y + 1) * (p.W + 1));
    }
  });
  return SatView{table->data(), 1, p.H, p.W, nullptr};
}

}  // namespace

// ---------------------------------------------------------------------------
// Options

std::string SliceOptionSpelling(const std::string& member) {
  struct Row {
    const char* member;
    const char* python;
    const char* cli;
  };
#define PATCHSTORE_SLICE_SPELLING_ROW(m, py, cli, doc) {#m, py, cli},
  static const Row kRows[] = {PATCHSTORE_SLICE_OPTIONS(PATCHSTORE_SLICE_SPELLING_ROW)};
#undef PATCHSTORE_SLICE_SPELLING_ROW
  for (const Row& r : kRows) {
    if (member != r.member) continue;
    const std::string cli = r.cli;
    return cli.empty() ? std::string(r.python) : std::string(r.python) + " (" + cli + ")";
  }
  return member;
}

const char* SliceFlipName(SliceFlip flip) {
  switch (flip) {
    case SliceFlip::kNone: return "";
    case SliceFlip::kBoth: return "both";
    case SliceFlip::kIndependent: return "independent";
  }
  return "";
}

Result<SliceFlip> ParseSliceFlip(const std::string& name) {
  if (name == "independent") return SliceFlip::kIndependent;
  if (name == "both" || name == "true" || name == "1") return SliceFlip::kBoth;
  if (name.empty() || name == "false" || name == "0") return SliceFlip::kNone;
  return Status::InvalidArgument(SliceOptionSpelling("flip") +
                                 " must be False, True or 'independent' (CLI: --flip or --flip=independent), got '" +
                                 name + "'");
}

Result<SliceContext> ParseSliceContext(const std::string& text) {
  SliceContext c;
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(SliceOptionSpelling("context") + " must be C or FIELD=C,FIELD=C (C >= 0), got '" +
                                   text + "': " + why);
  };
  auto number = [&](const std::string& s, int64_t* out) {
    if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos) return false;
    *out = std::stoll(s);
    return true;
  };
  if (text.empty()) return bad("empty");
  bool bare = false;
  size_t at = 0;
  while (at <= text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string part = text.substr(at, end - at);
    const size_t eq = part.find('=');
    int64_t v = 0;
    if (eq == std::string::npos) {
      if (bare) return bad("two numbers for every field");
      if (!number(part, &v)) return bad("'" + part + "' is not a count of slices");
      c.all = v;
      bare = true;
    } else {
      const std::string name = part.substr(0, eq);
      if (name.empty()) return bad("a field name is missing before '='");
      if (!number(part.substr(eq + 1), &v)) return bad("'" + part.substr(eq + 1) + "' is not a count of slices");
      c.fields.emplace_back(name, v);
    }
    at = end + 1;
  }
  return c;
}

SamplingPolicy SliceOptions::ResolvedPolicy() const { return WindowRule(*this).ResolvedPolicy(); }

bool SliceOptions::ClampOf(const std::string& field, double* lo, double* hi) const {
  const SliceClamp* any = nullptr;
  for (const SliceClamp& c : clamp) {
    if (c.field == field) {
      *lo = c.lo;
      *hi = c.hi;
      return true;
    }
    if (c.field.empty()) any = &c;
  }
  if (any == nullptr) return false;
  *lo = any->lo;
  *hi = any->hi;
  return true;
}

Status SliceOptions::Validate() const {
  auto bad = [](const std::string& member, const std::string& rule) {
    return Status::InvalidArgument(SliceOptionSpelling(member) + " " + rule);
  };
  auto served = [&](const std::string& f) { return std::find(fields.begin(), fields.end(), f) != fields.end(); };
  if (fields.empty()) return Status::InvalidArgument("no fields given");
  for (size_t i = 0; i < fields.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (fields[i] == fields[j]) return Status::InvalidArgument("fields name '" + fields[i] + "' twice");
  auto context_range = [&](int64_t c, const std::string& of) -> Status {
    if (c < 0 || c > kMaxContext)
      return bad("context",
                 "must be in [0, " + std::to_string(kMaxContext) + "] slices" + of + ", got " + std::to_string(c));
    return Status::OK();
  };
  PS_RETURN_IF_ERROR(context_range(context.all, ""));
  for (size_t i = 0; i < context.fields.size(); ++i) {
    const std::string& name = context.fields[i].first;
    if (!served(name))
      return bad("context",
                 "names field '" + name + "', which is not among the fields served (" + FieldList(fields) + ")");
    for (size_t j = 0; j < i; ++j)
      if (context.fields[j].first == name) return bad("context", "names field '" + name + "' twice");
    PS_RETURN_IF_ERROR(context_range(context.fields[i].second, " for '" + name + "'"));
  }
  if (!(crop.none() || (crop.h >= 1 && crop.w >= 1 && crop.h < kMaxSide && crop.w < kMaxSide)))
    return bad("crop", "must be S or (h, w) with sides in [1, 2**31), got (" + std::to_string(crop.h) + ", " +
                           std::to_string(crop.w) + ")");
  if (rot90 && !crop.none() && crop.h != crop.w)
    return Status::InvalidArgument(SliceOptionSpelling("rot90") +
                                   " needs a square crop (odd turns swap height and width), got " +
                                   Size(crop.h, crop.w));
  if (flip != SliceFlip::kNone && flip != SliceFlip::kBoth && flip != SliceFlip::kIndependent)
    return bad("flip", "must be False, True or 'independent'");
  if (!(min_valid > 0 && std::isfinite(min_valid)))
    return bad("min_valid",
               "must be positive (voxels >= 1, or a fraction of the window < 1), got " + FormatNumber(min_valid));
  if (!crop.none() && !(min_valid <= static_cast<double>(crop.h) * static_cast<double>(crop.w)))
    return bad("min_valid", FormatNumber(min_valid) + " asks for more valid voxels than a " + Size(crop.h, crop.w) +
                                " crop holds (" + std::to_string(crop.h * crop.w) + ")");
  if (!(min_valid < 1e18)) return bad("min_valid", "is too large, got " + FormatNumber(min_valid));
  if (!(positive_fraction == -1 || (positive_fraction >= 0 && positive_fraction <= 1)))
    return bad("positive_fraction", "must be in [0, 1] (None, CLI -1: off), got " + FormatNumber(positive_fraction));
  for (size_t i = 0; i < clamp.size(); ++i) {
    const SliceClamp& c = clamp[i];
    const std::string of = c.field.empty() ? "every field" : "'" + c.field + "'";
    if (!c.field.empty() && !served(c.field))
      return bad("clamp",
                 "names field '" + c.field + "', which is not among the fields served (" + FieldList(fields) + ")");
    for (size_t j = 0; j < i; ++j)
      if (clamp[j].field == c.field) return bad("clamp", "for " + of + " is given twice");
    if (!(c.lo <= c.hi))
      return bad("clamp",
                 "for " + of + " needs lo <= hi, got (" + FormatNumber(c.lo) + ", " + FormatNumber(c.hi) + ")");
  }
  if (!(clamp_warn == -1 || (clamp_warn >= 0 && clamp_warn <= 1)))
    return bad("clamp_warn", "must be a fraction in [0, 1] (None, C++ -1: never), got " + FormatNumber(clamp_warn));
  if (output != Output::kFloat32 && output != Output::kStored) return bad("output", "must be 'float32' or 'stored'");
  if (num_threads < 1 || num_threads > 4096)
    return bad("num_threads", "must be in [1, 4096] (Python 0: all cores), got " + std::to_string(num_threads));
  // The mask rule's own checks (positive_fraction needs require, ...): the frames sampler's policies.
  auto policy = MakeWindowPolicy(WindowRule(*this), "");
  if (!policy.ok()) return policy.status();
  return Status::OK();
}

// ---------------------------------------------------------------------------
// The sampler

struct SliceSampler::Lists {
  uint64_t sample = 0;
  int64_t slice = 0;
  WindowSet pos, neg;
};

uint64_t SliceSampler::Threshold(int64_t area) const {
  const double m = options_.min_valid;
  const uint64_t t = m < 1 ? static_cast<uint64_t>(std::ceil(m * static_cast<double>(area)))
                           : static_cast<uint64_t>(std::ceil(m));
  return std::max<uint64_t>(t, 1);
}

Result<std::unique_ptr<SliceSampler>> SliceSampler::Create(std::shared_ptr<const Reader> reader, const SliceOptions& o,
                                                           const std::vector<uint8_t>* slice_flags) {
  auto s = std::unique_ptr<SliceSampler>(new SliceSampler());
  s->reader_ = reader;
  s->options_ = o;
  const std::string where = "slices of '" + reader->path() + "'";
  if (reader->meta().kind != "volumes")
    return Status::InvalidArgument(where +
                                   ": slices are served from volume stores (written by `patchstore ingest "
                                   "hdf5`); this one holds " +
                                   reader->meta().kind);
  PS_RETURN_IF_ERROR(o.Validate());
  for (const std::string& f : o.fields) {
    auto fi = reader->FieldIndex(f);
    if (!fi.ok()) return fi.status().WithContext(where);
    s->fields_.push_back(*fi);
    s->contexts_.push_back(o.context.Of(f));
  }
  PS_ASSIGN_OR_RETURN(s->policy_, MakeWindowPolicy(WindowRule(o), where));
  if (s->policy_->uses_mask()) {
    auto mf = reader->FieldIndex(o.require);
    if (!mf.ok()) return mf.status().WithContext(where + " (require)");
    s->mask_field_ = *mf;
  }
  // The volumes considered: the subset in its order, or every one.
  std::vector<uint64_t> order;
  if (o.ids.empty() && o.samples.empty()) {
    order.resize(reader->size());
    for (uint64_t i = 0; i < order.size(); ++i) order[i] = i;
  } else {
    for (const std::string& id : o.ids) {
      auto i = reader->Find(id);
      if (!i.ok()) return i.status().WithContext(where + " (ids)");
      order.push_back(*i);
    }
    for (uint64_t i : o.samples) {
      if (i >= reader->size())
        return Status::OutOfRange(where + ": volume index " + std::to_string(i) + " outside [0, " +
                                  std::to_string(reader->size()) + ")");
      order.push_back(i);
    }
  }
  PS_ASSIGN_OR_RETURN(SliceIndex all, SliceIndex::Build(*reader, order));
  s->considered_volumes_ = all.volume_count();
  // Volumes without a slice, or with slices smaller than the crop, give no item.
  const VolumeSelection sel = SelectVolumesGivingItems(*reader, all, o.crop.h, o.crop.w);
  std::vector<std::pair<uint64_t, std::string>> skipped;  // (sample, why)
  for (uint64_t v = 0; v < all.volume_count(); ++v)
    if (!all.GivesItems(v, o.crop.h, o.crop.w))
      skipped.emplace_back(all.sample(v),
                           all.depth(v) == 0 ? std::string("no slice") : Size(all.height(v), all.width(v)) + " slices");
  if (sel.kept.empty())
    return Status::InvalidArgument(
        where + ": no volume gives an item" +
        (o.crop.none() ? std::string()
                       : ": crop " + Size(o.crop.h, o.crop.w) + " is larger than the slices of every volume") +
        " (" + sel.skipped_text + ")");
  if (sel.skipped.empty()) {
    s->index_ = std::move(all);
  } else {
    PS_ASSIGN_OR_RETURN(s->index_, SliceIndex::Build(*reader, sel.kept));
  }
  if (o.rot90 && o.crop.none())
    for (uint64_t v = 0; v < s->index_.volume_count(); ++v)
      if (s->index_.height(v) != s->index_.width(v))
        return Status::InvalidArgument(where + ": " + SliceOptionSpelling("rot90") +
                                       " needs square slices or a square crop (odd turns swap height and width); "
                                       "volume '" +
                                       std::string(reader->id(s->index_.sample(v))) + "' has " +
                                       Size(s->index_.height(v), s->index_.width(v)) + " slices");
  if (s->mask_field_ >= 0) {
    if (slice_flags != nullptr) {
      if (slice_flags->size() != s->index_.size())
        return Status::InvalidArgument(where + ": " + std::to_string(slice_flags->size()) +
                                       " slice flags for an index of " + std::to_string(s->index_.size()) +
                                       " slices (flags of another store or other options)");
      for (uint8_t f : *slice_flags)
        if (f > (kPositive | kNegative) || f == 0)
          return Status::InvalidArgument(where + ": slice flag " + std::to_string(f) + " is not a slice's flags");
      s->flags_ = *slice_flags;
    } else {
      PS_RETURN_IF_ERROR(s->ComputeFlags().WithContext(where));
    }
    if (o.ResolvedPolicy() == SamplingPolicy::kMinValid) {
      // min_valid: the items are the qualifying slices; a volume without one gives none.
      std::vector<uint64_t> keep;
      std::vector<bool> kept(s->index_.volume_count(), false);
      const std::string window = o.crop.none() ? std::string("slice") : Size(o.crop.h, o.crop.w) + " crop";
      for (uint64_t v = 0; v < s->index_.volume_count(); ++v) {
        bool any = false;
        for (uint64_t f = s->index_.first(v); f < s->index_.first(v + 1) && !any; ++f)
          any = (s->flags_[f] & kPositive) != 0;
        if (any) {
          keep.push_back(s->index_.sample(v));
          kept[v] = true;
          continue;
        }
        const int64_t area = o.crop.none() ? s->index_.height(v) * s->index_.width(v) : o.crop.h * o.crop.w;
        skipped.emplace_back(s->index_.sample(v), "no " + window + " with >= " + std::to_string(s->Threshold(area)) +
                                                      " valid voxels of '" + o.require + "'");
      }
      if (keep.empty()) {
        std::string text;
        for (size_t k = 0; k < skipped.size() && k < 4; ++k)
          text += (k ? ", '" : "'") + std::string(reader->id(skipped[k].first)) + "' (" + skipped[k].second + ")";
        return Status::InvalidArgument(where + ": no slice qualifies (require='" + o.require + "', min_valid=" +
                                       FormatNumber(o.min_valid) + "): " + text + (skipped.size() > 4 ? ", ..." : ""));
      }
      if (keep.size() != s->index_.volume_count()) {
        // Rebuild the index without them, keeping the flags of the others.
        std::vector<uint8_t> flags;
        for (uint64_t v = 0; v < s->index_.volume_count(); ++v)
          if (kept[v])
            flags.insert(flags.end(), s->flags_.begin() + static_cast<int64_t>(s->index_.first(v)),
                         s->flags_.begin() + static_cast<int64_t>(s->index_.first(v + 1)));
        PS_ASSIGN_OR_RETURN(s->index_, SliceIndex::Build(*reader, keep));
        s->flags_ = std::move(flags);
      }
      s->restricted_ = true;
      for (uint64_t f = 0; f < s->flags_.size(); ++f)
        if (s->flags_[f] & kPositive) s->items_.push_back(f);
    } else {
      // positive_fraction: each volume's slices of either kind, for replacement draws.
      const uint64_t nv = s->index_.volume_count();
      s->pos_first_.assign(nv + 1, 0);
      s->neg_first_.assign(nv + 1, 0);
      for (uint64_t v = 0; v < nv; ++v) {
        for (uint64_t f = s->index_.first(v); f < s->index_.first(v + 1); ++f) {
          const uint32_t k = static_cast<uint32_t>(f - s->index_.first(v));
          if (s->flags_[f] & kPositive) s->pos_.push_back(k);
          if (s->flags_[f] & kNegative) s->neg_.push_back(k);
        }
        s->pos_first_[v + 1] = s->pos_.size();
        s->neg_first_[v + 1] = s->neg_.size();
      }
    }
  } else {
    s->flags_.assign(s->index_.size(), 0);
  }
  for (size_t k = 0; k < skipped.size(); ++k) {
    s->skipped_.push_back(skipped[k].first);
    if (k < 4)
      s->skipped_text_ += (k ? ", '" : "'") + std::string(reader->id(skipped[k].first)) + "' (" + skipped[k].second +
                          ")";
  }
  if (skipped.size() > 4) s->skipped_text_ += ", ...";
  return s;
}

Status SliceSampler::ComputeFlags() {
  flags_.assign(index_.size(), 0);
  const bool need_neg = options_.ResolvedPolicy() == SamplingPolicy::kPositiveFraction;
  const bool crop = !options_.crop.none();
  const uint64_t nv = index_.volume_count();
  std::vector<Status> status(nv);
  auto volume = [&](uint64_t v) -> Status {
    const uint64_t sample = index_.sample(v);
    const int64_t S = index_.depth(v), H = index_.height(v), W = index_.width(v);
    const int64_t h = crop ? options_.crop.h : H, w = crop ? options_.crop.w : W;
    const uint64_t T = Threshold(h * w);
    const uint64_t plane = static_cast<uint64_t>(H * W);
    uint8_t* flags = flags_.data() + index_.first(v);
    // The flags of a slice from its valid count c, where c decides them;
    // 0 when only its windows do.
    auto from_count = [&](uint64_t c) -> uint8_t {
      if (c < T) return kNegative;  // no window holds more than the slice
      if (!crop) return kPositive;  // the window is the slice
      if (c == plane) return static_cast<uint64_t>(h * w) >= T ? kPositive : kNegative;  // every window full
      if (T == 1 && !need_neg) return kPositive;  // any window over a valid voxel qualifies
      return 0;
    };
    const RecordSummary& ms = reader_->summary(sample, mask_field_);
    if (ms.has_valid_count && (ms.valid_count == 0 || ms.valid_count == plane * static_cast<uint64_t>(S))) {
      const uint8_t f = from_count(ms.valid_count == 0 ? 0 : plane);
      if (f != 0) {  // the summary decides every slice: no mask voxel read
        std::fill(flags, flags + S, f);
        return Status::OK();
      }
    }
    PS_ASSIGN_OR_RETURN(WindowSource vol, reader_->Window(sample, mask_field_, 0, 0, H, W));
    if (vol.tile != 0)
      return Status::InvalidArgument("require='" + options_.require + "': " + reader_->Describe(sample, mask_field_) +
                                     " is stored in tiles; mask-aware slices need row-major volumes");
    reader_->Prefetch(sample, mask_field_);  // read whole, once
    thread_local std::vector<uint32_t> table;
    for (int64_t k = 0; k < S; ++k) {
      const WindowSource p = SlicePlane(vol, k, 0, 0, H, W);
      uint8_t f = from_count(CountNonZero(p));
      if (f == 0) {
        // The crop's windows decide: the slice's summed-area table.
        const SatView sat = PlaneSat(p, &table);
        bool pos = false, neg = false;
        for (int64_t y = 0; y + h <= H && !(pos && neg); ++y)
          for (int64_t x = 0; x + w <= W && !(pos && neg); ++x) (sat.Count(0, y, x, h, w) >= T ? pos : neg) = true;
        f = static_cast<uint8_t>((pos ? kPositive : 0) | (neg ? kNegative : 0));
      }
      flags[k] = f;
    }
    return Status::OK();
  };
  ParallelBlocks(static_cast<int64_t>(nv), options_.num_threads, [&](int64_t b, int64_t e) {
    for (int64_t v = b; v < e; ++v) status[v] = volume(static_cast<uint64_t>(v));
  });
  for (const Status& st : status) PS_RETURN_IF_ERROR(st);
  return Status::OK();
}

Result<uint64_t> SliceSampler::WindowCount(uint64_t sample, int64_t slice, int64_t y, int64_t x, int64_t h,
                                           int64_t w) const {
  const RecordSummary& ms = reader_->summary(sample, mask_field_);
  const int64_t H = static_cast<int64_t>(ms.shape[1]), W = static_cast<int64_t>(ms.shape[2]);
  PS_ASSIGN_OR_RETURN(WindowSource vol, reader_->Window(sample, mask_field_, 0, 0, H, W));
  if (vol.tile != 0) return Status::InvalidArgument(reader_->Describe(sample, mask_field_) + " is stored in tiles");
  return CountNonZero(SlicePlane(vol, slice, y, x, h, w));
}

Result<std::shared_ptr<const SliceSampler::Lists>> SliceSampler::ListsOf(uint64_t sample, int64_t slice, int64_t H,
                                                                         int64_t W, uint64_t threshold) const {
  const uint64_t key = splitmix::Key(sample, static_cast<uint64_t>(slice));
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = lists_.find(key);
    if (it != lists_.end() && it->second->sample == sample && it->second->slice == slice) return it->second;
  }
  PS_ASSIGN_OR_RETURN(WindowSource vol, reader_->Window(sample, mask_field_, 0, 0, H, W));
  if (vol.tile != 0) return Status::InvalidArgument(reader_->Describe(sample, mask_field_) + " is stored in tiles");
  thread_local std::vector<uint32_t> table;
  const SatView sat = PlaneSat(SlicePlane(vol, slice, 0, 0, H, W), &table);
  auto lists = std::make_shared<Lists>();
  lists->sample = sample;
  lists->slice = slice;
  BuildWindowSets(sat, 0, options_.crop.h, options_.crop.w, threshold, &lists->pos, &lists->neg);
  const uint64_t bytes = lists->pos.bytes() + lists->neg.bytes() + sizeof(Lists) + 64;
  std::lock_guard<std::mutex> lock(mu_);
  lists_[key] = lists;
  lists_order_.emplace_back(key, bytes);
  lists_bytes_ += bytes;
  while (lists_bytes_ > kListCacheBytes && lists_order_.size() > 1) {
    lists_.erase(lists_order_.front().first);
    lists_bytes_ -= std::min(lists_bytes_, lists_order_.front().second);
    lists_order_.pop_front();
  }
  return std::shared_ptr<const Lists>(lists);
}

Result<SliceItem> SliceSampler::Item(uint64_t epoch, uint64_t i) const {
  if (i >= size())
    return Status::OutOfRange("slice item " + std::to_string(i) + " out of range [0, " + std::to_string(size()) +
                              ") of '" + reader_->path() + "'");
  const SliceOptions& o = options_;
  const uint64_t f = item_slice(i);
  const uint64_t v = index_.volume_of(f);
  const uint64_t sample = index_.sample(v);
  int64_t slice = static_cast<int64_t>(f - index_.first(v));
  const int64_t H = index_.height(v), W = index_.width(v);
  SliceItem item;
  item.transform = DrawSliceTransform(o.seed, epoch, i, H, W, o.crop.h, o.crop.w, o.flip, o.rot90);
  if (mask_field_ >= 0) {
    const uint64_t key = splitmix::Key(o.seed, epoch, i, kSliceTag);
    uint8_t kind = policy_->WantQualifying(splitmix::Mix(key ^ 5)) ? kPositive : kNegative;
    if (!(flags_[f] & kind)) {
      // Item i's slice has no window of that kind: a slice of the volume that has one, or, when no
      // slice of the volume has one, the other kind (which item i's slice then has).
      auto list = [&](uint8_t k) {
        const std::vector<uint32_t>& l = k == kPositive ? pos_ : neg_;
        const std::vector<uint64_t>& first = k == kPositive ? pos_first_ : neg_first_;
        return std::make_pair(l.data() + first[v], first[v + 1] - first[v]);
      };
      const auto [slices, n] = list(kind);
      if (n == 0) {
        kind ^= kPositive | kNegative;
      } else {
        slice = slices[splitmix::Below(splitmix::Mix(key ^ 6), n)];
      }
    }
    item.positive = kind == kPositive;
    if (!o.crop.none()) {
      const int64_t ny = H - o.crop.h + 1, nx = W - o.crop.w + 1;
      const uint64_t T = Threshold(o.crop.h * o.crop.w);
      bool found = false;
      for (int t = 0; t < PatchSampler::kWindowTries && !found; ++t) {
        int64_t y = item.transform.y, x = item.transform.x;  // candidate 0: the crop drawn without a mask
        if (t > 0) CandidateWindow(key, t, ny, nx, &y, &x);
        PS_ASSIGN_OR_RETURN(uint64_t c, WindowCount(sample, slice, y, x, o.crop.h, o.crop.w));
        if ((c >= T) == item.positive) {
          item.transform.y = y;
          item.transform.x = x;
          found = true;
        }
      }
      if (!found) {
        // An exact draw from the slice's windows of that kind.
        PS_ASSIGN_OR_RETURN(auto lists, ListsOf(sample, slice, H, W, T));
        const WindowSet& set = item.positive ? lists->pos : lists->neg;
        if (!set.Draw(splitmix::Below(splitmix::Mix(key ^ 7), set.total), &item.transform.y, &item.transform.x))
          return Status::Internal("slice " + std::to_string(slice) + " of " + reader_->Describe(sample, mask_field_) +
                                  ": no " + (item.positive ? "qualifying" : "other") +
                                  " crop where the slice flags promised one (flags of another store?)");
      }
    }
  }
  item.ref = SliceRef{sample, slice, index_.depth(v)};
  std::tie(item.out_h, item.out_w) = item.transform.OutputSize(H, W);
  return item;
}

Status SliceSampler::Items(uint64_t epoch, const uint64_t* idx, size_t n, SliceItem* out) const {
  for (size_t k = 0; k < n; ++k)
    if (idx[k] >= size())
      return Status::OutOfRange("slice item " + std::to_string(idx[k]) + " out of range [0, " + std::to_string(size()) +
                                ") of '" + reader_->path() + "'");
  // Mask-aware crops count candidate windows: worth the threads; plain draws are a few hashes each.
  const int threads = mask_field_ >= 0 && !options_.crop.none() ? options_.num_threads : 1;
  std::vector<Status> status(static_cast<size_t>(std::max(threads, 1)));
  std::atomic<int> next_block{0};
  ParallelBlocks(static_cast<int64_t>(n), threads, [&](int64_t b, int64_t e) {
    const int block = next_block.fetch_add(1);
    for (int64_t k = b; k < e; ++k) {
      auto it = Item(epoch, idx[k]);
      if (!it.ok()) {
        status[static_cast<size_t>(block)] = it.status();
        return;
      }
      out[k] = *it;
    }
  });
  for (const Status& st : status) PS_RETURN_IF_ERROR(st);
  return Status::OK();
}

std::string SliceSampler::SkippedReport() const {
  if (skipped_.empty()) return "";
  return std::to_string(skipped_.size()) + " of " + std::to_string(considered_volumes_) + " volumes of '" +
         reader_->path() + "' give no item and are skipped" +
         (options_.crop.none() ? std::string() : " (crop " + Size(options_.crop.h, options_.crop.w) + ")") + ": " +
         skipped_text_;
}

}  // namespace patchstore
