#include "reader/verify.h"

#include <set>
#include <utility>

#include "store/format.h"
#include "store/store.h"

namespace patchstore {

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
  report.samples = ids.size();
  const size_t nf = meta.fields.size();
  auto field_name = [&](uint16_t f) -> std::string {
    if (f < nf) return meta.fields[f].name;
    if (f >= kAuxFieldBase && static_cast<size_t>(f - kAuxFieldBase) < nf) return meta.fields[f - kAuxFieldBase].name + " (index)";
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
    report.problems.push_back({"", "", "store format " + std::to_string(meta.format_version) +
                                           " has no sample index: run `patchstore upgrade " + path + "`"});
  }
  std::set<std::pair<uint64_t, uint16_t>> seen;
  uint64_t total = ids.size() * nf;
  Status st = snap->ForEachRecord([&](uint64_t s, uint16_t f, const uint8_t* data, size_t size) -> Status {
    ++report.records;
    report.bytes += size;
    seen.emplace(s, f);
    if (s >= ids.size() || (f >= nf && (f < kAuxFieldBase || static_cast<size_t>(f - kAuxFieldBase) >= nf))) {
      report.problems.push_back({sample_name(s), field_name(f), "record belongs to no sample or field"});
      return Status::OK();
    }
    // Streaming with the map opened for random access (no readahead): ask
    // for the whole record at once, and drop its pages from this process
    // once checked, so memory stays flat whatever the store's size (the
    // pages stay in the page cache for other readers).
    snap->Advise(Access::kWillNeed, data, size);
    auto h = ParseRecordHeader(data, size);
    Status rst = h.ok() ? VerifyRecordBody(*h, data) : h.status();
    if (rst.ok() && h->layout != (f >= kAuxFieldBase ? Layout::kSAT : meta.fields[f].layout))
      rst = Status::Corruption("record layout disagrees with the field");
    if (rst.ok() && f < nf && h->dtype != DType::kFloat32) rst = Status::Corruption("record is not float32");
    if (rst.ok() && f < nf && h->shape[0] != meta.fields[f].channels && meta.fields[f].layout == Layout::kCHW)
      rst = Status::Corruption("record has " + std::to_string(h->shape[0]) + " channels, the field " +
                               std::to_string(meta.fields[f].channels));
    if (rst.ok() && f < nf && have_sum[s]) {
      RecordSummary want = SummaryOf(*h);
      if (meta.fields[f].is_mask && h->dtype == DType::kFloat32) {
        want.has_valid_count = true;
        want.valid_count = CountValid(reinterpret_cast<const float*>(data + kRecordHeaderSize), h->elements());
      }
      if (!(want == sums[s].fields[f]))
        rst = Status::Corruption("the sample index disagrees with the record (shape, layout or mask count)");
    }
    if (!rst.ok()) report.problems.push_back({sample_name(s), field_name(f), rst.message()});
    snap->Advise(Access::kDontNeed, data, size);
    if (progress) progress(report.records, total);
    return Status::OK();
  });
  if (!st.ok()) report.problems.push_back({"", "", st.message()});
  for (uint64_t s = 0; s < ids.size(); ++s)
    for (uint16_t f = 0; f < nf; ++f)
      if (!seen.count({s, f})) {
        report.problems.push_back({sample_name(s), meta.fields[f].name, "record missing"});
      } else if (have_sum[s] && !sums[s].fields[f].present) {
        report.problems.push_back({sample_name(s), meta.fields[f].name, "record not listed in the sample index"});
      }
  return report;
}

}  // namespace patchstore
