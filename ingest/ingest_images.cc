// Image ingest: a pool of decoder threads feeding one LMDB writer in input
// order, so that the store's sample indices do not depend on thread timing
// and a resumed ingest ends with the same content as an uninterrupted one.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "ingest/decode.h"
#include "ingest/decode_pool.h"
#include "ingest/encoding.h"
#include "ingest/projection.h"
#include "ingest/sources.h"
#include "patchstore/ingest/ingest.h"
#include "patchstore/store/store.h"

#include "ingest/checks.h"

namespace patchstore {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Reusable float buffers: a fresh page costs far more to fault in than to
// fill, so decoded samples recycle their memory.
class BufferPool {
 public:
  struct Buffer {
    std::unique_ptr<float[]> data;
    size_t capacity = 0;
  };
  Buffer Acquire(size_t n) {
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
    return Buffer{std::unique_ptr<float[]>(new float[n]), n};
  }
  void Release(Buffer b) {
    if (!b.data) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.size() < 64) free_.push_back(std::move(b));
  }

 private:
  std::mutex mu_;
  std::vector<Buffer> free_;
};

struct FieldPlan {
  std::string name;
  bool is_mask = false;
  std::string norm_spec;  // "" = default for the source type
  FieldEncoding encoding = FieldEncoding::kFloat32;
  uint16_t tile = 0;  // 0: rows
};

struct DecodedField {
  BufferPool::Buffer buffer;  // row-major (C,H,W) of header.dtype
  RecordHeader header;
  FieldMeta meta;
  std::string path;
};

struct DecodedSample {
  Status status;
  std::string failed_file;
  std::vector<DecodedField> fields;
  std::vector<std::string> warnings;  // the decoders' notes (DecodedImage::warnings)
  uint64_t bytes = 0;
};

Result<Normalization> ResolveNorm(const FieldPlan& plan, SourceType type) {
  const double maxval = SourceMaxValue(type);
  if (!plan.norm_spec.empty()) {
    PS_ASSIGN_OR_RETURN(Normalization n, ParseNormalization(plan.norm_spec, maxval));
    PS_RETURN_IF_ERROR(CheckNormalizationFor(n, type, plan.norm_spec));
    return n;
  }
  Normalization n;
  if (plan.is_mask) {
    n.kind = NormKind::kBinary;
  } else if (maxval > 0) {
    n.kind = NormKind::kSymmetric;
    n.scale = maxval;
  }
  return n;
}

using DecodeFn = std::function<Result<DecodedImage>(const std::string& path, const std::string& channel)>;

DecodedSample DecodeSample(const SampleSource& src, const std::vector<FieldPlan>& plans, const DecodeFn& decode,
                           BufferPool* pool) {
  DecodedSample out;
  int H = -1, W = -1;
  std::string first_path;
  for (size_t f = 0; f < plans.size(); ++f) {
    const FileRef& file = src.files[f];
    auto img = decode(file.path, file.channel);
    if (!img.ok()) {
      out.status = img.status().WithContext("sample '" + src.id + "' field '" + plans[f].name + "'");
      out.failed_file = file.path;
      return out;
    }
    for (const std::string& w : img->warnings)
      out.warnings.push_back("sample '" + src.id + "' field '" + plans[f].name + "': " + w);
    if (H < 0) {
      H = img->height();
      W = img->width();
      first_path = file.path;
    } else if (img->height() != H || img->width() != W) {
      out.status = Status::InvalidArgument("sample '" + src.id + "': fields differ in size: '" + first_path + "' is " +
                                           std::to_string(W) + "x" + std::to_string(H) + " but '" + file.path +
                                           "' is " + std::to_string(img->width()) + "x" +
                                           std::to_string(img->height()));
      out.failed_file = file.path;
      return out;
    }
    if (plans[f].is_mask && img->channels() > 1) {
      // Masks saved as RGB(A): a pixel is set where any colour channel is
      // (alpha ignored), stored as one channel.
      std::vector<cv::Mat> planes;
      cv::split(img->pixels, planes);
      cv::Mat any = planes[0].clone();
      const std::string& names = img->channel_names;
      const bool alpha_last = names.size() >= 2 && names.compare(names.size() - 2, 2, ",A") == 0;
      const int colour = alpha_last ? img->channels() - 1 : img->channels();
      for (int c = 1; c < colour; ++c) any = cv::max(any, planes[c]);
      img->pixels = any;
      img->channel_names = "Y";
    }
    auto norm = ResolveNorm(plans[f], img->source_type);
    if (!norm.ok()) {
      out.status = norm.status().WithContext("sample '" + src.id + "' field '" + plans[f].name + "' ('" + file.path +
                                             "')");
      out.failed_file = file.path;
      return out;
    }
    if (!plans[f].norm_spec.empty() && img->pixels.depth() == CV_32F && !IsIntegerSource(img->source_type)) {
      // Float sources: the transform must keep this image's own values
      // finite and apart (CheckNormalizationFor could only check the type).
      const float* px = img->pixels.ptr<float>(0);
      const size_t count = img->pixels.total() * static_cast<size_t>(img->channels());
      double lo = INFINITY, hi = -INFINITY;
      for (size_t i = 0; i < count; ++i)
        if (std::isfinite(px[i])) {
          lo = std::min(lo, static_cast<double>(px[i]));
          hi = std::max(hi, static_cast<double>(px[i]));
        }
      Status st = lo <= hi ? CheckNormalizationOn(*norm, lo, hi, false, plans[f].norm_spec,
                                                  std::string(SourceTypeName(img->source_type)) + " value of this file")
                           : Status::OK();
      if (!st.ok()) {
        out.status = st.WithContext("sample '" + src.id + "' field '" + plans[f].name + "' ('" + file.path + "')");
        out.failed_file = file.path;
        return out;
      }
    }
    DecodedField d;
    d.path = file.path;
    d.header.layout = Layout::kCHW;
    d.header.rank = 3;
    d.header.shape = {static_cast<uint64_t>(img->channels()), static_cast<uint64_t>(H), static_cast<uint64_t>(W), 0};
    d.header.norm = *norm;
    d.header.source_type = img->source_type;
    // The one decision of the record's dtype (ingest/encoding.h); the tile
    // edge is the field's layout.
    d.header.dtype = RecordDType(plans[f].encoding, img->source_type, *norm);
    d.header.tile = plans[f].tile;
    const size_t n = static_cast<size_t>(img->channels()) * H * W;
    const size_t bytes = n * DTypeSize(d.header.dtype);
    d.buffer = pool->Acquire((bytes + sizeof(float) - 1) / sizeof(float));
    ToCHW(*img, *norm, d.header.dtype, d.buffer.data.get());
    d.meta.dtype = d.header.dtype;
    d.meta.tile = d.header.tile;
    d.meta.name = plans[f].name;
    d.meta.channels = static_cast<uint32_t>(img->channels());
    d.meta.layout = Layout::kCHW;
    d.meta.source_type = img->source_type;
    d.meta.norm = *norm;
    d.meta.channel_names = img->channel_names;
    d.meta.is_mask = plans[f].is_mask;
    d.meta.source_format = img->format;
    // Masks carry no stored summed-area table (format 1 did: 20% of a frames
    // store): the writer records each mask's valid count in the sample index,
    // and the sampler computes a frame's table from the mask on its first
    // visit, reading the same number of bytes the table would have taken.
    // The payload as stored: tile padding included.
    out.bytes += d.header.tiled() ? static_cast<size_t>(d.header.grid().elements()) * DTypeSize(d.header.dtype) : bytes;
    out.fields.push_back(std::move(d));
  }
  return out;
}

}  // namespace

Result<IngestSummary> IngestImages(const ImageIngestOptions& o) {
  const auto start = Clock::now();
  // OpenCV checks declared image sizes against this before allocating (read
  // once, on its first decode; an explicit setting by the user wins).
  ::setenv("CV_IO_MAX_IMAGE_PIXELS", std::to_string(o.max_pixels).c_str(), 0);
  if (o.store.empty()) return Status::InvalidArgument("ingest: no store path given");
  if (o.threads < 0)
    return Status::InvalidArgument("ingest: threads must be 0 (all cores) or positive, got " +
                                   std::to_string(o.threads));
  if (!(o.decode_timeout_s > 0) || !std::isfinite(o.decode_timeout_s))
    return Status::InvalidArgument("ingest: the decode timeout must be a positive number of seconds, got " +
                                   std::to_string(o.decode_timeout_s));
  if (o.max_pixels == 0) return Status::InvalidArgument("ingest: max_pixels must be positive (it is 0)");
  const bool by_manifest = !o.manifest.empty();
  if (by_manifest == !o.root.empty())
    return Status::InvalidArgument("ingest: give either a manifest or a root folder with --field templates");
  SourceList list;
  if (by_manifest) {
    PS_ASSIGN_OR_RETURN(list, ReadManifest(o.manifest));
  } else {
    PS_ASSIGN_OR_RETURN(list, FindByTemplates(o.root, o.field_templates));
    if (list.samples.empty())
      return Status::NotFound("ingest: no file under '" + o.root + "' matches the template of field '" +
                              o.field_templates[0].first + "' ('" + o.field_templates[0].second + "')");
  }
  if (o.shard_count > 0 || o.shard_index > 0) {
    // Validated before the store is created.
    StoreMeta probe;
    PS_RETURN_IF_ERROR(CheckShard(&probe, o.store, o.shard_index, o.shard_count));
  }
  auto input_ordinals = InputOrdinals(list.samples, o.shard_count,
                                      [](const SampleSource& s) -> std::string_view { return s.id; });
  KeepShard(&list.samples, o.shard_index, o.shard_count,
            [](const SampleSource& s) -> std::string_view { return s.id; });
  PS_ASSIGN_OR_RETURN(const EncodingPlan encoding, ParseEncodings(o.encoding));
  PS_RETURN_IF_ERROR(CheckEncodingFields(encoding, list.fields));
  PS_ASSIGN_OR_RETURN(uint16_t tile, ParseLayout(o.layout, o.tile_size));
  std::vector<FieldPlan> plans;
  for (const std::string& f : list.fields) {
    FieldPlan p;
    p.name = f;
    p.is_mask = f == "mask" || std::find(o.mask_fields.begin(), o.mask_fields.end(), f) != o.mask_fields.end();
    auto it = o.norm.find(f);
    if (it != o.norm.end()) p.norm_spec = it->second;
    p.encoding = encoding.For(f);
    plans.push_back(p);
  }
  for (const std::string& m : o.mask_fields)
    if (std::find(list.fields.begin(), list.fields.end(), m) == list.fields.end())
      return Status::InvalidArgument("ingest: --mask names field '" + m + "', which the input does not have");
  for (const auto& [f, spec] : o.norm) {
    if (std::find(list.fields.begin(), list.fields.end(), f) == list.fields.end())
      return Status::InvalidArgument("ingest: --norm names field '" + f + "', which the input does not have");
    auto check = ParseNormalization(spec, 255.0);
    if (!check.ok()) return check.status().WithContext("ingest: --norm for field '" + f + "'");
  }

  // The report's folder is checked before the store is touched (the default
  // one lives in the store, which Writer::Open creates).
  const std::string report_path = o.report_path.empty() ? o.store + "/ingest-errors.tsv" : o.report_path;
  if (o.skip_errors && !o.report_path.empty()) PS_RETURN_IF_ERROR(CheckReportPath(report_path));
  WriterOptions wo;
  wo.kind = "frames";
  wo.durable = o.durable;
  PS_ASSIGN_OR_RETURN(auto writer, Writer::Open(o.store, wo));
  PS_RETURN_IF_ERROR(CheckShard(&writer->mutable_meta(), o.store, o.shard_index, o.shard_count));
  if (!o.command_line.empty()) writer->mutable_meta().attributes["ingest_command"] = o.command_line;
  // A resumed ingest must normalise as the first one did.
  for (const FieldPlan& p : plans)
    PS_RETURN_IF_ERROR(CheckResumeSetting(&writer->mutable_meta(), o.store, "norm." + p.name,
                                          p.norm_spec.empty() ? "default" : p.norm_spec,
                                          "--norm of field '" + p.name + "'"));
  if (o.skip_errors) PS_RETURN_IF_ERROR(CheckReportPath(report_path));
  // ... and store its records in the same dtypes and layout; `--layout
  // tiles` without --tile-size keeps the resumed store's tile edge.
  if (tile != 0 && o.tile_size == 0 && StoredTile(writer->meta()) != 0) tile = StoredTile(writer->meta());
  PS_RETURN_IF_ERROR(CheckResumeEncoding(writer->meta(), o.store, encoding, tile));
  for (FieldPlan& p : plans) p.tile = tile;

  if (!writer->meta().fields.empty()) {
    // The store's field set is fixed by its first ingest: a renamed or
    // missing field would leave samples without records.
    std::vector<std::string> have, want = list.fields;
    for (const FieldMeta& f : writer->meta().fields) have.push_back(f.name);
    std::vector<std::string> a = have, b = want;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a != b) {
      auto join = [](const std::vector<std::string>& v) {
        std::string s;
        for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
        return s;
      };
      return Status::InvalidArgument("ingest into '" + o.store + "': the store holds the fields " + join(have) +
                                     " but this input gives " + join(want) +
                                     "; every ingest into a store must give the same fields (use a new store)");
    }
  }
  IngestSummary summary;
  summary.samples_total = list.samples.size();
  std::vector<const SampleSource*> todo;
  for (const SampleSource& s : list.samples) {
    if (writer->Contains(s.id)) ++summary.samples_present;
    else todo.push_back(&s);
  }

  const int threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  const size_t window = static_cast<size_t>(threads) * 2 + 2;  // decoded samples in flight
  BufferPool pool;
  std::mutex mu;
  std::condition_variable cv_done, cv_room;
  std::map<size_t, DecodedSample> ready;
  std::atomic<size_t> next{0};
  size_t consumed = 0;  // guarded by mu
  std::atomic<bool> stop{false};

  const size_t nthreads = std::min<size_t>(static_cast<size_t>(threads), std::max<size_t>(todo.size(), 1));
  std::unique_ptr<DecodePool> decoders;
  if (o.isolate_decoders && !todo.empty()) {
    DecodePoolOptions po;
    po.slots = static_cast<int>(nthreads);
    po.max_pixels = o.max_pixels;
    po.timeout_s = o.decode_timeout_s;
    PS_ASSIGN_OR_RETURN(decoders, DecodePool::Start(po));
  }
  auto worker = [&](int slot) {
    DecodeFn decode = [&](const std::string& path, const std::string& channel) -> Result<DecodedImage> {
      if (decoders) return decoders->Decode(slot, path, channel);
      // No time limit in this process: a FIFO would block it forever.
      PS_RETURN_IF_ERROR(CheckRegularInput(path, "image"));
      return DecodeFile(path, channel, o.max_pixels);
    };
    for (;;) {
      size_t pos;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv_room.wait(lock, [&] { return stop.load() || next.load() < consumed + window; });
        if (stop.load()) return;
        pos = next.fetch_add(1);
      }
      if (pos >= todo.size()) return;
      DecodedSample d = DecodeSample(*todo[pos], plans, decode, &pool);
      {
        std::lock_guard<std::mutex> lock(mu);
        ready.emplace(pos, std::move(d));
      }
      cv_done.notify_all();
    }
  };
  std::vector<std::thread> pool_threads;
  for (size_t t = 0; t < nthreads && !todo.empty(); ++t) pool_threads.emplace_back(worker, static_cast<int>(t));

  FILE* report = nullptr;
  bool report_failed = false;
  std::vector<SampleInput> batch;
  std::vector<DecodedSample> batch_data;
  uint64_t batch_bytes = 0;
  Status failure;
  bool projected = false;  // the store's projected size was reported

  auto flush = [&]() -> Status {
    if (batch.empty()) return Status::OK();
    Status st = writer->WriteBatch(batch);
    if (st.ok()) {
      summary.samples_written += batch.size();
      summary.bytes_written += batch_bytes;
    }
    for (DecodedSample& d : batch_data)
      for (DecodedField& f : d.fields) pool.Release(std::move(f.buffer));
    batch.clear();
    batch_data.clear();
    batch_bytes = 0;
    return st;
  };
  auto report_progress = [&] {
    if (!o.progress) return;
    Progress p;
    p.total = todo.size();
    p.done = consumed;
    p.failed = summary.samples_failed;
    p.skipped = summary.samples_present;
    p.bytes = summary.bytes_decoded;
    p.seconds = Seconds(start);
    o.progress(p);
  };

  for (size_t pos = 0; pos < todo.size(); ++pos) {
    if (o.cancelled && o.cancelled()) {
      failure = Status::Aborted("cancelled");
      break;
    }
    DecodedSample d;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv_done.wait(lock, [&] { return ready.count(pos) != 0; });
      d = std::move(ready[pos]);
      ready.erase(pos);
    }
    const SampleSource& src = *todo[pos];
    // Register the fields (first sample) or check them against the store.
    if (d.status.ok()) {
      for (DecodedField& f : d.fields) {
        auto idx = writer->EnsureField(f.meta);
        if (!idx.ok()) {
          const int have = writer->meta().FieldIndex(f.meta.name);
          if (have >= 0 && writer->meta().fields[have].dtype != f.meta.dtype) {
            // Compact fields take the dtype of their first sample's source;
            // a later file of another bit depth cannot be held exactly.
            const FieldMeta& fm = writer->meta().fields[have];
            d.status = Status::InvalidArgument(
                "sample '" + src.id + "' ('" + f.path + "'): field '" + fm.name + "' is stored as " +
                DTypeName(fm.dtype) + " (--encoding " + FieldEncodingName(encoding.For(fm.name)) + ", " +
                SourceTypeName(fm.source_type) + " sources) but this file is " + SourceTypeName(f.meta.source_type) +
                ", which needs " + DTypeName(f.meta.dtype) + "; give the field one bit depth, or --encoding " +
                fm.name + "=float32");
          } else {
            d.status = idx.status().WithContext("sample '" + src.id + "' ('" + f.path + "')");
          }
          d.failed_file = f.path;
          break;
        }
      }
    }
    if (!d.status.ok()) {
      for (DecodedField& f : d.fields) pool.Release(std::move(f.buffer));
      if (!o.skip_errors) {
        failure = d.status;
        break;
      }
      ++summary.samples_failed;
      if (summary.errors.size() < 100) summary.errors.push_back(d.status.message());
      if (!report && !report_failed) {
        report = std::fopen(report_path.c_str(), "a");
        if (report) summary.report_path = report_path;
        else summary.report_error = "writing '" + report_path + "': " + std::strerror(errno);
        report_failed = report == nullptr;
      }
      if (report) {
        std::string msg = d.status.message();
        std::replace(msg.begin(), msg.end(), '\t', ' ');
        std::replace(msg.begin(), msg.end(), '\n', ' ');
        std::fprintf(report, "%s\t%s\t%s\n", src.id.c_str(), d.failed_file.c_str(), msg.c_str());
        if (std::fflush(report) != 0) {
          summary.report_error = "writing '" + report_path + "': " + std::strerror(errno);
          summary.report_path.clear();
        }
      }
    } else {
      if (!projected) {
        // Before the first write: the store's size, from this sample's
        // records times the samples of the input (ingest/projection.h).
        projected = true;
        std::vector<ProjectedRecord> records;
        for (const DecodedField& f : d.fields) {
          ProjectedRecord r;
          r.field = f.meta.name;
          r.header = f.header;
          r.is_mask = f.meta.is_mask;
          r.mask_blocks = writer->meta().fields[writer->meta().FieldIndex(f.meta.name)].mask_blocks;
          records.push_back(std::move(r));
        }
        StoreProjector projector("ingest", /*frames=*/true);
        projector.Add(records, summary.samples_total, src.id.size());
        const StoreProjection proj = projector.Finish();
        summary.projected_bytes = proj.bytes;
        summary.ram_bytes = proj.ram_bytes;
        summary.advice = proj.advice;
        if (o.progress) {
          Progress p;
          p.total = todo.size();
          p.skipped = summary.samples_present;
          p.seconds = Seconds(start);
          p.message = proj.message;
          o.progress(p);
        }
      }
      SampleInput in;
      in.id = src.id;
      for (DecodedField& f : d.fields) {
        RecordInput r;
        r.field = static_cast<uint16_t>(writer->meta().FieldIndex(f.meta.name));
        r.header = f.header;
        if (f.header.tiled()) {
          // Tiles are cut straight into the record LMDB reserves.
          const void* rows = f.buffer.data.get();
          const size_t es = DTypeSize(f.header.dtype);
          const TileGrid grid = f.header.grid();
          r.fill = [rows, es, grid](void* dst) {
            TileCHW(rows, es, grid, dst);
            return Status::OK();
          };
        } else {
          r.data = f.buffer.data.get();
        }
        in.records.push_back(std::move(r));
      }
      for (std::string& w : d.warnings)
        if (summary.warnings.size() < 100) summary.warnings.push_back(std::move(w));
      summary.bytes_decoded += d.bytes;
      batch_bytes += d.bytes;
      batch.push_back(std::move(in));
      batch_data.push_back(std::move(d));
    }
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
    report_progress();
  }
  // Commit what was decoded before a failure: those samples are complete.
  Status st = flush();
  if (failure.ok() && !st.ok()) failure = st;
  stop.store(true);
  cv_room.notify_all();
  for (auto& t : pool_threads) t.join();
  if (report && std::fclose(report) != 0 && summary.report_error.empty()) {
    summary.report_error = "writing '" + report_path + "': " + std::strerror(errno);
    summary.report_path.clear();
  }
  report_progress();
  summary.seconds = Seconds(start);
  if (!failure.ok())
    return failure.WithContext("ingest into '" + o.store + "' stopped after " +
                               std::to_string(summary.samples_written) + " new samples");
  if (summary.samples_failed == 0 && !writer->meta().sealed) {
    PS_RETURN_IF_ERROR(writer->Seal(OrdinalLookup(input_ordinals)));
  } else if (summary.samples_failed == 0 && summary.samples_written == 0) {
    // Nothing to do: already complete and sealed.
  }
  return summary;
}

}  // namespace patchstore
