#include "patchstore/reader/reader.h"

#include "reader/parallel.h"
#include "store/shard.h"

#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>

namespace patchstore {
namespace {

// On an error path: when the store changed under a lock-free snapshot, the
// error is that change (pages may have been reused), not what it looks like.
Status UnlessChanged(const Snapshot& snap, Status st) {
  Status changed = snap.CheckUnchanged();
  return changed.ok() ? st : changed;
}

}  // namespace

Result<std::shared_ptr<Reader>> Reader::Open(const std::string& path, const ReaderOptions& options) {
  SnapshotOptions so;
  so.force_no_lock = options.no_lock;
  PS_ASSIGN_OR_RETURN(auto snap, Snapshot::Open(path, so));
  auto r = std::shared_ptr<Reader>(new Reader());
  r->path_ = path;
  r->options_ = options;
  r->snapshot_ = std::move(snap);
  r->meta_ = &r->snapshot_->meta();
  r->owner_ = r->snapshot_;
  r->no_lock_ = r->snapshot_->no_lock();
  r->stores_.push_back(StoreRef{r->snapshot_, path, 0});
  r->pid_ = ::getpid();
  r->BuildFieldTables();
  PS_RETURN_IF_ERROR(r->Index());
  return r;
}

namespace {

std::string LayoutText(const FieldMeta& f) {
  if (f.layout == Layout::kSHW) return "volume (SHW)";
  if (f.layout != Layout::kCHW) return "layout " + std::to_string(static_cast<int>(f.layout));
  return f.tile ? "tiles of " + std::to_string(f.tile) + "x" + std::to_string(f.tile) : "rows";
}

// False when `a` and `b` are the same field for a set; else true with the
// first property that differs and its two values (as printed).
bool FieldDiffers(const FieldMeta& a, const FieldMeta& b, std::string* what, std::string* va, std::string* vb) {
  auto differ = [&](const char* property, std::string x, std::string y) {
    if (x == y) return false;
    *what = property;
    *va = std::move(x);
    *vb = std::move(y);
    return true;
  };
  return differ("name", a.name, b.name) || differ("channels", std::to_string(a.channels), std::to_string(b.channels)) ||
         differ("layout", LayoutText(a), LayoutText(b)) ||
         differ("mask", a.is_mask ? "a mask" : "not a mask", b.is_mask ? "a mask" : "not a mask") ||
         differ("dtype", DTypeName(a.dtype), DTypeName(b.dtype)) ||
         (!(a.norm == b.norm) && differ("normalisation", a.norm.ToString(), b.norm.ToString()));
}

// OK when the store `m` (at `path`) may join a set modelled on `model`
// (at `model_path`); else InvalidArgument naming the property and both values.
Status CompareSetMember(const StoreMeta& model, const std::string& model_path, const StoreMeta& m,
                        const std::string& path) {
  auto fail = [&](const std::string& what) {
    return Status::InvalidArgument("opening a set of stores: " + what + ": a set needs the same fields in every store");
  };
  if (m.kind != model.kind)
    return fail("store '" + path + "' holds " + m.kind + ", store '" + model_path + "' holds " + model.kind);
  for (const FieldMeta& f : model.fields)
    if (m.FieldIndex(f.name) < 0)
      return fail("store '" + path + "' has no field '" + f.name + "' (store '" + model_path + "' has)");
  for (const FieldMeta& f : m.fields)
    if (model.FieldIndex(f.name) < 0)
      return fail("store '" + path + "' has a field '" + f.name + "' that store '" + model_path + "' has not");
  for (size_t i = 0; i < m.fields.size(); ++i) {
    const FieldMeta& mine = m.fields[i];
    const FieldMeta& theirs = model.fields[i];
    std::string what, va, vb;
    if (mine.name != theirs.name)
      return fail("store '" + path + "' has field '" + mine.name + "' at position " + std::to_string(i) + ", store '" +
                  model_path + "' field '" + theirs.name + "'");
    if (FieldDiffers(mine, theirs, &what, &va, &vb))
      return fail("store '" + path + "' field '" + mine.name + "': " + what + " " + va + ", store '" + model_path +
                  "' has " + vb);
  }
  return Status::OK();
}

}  // namespace

Result<std::shared_ptr<Reader>> Reader::OpenSet(const std::vector<std::string>& paths, const ReaderOptions& options) {
  if (paths.empty()) return Status::InvalidArgument("opening a set of stores: no store given");
  SnapshotOptions so;
  so.force_no_lock = options.no_lock;
  struct Opened {
    std::shared_ptr<Snapshot> snap;
    std::string path;
    uint32_t index = 0, count = 0;
  };
  std::vector<Opened> opened;
  for (const std::string& p : paths) {
    PS_ASSIGN_OR_RETURN(auto snap, Snapshot::Open(p, so));
    Opened o{std::move(snap), p};
    Status st = ShardOfStore(o.snap->meta(), &o.index, &o.count);
    if (!st.ok()) return st.WithContext("opening store '" + p + "'");
    opened.push_back(std::move(o));
  }
  // Shards: one set, complete, in shard order.
  const Opened& first = opened.front();
  for (const Opened& o : opened) {
    if ((o.count == 0) != (first.count == 0))
      return Status::InvalidArgument("opening a set of stores: '" + (o.count ? o.path : first.path) + "' is a shard (" +
                                     std::to_string(o.count ? o.index : first.index) + "/" +
                                     std::to_string(o.count ? o.count : first.count) + ") but '" +
                                     (o.count ? first.path : o.path) + "' is not (ingested without --shard)");
    if (o.count != first.count)
      return Status::InvalidArgument("opening a shard set: '" + first.path + "' is shard " +
                                     std::to_string(first.index) + "/" + std::to_string(first.count) + " but '" +
                                     o.path + "' is shard " + std::to_string(o.index) + "/" + std::to_string(o.count) +
                                     " (stores of two different shard sets)");
  }
  if (first.count != 0) {
    std::vector<const Opened*> by_index(first.count, nullptr);
    for (const Opened& o : opened) {
      if (by_index[o.index] != nullptr)
        return Status::InvalidArgument("opening a shard set: '" + by_index[o.index]->path + "' and '" + o.path +
                                       "' are both shard " + std::to_string(o.index) + "/" + std::to_string(o.count));
      by_index[o.index] = &o;
    }
    std::string missing;
    size_t n_missing = 0;
    for (uint32_t i = 0; i < first.count; ++i)
      if (by_index[i] == nullptr) {
        ++n_missing;
        if (n_missing <= 10) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
      }
    if (n_missing && !options.partial_set)
      return Status::InvalidArgument("opening a shard set of " + std::to_string(first.count) +
                                     " shards: " + std::to_string(opened.size()) + " found (first: '" + first.path +
                                     "'), shard" + (n_missing > 1 ? "s " : " ") + missing +
                                     (n_missing > 10 ? ", ..." : "") + " missing");
    std::vector<Opened> sorted;
    for (const Opened* o : by_index)
      if (o != nullptr) sorted.push_back(*o);
    opened.swap(sorted);
  }
  auto r = std::shared_ptr<Reader>(new Reader());
  r->options_ = options;
  r->pid_ = ::getpid();
  // A shard that received no sample (and so has no fields) fits any set.
  auto fieldless = [](const Opened& o) { return o.snap->id_count() == 0 && o.snap->meta().fields.empty(); };
  const Opened* model = &opened.front();
  for (const Opened& o : opened)
    if (!fieldless(o)) {
      model = &o;
      break;
    }
  r->set_meta_ = model->snap->meta();
  r->set_meta_.sample_count = 0;
  r->set_meta_.sealed = true;
  r->no_lock_ = true;
  auto holder = std::make_shared<std::vector<std::shared_ptr<Snapshot>>>();
  for (const Opened& o : opened) {
    const StoreMeta& m = o.snap->meta();
    if (!fieldless(o)) PS_RETURN_IF_ERROR(CompareSetMember(r->set_meta_, model->path, m, o.path));
    r->stores_.push_back(StoreRef{o.snap, o.path, r->set_meta_.sample_count});
    r->set_meta_.sample_count += o.snap->id_count();
    r->set_meta_.sealed = r->set_meta_.sealed && m.sealed;
    r->no_lock_ = r->no_lock_ && o.snap->no_lock();
    holder->push_back(o.snap);
  }
  // Address-based requests (prefetch, residency) go through a store that
  // has a map: the first one holding samples.
  r->snapshot_ = r->stores_.front().snapshot;
  for (const StoreRef& s : r->stores_)
    if (s.snapshot->id_count() > 0) {
      r->snapshot_ = s.snapshot;
      break;
    }
  r->meta_ = &r->set_meta_;
  r->owner_ = holder;
  r->BuildFieldTables();
  r->path_ = r->stores_.size() == 1
                 ? r->stores_[0].path
                 : r->stores_[0].path + " (+" + std::to_string(r->stores_.size() - 1) + " more stores)";
  PS_RETURN_IF_ERROR(r->Index());
  if (r->stores_.size() > 1) PS_RETURN_IF_ERROR(r->OrderByInput());
  // Ids are unique across the set: build the lookup table now and name
  // both stores of an id found twice.
  std::call_once(r->find_once_, [&] {
    r->find_.reserve(r->ids_.size());
    for (uint64_t i = 0; i < r->ids_.size(); ++i) r->find_.emplace(r->ids_[i], i);
  });
  if (r->find_.size() != r->ids_.size()) {
    for (uint64_t i = 0; i < r->ids_.size(); ++i) {
      const uint64_t j = r->find_.at(r->ids_[i]);
      if (j != i) {
        uint64_t li = 0, lj = 0;
        const StoreRef& a = r->Locate(std::min(i, j), &li);
        const StoreRef& b = r->Locate(std::max(i, j), &lj);
        return Status::InvalidArgument("opening a set of stores: sample id '" + std::string(r->ids_[i]) + "' is in '" +
                                       a.path + "' (sample #" + std::to_string(li) + ") and in '" + b.path +
                                       "' (sample #" + std::to_string(lj) +
                                       "); every id must be in one store of a set");
      }
    }
  }
  return r;
}

Status Reader::OrderByInput() {
  const uint64_t n = ids_.size();
  std::vector<std::pair<uint64_t, uint64_t>> by_ordinal;  // (ordinal, global index in store order)
  by_ordinal.reserve(n);
  for (const StoreRef& s : stores_) {
    const uint64_t count = s.snapshot->id_count();
    if (count == 0) continue;
    auto order = s.snapshot->InputOrder();
    if (!order.ok()) {
      if (order.status().code() == Code::kNotFound) return Status::OK();  // shard order
      return order.status().WithContext("opening a set of stores (run `patchstore verify`)");
    }
    for (uint64_t i = 0; i < count; ++i) by_ordinal.emplace_back((*order)[i], s.begin + i);
  }
  std::sort(by_ordinal.begin(), by_ordinal.end());
  for (uint64_t g = 1; g < n; ++g)
    if (by_ordinal[g].first == by_ordinal[g - 1].first) return Status::OK();  // different inputs: shard order
  const size_t nf = meta().fields.size();
  std::vector<std::string_view> ids(n);
  std::vector<RecordSummary> summaries(summaries_.size());
  std::vector<uint32_t> store_of(n);
  std::vector<uint64_t> local_of(n);
  for (uint64_t g = 0; g < n; ++g) {
    const uint64_t old = by_ordinal[g].second;
    ids[g] = ids_[old];
    for (size_t f = 0; f < nf; ++f) summaries[g * nf + f] = summaries_[old * nf + f];
    const size_t s = StoreOf(old);
    store_of[g] = static_cast<uint32_t>(s);
    local_of[g] = old - stores_[s].begin;
  }
  ids_.swap(ids);
  summaries_.swap(summaries);
  order_store_.swap(store_of);
  order_local_.swap(local_of);
  return Status::OK();
}

uint64_t Reader::LocalIndex(uint64_t sample) const {
  uint64_t local = 0;
  Locate(sample, &local);
  return local;
}

size_t Reader::StoreOf(uint64_t sample) const {
  if (stores_.size() == 1) return 0;
  if (!order_store_.empty()) return order_store_[sample];
  auto it = std::upper_bound(stores_.begin(), stores_.end(), sample,
                             [](uint64_t s, const StoreRef& ref) { return s < ref.begin; });
  return static_cast<size_t>(it - stores_.begin()) - 1;
}

const Reader::StoreRef& Reader::Locate(uint64_t sample, uint64_t* local) const {
  if (!order_store_.empty()) {
    *local = order_local_[sample];
    return stores_[order_store_[sample]];
  }
  const StoreRef& s = stores_[StoreOf(sample)];
  *local = sample - s.begin;
  return s;
}

Status Reader::UnlessChangedAt(uint64_t sample, Status st) const {
  if (stores_.size() == 1 || sample < ids_.size()) {
    uint64_t local = 0;
    return UnlessChanged(*(stores_.size() == 1 ? stores_[0] : Locate(sample, &local)).snapshot, std::move(st));
  }
  for (const StoreRef& s : stores_) {
    Status changed = s.snapshot->CheckUnchanged();
    if (!changed.ok()) return changed;
  }
  return st;
}

bool Reader::InOpeningProcess() const { return ::getpid() == pid_; }

namespace {

// The candidate rule of a normalisation: the float32 steps of
// Normalization::Apply written as ((float)v / div) * mul + add (or v != 0).
// Only a candidate: MakeValueTable keeps it when it reproduces every value.
ValueTable RuleOf(const Normalization& n) {
  ValueTable t;
  t.rule = ValueTable::Rule::kAffine;
  switch (n.kind) {
    case NormKind::kNone: break;
    case NormKind::kUnit: t.div = static_cast<float>(n.scale); break;
    case NormKind::kSymmetric:
      t.div = static_cast<float>(n.scale);
      t.mul = 2.0f;
      t.add = -1.0f;
      break;
    case NormKind::kAffine:
      t.mul = static_cast<float>(n.scale);
      t.add = static_cast<float>(n.offset);
      break;
    case NormKind::kBinary: t.rule = ValueTable::Rule::kNonZero; break;
    default: t.rule = ValueTable::Rule::kLookup;  // kRange: computed in double
  }
  t.clamp = n.clamp;
  t.lo = static_cast<float>(n.clamp_lo);
  t.hi = static_cast<float>(n.clamp_hi);
  return t;
}

template <class T>
void FillValueTable(const Normalization& norm, std::vector<float>* values, ValueTable* t) {
  constexpr int64_t lo = std::is_signed_v<T> ? -32768 : 0;
  constexpr int64_t count = int64_t{1} << (8 * sizeof(T));
  values->resize(static_cast<size_t>(count));
  std::vector<T> all(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    all[static_cast<size_t>(i)] = static_cast<T>(lo + i);
    (*values)[static_cast<size_t>(i)] = norm.Apply(static_cast<double>(lo + i));
  }
  *t = RuleOf(norm);
  t->values = values->data();
  if (t->rule == ValueTable::Rule::kLookup) return;
  // The rule through the same ConvertRun the gather kernels call, on every
  // value at once (so vectorised exactly as there), compared bit for bit.
  std::vector<float> by_rule(values->size());
  ConvertRun(all.data(), count, by_rule.data(), t);
  if (std::memcmp(by_rule.data(), values->data(), values->size() * sizeof(float)) != 0)
    t->rule = ValueTable::Rule::kLookup;
}

}  // namespace

std::shared_ptr<const ValueTable> MakeValueTable(DType dtype, const Normalization& norm) {
  struct Owned {
    std::vector<float> values;
    ValueTable table;
  };
  auto o = std::make_shared<Owned>();
  if (dtype == DType::kUInt8) FillValueTable<uint8_t>(norm, &o->values, &o->table);
  else if (dtype == DType::kUInt16) FillValueTable<uint16_t>(norm, &o->values, &o->table);
  else FillValueTable<int16_t>(norm, &o->values, &o->table);
  return std::shared_ptr<const ValueTable>(o, &o->table);
}

void Reader::BuildFieldTables() {
  // One table per raw-source field, built with the same function (and the
  // same float32 arithmetic) as ingest: every converted value is exactly the
  // value a float32 record of the same source holds.
  struct Owned {
    std::shared_ptr<const void> owner;
    std::shared_ptr<const ValueTable> table;
  };
  tables_.assign(meta().fields.size(), nullptr);
  view_owners_.assign(meta().fields.size(), owner_);
  for (size_t f = 0; f < meta().fields.size(); ++f) {
    const FieldMeta& fm = meta().fields[f];
    if (!StoresRawSource(fm.dtype)) continue;
    auto o = std::make_shared<Owned>();
    o->owner = owner_;
    o->table = MakeValueTable(fm.dtype, fm.norm);
    tables_[f] = std::shared_ptr<const ValueTable>(o, o->table.get());
    view_owners_[f] = o;
  }
}

Status Reader::Index() {
  uint64_t total = 0;
  for (const StoreRef& s : stores_) total += s.snapshot->id_count();
  ids_.assign(total, std::string_view());
  summaries_.assign(total * meta().fields.size(), RecordSummary{});
  for (size_t s = 0; s < stores_.size(); ++s) PS_RETURN_IF_ERROR(IndexStore(s));
  // Record locations are looked up on first access (one B-tree descent
  // each), not walked here: opening reads no record page.
  slot_count_ = total * meta().fields.size();
  slots_.reset(new RecordSlot[slot_count_]);
  if (options_.verify_checksums) {
    verified_.reset(new std::atomic<uint8_t>[slot_count_]);
    for (size_t i = 0; i < slot_count_; ++i) verified_[i].store(0, std::memory_order_relaxed);
  }
  return Status::OK();
}

// Fills ids_ and summaries_ for the samples of one store (global indices
// base .. base + its count - 1).
Status Reader::IndexStore(size_t store) {
  const Snapshot* snapshot_ = stores_[store].snapshot.get();  // this store's, in the code below
  const std::string& path_ = stores_[store].path;
  const uint64_t base = stores_[store].begin;
  const uint64_t n = snapshot_->id_count();
  const size_t nf = meta().fields.size();
  std::string_view* ids_ = this->ids_.data() + base;
  auto fill = [&](uint64_t idx, const SampleSummary& sum) {
    for (size_t f = 0; f < sum.fields.size() && f < nf; ++f) summaries_[(base + idx) * nf + f] = sum.fields[f];
  };
  auto sealed = snapshot_->SealedIndex();
  if (sealed.ok()) {
    // A sealed store: every id and summary in one contiguous value, read
    // with one request instead of a walk over scattered B-tree pages.
    snapshot_->Advise(Access::kWillNeed, sealed->data(), sealed->size());
    auto entries = DecodeSealedIndex(sealed->data(), sealed->size());
    if (!entries.ok()) return entries.status().WithContext("opening store '" + path_ + "' (run `patchstore verify`)");
    if (entries->size() != n)
      return Status::Corruption("opening store '" + path_ + "': the sealed index lists " +
                                std::to_string(entries->size()) + " samples, the store " + std::to_string(n));
    size_t id_bytes = 0;
    for (const auto& e : *entries) id_bytes += e.id.size();
    id_arenas_.push_back(std::make_unique<std::string>());
    std::string& id_arena_ = *id_arenas_.back();
    id_arena_.reserve(id_bytes);
    for (const auto& e : *entries) id_arena_.append(e.id);
    for (uint64_t i = 0, at = 0; i < n; ++i) {
      ids_[i] = std::string_view(id_arena_.data() + at, (*entries)[i].id.size());
      at += (*entries)[i].id.size();
      auto sum = DecodeSampleSummary(i, (*entries)[i].summary.data(), (*entries)[i].summary.size());
      if (!sum.ok() || sum->fields.size() > nf)
        return Status::Corruption("opening store '" + path_ + "': sealed index entry #" + std::to_string(i) +
                                  " is damaged (run `patchstore verify`)");
      fill(i, *sum);
    }
  } else if (sealed.status().code() != Code::kNotFound) {
    return sealed.status();
  } else {
    std::vector<bool> seen(n, false);
    PS_RETURN_IF_ERROR(snapshot_->ForEachId([&](uint64_t idx, std::string_view id) -> Status {
      if (idx >= n || seen[idx])
        return Status::Corruption("opening store '" + path_ + "': sample index " + std::to_string(idx) +
                                  " out of sequence (ids are not dense)");
      seen[idx] = true;
      ids_[idx] = id;
      return Status::OK();
    }));
    std::vector<bool> have(n, false);
    PS_RETURN_IF_ERROR(snapshot_->ForEachSummary([&](uint64_t idx, const SampleSummary& sum) -> Status {
      if (idx >= n || have[idx] || sum.fields.size() > nf)
        return Status::Corruption("opening store '" + path_ + "': sample index entry #" + std::to_string(idx) +
                                  " does not match the samples and fields of the store (run `patchstore verify`)");
      have[idx] = true;
      fill(idx, sum);
      return Status::OK();
    }));
  }
  return Status::OK();
}

Result<Reader::RecordRef> Reader::Ref(uint64_t sample, int field) const {
  const size_t slot = sample * meta().fields.size() + static_cast<size_t>(field);
  RecordSlot& s = slots_[slot];
  if (s.state.load(std::memory_order_acquire) == 1)
    return RecordRef{s.data.load(std::memory_order_relaxed), s.size.load(std::memory_order_relaxed)};
  if (!summaries_[slot].present) return RecordRef{};
  uint64_t local = sample;
  const Snapshot& snap = stores_.size() == 1 ? *snapshot_ : *Locate(sample, &local).snapshot;
  auto rec = snap.GetRecord(local, static_cast<uint16_t>(field));
  if (!rec.ok()) {
    if (rec.status().code() == Code::kNotFound)
      return Status::Corruption("reading " + Describe(sample, field) +
                                ": listed in the store's sample index but has no record (run `patchstore verify`)");
    return rec.status().WithContext("reading " + Describe(sample, field));
  }
  // A snapshot without a lock-table slot (a sealed store) does not pin its
  // pages: if a writer has committed since, the B-tree pages just walked may
  // have been reused. Never cache what such a lookup found.
  if (snap.no_lock()) PS_RETURN_IF_ERROR(snap.CheckUnchanged());
  // Threads racing here store the same values.
  s.data.store(reinterpret_cast<const uint8_t*>(rec->data()), std::memory_order_relaxed);
  s.size.store(rec->size(), std::memory_order_relaxed);
  s.state.store(1, std::memory_order_release);
  return RecordRef{reinterpret_cast<const uint8_t*>(rec->data()), rec->size()};
}

Result<uint64_t> Reader::Find(std::string_view id) const {
  std::call_once(find_once_, [this] {
    find_.reserve(ids_.size());
    for (uint64_t i = 0; i < ids_.size(); ++i) find_.emplace(ids_[i], i);
  });
  auto it = find_.find(id);
  if (it == find_.end())
    return UnlessChangedAt(UINT64_MAX, Status::NotFound("no sample '" + std::string(id) + "' in '" + path_ + "'"));
  return it->second;
}

Result<int> Reader::FieldIndex(std::string_view name) const {
  int f = meta().FieldIndex(name);
  if (f < 0) {
    std::string known;
    for (const FieldMeta& m : meta().fields) known += (known.empty() ? "" : ", ") + m.name;
    return Status::NotFound("no field '" + std::string(name) + "' in '" + path_ + "' (fields: " + known + ")");
  }
  return f;
}

std::string Reader::Describe(uint64_t sample, int field) const {
  std::string s = sample < ids_.size() ? "'" + std::string(ids_[sample]) + "'" : "sample #" + std::to_string(sample);
  if (field >= 0 && field < field_count()) s += " field '" + meta().fields[field].name + "'";
  if (stores_.size() > 1 && sample < ids_.size()) return s + " in '" + stores_[StoreOf(sample)].path + "'";
  return s + " in '" + path_ + "'";
}

Result<RecordHeader> Reader::CheckedHeader(uint64_t sample, int field, const uint8_t** data_out) const {
  if (sample >= ids_.size())
    return Status::OutOfRange("sample index " + std::to_string(sample) + " out of range [0, " +
                              std::to_string(ids_.size()) + ") in '" + path_ + "'");
  if (field < 0 || field >= field_count())
    return Status::NotFound("field #" + std::to_string(field) + " does not exist in '" + path_ + "'");
  const size_t slot = sample * meta().fields.size() + field;
  auto ref_r = Ref(sample, field);
  if (!ref_r.ok()) return UnlessChangedAt(sample, ref_r.status());
  const RecordRef ref = *ref_r;
  if (data_out != nullptr) *data_out = ref.data;
  if (ref.data == nullptr)
    return UnlessChangedAt(sample, Status::NotFound("reading " + Describe(sample, field) + ": record missing"));
  auto h = ParseRecordHeader(ref.data, ref.size);
  if (!h.ok()) return UnlessChangedAt(sample, h.status().WithContext("reading " + Describe(sample, field)));
  if (reinterpret_cast<uintptr_t>(ref.data + kRecordHeaderSize) % kPayloadAlignment != 0)
    return Status::Corruption("reading " + Describe(sample, field) + ": payload is not " +
                              std::to_string(kPayloadAlignment) + "-byte aligned in the map");
  // The record must agree with what the metadata says of its field.
  const FieldMeta& fm = meta().fields[field];
  if (h->dtype != fm.dtype)
    return UnlessChanged(*snapshot_, Status::Corruption("reading " + Describe(sample, field) + ": the record holds " +
                                                        DTypeName(h->dtype) + " but the field is " +
                                                        DTypeName(fm.dtype) + " (run `patchstore verify`)"));
  if (h->layout != fm.layout || h->rank != 3 || (fm.layout == Layout::kCHW && h->shape[0] != fm.channels))
    return UnlessChangedAt(sample, Status::Corruption("reading " + Describe(sample, field) +
                                                      ": record shape or layout disagrees with the store metadata"));
  if (h->tile != fm.tile)
    return UnlessChangedAt(sample, Status::Corruption(
                                       "reading " + Describe(sample, field) + ": the record is " +
                                       (h->tile ? std::to_string(h->tile) + "-pixel tiles" : std::string("rows")) +
                                       " but the field is stored in " +
                                       (fm.tile ? std::to_string(fm.tile) + "-pixel tiles" : std::string("rows")) +
                                       " (run `patchstore verify`)"));
  // Raw-source records are normalised on read with the field's table: the
  // record must say the same normalisation, or its values would be wrong.
  if (StoresRawSource(h->dtype) && !(h->norm == fm.norm))
    return UnlessChangedAt(sample, Status::Corruption("reading " + Describe(sample, field) +
                                                      ": the record's normalisation disagrees with its field's "
                                                      "(run `patchstore verify`)"));
  const RecordSummary& sum = summaries_[slot];
  if (sum.dtype != h->dtype || sum.layout != h->layout || sum.rank != h->rank || sum.shape != h->shape ||
      sum.tile != h->tile)
    return UnlessChangedAt(sample, Status::Corruption("reading " + Describe(sample, field) +
                                                      ": the record disagrees with the store's sample index (run "
                                                      "`patchstore verify`)"));
  if (verified_ && verified_[slot].load(std::memory_order_acquire) == 0) {
    Status st = VerifyRecordBody(*h, ref.data);
    if (!st.ok()) return UnlessChangedAt(sample, st.WithContext("reading " + Describe(sample, field)));
    verified_[slot].store(1, std::memory_order_release);
  }
  return h;
}

Result<RecordHeader> Reader::Header(uint64_t sample, int field) const { return CheckedHeader(sample, field); }

Result<std::optional<VolumeGeometry>> Reader::Geometry(uint64_t sample) const {
  if (sample >= size()) return Status::OutOfRange("sample " + std::to_string(sample) + " of " + std::to_string(size()));
  uint64_t local = 0;
  const StoreRef& store = Locate(sample, &local);
  return store.snapshot->Geometry(local);
}

Result<RecordSummary> Reader::Summary(uint64_t sample, int field) const {
  if (sample >= ids_.size())
    return Status::OutOfRange("sample index " + std::to_string(sample) + " out of range [0, " +
                              std::to_string(ids_.size()) + ") in '" + path_ + "'");
  if (field < 0 || field >= field_count())
    return Status::NotFound("field #" + std::to_string(field) + " does not exist in '" + path_ + "'");
  const RecordSummary& s = summary(sample, field);
  if (!s.present) return Status::NotFound("reading " + Describe(sample, field) + ": record missing");
  return s;
}

namespace {

// A contiguous row-major (C,h,w) array of `es`-byte elements, owned by a view.
struct OwnedBytes {
  std::shared_ptr<const void> keep;  // the map and the field's table
  std::unique_ptr<uint8_t[]> bytes;
};

// Copies rows [y, y+h) x columns [x, x+w) of every channel of a tiled
// payload into a row-major (C,h,w) array at `dst` (pure byte moves).
void UntileWindow(const uint8_t* payload, size_t es, const TileGrid& g, int64_t y, int64_t x, int64_t h, int64_t w,
                  uint8_t* dst) {
  const int64_t T = g.T;
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t r = 0; r < h; ++r) {
      const int64_t yy = y + r;
      uint8_t* d = dst + static_cast<size_t>((c * h + r) * w) * es;
      for (int64_t xx = x; xx < x + w;) {
        const int64_t n = std::min(T - xx % T, x + w - xx);
        std::memcpy(d + static_cast<size_t>(xx - x) * es,
                    payload + static_cast<size_t>(g.ElementOffset(c, yy, xx)) * es, static_cast<size_t>(n) * es);
        xx += n;
      }
    }
}

TensorView OwnedView(std::shared_ptr<const void> keep, DType dtype, const ValueTable* lut, int64_t C, int64_t h,
                     int64_t w) {
  auto o = std::make_shared<OwnedBytes>();
  o->keep = std::move(keep);
  const size_t es = DTypeSize(dtype);
  o->bytes.reset(new uint8_t[static_cast<size_t>(C * h * w) * es]);
  TensorView v;
  v.data = o->bytes.get();
  v.dtype = dtype;
  v.lut = lut;
  v.rank = 3;
  v.shape = {C, h, w, 0};
  v.strides = {static_cast<int64_t>(h * w * es), static_cast<int64_t>(w * es), static_cast<int64_t>(es), 0};
  v.owner = o;
  return v;
}

}  // namespace

Result<TensorView> Reader::Get(uint64_t sample, int field) const {
  const uint8_t* data = nullptr;
  PS_ASSIGN_OR_RETURN(RecordHeader h, CheckedHeader(sample, field, &data));
  if (h.tiled()) {
    const TileGrid g = h.grid();
    TensorView v = OwnedView(view_owner(field), h.dtype, field_table(field), g.C, g.H, g.W);
    UntileCHW(data + kRecordHeaderSize, DTypeSize(h.dtype), g, const_cast<void*>(v.data));
    return v;
  }
  TensorView v;
  v.data = data + kRecordHeaderSize;
  v.dtype = h.dtype;
  v.lut = field_table(field);
  v.rank = h.rank;
  int64_t stride = static_cast<int64_t>(DTypeSize(h.dtype));
  for (int i = h.rank - 1; i >= 0; --i) {
    v.shape[i] = static_cast<int64_t>(h.shape[i]);
    v.strides[i] = stride;
    stride *= v.shape[i];
  }
  v.owner = view_owner(field);
  return v;
}

Result<WindowSource> Reader::Window(uint64_t sample, int field, int64_t y, int64_t x, int64_t h, int64_t w) const {
  const uint8_t* data = nullptr;
  PS_ASSIGN_OR_RETURN(RecordHeader hd, CheckedHeader(sample, field, &data));
  if (hd.rank != 3)
    return Status::InvalidArgument("patch of " + Describe(sample, field) + ": record has rank " +
                                   std::to_string(hd.rank) + ", not 3");
  const int64_t H = static_cast<int64_t>(hd.shape[1]), W = static_cast<int64_t>(hd.shape[2]);
  auto window = [&] {
    // In 128 bits: hostile arguments must not overflow while the message is built.
    auto end = [](int64_t a, int64_t b) {
      const __int128 e = static_cast<__int128>(a) + b;
      return e > INT64_MAX ? std::string("overflow") : std::to_string(static_cast<int64_t>(e));
    };
    return "[" + std::to_string(y) + ":" + end(y, h) + "," + std::to_string(x) + ":" + end(x, w) + "]";
  };
  if (h <= 0 || w <= 0)
    return Status::InvalidArgument("patch " + window() + " of " + Describe(sample, field) +
                                   ": height and width must be positive");
  if (y < 0 || x < 0 || y > H - h || x > W - w)
    return Status::OutOfRange("patch " + window() + " of " + Describe(sample, field) + ": outside the " +
                              std::to_string(H) + "x" + std::to_string(W) + " record");
  return WindowSource{data + kRecordHeaderSize,
                      hd.dtype,
                      field_table(field),
                      static_cast<int64_t>(hd.shape[0]),
                      H,
                      W,
                      hd.tile,
                      y,
                      x,
                      h,
                      w};
}

Result<TensorView> Reader::Patch(uint64_t sample, int field, int64_t y, int64_t x, int64_t h, int64_t w) const {
  PS_ASSIGN_OR_RETURN(WindowSource s, Window(sample, field, y, x, h, w));
  PrefetchWindows({s});
  if (s.tile) {
    TensorView v = OwnedView(view_owner(field), s.dtype, s.lut, s.C, h, w);
    UntileWindow(s.payload, DTypeSize(s.dtype), s.grid(), y, x, h, w, static_cast<uint8_t*>(const_cast<void*>(v.data)));
    return v;
  }
  const int64_t es = static_cast<int64_t>(DTypeSize(s.dtype));
  TensorView v;
  v.data = s.payload + (y * s.W + x) * es;
  v.dtype = s.dtype;
  v.lut = s.lut;
  v.rank = 3;
  v.shape = {s.C, h, w, 0};
  v.strides = {s.H * s.W * es, s.W * es, es, 0};
  v.owner = view_owner(field);
  return v;
}

namespace {

// `n` floats from `src` (in cache) to `dst` by non-temporal stores, which
// write whole cache lines to memory without first reading them (a copy to a
// destination larger than the cache otherwise reads every line it writes);
// a plain copy where `dst` is not 16-byte aligned (or without SSE2). The
// caller ends with StreamFence() before another thread reads `dst`.
inline void StreamOut(const float* src, int64_t n, float* dst) {
#if defined(__SSE2__)
  if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
      _mm_stream_ps(dst + j, _mm_loadu_ps(src + j));
      _mm_stream_ps(dst + j + 4, _mm_loadu_ps(src + j + 4));
      _mm_stream_ps(dst + j + 8, _mm_loadu_ps(src + j + 8));
      _mm_stream_ps(dst + j + 12, _mm_loadu_ps(src + j + 12));
    }
    for (; j + 4 <= n; j += 4) _mm_stream_ps(dst + j, _mm_loadu_ps(src + j));
    for (; j < n; ++j) dst[j] = src[j];
    return;
  }
#endif
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

// Orders the non-temporal stores of this thread before what follows.
inline void StreamFence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// n elements into the output type O: float32 through ConvertRun (the
// field's table; a memcpy for float32), or copied as stored (O == T).
template <class T, class O>
inline void PutRun(const T* src, int64_t n, O* dst, const ValueTable* lut) {
  if constexpr (std::is_same_v<O, T>) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(T));
  } else {
    ConvertRun(src, n, dst, lut);
  }
}

// The window of a row-major view (rank 3) into C planes of h x w elements
// of O (float32, or T as stored) at `dst`, row by row; `stream` (float32
// output only): written by StreamOut (float32 rows straight from the
// source, others converted into a per-thread row first).
template <class T, class O = float>
void CopyWindowAs(const TensorView& v, O* dst, bool stream = false) {
  const int64_t C = v.shape[0], h = v.shape[1], w = v.shape[2];
  const size_t row = static_cast<size_t>(w) * sizeof(T);  // source bytes per row
  const uint8_t* base = v.bytes();
  // Rows of a window lie in different pages, where the hardware prefetcher
  // starts cold; prefetching a few rows ahead hides that latency (measured:
  // bench/reader_benchmark BM_PatchCopy).
  constexpr int64_t kAhead = 4;
  auto prefetch_row = [&](int64_t c, int64_t r) {
    const uint8_t* p = base + c * v.strides[0] + r * v.strides[1];
    for (size_t b = 0; b < row; b += 64) __builtin_prefetch(p + b);
  };
  int64_t ac = 0, ar = 0;  // the row kAhead rows on
  for (int64_t i = 0; i < std::min(C * h, kAhead); ++i) {
    prefetch_row(ac, ar);
    if (++ar == h) ar = 0, ++ac;
  }
  if constexpr (!std::is_same_v<O, float>) stream = false;
  thread_local std::vector<float> stage;
  if (stream && !std::is_same_v<T, float> && stage.size() < static_cast<size_t>(w))
    stage.resize(static_cast<size_t>(w));
  for (int64_t c = 0; c < C; ++c)
    for (int64_t r = 0; r < h; ++r) {
      if (ac < C) {
        prefetch_row(ac, ar);
        if (++ar == h) ar = 0, ++ac;
      }
      const T* src = reinterpret_cast<const T*>(base + c * v.strides[0] + r * v.strides[1]);
      if (!stream) {
        PutRun(src, w, dst, v.lut);  // a memcpy for float32 or stored output
      } else if constexpr (std::is_same_v<O, float>) {
        if constexpr (std::is_same_v<T, float>) {
          StreamOut(src, w, dst);
        } else {
          ConvertRun(src, w, stage.data(), v.lut);
          StreamOut(stage.data(), w, dst);
        }
      }
      dst += w;
    }
  if (stream) StreamFence();
}

// Visits the window of a tiled record run by run: fn(c, r, x, src, n) for
// the n elements of channel c, window row r, window columns [x, x+n) at
// `src`; tile row by tile row, each tile's rows in address order.
template <class T, class Fn>
void ForEachTiledRun(const WindowSource& s, Fn&& fn) {
  const T* p = reinterpret_cast<const T*>(s.payload);
  const TileGrid g = s.grid();
  const int64_t TT = g.T;
  const int64_t ty0 = s.y / TT, ty1 = (s.y + s.h - 1) / TT, tx0 = s.x / TT, tx1 = (s.x + s.w - 1) / TT;
  // The tiles of one tile row are one contiguous range: while a tile row is
  // visited, the next one is prefetched whole into the cache (the rows of
  // one window row come from several tiles, which the hardware prefetcher
  // does not follow).
  auto prefetch_tile_row = [&](int64_t ty) {
    const uint8_t* b = reinterpret_cast<const uint8_t*>(p + g.TileOffset(ty, tx0));
    const uint8_t* e = reinterpret_cast<const uint8_t*>(p + g.TileOffset(ty, tx1) + g.tile_elements());
    for (; b < e; b += 64) __builtin_prefetch(b);
  };
  prefetch_tile_row(ty0);
  for (int64_t ty = ty0; ty <= ty1; ++ty) {
    if (ty < ty1) prefetch_tile_row(ty + 1);
    const int64_t r0 = std::max(s.y, ty * TT), r1 = std::min(s.y + s.h, (ty + 1) * TT);
    const T* row_tiles = p + g.TileOffset(ty, 0);
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t r = r0; r < r1; ++r) {
        const T* plane_row = row_tiles + c * TT * TT + (r % TT) * TT;
        for (int64_t tx = tx0; tx <= tx1; ++tx) {
          const int64_t c0 = std::max(s.x, tx * TT), c1 = std::min(s.x + s.w, (tx + 1) * TT);
          fn(c, r - s.y, c0 - s.x, plane_row + tx * g.tile_elements() + c0 % TT, c1 - c0);
        }
      }
  }
}

// The window of a tiled record, untransformed, into C planes of h x w
// elements of O (float32, or T as stored) at `dst`: each output row written
// left to right, a segment from each tile it crosses.
template <class T, class O = float>
void CopyTiledWindow(const WindowSource& s, O* dst) {
  const ValueTable* const lut = s.lut;
  // Most runs span a whole tile row (all but a window row's first and last
  // tile): for the usual tile edges their length is a constant here, so the
  // copy or conversion of a run is inlined and unrolled instead of a call
  // (memcpy's, or a loop's set-up) per 32 or 64 elements (measured:
  // bench/sampler_benchmark BM_SamplerGatherLayout).
  auto run = [&](auto tile) {
    constexpr int64_t kT = decltype(tile)::value;
    ForEachTiledRun<T>(s, [&](int64_t c, int64_t r, int64_t x, const T* src, int64_t n) {
      O* out = dst + (c * s.h + r) * s.w + x;
      if (kT != 0 && n == kT) PutRun(src, kT, out, lut);
      else PutRun(src, n, out, lut);
    });
  };
  switch (s.tile) {
    case 32: run(std::integral_constant<int64_t, 32>{}); break;
    case 64: run(std::integral_constant<int64_t, 64>{}); break;
    default: run(std::integral_constant<int64_t, 0>{}); break;
  }
}

// Elements of the window whose normalised value is non-zero and not NaN,
// without writing them anywhere: float32 counted in place, other dtypes
// converted by ConvertRun (the values a copy gives) into a piece of 1,024
// floats that stays in L1 and is counted whenever it is full (runs of a
// tiled window are as short as a tile's width).
template <class T>
uint64_t CountNonZeroT(const WindowSource& s) {
  uint64_t count = 0;
  constexpr int64_t kPiece = 1024;
  float piece[kPiece];
  int64_t fill = 0;
  auto count_piece = [&] {
    for (int64_t j = 0; j < fill; ++j) count += (piece[j] == piece[j] && piece[j] != 0.0f) ? 1u : 0u;
    fill = 0;
  };
  auto run = [&](const T* src, int64_t n) {
    if constexpr (std::is_same_v<T, float>) {
      for (int64_t j = 0; j < n; ++j) count += (src[j] == src[j] && src[j] != 0.0f) ? 1u : 0u;
    } else {
      while (n > 0) {
        const int64_t m = std::min(n, kPiece - fill);
        ConvertRun(src, m, piece + fill, s.lut);
        fill += m;
        src += m;
        n -= m;
        if (fill == kPiece) count_piece();
      }
    }
  };
  if (s.tile) {
    ForEachTiledRun<T>(s, [&](int64_t, int64_t, int64_t, const T* src, int64_t n) { run(src, n); });
  } else {
    const T* p = reinterpret_cast<const T*>(s.payload);
    for (int64_t c = 0; c < s.C; ++c)
      for (int64_t r = 0; r < s.h; ++r) run(p + (c * s.H + s.y + r) * s.W + s.x, s.w);
  }
  count_piece();
  return count;
}

// One plane of the transform kernel into O: CopyTransformed (float32) or
// CopyTransformedStored (as stored).
template <class T, class O>
inline void TransformPlaneTo(const T* plane, int64_t row_stride, int64_t y, int64_t x, int64_t h, int64_t w,
                             Transform t, O* dst, const ValueTable* lut) {
  if constexpr (std::is_same_v<O, T>) CopyTransformedStored<T>(plane, row_stride, y, x, h, w, t, dst);
  else CopyTransformed<T>(plane, row_stride, y, x, h, w, t, dst, lut);
}

template <class T, class O = float>
void CopyWindowT(const WindowSource& s, Transform t, O* dst, bool stream) {
  const int64_t plane_out = s.h * s.w;
  if (s.tile == 0) {
    if (t.identity()) {
      TensorView v;
      v.data = s.payload + static_cast<size_t>(s.y * s.W + s.x) * sizeof(T);
      v.dtype = s.dtype;
      v.lut = s.lut;
      v.rank = 3;
      v.shape = {s.C, s.h, s.w, 0};
      v.strides = {static_cast<int64_t>(s.H * s.W * sizeof(T)), static_cast<int64_t>(s.W * sizeof(T)),
                   static_cast<int64_t>(sizeof(T)), 0};
      CopyWindowAs<T, O>(v, dst, stream);
      return;
    }
    const T* p = reinterpret_cast<const T*>(s.payload);
    for (int64_t c = 0; c < s.C; ++c)
      TransformPlaneTo<T, O>(p + c * s.H * s.W, s.W, s.y, s.x, s.h, s.w, t, dst + c * plane_out, s.lut);
    return;
  }
  if (t.identity()) {
    CopyTiledWindow<T, O>(s, dst);
    return;
  }
  // Transformed tiled windows: untiled (and converted) into a per-thread
  // plane set in cache, then turned by the one transform kernel.
  thread_local std::vector<O> stage;
  const size_t n = static_cast<size_t>(s.C * plane_out);
  if (stage.size() < n) stage.resize(n);
  CopyTiledWindow<T, O>(s, stage.data());
  for (int64_t c = 0; c < s.C; ++c)
    TransformPlaneTo<O, O>(stage.data() + c * plane_out, s.w, 0, 0, s.h, s.w, t, dst + c * plane_out, nullptr);
}

}  // namespace

void CopyToFloat32(const TensorView& v, float* dst) {
  VisitDType(v.dtype, [&](auto tag) { CopyWindowAs<typename decltype(tag)::type>(v, dst); });
}

TensorView AsFloat32(const TensorView& v) {
  if (v.dtype == DType::kFloat32) return v;
  struct Owned {
    std::shared_ptr<const void> keep;
    std::unique_ptr<float[]> values;
  };
  auto o = std::make_shared<Owned>();
  o->keep = v.owner;
  o->values.reset(new float[static_cast<size_t>(v.elements())]);
  TensorView r;
  r.rank = v.rank;
  r.dtype = DType::kFloat32;
  r.shape = v.shape;
  int64_t stride = sizeof(float);
  for (int i = v.rank - 1; i >= 0; --i) {
    r.strides[i] = stride;
    stride *= v.shape[i];
  }
  // As a rank-3 view: leading dims of 1 for rank 1 and 2.
  TensorView v3 = v;
  if (v.rank < 3) {
    const int k = 3 - v.rank;
    for (int i = 2; i >= 0; --i) {
      v3.shape[i] = i >= k ? v.shape[i - k] : 1;
      v3.strides[i] = i >= k ? v.strides[i - k] : 0;
    }
    v3.rank = 3;
  }
  CopyToFloat32(v3, o->values.get());
  r.data = o->values.get();
  r.owner = o;
  return r;
}

int64_t StreamThresholdBytes() {
  static const int64_t bytes = [] {
    if (const char* e = std::getenv("PATCHSTORE_STREAM_BYTES"); e && *e)
      return static_cast<int64_t>(std::strtoll(e, nullptr, 10));
    // sysfs as lscpu reads it ("32768K"); in virtual machines sysconf's
    // figure from cpuid can be the host's.
    if (std::FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r")) {
      long long v = 0;
      char unit = 0;
      const int got = std::fscanf(f, "%lld%c", &v, &unit);
      std::fclose(f);
      if (got >= 1 && v > 0) return static_cast<int64_t>(v) * (unit == 'K' ? 1024 : unit == 'M' ? 1 << 20 : 1);
    }
    return int64_t{32} << 20;
  }();
  return bytes;
}

void CopyWindow(const WindowSource& src, Transform t, float* dst, bool stream) {
  VisitDType(src.dtype, [&](auto tag) { CopyWindowT<typename decltype(tag)::type>(src, t, dst, stream); });
}

void CopyWindow(const WindowSource& src, Transform t, void* dst, Output output, bool stream) {
  if (output == Output::kFloat32) {
    CopyWindow(src, t, static_cast<float*>(dst), stream);
    return;
  }
  VisitDType(src.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    CopyWindowT<T, T>(src, t, static_cast<T*>(dst), false);
  });
}

void ConvertStored(DType dtype, const ValueTable* table, const void* src, int64_t n, float* dst, int num_threads) {
  VisitDType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = static_cast<const T*>(src);
    ParallelBlocks(n, num_threads,
                   [&](int64_t begin, int64_t end) { ConvertRun(in + begin, end - begin, dst + begin, table); });
  });
}

uint64_t CountNonZero(const WindowSource& src) {
  uint64_t n = 0;
  VisitDType(src.dtype, [&](auto tag) { n = CountNonZeroT<typename decltype(tag)::type>(src); });
  return n;
}

std::vector<std::pair<const void*, size_t>> WindowByteRanges(const WindowSource& s) {
  std::vector<std::pair<const void*, size_t>> out;
  const size_t es = DTypeSize(s.dtype);
  if (s.tile == 0) {
    out.reserve(static_cast<size_t>(s.C * s.h));
    for (int64_t c = 0; c < s.C; ++c)
      for (int64_t r = 0; r < s.h; ++r)
        out.emplace_back(s.payload + static_cast<size_t>((c * s.H + s.y + r) * s.W + s.x) * es,
                         static_cast<size_t>(s.w) * es);
    return out;
  }
  const TileGrid g = s.grid();
  const int64_t ty0 = s.y / g.T, ty1 = (s.y + s.h - 1) / g.T, tx0 = s.x / g.T, tx1 = (s.x + s.w - 1) / g.T;
  for (int64_t ty = ty0; ty <= ty1; ++ty) {
    const int64_t begin = g.TileOffset(ty, tx0), end = g.TileOffset(ty, tx1) + g.tile_elements();
    out.emplace_back(s.payload + static_cast<size_t>(begin) * es, static_cast<size_t>(end - begin) * es);
  }
  return out;
}

Status Reader::CopyPatch(uint64_t sample, int field, int64_t y, int64_t x, int64_t h, int64_t w, float* dst) const {
  PS_ASSIGN_OR_RETURN(WindowSource s, Window(sample, field, y, x, h, w));
  PrefetchWindows({s});
  CopyWindow(s, Transform{}, dst);
  return Status::OK();
}

Status Reader::CopyPatches(const std::vector<PatchRequest>& requests, int64_t h, int64_t w, float* dst,
                           int num_threads) const {
  if (requests.empty()) return Status::OK();
  std::vector<WindowSource> wins;
  wins.reserve(requests.size());
  int64_t C = -1;
  for (const PatchRequest& r : requests) {
    PS_ASSIGN_OR_RETURN(WindowSource s, Window(r.sample, r.field, r.y, r.x, h, w));
    if (C < 0) C = s.C;
    if (s.C != C)
      return Status::InvalidArgument("batch of patches mixes " + std::to_string(C) + " and " + std::to_string(s.C) +
                                     " channels (" + Describe(r.sample, r.field) + ")");
    wins.push_back(s);
  }
  // Out of the page cache every row (or tile row) is a page fault: ask for
  // all of them before copying any, so the disk has many requests in flight.
  PrefetchWindows(wins);
  const int64_t item = C * h * w;
  const int64_t n = static_cast<int64_t>(wins.size());
  ParallelBlocks(n, num_threads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) CopyWindow(wins[i], Transform{}, dst + i * item);
  });
  return Status::OK();
}

Result<SatView> Reader::Sat(uint64_t sample, int field, bool cache, std::vector<uint32_t>* scratch) const {
  // An image mask into the caller's scratch (format-1 stores' stored
  // tables aside): strips of the record, no whole-record copy.
  const bool image_mask = field >= 0 && field < field_count() && field_layout(field) == Layout::kCHW &&
                          !field_has_sat(field) && sample < ids_.size();
  const RecordSummary* sum = image_mask ? &summary(sample, field) : nullptr;
  if (scratch != nullptr && !cache && sum != nullptr && sum->present && sum->rank == 3 && sum->shape[0] == 1) {
    Prefetch(sample, field);  // the whole mask is read: one request, not a page fault per page
    const int64_t H = static_cast<int64_t>(sum->shape[1]), W = static_cast<int64_t>(sum->shape[2]);
    const int64_t stride = W + 1;
    scratch->resize(static_cast<size_t>((H + 1) * stride));
    uint32_t* s = scratch->data();
    std::fill(s, s + stride, 0u);
    // Strips of rows, normalised into a piece that stays in cache, then
    // summed row by row.
    constexpr int64_t kStripRows = 16;
    thread_local std::vector<float> strip;
    strip.resize(static_cast<size_t>(std::min(kStripRows, H) * W));
    for (int64_t y0 = 0; y0 < H; y0 += kStripRows) {
      const int64_t rows = std::min(kStripRows, H - y0);
      PS_ASSIGN_OR_RETURN(WindowSource src, Window(sample, field, y0, 0, rows, W));
      CopyWindow(src, Transform{}, strip.data());
      for (int64_t r = 0; r < rows; ++r)
        SatRow(strip.data() + r * W, W, s + (y0 + r) * stride, s + (y0 + r + 1) * stride);
    }
    SatView v;
    v.data = s;
    v.planes = 1;
    v.H = H;
    v.W = W;
    return v;
  }
  PS_ASSIGN_OR_RETURN(TensorView mask, Get(sample, field));
  if (mask.rank != 3) return Status::InvalidArgument("mask " + Describe(sample, field) + " is not 3-dimensional");
  const bool volume = field_layout(field) == Layout::kSHW;
  if (!volume && mask.shape[0] != 1)
    return Status::InvalidArgument("mask " + Describe(sample, field) + " has " + std::to_string(mask.shape[0]) +
                                   " channels; a mask must have one");
  const int64_t planes = mask.shape[0], H = mask.shape[1], W = mask.shape[2];
  const size_t slot = sample * meta().fields.size() + field;
  // Format-1 stores may hold a stored table as an auxiliary record.
  RecordRef ref;
  if (field_has_sat(field)) {
    uint64_t local = 0;
    auto aux = Locate(sample, &local).snapshot->GetRecord(local, static_cast<uint16_t>(kAuxFieldBase + field));
    if (aux.ok()) ref = RecordRef{reinterpret_cast<const uint8_t*>(aux->data()), aux->size()};
  }
  if (ref.data != nullptr) {
    auto h = ParseRecordHeader(ref.data, ref.size);
    if (!h.ok()) return h.status().WithContext("reading the mask index of " + Describe(sample, field));
    if (h->dtype != DType::kUInt32 || h->layout != Layout::kSAT || h->rank != 3 ||
        h->shape[0] != static_cast<uint64_t>(planes) || h->shape[1] != static_cast<uint64_t>(H + 1) ||
        h->shape[2] != static_cast<uint64_t>(W + 1))
      return Status::Corruption("reading the mask index of " + Describe(sample, field) +
                                ": its shape disagrees with the mask");
    if (reinterpret_cast<uintptr_t>(ref.data + kRecordHeaderSize) % kPayloadAlignment != 0)
      return Status::Corruption("reading the mask index of " + Describe(sample, field) + ": unaligned");
    SatView v;
    v.data = reinterpret_cast<const uint32_t*>(ref.data + kRecordHeaderSize);
    v.planes = planes;
    v.H = H;
    v.W = W;
    v.owner = owner_;
    return v;
  }
  std::unique_lock<std::mutex> lock(sat_mu_);
  auto it = sat_cache_.find(slot);
  if (it != sat_cache_.end()) return it->second;
  if (!cache) lock.unlock();
  Prefetch(sample, field);  // the whole mask is read: one request, not a page fault per page
  auto buf = std::shared_ptr<uint32_t[]>(new uint32_t[static_cast<size_t>(planes * (H + 1) * (W + 1))]);
  // Compact or tiled masks: the table is built from the normalised,
  // row-major values, so the mask rule is the same for every encoding.
  const TensorView values = AsFloat32(mask);
  ComputeSat(values.data_as<float>(), planes, H, W, buf.get());
  SatView v;
  v.data = buf.get();
  v.planes = planes;
  v.H = H;
  v.W = W;
  v.owner = buf;
  if (cache) sat_cache_.emplace(slot, v);
  return v;
}

Result<MaskBlocksView> Reader::MaskBlocks(uint64_t sample, int field) const {
  if (sample >= ids_.size()) return Status::OutOfRange("sample " + std::to_string(sample) + " out of range");
  if (field < 0 || field >= field_count()) return Status::NotFound("no field #" + std::to_string(field));
  uint64_t local = 0;
  const StoreRef& store = Locate(sample, &local);
  // The store's own metadata: stores of a set written before block counts
  // existed have none.
  const uint32_t b = store.snapshot->meta().fields[field].mask_blocks;
  const RecordSummary& sum = summary(sample, field);
  if (b == 0 || !sum.present) return Status::NotFound(Describe(sample, field) + " has no mask block counts");
  const std::string what = "reading the mask block counts of " + Describe(sample, field);
  auto aux = store.snapshot->GetRecord(local, static_cast<uint16_t>(kAuxFieldBase + field));
  if (!aux.ok()) {
    if (aux.status().code() == Code::kNotFound)
      return Status::Corruption(what + ": the record is missing (run `patchstore verify`)");
    return aux.status().WithContext(what);
  }
  auto h = ParseRecordHeader(aux->data(), aux->size());
  if (!h.ok()) return h.status().WithContext(what);
  RecordHeader mask;
  mask.layout = sum.layout;
  mask.rank = sum.rank;
  mask.shape = sum.shape;
  auto want = MaskBlocksHeader(mask, b);
  if (!want.ok()) return Status::Corruption(what + ": " + want.status().message());
  if (h->dtype != want->dtype || h->layout != want->layout || h->rank != want->rank || h->shape != want->shape ||
      h->tile != 0)
    return Status::Corruption(what + ": its shape disagrees with the mask's");
  const auto* data = reinterpret_cast<const uint8_t*>(aux->data());
  if (reinterpret_cast<uintptr_t>(data + kRecordHeaderSize) % kPayloadAlignment != 0)
    return Status::Corruption(what + ": unaligned");
  Status body = VerifyRecordBody(*h, data);
  if (!body.ok()) return body.WithContext(what);
  MaskBlocksView v;
  v.data = reinterpret_cast<const uint32_t*>(data + kRecordHeaderSize);
  v.B = b;
  v.H = static_cast<int64_t>(sum.shape[1]);
  v.W = static_cast<int64_t>(sum.shape[2]);
  v.by = static_cast<int64_t>(h->shape[1]) - 1;
  v.bx = static_cast<int64_t>(h->shape[2]) - 1;
  v.owner = owner_;
  return v;
}

uint32_t Reader::MaskBlockEdge(uint64_t sample, int field) const {
  if (sample >= ids_.size() || field < 0 || field >= field_count()) return 0;
  uint64_t local = 0;
  return Locate(sample, &local).snapshot->meta().fields[field].mask_blocks;
}

void Reader::PrefetchMaskBlocks(uint64_t sample, int field) const {
  if (sample >= ids_.size() || field < 0 || field >= field_count() || !InOpeningProcess()) return;
  uint64_t local = 0;
  const StoreRef& store = Locate(sample, &local);
  if (store.snapshot->meta().fields[field].mask_blocks == 0) return;
  auto aux = store.snapshot->GetRecord(local, static_cast<uint16_t>(kAuxFieldBase + field));
  if (aux.ok()) store.snapshot->Advise(Access::kWillNeed, aux->data(), aux->size());
}

void Reader::Prefetch(uint64_t sample, int field) const {
  if (sample >= ids_.size() || field < 0 || field >= field_count()) return;
  auto ref = Ref(sample, field);
  uint64_t local = 0;
  if (ref.ok() && ref->data != nullptr)
    Locate(sample, &local).snapshot->Advise(Access::kWillNeed, ref->data, ref->size);
}

bool Reader::RecordResident(uint64_t sample, int field) const {
  if (sample >= ids_.size() || field < 0 || field >= field_count()) return false;
  auto ref = Ref(sample, field);
  if (!ref.ok() || ref->data == nullptr) return false;
  uint64_t local = 0;
  return Locate(sample, &local).snapshot->Resident(ref->data, ref->size);
}

void Reader::PrefetchWindow(const TensorView& v) const {
  if (v.data == nullptr || v.rank != 3) return;
  const uint8_t* base = v.bytes();
  const size_t row = static_cast<size_t>(v.shape[2] * v.itemsize());
  thread_local std::vector<std::pair<const void*, size_t>> rows;
  rows.clear();
  for (int64_t c = 0; c < v.shape[0]; ++c)
    for (int64_t y = 0; y < v.shape[1]; ++y) rows.emplace_back(base + c * v.strides[0] + y * v.strides[1], row);
  snapshot_->WillNeed(rows);
}

void Reader::WindowRanges(uint64_t sample, int field, int64_t y, int64_t x, int64_t h, int64_t w,
                          std::vector<std::pair<const void*, size_t>>* out) const {
  out->clear();
  if (sample >= ids_.size() || field < 0 || field >= field_count()) return;
  const RecordSummary& sum = summary(sample, field);
  if (!sum.present || sum.rank != 3) return;
  const int64_t C = static_cast<int64_t>(sum.shape[0]), H = static_cast<int64_t>(sum.shape[1]),
                W = static_cast<int64_t>(sum.shape[2]);
  if (h <= 0 || w <= 0 || y < 0 || x < 0 || C <= 0 || y > H - h || x > W - w) return;
  auto ref = Ref(sample, field);
  if (!ref.ok() || ref->data == nullptr) return;
  const int64_t item = static_cast<int64_t>(DTypeSize(sum.dtype));
  // A record shorter than its summary says is damaged: Patch() reports it; no hint here.
  if (item <= 0 || sum.payload_bytes() > ref->size - std::min<uint64_t>(ref->size, kRecordHeaderSize) ||
      ref->size < kRecordHeaderSize)
    return;
  if (sum.tile != 0 && sum.layout != Layout::kCHW) return;
  // The ranges of the one gather kernel (WindowByteRanges: rows, or tile
  // rows), merged where adjacent in memory (full-width rows, planes).
  const WindowSource src{ref->data + kRecordHeaderSize, sum.dtype, nullptr, C, H, W, sum.tile, y, x, h, w};
  for (const auto& r : WindowByteRanges(src)) {
    if (!out->empty() && static_cast<const uint8_t*>(out->back().first) + out->back().second == r.first)
      out->back().second += r.second;
    else out->push_back(r);
  }
}

void Reader::PrefetchPatch(uint64_t sample, int field, int64_t y, int64_t x, int64_t h, int64_t w) const {
  if (!InOpeningProcess()) return;
  std::vector<std::pair<const void*, size_t>> ranges;
  WindowRanges(sample, field, y, x, h, w, &ranges);
  if (ranges.empty()) return;
  uint64_t local = 0;
  // WillNeed pays one mincore() and requests only runs with missing pages.
  Locate(sample, &local).snapshot->WillNeed(ranges);
}

void Reader::PrefetchRanges(const std::vector<std::pair<const void*, size_t>>& ranges) const {
  if (!ranges.empty()) snapshot_->WillNeed(ranges);
}

void Reader::PrefetchWindows(const std::vector<WindowSource>& windows) const {
  windows_read_ahead_.fetch_add(windows.size(), std::memory_order_relaxed);
  if (!InOpeningProcess()) return;
  for (const WindowSource& s : windows)
    if (s.payload != nullptr && s.h > 0 && s.w > 0) snapshot_->WillNeed(WindowByteRanges(s));
}

void Reader::PrefetchBytes(const void* data, size_t size) const {
  if (data != nullptr && size != 0) snapshot_->WillNeed({{data, size}});
}

Status Reader::Verify(uint64_t sample, int field) const {
  if (sample >= ids_.size() || field < 0 || field >= field_count()) return Status::OutOfRange("verify: no such record");
  PS_ASSIGN_OR_RETURN(RecordRef ref, Ref(sample, field));
  if (ref.data == nullptr) return Status::Corruption("verifying " + Describe(sample, field) + ": record missing");
  auto h = ParseRecordHeader(ref.data, ref.size);
  if (!h.ok()) return h.status().WithContext("verifying " + Describe(sample, field));
  Status st = VerifyRecordBody(*h, ref.data);
  if (!st.ok()) return st.WithContext("verifying " + Describe(sample, field));
  return Status::OK();
}

}  // namespace patchstore
