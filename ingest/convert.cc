// CopyStore / ConvertStore (ingest/convert.h): converter threads turn each
// sample's records into the target layout and dtype in input order while
// one writer commits them, as image ingest decodes and commits.
#include "patchstore/ingest/convert.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "ingest/checks.h"
#include "ingest/encoding.h"
#include "ingest/projection.h"
#include "patchstore/reader/reader.h"
#include "patchstore/reader/transform.h"
#include "patchstore/store/copy.h"
#include "patchstore/store/store.h"

namespace patchstore {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

uint32_t Bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

std::string FormatValue(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

// Float32 values (as readers return them) -> the source values of a
// raw-source dtype (uint8, uint16, int16: StoresRawSource) that give exactly
// those values under `norm` (Normalization::Apply, the function readers
// apply): a hash table from every value's bits to its source value. Where
// several source values give one value (a mask's binary {0,1}, clamped
// values), the one the normalisation's inverse gives (what export writes
// back) is kept, else the smallest. A value that no source value gives has
// no encoding.
class RawEncoder {
 public:
  RawEncoder(DType dtype, const Normalization& norm, SourceType source) {
    const int64_t lo = dtype == DType::kInt16 ? -32768 : 0;
    const int64_t hi = dtype == DType::kUInt8 ? 255 : dtype == DType::kUInt16 ? 65535 : 32767;
    const uint64_t n = static_cast<uint64_t>(hi - lo + 1);
    uint32_t bits = 0;
    while ((uint64_t{1} << bits) < 4 * n) ++bits;
    shift_ = 32 - bits;
    mask_ = (uint32_t{1} << bits) - 1;
    slots_.assign(size_t{1} << bits, Slot{});
    std::vector<uint32_t> value_bits(n);
    for (int64_t x = lo; x <= hi; ++x) {
      const uint32_t b = Bits(norm.Apply(static_cast<double>(x)));
      value_bits[static_cast<size_t>(x - lo)] = b;
      Slot* s = Find(b);
      if (s->x == kEmpty) *s = Slot{b, static_cast<int32_t>(x)};
    }
    const double maxval = SourceMaxValue(source);
    for (Slot& s : slots_) {
      if (s.x == kEmpty) continue;
      float v;
      std::memcpy(&v, &s.bits, 4);
      const double g = norm.Invert(v, maxval);
      if (!std::isfinite(g) || g < static_cast<double>(lo) - 0.5 || g > static_cast<double>(hi) + 0.5) continue;
      const int64_t c = std::min<int64_t>(std::max<int64_t>(std::llround(g), lo), hi);
      if (value_bits[static_cast<size_t>(c - lo)] == s.bits) s.x = static_cast<int32_t>(c);
    }
  }

  // The source value giving `v`; false when there is none.
  bool Encode(float v, int64_t* out) const {
    const Slot* s = Find(Bits(v));
    if (s->x == kEmpty) return false;
    *out = s->x;
    return true;
  }

 private:
  static constexpr int32_t kEmpty = INT32_MIN;
  struct Slot {
    uint32_t bits = 0;
    int32_t x = kEmpty;
  };
  // The slot holding `b`, or the empty slot where it would go.
  Slot* Find(uint32_t b) { return const_cast<Slot*>(static_cast<const RawEncoder*>(this)->Find(b)); }
  const Slot* Find(uint32_t b) const {
    uint32_t h = (b * 0x9E3779B1u) >> shift_;
    for (;;) {
      const Slot& s = slots_[h];
      if (s.x == kEmpty || s.bits == b) return &s;
      h = (h + 1) & mask_;
    }
  }
  uint32_t shift_ = 0, mask_ = 0;
  std::vector<Slot> slots_;  // open addressing, at most a quarter full
};

// How one field is converted.
struct FieldConversion {
  FieldMeta target;  // the copy's field
  DType src_dtype = DType::kFloat32;
  bool half_on_request = false;           // FIELD=float16: rounding accepted, as at ingest
  std::string encoding_option;            // what gave the target dtype ("--encoding compact")
  std::shared_ptr<const RawEncoder> raw;  // for raw-source targets of another dtype
};

// The --encoding name that keeps a field of dtype `d` as it is.
const char* KeepingEncoding(DType d) {
  if (d == DType::kFloat32) return "float32";
  if (d == DType::kFloat16) return "float16";
  return "compact";
}

struct ConvertedRecord {
  RecordInput input;
  std::unique_ptr<uint8_t[]> rows;  // target rows owned here (fill reads them), when converted or retiled
};

struct ConvertedSample {
  Status status;
  std::string id;
  std::vector<ConvertedRecord> records;
  std::optional<VolumeGeometry> geometry;  // volumes: carried over as stored
  uint64_t bytes = 0;                      // target payload bytes
};

// "(c, y, x)" of element i of a (C,H,W) or (S,H,W) record.
std::string Position(uint64_t i, const RecordHeader& h) {
  const uint64_t H = h.shape[1], W = h.shape[2];
  return "(" + std::to_string(i / (H * W)) + ", " + std::to_string(i / W % H) + ", " + std::to_string(i % W) + ")";
}

// Encodes n float32 values into `dst` of the field's target dtype. Returns
// the index of the first value it cannot hold exactly (n when none).
uint64_t EncodeValues(const float* v, uint64_t n, const FieldConversion& fc, void* dst) {
  uint64_t bad = n;
  VisitDType(fc.target.dtype, [&](auto tag) {
    using U = typename decltype(tag)::type;
    U* out = static_cast<U*>(dst);
    if constexpr (std::is_same_v<U, float>) {
      std::memcpy(out, v, n * sizeof(float));
    } else if constexpr (std::is_same_v<U, Float16>) {
      for (uint64_t i = 0; i < n; ++i) {
        out[i] = ToFloat16(v[i]);
        if (!fc.half_on_request && Bits(ToFloat32(out[i])) != Bits(v[i])) {
          bad = i;
          return;
        }
      }
    } else if constexpr (std::is_integral_v<U> && sizeof(U) <= 2) {
      // A one-entry cache: masks and flat regions repeat values.
      uint32_t last_bits = Bits(v[0]) ^ 1u;
      U last = 0;
      for (uint64_t i = 0; i < n; ++i) {
        const uint32_t b = Bits(v[i]);
        if (b != last_bits) {
          int64_t x;
          if (!fc.raw || !fc.raw->Encode(v[i], &x)) {
            bad = i;
            return;
          }
          last = static_cast<U>(x);
          last_bits = b;
        }
        out[i] = last;
      }
    } else {
      bad = 0;  // RecordDType never chooses it
    }
  });
  return bad;
}

// Converts record (sample, field) of `reader` as `fc` says into `out`:
// its header and either a fill that copies or re-tiles the stored bytes (same
// dtype) or target rows owned by `out`. The Reader checks the record's
// checksum on this first access.
Status ConvertRecord(const Reader& reader, uint64_t sample, int field, const FieldConversion& fc, ConvertedRecord* out,
                     uint64_t* bytes) {
  PS_ASSIGN_OR_RETURN(RecordHeader h, reader.Header(sample, field));
  const int64_t H = static_cast<int64_t>(h.shape[1]), W = static_cast<int64_t>(h.shape[2]);
  PS_ASSIGN_OR_RETURN(WindowSource w, reader.Window(sample, field, 0, 0, H, W));
  RecordHeader t = h;
  t.dtype = fc.target.dtype;
  t.tile = h.layout == Layout::kCHW ? fc.target.tile : 0;
  PS_RETURN_IF_ERROR(FinalizeHeader(&t));
  out->input.field = static_cast<uint16_t>(field);
  out->input.header = t;
  *bytes = t.payload_bytes;
  const uint8_t* payload = w.payload;
  const size_t es_src = DTypeSize(h.dtype), es_dst = DTypeSize(t.dtype);
  const uint64_t n = h.elements();
  if (h.dtype == t.dtype) {
    const size_t es = es_src;
    if (h.tile == t.tile) {
      const uint64_t size = t.payload_bytes;
      out->input.fill = [payload, size](void* dst) {
        std::memcpy(dst, payload, size);
        return Status::OK();
      };
      return Status::OK();
    }
    if (!h.tiled()) {
      const TileGrid g = t.grid();
      out->input.fill = [payload, es, g](void* dst) {
        TileCHW(payload, es, g, dst);
        return Status::OK();
      };
      return Status::OK();
    }
    if (!t.tiled()) {
      const TileGrid g = h.grid();
      out->input.fill = [payload, es, g](void* dst) {
        UntileCHW(payload, es, g, dst);
        return Status::OK();
      };
      return Status::OK();
    }
    out->rows.reset(new uint8_t[n * es]);
    UntileCHW(payload, es, h.grid(), out->rows.get());
  } else {
    // Through the float32 values readers return, encoded again.
    std::unique_ptr<uint8_t[]> untiled;
    const void* src_rows = payload;
    if (h.tiled()) {
      untiled.reset(new uint8_t[n * es_src]);
      UntileCHW(payload, es_src, h.grid(), untiled.get());
      src_rows = untiled.get();
    }
    std::unique_ptr<float[]> values;
    const float* v = static_cast<const float*>(src_rows);
    if (h.dtype != DType::kFloat32) {
      values.reset(new float[n]);
      VisitDType(h.dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        ConvertRun<T>(static_cast<const T*>(src_rows), static_cast<int64_t>(n), values.get(), w.lut);
      });
      v = values.get();
    }
    out->rows.reset(new uint8_t[n * es_dst]);
    const uint64_t bad = EncodeValues(v, n, fc, out->rows.get());
    if (bad < n)
      return Status::InvalidArgument(
          "field '" + fc.target.name + "' cannot be stored as " + DTypeName(t.dtype) + " (" + fc.encoding_option +
          ") without changing its values: the value " + FormatValue(v[bad]) + " at " + Position(bad, h) +
          " is not one that " + DTypeName(t.dtype) +
          (StoresRawSource(t.dtype) ? " source values give under its normalisation " + h.norm.ToString()
                                    : std::string(" holds exactly")) +
          " (was the store written with float16, or by hand?); keep the field as it is with --encoding " +
          fc.target.name + "=" + KeepingEncoding(h.dtype));
  }
  const uint8_t* rows = out->rows.get();
  if (t.tiled()) {
    const TileGrid g = t.grid();
    out->input.fill = [rows, es_dst, g](void* dst) {
      TileCHW(rows, es_dst, g, dst);
      return Status::OK();
    };
  } else {
    const uint64_t size = t.payload_bytes;
    out->input.fill = [rows, size](void* dst) {
      std::memcpy(dst, rows, size);
      return Status::OK();
    };
  }
  return Status::OK();
}

std::string TargetName(const FieldMeta& f) {
  return std::string(DTypeName(f.dtype)) + " " + (f.layout == Layout::kCHW ? LayoutName(f.tile) : "rows");
}

}  // namespace

Status ConvertStore(const CopyOptions& o, const std::string& dst_dir) {
  const auto start = Clock::now();
  const std::string ctx = "copy '" + o.src + "'";
  ReaderOptions ro;
  ro.verify_checksums = true;  // a damaged record must not be copied under a fresh checksum
  PS_ASSIGN_OR_RETURN(std::shared_ptr<Reader> reader, Reader::Open(o.src, ro));
  const StoreMeta& meta = reader->meta();

  // Options.
  PS_ASSIGN_OR_RETURN(const EncodingPlan plan, ParseEncodings(o.encoding));
  bool whole_store_spec = false;
  for (const std::string& s : o.encoding) whole_store_spec = whole_store_spec || s.find('=') == std::string::npos;
  for (const auto& [name, e] : plan.per_field)
    if (meta.FieldIndex(name) < 0) {
      std::string have;
      for (const FieldMeta& f : meta.fields) have += (have.empty() ? "" : ", ") + f.name;
      return Status::InvalidArgument(ctx + ": --encoding names field '" + name + "', which the store does not have " +
                                     "(fields: " + have + ")");
    }
  if (!o.layout.empty() && o.layout != "rows" && o.layout != "tiles")
    return Status::InvalidArgument(ctx + ": --layout must be rows or tiles, got '" + o.layout + "'");
  if (o.tile_size != 0 && o.layout != "tiles")
    return Status::InvalidArgument(ctx + ": --tile-size " + std::to_string(o.tile_size) +
                                   " is for --layout tiles (give --layout tiles --tile-size " +
                                   std::to_string(o.tile_size) + ")");
  if (o.tile_size != 0 && !ValidTileSize(o.tile_size))
    return Status::InvalidArgument(ctx + ": --tile-size must be a multiple of 8 in " + std::to_string(kMinTileSize) +
                                   ".." + std::to_string(kMaxTileSize) + ", got " + std::to_string(o.tile_size));
  if (o.layout == "tiles" && meta.kind == "volumes")
    return Status::InvalidArgument(ctx + ": --layout tiles is for image frames; '" + o.src +
                                   "' holds volumes, whose slices are read whole, each one contiguous range of its "
                                   "(S,H,W) record, so tiles would not help (convert its --encoding only)");
  uint16_t tile = 0;
  if (o.layout == "tiles")
    tile = static_cast<uint16_t>(o.tile_size ? o.tile_size : StoredTile(meta) ? StoredTile(meta) : kDefaultTileSize);

  std::vector<FieldConversion> fields;
  std::string plan_text;
  uint64_t widening = 1;  // how much larger than the source the copy may be (map size)
  for (const FieldMeta& f : meta.fields) {
    FieldConversion fc;
    fc.src_dtype = f.dtype;
    fc.target = f;
    const bool named = whole_store_spec || plan.per_field.count(f.name) != 0;
    if (named) {
      const FieldEncoding e = plan.For(f.name);
      fc.target.dtype = RecordDType(e, f.source_type, f.norm);
      fc.half_on_request = e == FieldEncoding::kFloat16;
      fc.encoding_option = plan.per_field.count(f.name) ? "--encoding " + f.name + "=" + FieldEncodingName(e)
                                                        : std::string("--encoding ") + FieldEncodingName(e);
    }
    if (f.layout == Layout::kCHW && !o.layout.empty()) fc.target.tile = tile;
    if (f.layout != Layout::kCHW) fc.target.tile = 0;
    // Summed-area tables of format-1 masks are not copied: the Writer gives
    // the mask block counts that replaced them (FORMAT.md).
    fc.target.has_sat = false;
    if (StoresRawSource(fc.target.dtype) && fc.target.dtype != f.dtype)
      fc.raw = std::make_shared<RawEncoder>(fc.target.dtype, f.norm, f.source_type);
    widening = std::max<uint64_t>(widening, (DTypeSize(fc.target.dtype) + DTypeSize(f.dtype) - 1) / DTypeSize(f.dtype));
    plan_text += std::string(plan_text.empty() ? "" : ", ") + f.name + " " + TargetName(f) + " -> " +
                 TargetName(fc.target);
    fields.push_back(std::move(fc));
  }
  if (o.progress) {
    Progress p;
    p.total = reader->size();
    p.message = "copy: re-laying out and re-encoding '" + o.src + "' from its records (" + plan_text + ")";
    o.progress(p);
  }

  // The copy.
  std::error_code ec;
  const uint64_t src_bytes = fs::file_size(fs::path(o.src) / "data.mdb", ec);
  WriterOptions wo;
  wo.kind = meta.kind;
  wo.durable = o.durable;
  wo.initial_map_size = std::max<uint64_t>(uint64_t{1} << 30, (ec ? 0 : src_bytes) * widening + (uint64_t{64} << 20));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Writer> writer, Writer::Open(dst_dir, wo));
  writer->mutable_meta().attributes = meta.attributes;
  if (!o.command_line.empty()) writer->mutable_meta().attributes["copy_command"] = o.command_line;
  for (size_t f = 0; f < fields.size(); ++f) {
    PS_ASSIGN_OR_RETURN(uint16_t index, writer->EnsureField(fields[f].target));
    if (index != f) return Status::Internal(ctx + ": field '" + fields[f].target.name + "' got another index");
  }

  const uint64_t total = reader->size();
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const size_t window = static_cast<size_t>(threads) * 2 + 2;  // samples in flight
  const int nf = reader->field_count();
  auto prefetch = [&](uint64_t s) {
    if (s >= total) return;
    for (int f = 0; f < nf; ++f) reader->Prefetch(s, f);  // the map has no readahead: ask for whole records
  };
  for (uint64_t s = 0; s < std::min<uint64_t>(window, total); ++s) prefetch(s);

  std::mutex mu;
  std::condition_variable cv_done, cv_room;
  std::map<uint64_t, ConvertedSample> ready;
  uint64_t next = 0, consumed = 0;  // guarded by mu
  bool stop = false;
  auto worker = [&] {
    for (;;) {
      uint64_t pos;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv_room.wait(lock, [&] { return stop || next < consumed + window; });
        if (stop || next >= total) return;
        pos = next++;
      }
      prefetch(pos + window);
      ConvertedSample cs;
      cs.id = std::string(reader->id(pos));
      if (auto g = reader->Geometry(pos); g.ok()) cs.geometry = *g;
      else cs.status = g.status().WithContext(ctx + ": sample '" + cs.id + "'");
      for (int f = 0; f < nf && cs.status.ok(); ++f) {
        if (!reader->summary(pos, f).present) continue;
        ConvertedRecord r;
        uint64_t bytes = 0;
        cs.status = ConvertRecord(*reader, pos, f, fields[f], &r, &bytes);
        if (!cs.status.ok()) {
          cs.status = cs.status.WithContext(ctx + ": sample '" + cs.id + "'");
          break;
        }
        cs.bytes += bytes;
        cs.records.push_back(std::move(r));
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        ready.emplace(pos, std::move(cs));
      }
      cv_done.notify_all();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads && static_cast<uint64_t>(t) < total; ++t) pool.emplace_back(worker);

  std::vector<ConvertedSample> batch;
  uint64_t batch_bytes = 0, written = 0, bytes_written = 0;
  auto flush = [&]() -> Status {
    if (batch.empty()) return Status::OK();
    std::vector<SampleInput> inputs;
    inputs.reserve(batch.size());
    for (const ConvertedSample& cs : batch) {
      SampleInput in;
      in.id = cs.id;
      in.geometry = cs.geometry;
      for (const ConvertedRecord& r : cs.records) in.records.push_back(r.input);
      inputs.push_back(std::move(in));
    }
    Status st = writer->WriteBatch(inputs);
    written += batch.size();
    bytes_written += batch_bytes;
    batch.clear();
    batch_bytes = 0;
    return st;
  };
  Status failure;
  for (uint64_t pos = 0; pos < total; ++pos) {
    if (o.cancelled && o.cancelled()) {
      failure = Status::Aborted("cancelled");
      break;
    }
    ConvertedSample cs;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv_done.wait(lock, [&] { return ready.count(pos) != 0; });
      cs = std::move(ready[pos]);
      ready.erase(pos);
      consumed = pos + 1;
    }
    cv_room.notify_all();
    if (!cs.status.ok()) {
      failure = cs.status;
      break;
    }
    batch_bytes += cs.bytes;
    batch.push_back(std::move(cs));
    if (batch_bytes >= (uint64_t{256} << 20) || batch.size() >= 256) {
      failure = flush();
      if (!failure.ok()) break;
    }
    if (o.progress) {
      Progress p;
      p.done = pos + 1;
      p.total = total;
      p.bytes = bytes_written + batch_bytes;
      p.seconds = Seconds(start);
      o.progress(p);
    }
  }
  if (failure.ok()) failure = flush();
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
  }
  cv_room.notify_all();
  for (std::thread& t : pool) t.join();
  if (!failure.ok()) return failure;
  if (total == 0) PS_RETURN_IF_ERROR(writer->CommitMeta());
  if (o.progress) {
    Progress p;
    p.done = p.total = total;
    p.bytes = bytes_written;
    p.seconds = Seconds(start);
    o.progress(p);
  }
  if (meta.sealed) {
    // A shard's input order goes with it (FORMAT.md "Shards").
    std::shared_ptr<std::unordered_map<std::string, uint64_t>> ordinals;
    auto order = reader->snapshot()->InputOrder();
    if (order.ok()) {
      ordinals = std::make_shared<std::unordered_map<std::string, uint64_t>>();
      for (uint64_t s = 0; s < total && s < order->size(); ++s)
        ordinals->emplace(std::string(reader->id(s)), (*order)[s]);
    } else if (order.status().code() != Code::kNotFound) {
      return order.status().WithContext(ctx);
    }
    PS_RETURN_IF_ERROR(writer->Seal(OrdinalLookup(ordinals)));
  }
  return Status::OK();
}

Result<CopySummary> CopyStore(const CopyOptions& o, std::vector<VerifyProblem>* problems) {
  const auto start = Clock::now();
  CopySummary summary;
  summary.converted = !o.layout.empty() || !o.encoding.empty() || o.tile_size != 0;
  std::error_code ec;
  const std::string& dst = o.dst;
  // One staging engine (patchstore/store/copy.h): path checks, removal of
  // the staging folders interrupted copies to DST left, the rename at the end.
  std::vector<StagingLeftover> leftovers;
  auto staged_or = StagedStore::Create(o.src, dst, &leftovers);
  for (const StagingLeftover& l : leftovers) {
    const std::string line = std::string("copy: ") + (l.removed ? "removed" : "kept") + " '" + l.path + "': " + l.note;
    if (o.notice) {
      o.notice(line);
    } else if (o.progress) {
      Progress p;
      p.message = line;
      o.progress(p);
    }
  }
  if (!staged_or.ok()) return staged_or.status();
  std::unique_ptr<StagedStore> staged = std::move(*staged_or);
  const std::string tmp = staged->path();
  auto fail = [&](Status st) {
    staged.reset();  // removes the staging folder
    return st;
  };
  Status st;
  if (summary.converted) {
    st = ConvertStore(o, tmp);
  } else {
    if (o.progress) {
      Progress p;
      p.message = "copy: writing a compacted copy of '" + o.src + "'...";
      o.progress(p);
    }
    st = CopyStoreCompact(o.src, tmp);
  }
  if (!st.ok()) return fail(st);
  summary.src_bytes = fs::file_size(fs::path(o.src) / "data.mdb", ec);
  summary.dst_bytes = fs::file_size(fs::path(tmp) / "data.mdb", ec);
  auto report = VerifyStore(tmp, o.verify_progress);
  if (!report.ok()) return fail(report.status().WithContext("verifying the copy of '" + o.src + "'"));
  if (!report->ok()) {
    if (problems) *problems = report->problems;
    return fail(Status::Corruption(
        "the copy of '" + o.src + "' failed verification (" + std::to_string(report->problems.size()) +
        " problems; is the source damaged? run 'patchstore verify " + o.src + "'); nothing written to '" + dst + "'"));
  }
  if (Status cst = staged->Commit(); !cst.ok()) return cst;
  summary.samples = report->samples;
  summary.records = report->records;
  summary.seconds = Seconds(start);
  return summary;
}

}  // namespace patchstore
