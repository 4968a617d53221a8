// The one ingest pipeline (ingest/driver.h): decoder threads feed one LMDB
// writer in input order.
#include "ingest/driver.h"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <new>
#include <thread>
#include <unordered_map>

#include "ingest/checks.h"
#include "ingest/encoding.h"

namespace patchstore {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// What the fills of a unit read at commit share: the error of a fill that
// fails while LMDB writes the batch, and whether the unit was counted done
// (a batch written again reads its units again).
struct FillState {
  Status error;
  bool counted = false;
};

// A unit on its way into a commit.
struct Pending {
  const IngestUnit* unit = nullptr;
  DecodedUnit decoded;
  SampleInput input;
  std::shared_ptr<FillState> fill;  // set when its records are read at commit
  bool deferred() const { return fill != nullptr; }
};

}  // namespace

BufferPool::Buffer BufferPool::Acquire(size_t bytes) {
  const size_t n = (bytes + sizeof(float) - 1) / sizeof(float);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].capacity >= n) {
        Buffer b = std::move(free_[i]);
        free_.erase(free_.begin() + static_cast<long>(i));
        return b;
      }
    }
  }
  Buffer b;
  b.data.reset(new (std::nothrow) float[std::max<size_t>(n, 1)]);
  if (b.data) b.capacity = n;
  return b;
}

void BufferPool::Release(Buffer b) {
  if (!b.data) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.size() < keep_) free_.push_back(std::move(b));
}

Status RefusedDType(const std::string& noun, const std::string& depth, const std::string& id, const UnitField& field,
                    const StoreMeta& meta, const std::string& encoding_name) {
  const int have = meta.FieldIndex(field.meta.name);
  if (have < 0 || meta.fields[have].dtype == field.meta.dtype) return Status::OK();
  // Compact fields take the dtype of their first unit's source; a later file
  // of another bit depth cannot be held exactly.
  const FieldMeta& fm = meta.fields[have];
  return Status::InvalidArgument(
      noun + " '" + id + "' ('" + field.path + "'): field '" + fm.name + "' is stored as " + DTypeName(fm.dtype) +
      " (--encoding " + encoding_name + ", " + SourceTypeName(fm.source_type) + " sources) but this file is " +
      SourceTypeName(field.meta.source_type) + ", which needs " + DTypeName(field.meta.dtype) +
      ". A store keeps the encoding of its first ingest: give the field one " + depth +
      ", or hold it as float32 (every type exactly) with 'patchstore copy STORE NEW --encoding " + fm.name +
      "=float32' (what is ingested so far) and this ingest again into NEW with --encoding " + fm.name +
      "=float32 (it resumes there)");
}

Status IngestSource::FieldRefused(const IngestUnit& unit, const UnitField& field, const Status& why,
                                  const StoreMeta& /*meta*/) const {
  return why.WithContext("sample '" + unit.id + "' ('" + field.path + "')");
}

Status CheckShardOption(const DriverOptions& o) {
  if (o.shard_count == 0 && o.shard_index == 0) return Status::OK();
  StoreMeta probe;  // validates I/N before anything is read
  return CheckShard(&probe, o.store, o.shard_index, o.shard_count);
}

Result<IngestSummary> RunIngest(const DriverOptions& o, std::vector<IngestUnit> units, IngestSource* source) {
  const Clock::time_point start = o.start;
  // --shard: the position of every id in the whole input is recorded at
  // seal, so a shard set is numbered as one ingest of the same input.
  auto input_ordinals = InputOrdinals(units, o.shard_count,
                                      [](const IngestUnit& u) -> std::string_view { return u.id; });
  std::vector<size_t> kept;  // planned indices of this shard
  for (size_t i = 0; i < units.size(); ++i)
    if (o.shard_count == 0 || units[i].every_shard || ShardOfId(units[i].id, o.shard_count) == o.shard_index)
      kept.push_back(i);

  // The report's folder is checked before the store is touched (the default
  // one lives in the store, which Writer::Open creates).
  FailureReport report(o.report_path.empty() ? o.store + "/ingest-errors.tsv" : o.report_path);
  if (o.skip_errors && !o.report_path.empty()) PS_RETURN_IF_ERROR(CheckReportPath(o.report_path));
  WriterOptions wo = o.writer;
  if (const uint64_t map = source->MapBytes(kept); map > 0) wo.initial_map_size = map;
  PS_ASSIGN_OR_RETURN(auto writer, Writer::Open(o.store, wo));
  PS_RETURN_IF_ERROR(CheckShard(&writer->mutable_meta(), o.store, o.shard_index, o.shard_count));
  PS_RETURN_IF_ERROR(source->Prepare(&writer->mutable_meta()));
  if (o.skip_errors) PS_RETURN_IF_ERROR(CheckReportPath(report.path()));
  if (!o.command_line.empty()) writer->mutable_meta().attributes["ingest_command"] = o.command_line;

  IngestSummary summary;
  auto warn = [&summary](std::vector<std::string> ws) {
    for (std::string& w : ws)
      if (summary.warnings.size() < 100) summary.warnings.push_back(std::move(w));
  };
  warn(o.warnings);
  warn(source->TakeWarnings());
  summary.samples_total = kept.size();
  std::vector<size_t> todo;
  for (size_t i : kept) {
    if (!units[i].every_shard && writer->Contains(units[i].id)) ++summary.samples_present;
    else todo.push_back(i);
  }
  auto notice = [&](const std::string& message) {
    if (!o.progress) return;
    Progress p;
    p.total = todo.size();
    p.skipped = summary.samples_present;
    p.seconds = Seconds(start);
    p.message = message;
    o.progress(p);
  };
  auto project = [&](StoreProjector* projector) {
    const StoreProjection proj = projector->Finish();
    summary.projected_bytes = proj.bytes;
    summary.ram_bytes = proj.ram_bytes;
    summary.advice = proj.advice;
    if (proj.samples > 0 && !todo.empty()) notice(proj.message);  // nothing to write: nothing to advise
  };
  // The store's size before the first write (ingest/projection.h): from the
  // planned headers where the source read them, else from the first decoded
  // unit's records times the units of the input.
  bool projected = false;
  {
    StoreProjector projector("ingest", o.frames);
    if (source->Project(kept, &projector)) {
      projected = true;
      project(&projector);
    }
  }

  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const size_t nthreads = o.inline_decode
                              ? 1
                              : std::min<size_t>(static_cast<size_t>(threads), std::max<size_t>(todo.size(), 1));
  const size_t window = o.window_per_thread * static_cast<size_t>(threads) + o.window_extra;
  BufferPool buffers(o.keep_buffers);
  bool any_decoded = false;
  for (size_t i : todo) any_decoded = any_decoded || units[i].status.ok();
  if (any_decoded) PS_RETURN_IF_ERROR(source->Start(static_cast<int>(nthreads)));

  auto decode = [&](size_t pos, int slot) {
    const IngestUnit& u = units[todo[pos]];
    if (!u.status.ok()) {
      DecodedUnit d;
      d.status = u.status;
      d.failed_file = u.file;
      return d;
    }
    return source->Decode(todo[pos], slot, &buffers);
  };
  std::mutex mu;
  std::condition_variable cv_done, cv_room;
  std::map<size_t, DecodedUnit> ready;
  size_t next = 0, consumed = 0;  // guarded by mu
  bool stop = false;
  auto worker = [&](int slot) {
    for (;;) {
      size_t pos;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv_room.wait(lock, [&] { return stop || next < consumed + window; });
        if (stop || next >= todo.size()) return;
        pos = next++;
      }
      DecodedUnit d = decode(pos, slot);
      {
        std::lock_guard<std::mutex> lock(mu);
        ready.emplace(pos, std::move(d));
      }
      cv_done.notify_all();
    }
  };
  std::vector<std::thread> workers;
  if (!o.inline_decode)
    for (size_t t = 0; t < nthreads && !todo.empty(); ++t) workers.emplace_back(worker, static_cast<int>(t));

  std::vector<Pending> batch;
  uint64_t batch_bytes = 0;
  // Units done: failed, or decoded into the batch, or (read at commit) read.
  size_t done = 0;
  auto report_progress = [&]() {
    if (!o.progress) return;
    Progress p;
    p.total = todo.size();
    p.done = done;
    p.failed = summary.samples_failed;
    p.skipped = summary.samples_present;
    p.bytes = summary.bytes_decoded;
    p.seconds = Seconds(start);
    o.progress(p);
  };

  auto release = [&](DecodedUnit* d) {
    for (UnitField& f : d->fields) buffers.Release(std::move(f.buffer));
  };
  // Commits the batch. A unit read at commit (fill) that fails is dropped
  // and the batch written again without it (skip), or with the units
  // before it only (stop: returns its error after committing them).
  auto flush = [&]() -> Status {
    Status stopped;
    while (!batch.empty()) {
      std::vector<SampleInput> inputs;
      inputs.reserve(batch.size());
      for (const Pending& p : batch) inputs.push_back(p.input);
      Status st = writer->WriteBatch(inputs);
      if (st.ok()) {
        summary.samples_written += batch.size();
        for (const Pending& p : batch) summary.bytes_written += p.decoded.bytes;
        break;
      }
      size_t k = 0;
      while (k < batch.size() && (!batch[k].deferred() || batch[k].fill->error.ok())) ++k;
      if (k == batch.size()) {  // not a source problem: the store failed
        stopped = st;
        break;
      }
      const Status bad = batch[k].fill->error;
      if (!o.skip_errors) {
        for (size_t i = k; i < batch.size(); ++i) release(&batch[i].decoded);
        batch.resize(k);
        stopped = bad;
        continue;
      }
      report.Add(&summary, batch[k].unit->id, batch[k].unit->file, bad);
      ++done;
      report_progress();
      release(&batch[k].decoded);
      batch.erase(batch.begin() + static_cast<long>(k));
    }
    for (Pending& p : batch) release(&p.decoded);
    batch.clear();
    batch_bytes = 0;
    warn(source->TakeWarnings());
    return stopped;
  };
  Status failure;
  for (size_t pos = 0; pos < todo.size(); ++pos) {
    if (o.cancelled && o.cancelled()) {
      // Units read at commit have not been read yet: drop them, stop now.
      if (std::any_of(batch.begin(), batch.end(), [](const Pending& p) { return p.deferred(); })) {
        for (Pending& p : batch) release(&p.decoded);
        batch.clear();
      }
      failure = Status::Aborted("cancelled");
      break;
    }
    DecodedUnit d;
    if (o.inline_decode) {
      d = decode(pos, 0);
    } else {
      std::unique_lock<std::mutex> lock(mu);
      cv_done.wait(lock, [&] { return ready.count(pos) != 0; });
      d = std::move(ready[pos]);
      ready.erase(pos);
    }
    const IngestUnit& unit = units[todo[pos]];
    bool read_later = false;  // its records are read at commit
    // Register the fields (first unit) or check them against the store.
    std::vector<uint16_t> field_index;
    for (size_t f = 0; f < d.fields.size() && d.status.ok(); ++f) {
      auto idx = writer->EnsureField(d.fields[f].meta);
      if (idx.ok()) {
        field_index.push_back(*idx);
        continue;
      }
      d.status = source->FieldRefused(unit, d.fields[f], idx.status(), writer->meta());
      d.failed_file = d.fields[f].path;
    }
    if (!d.status.ok()) {
      release(&d);
      if (!o.skip_errors) {
        failure = d.status;
        break;
      }
      report.Add(&summary, unit.id, d.failed_file, d.status);
    } else {
      if (!projected) {
        projected = true;
        std::vector<ProjectedRecord> records;
        for (const UnitField& f : d.fields) {
          ProjectedRecord r;
          r.field = f.meta.name;
          r.header = f.header;
          r.is_mask = f.meta.is_mask;
          r.mask_blocks = writer->meta().fields[writer->meta().FieldIndex(f.meta.name)].mask_blocks;
          records.push_back(std::move(r));
        }
        StoreProjector projector("ingest", o.frames);
        projector.Add(records, summary.samples_total, unit.id.size());
        project(&projector);
      }
      Pending p;
      size_t last_fill = 0;  // the field whose fill completes the unit
      for (size_t f = 0; f < d.fields.size(); ++f)
        if (d.fields[f].fill) last_fill = f;
      p.unit = &unit;
      p.input.id = unit.id;
      p.input.geometry = d.geometry;
      for (size_t f = 0; f < d.fields.size(); ++f) {
        UnitField& uf = d.fields[f];
        RecordInput r;
        r.field = field_index[f];
        r.header = uf.header;
        if (uf.fill) {
          // Read at commit: the unit is done (counted once, progress
          // reported) when its last record has been read.
          if (!p.fill) p.fill = std::make_shared<FillState>();
          r.fill = [&, fill = uf.fill, state = p.fill, last = f == last_fill, bytes = d.bytes](void* dst) {
            Status s = fill(dst);
            if (!s.ok()) {
              state->error = s;
              return s;
            }
            if (last && !state->counted) {
              state->counted = true;
              ++done;
              summary.bytes_decoded += bytes;
              report_progress();
            }
            return Status::OK();
          };
        } else if (uf.header.tiled()) {
          // Tiles are cut straight into the record LMDB reserves.
          const void* rows = uf.buffer.data.get();
          const size_t es = DTypeSize(uf.header.dtype);
          const TileGrid grid = uf.header.grid();
          r.fill = [rows, es, grid](void* dst) {
            TileCHW(rows, es, grid, dst);
            return Status::OK();
          };
        } else {
          r.data = uf.buffer.data.get();
        }
        p.input.records.push_back(std::move(r));
      }
      warn(std::move(d.warnings));
      read_later = p.deferred();
      if (!read_later) summary.bytes_decoded += d.bytes;
      batch_bytes += d.bytes;
      p.decoded = std::move(d);
      batch.push_back(std::move(p));
    }
    if (!read_later) ++done;
    {
      std::lock_guard<std::mutex> lock(mu);
      consumed = pos + 1;
    }
    cv_room.notify_all();
    if (batch_bytes >= o.batch_bytes || batch.size() >= std::max<uint64_t>(o.batch_samples, 1)) {
      Status st = flush();
      if (!st.ok()) {
        failure = st;
        break;
      }
    }
    if (!read_later) report_progress();
  }
  // Commit what was decoded before a failure: those units are complete.
  Status st = flush();
  if (failure.ok() && !st.ok()) failure = st;
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
  }
  cv_room.notify_all();
  for (auto& t : workers) t.join();
  for (auto& entry : ready) release(&entry.second);
  // A whole --on-error skip run without failures removes an earlier run's report.
  report.Close(&summary, /*remove_stale=*/o.skip_errors && failure.ok());
  if (!todo.empty()) report_progress();  // a resume with nothing left prints no "0/0"
  summary.seconds = Seconds(start);
  if (!failure.ok())
    return failure.WithContext("ingest into '" + o.store + "' stopped after " +
                               std::to_string(summary.samples_written) + " new " + o.noun);
  if (summary.samples_failed == 0 && !writer->meta().sealed)
    PS_RETURN_IF_ERROR(writer->Seal(OrdinalLookup(input_ordinals)));
  return summary;
}

}  // namespace patchstore
