#include "patchstore/reader/verify.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string_view>
#include <utility>

#include "patchstore/store/format.h"
#include "patchstore/store/store.h"

namespace patchstore {

namespace {

struct RecordRef {
  uint64_t sample;
  uint16_t field;
  const uint8_t* data;
  size_t size;
};

// The block counts (header `h`, record at `data`) of field `f` of sample `s`
// against the ones its mask record gives (FORMAT.md "Mask block counts").
Status CheckMaskBlocks(const std::vector<RecordRef>& refs,
                       const std::map<std::pair<uint64_t, uint16_t>, size_t>& record_at, uint64_t s, uint16_t f,
                       uint32_t b, const RecordHeader& h, const uint8_t* data) {
  auto it = record_at.find({s, f});
  if (it == record_at.end()) return Status::Corruption("mask block counts without their mask record");
  const RecordRef& m = refs[it->second];
  auto mh = ParseRecordHeader(m.data, m.size);
  if (!mh.ok()) return Status::Corruption("mask block counts of a damaged mask record");
  auto want = MaskBlocksHeader(*mh, b);
  if (!want.ok())
    return Status::Corruption("mask block counts of a mask that cannot have them: " + want.status().message());
  if (h.shape != want->shape || h.dtype != want->dtype || h.rank != want->rank || h.tile != 0)
    return Status::Corruption("mask block counts' shape disagrees with the mask");
  std::vector<uint32_t> expect(want->payload_bytes / sizeof(uint32_t));
  ComputeMaskBlocks(*mh, m.data + kRecordHeaderSize, b, expect.data());
  if (std::memcmp(expect.data(), data + kRecordHeaderSize, want->payload_bytes) != 0)
    return Status::Corruption("mask block counts disagree with the mask");
  return Status::OK();
}

}  // namespace

Result<VerifyReport> VerifyStore(const std::string& path, const std::function<void(uint64_t, uint64_t)>& progress) {
  SnapshotOptions so;
  so.allow_old_format = true;  // verify also checks a store that needs `patchstore upgrade`
  PS_ASSIGN_OR_RETURN(auto snap, Snapshot::Open(path, so));
  const StoreMeta& meta = snap->meta();
  VerifyReport report;

  std::vector<std::string> ids(snap->id_count());
  std::vector<bool> have_id(ids.size(), false);
  // Ids: decode each entry on its own so one bad id does not hide the rest.
  {
    Status st = snap->ForEachId([&](uint64_t idx, std::string_view id) -> Status {
      if (idx < ids.size()) {
        ids[idx] = std::string(id);
        have_id[idx] = true;
      } else {
        report.problems.push_back({std::string(id), "", "sample index " + std::to_string(idx) + " out of sequence"});
      }
      return Status::OK();
    });
    if (!st.ok()) report.problems.push_back({"", "", st.message()});
  }
  for (size_t i = 0; i < ids.size(); ++i)
    if (!have_id[i]) report.problems.push_back({"#" + std::to_string(i), "", "sample id missing or damaged"});
  // One id, one sample: a reader looking an id up would find only one of them.
  {
    std::map<std::string_view, size_t> first;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!have_id[i]) continue;
      auto [it, added] = first.emplace(ids[i], i);
      if (!added)
        report.problems.push_back({ids[i], "",
                                   "duplicate id: samples #" + std::to_string(it->second) + " and #" +
                                       std::to_string(i) + " have it (lookups by id find one of them)"});
    }
  }
  report.samples = ids.size();
  const size_t nf = meta.fields.size();
  // Normalisations that ingest refuses today (float32 overflow or distinct
  // values collapsed) but an older one accepted: the stored values are wrong.
  for (const FieldMeta& fm : meta.fields) {
    Status ns = CheckNormalizationFor(fm.norm, fm.source_type, fm.norm.ToString());
    if (!ns.ok()) report.problems.push_back({"", fm.name, ns.message() + " (the stored values are not the source's)"});
  }
  auto field_name = [&](uint16_t f) -> std::string {
    if (f < nf) return meta.fields[f].name;
    if (f >= kAuxFieldBase && static_cast<size_t>(f - kAuxFieldBase) < nf)
      return meta.fields[f - kAuxFieldBase].name +
             (meta.fields[f - kAuxFieldBase].mask_blocks ? " (block counts)" : " (index)");
    return "#" + std::to_string(f);
  };
  auto sample_name = [&](uint64_t s) { return s < ids.size() && have_id[s] ? ids[s] : "#" + std::to_string(s); };
  // The sample index: one summary per sample, each checked against the records below.
  std::vector<SampleSummary> sums(ids.size());
  std::vector<bool> have_sum(ids.size(), false);
  if (snap->has_index()) {
    Status ist = snap->ForEachSummary([&](uint64_t idx, const SampleSummary& sum) -> Status {
      if (idx >= ids.size() || sum.fields.size() > nf) {
        report.problems.push_back({sample_name(idx), "", "sample index entry belongs to no sample"});
      } else {
        sums[idx] = sum;
        sums[idx].fields.resize(nf);
        have_sum[idx] = true;
      }
      return Status::OK();
    });
    if (!ist.ok()) report.problems.push_back({"", "", ist.message()});
    for (size_t i = 0; i < ids.size(); ++i)
      if (!have_sum[i]) report.problems.push_back({sample_name(i), "", "sample index entry missing or damaged"});
  } else {
    report.problems.push_back({"", "",
                               "store format " + std::to_string(meta.format_version) +
                                   " has no sample index: run `patchstore upgrade " + path + "`"});
  }
  // The sealed index (sealed stores): the same ids and summaries in one value.
  if (meta.sealed && snap->has_index()) {
    auto blob = snap->SealedIndex();
    if (!blob.ok()) {
      report.problems.push_back({"", "", "sealed store without its sealed index: " + blob.status().message()});
    } else {
      auto entries = DecodeSealedIndex(blob->data(), blob->size());
      if (!entries.ok()) {
        report.problems.push_back({"", "", "sealed index: " + entries.status().message()});
      } else if (entries->size() != ids.size()) {
        report.problems.push_back({"", "",
                                   "sealed index lists " + std::to_string(entries->size()) + " samples, the store " +
                                       std::to_string(ids.size())});
      } else {
        for (size_t i = 0; i < ids.size(); ++i) {
          const auto& e = (*entries)[i];
          auto sum = DecodeSampleSummary(i, e.summary.data(), e.summary.size());
          bool same = sum.ok() && have_id[i] && e.id == ids[i] && have_sum[i];
          if (same) {
            sum->fields.resize(nf);
            for (size_t f = 0; f < nf && same; ++f) same = sum->fields[f] == sums[i].fields[f];
          }
          if (!same)
            report.problems.push_back(
                {sample_name(i), "", "the sealed index disagrees with the sample's id or index entry"});
        }
      }
    }
  }
  // Volume geometry (optional): every entry belongs to a sample and decodes.
  {
    Status gst = snap->ForEachGeometry([&](uint64_t idx, const uint8_t* data, size_t size) -> Status {
      if (idx >= ids.size()) {
        report.problems.push_back({sample_name(idx), "", "volume geometry entry belongs to no sample"});
        return Status::OK();
      }
      auto g = DecodeVolumeGeometry(idx, data, size);
      if (!g.ok()) report.problems.push_back({sample_name(idx), "", g.status().message()});
      return Status::OK();
    });
    if (!gst.ok()) report.problems.push_back({"", "", gst.message()});
  }
  std::set<std::pair<uint64_t, uint16_t>> seen;
  // Streaming with the map opened for random access (no kernel readahead):
  // list the records first (keys only, no record is touched), then keep
  // kReadAhead bytes of records requested ahead of the one being checked,
  // and drop each record's pages from this process once checked, so memory
  // stays flat whatever the store's size (the pages stay in the page cache
  // for other readers).
  std::vector<RecordRef> refs;
  Status st = snap->ForEachRecord([&](uint64_t s, uint16_t f, const uint8_t* data, size_t size) -> Status {
    refs.push_back({s, f, data, size});
    return Status::OK();
  });
  const uint64_t total = refs.size();                         // data records and their auxiliary ones
  std::map<std::pair<uint64_t, uint16_t>, size_t> record_at;  // (sample, field) -> refs index
  for (size_t i = 0; i < refs.size(); ++i) record_at.emplace(std::make_pair(refs[i].sample, refs[i].field), i);
  constexpr uint64_t kReadAhead = uint64_t{64} << 20;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  size_t ahead = 0;
  uint64_t ahead_bytes = 0;
  for (size_t i = 0; i < refs.size(); ++i) {
    while (ahead < refs.size() && (ahead <= i || ahead_bytes < kReadAhead)) {
      snap->Advise(Access::kWillNeed, refs[ahead].data, refs[ahead].size);
      ahead_bytes += refs[ahead].size;
      ++ahead;
    }
    ahead_bytes -= std::min<uint64_t>(ahead_bytes, refs[i].size);
    const uint64_t s = refs[i].sample;
    const uint16_t f = refs[i].field;
    const uint8_t* data = refs[i].data;
    const size_t size = refs[i].size;
    ++report.records;
    report.bytes += size;
    seen.emplace(s, f);
    if (s >= ids.size() || (f >= nf && (f < kAuxFieldBase || static_cast<size_t>(f - kAuxFieldBase) >= nf))) {
      report.problems.push_back({sample_name(s), field_name(f), "record belongs to no sample or field"});
      continue;
    }
    auto h = ParseRecordHeader(data, size);
    Status rst = h.ok() ? VerifyRecordBody(*h, data) : h.status();
    const uint32_t blocks = f >= kAuxFieldBase ? meta.fields[f - kAuxFieldBase].mask_blocks : 0;
    if (rst.ok() && f >= kAuxFieldBase && !blocks && h->layout == Layout::kBlocks)
      rst = Status::Corruption(
          meta.attributes.count(kUpgradingAttribute)
              ? "unused mask block counts: `patchstore upgrade` was interrupted while adding them; run "
                "`patchstore upgrade` again to finish"
              : "stale mask block counts: the metadata lacks the field's mask_blocks (an older patchstore appended "
                "to the store and rewrote it, or an upgrade by a patchstore that did not mark its progress was "
                "interrupted); run `patchstore upgrade` to rewrite them");
    else if (rst.ok() &&
             h->layout != (f >= kAuxFieldBase ? (blocks ? Layout::kBlocks : Layout::kSAT) : meta.fields[f].layout))
      rst = Status::Corruption("record layout disagrees with the field");
    if (rst.ok() && blocks != 0)
      rst = CheckMaskBlocks(refs, record_at, s, static_cast<uint16_t>(f - kAuxFieldBase), blocks, *h, data);
    // A record holds its field's dtype (summed-area tables: uint32); the valid
    // count below is computed for that dtype (SummarizeRecord dispatches with
    // VisitDType).
    const DType want = f < nf ? meta.fields[f].dtype : DType::kUInt32;
    if (rst.ok() && h->dtype != want)
      rst = Status::Corruption(std::string("record holds ") + DTypeName(h->dtype) + " but the field is " +
                               DTypeName(want));
    if (rst.ok() && f < nf && h->rank != 3)
      rst = Status::Corruption("record has rank " + std::to_string(h->rank) + ", the field's records 3");
    if (rst.ok() && f < nf && h->shape[0] != meta.fields[f].channels && meta.fields[f].layout == Layout::kCHW)
      rst = Status::Corruption("record has " + std::to_string(h->shape[0]) + " channels, the field " +
                               std::to_string(meta.fields[f].channels));
    // What reads refuse (Reader: "run `patchstore verify`") verify reports.
    if (rst.ok() && f < nf && h->tile != meta.fields[f].tile) {
      auto layout = [](uint16_t t) { return t ? std::to_string(t) + "-pixel tiles" : std::string("rows"); };
      rst = Status::Corruption("the record is stored in " + layout(h->tile) + " but the field in " +
                               layout(meta.fields[f].tile) + " (reads refuse it)");
    }
    if (rst.ok() && f < nf && StoresRawSource(h->dtype) && !(h->norm == meta.fields[f].norm))
      rst = Status::Corruption("the record's normalisation " + h->norm.ToString() + " disagrees with its field's " +
                               meta.fields[f].norm.ToString() +
                               " (reads refuse it: raw values are normalised with "
                               "the field's table)");
    if (rst.ok() && f < nf && have_sum[s]) {
      if (!(SummarizeRecord(*h, data, meta.fields[f].is_mask) == sums[s].fields[f]))
        rst = Status::Corruption("the sample index disagrees with the record (shape, layout or mask count)");
    }
    if (!rst.ok()) report.problems.push_back({sample_name(s), field_name(f), rst.message()});
    // Whole pages, the record's first and last included: a neighbour that
    // shares one faults it in again from the page cache (a minor fault).
    const uintptr_t b = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
    const uintptr_t e = (reinterpret_cast<uintptr_t>(data) + size + page - 1) & ~(page - 1);
    snap->Advise(Access::kDontNeed, reinterpret_cast<const void*>(b), e - b);
    if (progress) progress(report.records, total);
  }
  if (!st.ok()) report.problems.push_back({"", "", st.message()});
  for (uint64_t s = 0; s < ids.size(); ++s)
    for (uint16_t f = 0; f < nf; ++f)
      if (!seen.count({s, f})) {
        report.problems.push_back({sample_name(s), meta.fields[f].name, "record missing"});
      } else if (have_sum[s] && !sums[s].fields[f].present) {
        report.problems.push_back({sample_name(s), meta.fields[f].name, "record not listed in the sample index"});
      } else if (meta.fields[f].mask_blocks != 0 && !seen.count({s, static_cast<uint16_t>(kAuxFieldBase + f)})) {
        report.problems.push_back({sample_name(s), meta.fields[f].name, "mask block counts missing"});
      }
  return report;
}

}  // namespace patchstore
