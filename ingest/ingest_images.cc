// Image ingest: the images source of the ingest driver (ingest/driver.h).
// What is specific to images lives here: finding the samples (manifest or
// path templates), decoding each field (in isolated children with
// --isolate-decoders), masks saved as colour images, and the normalisation
// and record dtype of every field.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>

#include "ingest/checks.h"
#include "ingest/decode.h"
#include "ingest/decode_pool.h"
#include "ingest/driver.h"
#include "ingest/encoding.h"
#include "ingest/sources.h"
#include "patchstore/ingest/ingest.h"
#include "patchstore/store/store.h"

namespace patchstore {
namespace {

struct FieldPlan {
  std::string name;
  bool is_mask = false;
  std::string norm_spec;  // "" = default for the source type
  FieldEncoding encoding = FieldEncoding::kFloat32;
  uint16_t tile = 0;  // 0: rows
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

DecodedUnit DecodeSample(const SampleSource& src, const std::vector<FieldPlan>& plans, const DecodeFn& decode,
                         BufferPool* pool) {
  DecodedUnit out;
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
    const bool float64 = img->pixels.depth() == CV_64F;
    if ((!plans[f].norm_spec.empty() && img->pixels.depth() == CV_32F && !IsIntegerSource(img->source_type)) ||
        float64) {
      // Float sources: the transform must keep this image's own values
      // finite and apart (CheckNormalizationFor could only check the type);
      // float64 values beyond float32 with no normalisation are noted.
      ValueCheck check("'" + file.path + "'", "file", img->source_type, *norm, plans[f].norm_spec);
      const uint64_t count = img->pixels.total() * static_cast<uint64_t>(img->channels());
      Status st = float64 ? check.Add(img->pixels.ptr<double>(0), count) : check.Add(img->pixels.ptr<float>(0), count);
      for (const std::string& w : check.Finish())
        out.warnings.push_back("sample '" + src.id + "' field '" + plans[f].name + "': " + w);
      if (!st.ok()) {
        out.status = st.WithContext("sample '" + src.id + "' field '" + plans[f].name + "' ('" + file.path + "')");
        out.failed_file = file.path;
        return out;
      }
    }
    UnitField d;
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
    d.buffer = pool->Acquire(bytes);
    if (!d.buffer.data) {
      out.status = Status::IOError("sample '" + src.id + "' field '" + plans[f].name +
                                   "': out of memory for its record");
      out.failed_file = file.path;
      return out;
    }
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

class ImageSource : public IngestSource {
 public:
  ImageSource(const ImageIngestOptions& o, SourceList list, std::vector<FieldPlan> plans, EncodingPlan encoding,
              uint16_t tile)
      : o_(o), list_(std::move(list)), plans_(std::move(plans)), encoding_(std::move(encoding)), tile_(tile) {}

  Status Prepare(StoreMeta* meta) override {
    // A resumed ingest must normalise as the first one did ...
    for (const FieldPlan& p : plans_)
      PS_RETURN_IF_ERROR(CheckResumeSetting(meta, o_.store, "norm." + p.name,
                                            p.norm_spec.empty() ? "default" : p.norm_spec,
                                            "--norm of field '" + p.name + "'"));
    // ... and store its records in the same dtypes and layout; `--layout
    // tiles` without --tile-size keeps the resumed store's tile edge.
    if (tile_ != 0 && o_.tile_size == 0 && StoredTile(*meta) != 0) tile_ = StoredTile(*meta);
    PS_RETURN_IF_ERROR(CheckResumeEncoding(*meta, o_.store, encoding_, tile_));
    for (FieldPlan& p : plans_) p.tile = tile_;
    if (meta->fields.empty()) return Status::OK();
    // The store's field set is fixed by its first ingest: a renamed or
    // missing field would leave samples without records.
    std::vector<std::string> have, want = list_.fields;
    for (const FieldMeta& f : meta->fields) have.push_back(f.name);
    std::vector<std::string> a = have, b = want;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a == b) return Status::OK();
    auto join = [](const std::vector<std::string>& v) {
      std::string s;
      for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
      return s;
    };
    return Status::InvalidArgument("ingest into '" + o_.store + "': the store holds the fields " + join(have) +
                                   " but this input gives " + join(want) +
                                   "; every ingest into a store must give the same fields (use a new store)");
  }

  Status Start(int slots) override {
    if (!o_.isolate_decoders) return Status::OK();
    DecodePoolOptions po;
    po.slots = slots;
    po.max_pixels = o_.max_pixels;
    po.timeout_s = o_.decode_timeout_s;
    PS_ASSIGN_OR_RETURN(decoders_, DecodePool::Start(po));
    return Status::OK();
  }

  DecodedUnit Decode(size_t index, int slot, BufferPool* buffers) override {
    DecodeFn decode = [&](const std::string& path, const std::string& channel) -> Result<DecodedImage> {
      if (decoders_) return decoders_->Decode(slot, path, channel);
      // No time limit in this process: a FIFO would block it forever.
      PS_RETURN_IF_ERROR(CheckRegularInput(path, "image"));
      return DecodeFile(path, channel, o_.max_pixels);
    };
    return DecodeSample(list_.samples[index], plans_, decode, buffers);
  }

  Status FieldRefused(const IngestUnit& unit, const UnitField& field, const Status& why,
                      const StoreMeta& meta) const override {
    Status clash = RefusedDType("sample", "bit depth", unit.id, field, meta,
                                FieldEncodingName(encoding_.For(field.meta.name)));
    return clash.ok() ? IngestSource::FieldRefused(unit, field, why, meta) : clash;
  }

 private:
  const ImageIngestOptions& o_;
  SourceList list_;
  std::vector<FieldPlan> plans_;
  EncodingPlan encoding_;
  uint16_t tile_;
  std::unique_ptr<DecodePool> decoders_;
};

}  // namespace

Result<IngestSummary> IngestImages(const ImageIngestOptions& o) {
  DriverOptions d;
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
  d.store = o.store;
  d.warnings = list.warnings;
  d.shard_index = o.shard_index;
  d.shard_count = o.shard_count;
  PS_RETURN_IF_ERROR(CheckShardOption(d));  // before the store is created
  PS_ASSIGN_OR_RETURN(EncodingPlan encoding, ParseEncodings(o.encoding));
  PS_RETURN_IF_ERROR(CheckEncodingFields(encoding, list.fields));
  PS_ASSIGN_OR_RETURN(const uint16_t tile, ParseLayout(o.layout, o.tile_size));
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
  std::vector<IngestUnit> units;
  for (const SampleSource& s : list.samples) {
    IngestUnit u;
    u.id = s.id;
    units.push_back(std::move(u));
  }

  d.writer.kind = "frames";
  d.writer.durable = o.durable;
  d.command_line = o.command_line;
  d.threads = o.threads;
  d.batch_bytes = o.batch_bytes;
  d.batch_samples = o.batch_samples;
  d.skip_errors = o.skip_errors;
  d.report_path = o.report_path;
  d.frames = true;
  d.noun = "samples";
  d.progress = o.progress;
  d.cancelled = o.cancelled;
  ImageSource source(o, std::move(list), std::move(plans), std::move(encoding), tile);
  return RunIngest(d, std::move(units), &source);
}

}  // namespace patchstore
