// Medical volumes through ITK (patchstore/ingest/ingest_volumes.h): the ITK
// source of the ingest driver (ingest/driver.h). What is specific to ITK
// volumes lives here: the options (slice axis, --orient, --spacing,
// interpolation), asking the isolated ITK child (DecodePool running the ITK
// job) for each field, and the geometry: which image axis is the slice
// axis, the stored direction and spacing, and that every field lies on the
// first one's grid. The voxel conversion is volume_convert.h (also HDF5's).
#include <algorithm>
#include <array>
#include <cmath>
#include <memory>

#include "ingest/checks.h"
#include "ingest/decode_pool.h"
#include "ingest/driver.h"
#include "ingest/encoding.h"
#include "ingest/sources.h"
#include "ingest/volume_convert.h"
#include "ingest/volume_decode.h"
#include "patchstore/ingest/ingest_volumes.h"
#include "patchstore/store/store.h"

namespace patchstore {
namespace {

struct FieldPlan {
  std::string name;
  bool is_mask = false;
  bool nearest = false;
  std::string norm_spec;  // "" = default
  FieldEncoding encoding = FieldEncoding::kFloat32;
};

// The image axis (0 = i, 1 = j, 2 = k) closest to LPS axis `row` (0 L-R,
// 1 A-P, 2 S-I); "" or why it cannot be told.
int ClosestAxis(const std::array<double, 9>& d, int row, std::string* why) {
  int best = 0;
  for (int c = 1; c < 3; ++c)
    if (std::fabs(d[row * 3 + c]) > std::fabs(d[row * 3 + best])) best = c;
  for (int c = 0; c < 3; ++c)
    if (c != best && std::fabs(std::fabs(d[row * 3 + c]) - std::fabs(d[row * 3 + best])) < 1e-3) {
      *why = "image axes " + std::to_string(std::min(c, best)) + " and " + std::to_string(std::max(c, best)) +
             " are equally close to it (an oblique volume at 45 degrees; reorient it with --orient)";
      return -1;
    }
  return best;
}

class VolumeSource : public IngestSource {
 public:
  explicit VolumeSource(const VolumeIngestOptions& o) : o_(o) {}
  // Checks the options and lists the volumes.
  Status ParseOptions();
  const SourceList& list() const { return list_; }

  Status Prepare(StoreMeta* meta) override;
  Status Start(int slots) override;
  DecodedUnit Decode(size_t index, int slot, BufferPool* buffers) override;
  Status FieldRefused(const IngestUnit& unit, const UnitField& field, const Status& why,
                      const StoreMeta& meta) const override {
    Status clash = RefusedDType("volume", "voxel type", unit.id, field, meta,
                                FieldEncodingName(encoding_.For(field.meta.name)));
    return clash.ok() ? why.WithContext("volume '" + unit.id + "' ('" + field.path + "')") : clash;
  }

 private:
  const VolumeIngestOptions& o_;
  int anatomical_row_ = 2;  // LPS row of the slice direction
  EncodingPlan encoding_;
  SourceList list_;
  std::vector<FieldPlan> plans_;
  std::unique_ptr<DecodePool> pool_;
};

Status VolumeSource::ParseOptions() {
  if (o_.store.empty()) return Status::InvalidArgument("ingest: no store path given");
  if (o_.threads < 0)
    return Status::InvalidArgument("ingest: threads must be 0 (all cores) or positive, got " +
                                   std::to_string(o_.threads));
  if (!(o_.decode_timeout_s > 0) || !std::isfinite(o_.decode_timeout_s))
    return Status::InvalidArgument("ingest: the decode timeout must be a positive number of seconds");
  if (o_.max_voxels == 0) return Status::InvalidArgument("ingest: max_voxels must be positive");
  if (o_.batch_bytes == 0) return Status::InvalidArgument("ingest: batch_bytes must be positive");
  if (o_.slice_axis == "sagittal") anatomical_row_ = 0;
  else if (o_.slice_axis == "coronal") anatomical_row_ = 1;
  else if (o_.slice_axis == "axial") anatomical_row_ = 2;
  else
    return Status::InvalidArgument("ingest volumes: --slice-axis must be axial, coronal or sagittal, got '" +
                                   o_.slice_axis + "'");
  if (!o_.orient.empty()) {
    const std::string pairs[3] = {"LR", "AP", "SI"};
    bool seen[3] = {false, false, false}, ok = o_.orient.size() == 3;
    for (size_t i = 0; ok && i < 3; ++i) {
      int which = -1;
      for (int p = 0; p < 3; ++p)
        if (pairs[p].find(o_.orient[i]) != std::string::npos) which = p;
      ok = which >= 0 && !seen[which];
      if (ok) seen[which] = true;
    }
    if (!ok)
      return Status::InvalidArgument("ingest volumes: --orient takes three letters, one of each pair R/L, A/P, S/I "
                                     "(e.g. RAS or LPS), got '" +
                                     o_.orient + "'");
  }
  if (!o_.spacing.empty()) {
    bool ok = o_.spacing.size() == 3;
    for (double s : o_.spacing) ok = ok && std::isfinite(s) && s > 0;
    if (!ok) return Status::InvalidArgument("ingest volumes: --spacing takes three positive numbers X,Y,Z (mm)");
  }
  if (o_.volume_index < -1) return Status::InvalidArgument("ingest volumes: --volume-index must be 0 or more");
  if (o_.shard_count > 0 || o_.shard_index > 0) {
    StoreMeta probe;
    PS_RETURN_IF_ERROR(CheckShard(&probe, o_.store, o_.shard_index, o_.shard_count));
  }
  const bool by_manifest = !o_.manifest.empty();
  if (by_manifest == !o_.root.empty())
    return Status::InvalidArgument("ingest: give either a manifest or a root folder with --field templates");
  if (by_manifest) {
    PS_ASSIGN_OR_RETURN(list_, ReadManifest(o_.manifest));
  } else {
    PS_ASSIGN_OR_RETURN(list_, FindByTemplates(o_.root, o_.field_templates, /*match_folders=*/true));
    if (list_.samples.empty())
      return Status::NotFound("ingest: nothing under '" + o_.root + "' matches the template of field '" +
                              o_.field_templates[0].first + "' ('" + o_.field_templates[0].second + "')");
  }
  for (const SampleSource& s : list_.samples)
    for (size_t f = 0; f < s.files.size(); ++f)
      if (!s.files[f].channel.empty())
        return Status::InvalidArgument("ingest volumes: field '" + list_.fields[f] +
                                       "' names a channel (':" + s.files[f].channel + "'), which volumes do not have");
  auto has_field = [&](const std::string& f) {
    return std::find(list_.fields.begin(), list_.fields.end(), f) != list_.fields.end();
  };
  for (const std::string& m : o_.mask_fields)
    if (!has_field(m))
      return Status::InvalidArgument("ingest: --mask names field '" + m + "', which the input does not have");
  for (const auto& [f, spec] : o_.norm) {
    if (!has_field(f))
      return Status::InvalidArgument("ingest: --norm names field '" + f + "', which the input does not have");
    auto check = ParseNormalization(spec, 255.0);
    if (!check.ok()) return check.status().WithContext("ingest: --norm for field '" + f + "'");
  }
  for (const auto& [f, how] : o_.interpolation) {
    if (!has_field(f))
      return Status::InvalidArgument("ingest volumes: --interpolation names field '" + f +
                                     "', which the input does not have");
    if (how != "nearest" && how != "linear")
      return Status::InvalidArgument("ingest volumes: --interpolation " + f + "=" + how +
                                     ": must be nearest or linear");
  }
  PS_ASSIGN_OR_RETURN(encoding_, ParseEncodings(o_.encoding));
  PS_RETURN_IF_ERROR(CheckEncodingFields(encoding_, list_.fields));
  for (const std::string& f : list_.fields) {
    FieldPlan p;
    p.name = f;
    p.is_mask = std::find(o_.mask_fields.begin(), o_.mask_fields.end(), f) != o_.mask_fields.end();
    auto it = o_.interpolation.find(f);
    p.nearest = it != o_.interpolation.end() ? it->second == "nearest" : p.is_mask;
    auto n = o_.norm.find(f);
    if (n != o_.norm.end()) p.norm_spec = n->second;
    p.encoding = encoding_.For(f);
    plans_.push_back(p);
  }
  return Status::OK();
}

DecodedUnit VolumeSource::Decode(size_t index, int slot, BufferPool* buffers) {
  const SampleSource& src = list_.samples[index];
  DecodedUnit out;
  VolumeGrid grid0;
  std::array<int, 3> axes{};  // image axes of S, H, W
  std::array<uint64_t, 3> shw{};
  for (size_t f = 0; f < plans_.size(); ++f) {
    const FieldPlan& plan = plans_[f];
    const std::string& path = src.files[f].path;
    const std::string what = "volume '" + src.id + "' field '" + plan.name + "'";
    auto fail = [&](Status st) {
      out.status = std::move(st);
      out.failed_file = path;
      return std::move(out);
    };
    VolumeRequest req;
    req.path = path;
    req.series = o_.series;
    req.volume_index = o_.volume_index;
    req.orient = o_.orient;
    req.nearest = plan.nearest;
    req.max_voxels = o_.max_voxels;
    if (!o_.spacing.empty()) {
      if (f == 0) {
        req.resample = true;
        req.spacing = {o_.spacing[0], o_.spacing[1], o_.spacing[2]};
      } else {
        req.to_reference = true;
        req.reference = grid0;
      }
    }
    auto raw = pool_->Call(slot, EncodeVolumeRequest(req), path);
    if (!raw.ok()) return fail(raw.status().WithContext(what));
    auto reply = DecodeVolumeReply(*raw);
    if (!reply.ok()) return fail(reply.status().WithContext(what));
    if (!reply->status.ok()) return fail(reply->status.WithContext(what));
    for (const std::string& w : reply->warnings) out.warnings.push_back(what + ": " + w);
    const VolumeGrid& g = reply->grid;
    if (f == 0) {
      grid0 = g;
      std::string why;
      const int s = ClosestAxis(g.direction, anatomical_row_, &why);
      if (s < 0)
        return fail(
            Status::InvalidArgument(what + " ('" + path + "'): cannot tell its " + o_.slice_axis + " axis: " + why));
      // H, W: the two other axes in array order (k, j, i: slowest first).
      int k = 0;
      axes[0] = s;
      for (int a = 2; a >= 0; --a)
        if (a != s) axes[1 + k++] = a;
      for (int i = 0; i < 3; ++i) shw[i] = g.size[axes[i]];
      VolumeGeometry& geo = out.geometry.emplace();
      // The stored image's axes x, y, z are W, H, S.
      const int xyz[3] = {axes[2], axes[1], axes[0]};
      for (int c = 0; c < 3; ++c) {
        geo.spacing[c] = g.spacing[xyz[c]];
        for (int r = 0; r < 3; ++r) geo.direction[r * 3 + c] = g.direction[r * 3 + xyz[c]];
      }
      geo.origin = g.origin;
      geo.qform_code = static_cast<int16_t>(reply->qform_code);
      geo.sform_code = static_cast<int16_t>(reply->sform_code);
      geo.flags = reply->flags;
      geo.source_spacing = reply->source.spacing;
      geo.source_size = reply->source.size;
      Status gs = CheckVolumeGeometry(geo);
      if (!gs.ok()) return fail(gs.WithContext(what + " ('" + path + "')"));
    } else {
      const std::string diff = GridDifference(grid0, g);
      if (!diff.empty())
        return fail(Status::InvalidArgument("volume '" + src.id + "': field '" + plan.name + "' ('" + path +
                                            "') is on another grid than field '" + plans_[0].name + "' ('" +
                                            src.files[0].path + "'): " + diff +
                                            "; resample every field onto one grid with --spacing X,Y,Z"));
    }
    const SourceType source = VoxelSource(reply->type);
    auto norm = ResolveVolumeNorm(plan.norm_spec, plan.is_mask, source, SourceTypeName(source), plan.name,
                                  what + ": reading '" + path + "'");
    if (!norm.ok()) return fail(norm.status());
    UnitField d;
    d.path = path;
    d.header.layout = Layout::kSHW;
    d.header.rank = 3;
    d.header.shape = {shw[0], shw[1], shw[2], 0};
    d.header.norm = *norm;
    d.header.source_type = source;
    d.header.dtype = RecordDType(plan.encoding, source, *norm);
    const uint64_t n = shw[0] * shw[1] * shw[2];
    const uint64_t bytes = n * DTypeSize(d.header.dtype);
    if (reply->bytes != n * VoxelSize(reply->type) || reply->bytes > pool_->shared_size(slot))
      return fail(Status::Internal(what + ": the decoder returned an impossible size"));
    d.buffer = buffers->Acquire(bytes);
    if (!d.buffer.data) return fail(Status::IOError(what + ": out of memory for its record"));
    void* data = d.buffer.data.get();
    const std::array<int64_t, 3> stride_ijk{1, static_cast<int64_t>(g.size[0]),
                                            static_cast<int64_t>(g.size[0] * g.size[1])};
    const std::array<int64_t, 3> strides{stride_ijk[axes[0]], stride_ijk[axes[1]], stride_ijk[axes[2]]};
    const std::array<int64_t, 3> dims{static_cast<int64_t>(shw[0]), static_cast<int64_t>(shw[1]),
                                      static_cast<int64_t>(shw[2])};
    // The same checks as HDF5 datasets (ValueCheck, checks.h): 32-bit integers
    // above 2^24 and float64 values beyond float32 are noted, a --norm that
    // overflows on this volume's values is refused.
    ValueCheck check(what + " ('" + path + "')", "volume", source, *norm, plan.norm_spec);
    auto convert = [&](auto type) {
      return CheckAndConvertSlab<decltype(type)>(&check, pool_->shared(slot), dims[0], dims[1], dims[2], strides[0],
                                                 strides[1], strides[2], *norm, d.header.dtype, data);
    };
    Status cst;
    switch (reply->type) {
      case VoxelType::kUInt8: cst = convert(uint8_t{}); break;
      case VoxelType::kInt8: cst = convert(int8_t{}); break;
      case VoxelType::kUInt16: cst = convert(uint16_t{}); break;
      case VoxelType::kInt16: cst = convert(int16_t{}); break;
      case VoxelType::kUInt32: cst = convert(uint32_t{}); break;
      case VoxelType::kInt32: cst = convert(int32_t{}); break;
      case VoxelType::kInt64: cst = convert(int64_t{}); break;
      case VoxelType::kUInt64: cst = convert(uint64_t{}); break;
      case VoxelType::kFloat32: cst = convert(float{}); break;
      case VoxelType::kFloat64: cst = convert(double{}); break;
    }
    if (!cst.ok()) return fail(cst.WithContext(what + ": reading '" + path + "'"));
    for (std::string& w : check.Finish()) out.warnings.push_back(std::move(w));
    if (plan.is_mask) {
      RecordHeader h = d.header;
      h.payload_bytes = bytes;
      if (AllZeroAfterNorm(h, data))
        out.warnings.push_back(what + " ('" + path + "') is all zero: an empty mask (require= finds nothing in it)");
    }
    d.meta.name = plan.name;
    d.meta.channels = 1;
    d.meta.layout = Layout::kSHW;
    d.meta.source_type = source;
    d.meta.norm = *norm;
    d.meta.dtype = d.header.dtype;
    d.meta.is_mask = plan.is_mask;
    d.meta.source_format = reply->format;
    out.bytes += bytes;
    out.fields.push_back(std::move(d));
  }
  return out;
}

Status VolumeSource::Prepare(StoreMeta* meta) {
  if (!meta->fields.empty()) {
    std::string have, want;
    for (const FieldMeta& f : meta->fields) have += (have.empty() ? "" : ",") + f.name;
    for (const std::string& f : list_.fields) want += (want.empty() ? "" : ",") + f;
    if (have != want)
      return Status::InvalidArgument("ingest into '" + o_.store + "': the store has fields " + have +
                                     " but this ingest gives " + want +
                                     " (the same --field options in the same order)");
  }
  // A resumed ingest must shape every record as the first one did.
  auto spacing_text = [&] {
    if (o_.spacing.empty()) return std::string("none");
    return FormatTriple({o_.spacing[0], o_.spacing[1], o_.spacing[2]});
  };
  PS_RETURN_IF_ERROR(CheckResumeSetting(meta, o_.store, "volume.slice_axis", o_.slice_axis, "--slice-axis"));
  PS_RETURN_IF_ERROR(
      CheckResumeSetting(meta, o_.store, "volume.orient", o_.orient.empty() ? "none" : o_.orient, "--orient"));
  PS_RETURN_IF_ERROR(CheckResumeSetting(meta, o_.store, "volume.spacing", spacing_text(), "--spacing"));
  for (const FieldPlan& p : plans_) {
    PS_RETURN_IF_ERROR(CheckResumeSetting(meta, o_.store, "norm." + p.name,
                                          !p.norm_spec.empty() ? p.norm_spec
                                          : p.is_mask          ? "default (mask: binary)"
                                                               : "default",
                                          "--norm of field '" + p.name + "'"));
    if (!o_.spacing.empty())
      PS_RETURN_IF_ERROR(CheckResumeSetting(meta, o_.store, "volume.interpolation." + p.name,
                                            p.nearest ? "nearest" : "linear",
                                            "--interpolation of field '" + p.name + "'"));
  }
  PS_RETURN_IF_ERROR(CheckResumeEncoding(*meta, o_.store, encoding_, 0));
  meta->attributes["source_format"] = "itk";
  return Status::OK();
}

Status VolumeSource::Start(int slots) {
  DecodePoolOptions po;
  po.slots = slots;
  po.timeout_s = o_.decode_timeout_s;
  po.job = ItkVolumeDecoder();
  po.shared_bytes = o_.max_voxels * 8;
  po.memory_limit = o_.decode_memory_bytes ? o_.decode_memory_bytes : uint64_t{8} << 30;
  PS_ASSIGN_OR_RETURN(pool_, DecodePool::Start(po));
  return Status::OK();
}

}  // namespace

bool VolumeIngestAvailable() { return ItkVolumeDecoder() != nullptr; }

Result<IngestSummary> IngestVolumes(const VolumeIngestOptions& o) {
  DriverOptions d;
  if (ItkVolumeDecoder() == nullptr)
    return Status::Unsupported("ingest volumes: this patchstore was built without ITK, which reads NIfTI, MetaImage, "
                               "NRRD and DICOM (install libinsighttoolkit5-dev and build again)");
  d.store = o.store;
  d.shard_index = o.shard_index;
  d.shard_count = o.shard_count;
  VolumeSource source(o);
  PS_RETURN_IF_ERROR(source.ParseOptions());
  d.warnings = source.list().warnings;
  std::vector<IngestUnit> units;
  for (const SampleSource& s : source.list().samples) {
    IngestUnit u;
    u.id = s.id;
    units.push_back(std::move(u));
  }
  d.writer.kind = "volumes";
  d.writer.durable = o.durable;
  d.command_line = o.command_line;
  d.threads = o.threads;
  d.window_per_thread = 1;  // decoded volumes in flight: they are large
  d.window_extra = 1;
  d.keep_buffers = 0;
  d.batch_bytes = o.batch_bytes;
  d.batch_samples = 256;
  d.skip_errors = o.skip_errors;
  d.report_path = o.report_path;
  d.frames = false;
  d.noun = "volumes";
  d.progress = o.progress;
  d.cancelled = o.cancelled;
  return RunIngest(d, std::move(units), &source);
}

}  // namespace patchstore
