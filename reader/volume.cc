#include "patchstore/reader/volume.h"

#include "reader/parallel.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>

#include "patchstore/reader/transform.h"

namespace patchstore {
namespace {

// A volume record in the map, of any dtype (compact volumes: uint16/int16
// raw source values, converted with the field's table by CopyStack).
struct VolumeRef {
  const uint8_t* data = nullptr;
  DType dtype = DType::kFloat32;
  const ValueTable* lut = nullptr;
  int64_t S = 0, H = 0, W = 0;
  size_t es() const { return DTypeSize(dtype); }
};

// Volume() without its whole-record read-ahead (slice reads ask for their
// slices only: PrefetchStack).
Result<TensorView> VolumeView(const Reader& reader, uint64_t sample, int field) {
  PS_ASSIGN_OR_RETURN(RecordHeader h, reader.Header(sample, field));
  if (h.layout != Layout::kSHW || h.rank != 3)
    return Status::InvalidArgument("reading " + reader.Describe(sample, field) +
                                   " as a volume: the record is not a (S, H, W) volume (store kind '" +
                                   reader.meta().kind + "')");
  return reader.Get(sample, field);
}

Result<VolumeRef> CheckedVolume(const Reader& reader, uint64_t sample, int field, TensorView* keep = nullptr) {
  PS_ASSIGN_OR_RETURN(TensorView v, VolumeView(reader, sample, field));
  VolumeRef r{v.bytes(), v.dtype, v.lut, v.shape[0], v.shape[1], v.shape[2]};
  if (keep) *keep = std::move(v);
  return r;
}

Status CheckSlice(const Reader& reader, uint64_t sample, int field, const VolumeRef& v, int64_t slice,
                  int64_t context) {
  if (slice < 0 || slice >= v.S)
    return Status::OutOfRange("slice " + std::to_string(slice) + " of " + reader.Describe(sample, field) +
                              ": outside [0, " + std::to_string(v.S) + ")");
  if (context < 0)
    return Status::InvalidArgument("slice stack of " + reader.Describe(sample, field) + ": context " +
                                   std::to_string(context) + " is negative");
  return Status::OK();
}

// Out of the page cache every page of a slice is a fault: ask for the
// stack's slices (contiguous in an (S,H,W) record) before copying them.
void PrefetchStack(const Reader& reader, const VolumeRef& v, int64_t slice, int64_t context) {
  const int64_t lo = std::max<int64_t>(slice - context, 0), hi = std::min(slice + context, v.S - 1);
  const int64_t plane = v.H * v.W;
  reader.PrefetchBytes(v.data + lo * plane * static_cast<int64_t>(v.es()),
                       static_cast<size_t>((hi - lo + 1) * plane) * v.es());
}

// Copies the (2c+1) planes, clamping slice indices to the volume; `t` is
// checked against the plane.
// `dst`: float32 (kFloat32) or elements of v.dtype (kStored, copied as
// stored).
void CopyStack(const VolumeRef& v, int64_t slice, int64_t context, const SliceTransform& t, void* dst,
               Output output = Output::kFloat32) {
  const int64_t plane = v.H * v.W;
  const bool identity = t.identity();
  const int64_t h = t.height ? t.height : v.H, w = t.width ? t.width : v.W;
  const Transform k = t.transform();
  for (int64_t d = 0; d <= 2 * context; ++d) {
    const int64_t s = std::min(std::max<int64_t>(slice - context + d, 0), v.S - 1);
    VisitDType(v.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* src = reinterpret_cast<const T*>(v.data) + s * plane;
      if (output == Output::kStored) {
        T* out = static_cast<T*>(dst);
        if (identity) std::memcpy(out + d * plane, src, static_cast<size_t>(plane) * sizeof(T));
        else CopyTransformedStored(src, v.W, t.y, t.x, h, w, k, out + d * h * w);
        return;
      }
      float* out = static_cast<float*>(dst);
      if (identity) ConvertRun(src, plane, out + d * plane, v.lut);  // a memcpy for float32
      else CopyTransformed(src, v.W, t.y, t.x, h, w, k, out + d * h * w, v.lut);
    });
  }
}

}  // namespace

Result<TensorView> Volume(const Reader& reader, uint64_t sample, int field) {
  PS_ASSIGN_OR_RETURN(TensorView v, VolumeView(reader, sample, field));
  reader.Prefetch(sample, field);  // a whole volume is usually read whole
  return v;
}

// ---------------------------------------------------------------------------
// SliceIndex

Result<SliceIndex> SliceIndex::Build(const Reader& reader) {
  std::vector<uint64_t> all(reader.size());
  for (uint64_t i = 0; i < all.size(); ++i) all[i] = i;
  return Build(reader, all);
}

VolumeSelection SelectVolumesGivingItems(const Reader& reader, const SliceIndex& index, int64_t crop_h,
                                         int64_t crop_w) {
  VolumeSelection sel;
  for (uint64_t v = 0; v < index.volume_count(); ++v) {
    if (index.GivesItems(v, crop_h, crop_w)) {
      sel.kept.push_back(index.sample(v));
      continue;
    }
    sel.skipped.push_back(index.sample(v));
    if (sel.skipped.size() > 4) continue;
    if (sel.skipped.size() > 1) sel.skipped_text += ", ";
    sel.skipped_text += "'" + std::string(reader.id(index.sample(v))) + "' (" +
                        (index.depth(v) == 0
                             ? std::string("no slice")
                             : std::to_string(index.height(v)) + "x" + std::to_string(index.width(v)) + " slices") +
                        ")";
  }
  if (sel.skipped.size() > 4) sel.skipped_text += ", ...";
  return sel;
}

Result<SliceIndex> SliceIndex::Build(const Reader& reader, const std::vector<uint64_t>& samples) {
  if (reader.meta().kind != "volumes")
    return Status::InvalidArgument("indexing slices of '" + reader.path() + "': it is a store of " +
                                   reader.meta().kind + ", not volumes");
  if (reader.field_count() == 0)
    return Status::InvalidArgument("indexing slices of '" + reader.path() + "': the store has no fields");
  SliceIndex ix;
  ix.samples_.reserve(samples.size());
  ix.first_.reserve(samples.size() + 1);
  ix.first_.push_back(0);
  std::vector<bool> seen(reader.size(), false);
  uint64_t total = 0;
  for (uint64_t s : samples) {
    if (s >= reader.size())
      return Status::OutOfRange("indexing slices of '" + reader.path() + "': sample index " + std::to_string(s) +
                                " out of range [0, " + std::to_string(reader.size()) + ")");
    if (seen[s])
      return Status::InvalidArgument("indexing slices of '" + reader.path() + "': sample " + reader.Describe(s, -1) +
                                     " listed twice");
    seen[s] = true;
    std::array<uint64_t, 4> shape{};
    for (int f = 0; f < reader.field_count(); ++f) {
      PS_ASSIGN_OR_RETURN(RecordSummary h, reader.Summary(s, f));  // the index: no record read
      if (h.layout != Layout::kSHW || h.rank != 3)
        return Status::InvalidArgument("indexing slices of " + reader.Describe(s, f) +
                                       ": the record is not a (S, H, W) volume");
      if (f == 0) {
        shape = h.shape;
      } else if (h.shape != shape) {
        auto str = [](const std::array<uint64_t, 4>& a) {
          return std::to_string(a[0]) + "x" + std::to_string(a[1]) + "x" + std::to_string(a[2]);
        };
        return Status::InvalidArgument("indexing slices of " + reader.Describe(s, f) + ": shape " + str(h.shape) +
                                       " differs from " + str(shape) + " of field '" + reader.field(0).name + "'");
      }
    }
    total += shape[0];
    ix.samples_.push_back(s);
    ix.first_.push_back(total);
    ix.hw_.emplace_back(static_cast<int64_t>(shape[1]), static_cast<int64_t>(shape[2]));
  }
  if (ix.samples_.size() > UINT32_MAX)
    return Status::InvalidArgument("indexing slices of '" + reader.path() + "': more than 2^32 volumes");
  ix.volume_of_.resize(total);
  for (uint64_t v = 0; v < ix.samples_.size(); ++v)
    std::fill(ix.volume_of_.begin() + static_cast<int64_t>(ix.first_[v]),
              ix.volume_of_.begin() + static_cast<int64_t>(ix.first_[v + 1]), static_cast<uint32_t>(v));
  return ix;
}

Result<SliceRef> SliceIndex::At(uint64_t i) const {
  if (i >= size())
    return Status::OutOfRange("slice index " + std::to_string(i) + " out of range [0, " + std::to_string(size()) + ")");
  return (*this)[i];
}

// ---------------------------------------------------------------------------
// Stacks and transforms

std::pair<int64_t, int64_t> SliceTransform::OutputSize(int64_t H, int64_t W) const {
  const int64_t h = height ? height : H;
  const int64_t w = width ? width : W;
  return transform().OutputSize(h, w);
}

Status SliceTransform::Check(int64_t H, int64_t W) const {
  auto crop = [&] {
    return "crop [" + std::to_string(y) + ":" + std::to_string(y + height) + "," + std::to_string(x) + ":" +
           std::to_string(x + width) + "]";
  };
  if (height == 0 && width == 0) {
    if (y != 0 || x != 0)
      return Status::InvalidArgument("crop at (" + std::to_string(y) + ", " + std::to_string(x) +
                                     ") without a size (height and width are 0)");
    return Status::OK();
  }
  if (height <= 0 || width <= 0) return Status::InvalidArgument(crop() + ": height and width must both be positive");
  if (y < 0 || x < 0 || y > H - height || x > W - width)
    return Status::OutOfRange(crop() + " is outside the " + std::to_string(H) + "x" + std::to_string(W) + " slice");
  return Status::OK();
}

Status TransformPlane(const float* src, int64_t H, int64_t W, int64_t row_stride, const SliceTransform& t, float* dst) {
  PS_RETURN_IF_ERROR(t.Check(H, W));
  const int64_t h = t.height ? t.height : H, w = t.width ? t.width : W;
  CopyTransformed(src, row_stride, t.y, t.x, h, w, t.transform(), dst);
  return Status::OK();
}

Result<TensorView> SliceStack(const Reader& reader, uint64_t sample, int field, int64_t slice, int64_t context) {
  TensorView vol;
  PS_ASSIGN_OR_RETURN(VolumeRef v, CheckedVolume(reader, sample, field, &vol));
  PS_RETURN_IF_ERROR(CheckSlice(reader, sample, field, v, slice, context));
  PrefetchStack(reader, v, slice, context);
  const int64_t n = 2 * context + 1;
  TensorView out = vol;
  out.shape[0] = n;
  if (slice - context >= 0 && slice + context < v.S && v.dtype == DType::kFloat32) {
    out.data = v.data + (slice - context) * v.H * v.W * static_cast<int64_t>(sizeof(float));
    return out;
  }
  // Compact volumes are converted (float32 normalised values, a copy).
  out.dtype = DType::kFloat32;
  out.lut = nullptr;
  out.strides = {v.H * v.W * 4, v.W * 4, 4, 0};
  // Crossing an end (or converting): replicate the end slices into an owned buffer.
  std::shared_ptr<float> buf(new float[static_cast<size_t>(n * v.H * v.W)], std::default_delete<float[]>());
  CopyStack(v, slice, context, SliceTransform{}, buf.get());
  out.data = buf.get();
  out.owner = std::move(buf);
  return out;
}

Status CopySliceStack(const Reader& reader, uint64_t sample, int field, int64_t slice, int64_t context,
                      const SliceTransform& t, float* dst) {
  PS_ASSIGN_OR_RETURN(VolumeRef v, CheckedVolume(reader, sample, field));
  PS_RETURN_IF_ERROR(CheckSlice(reader, sample, field, v, slice, context));
  Status st = t.Check(v.H, v.W);
  if (!st.ok()) return st.WithContext("slice stack of " + reader.Describe(sample, field));
  PrefetchStack(reader, v, slice, context);
  CopyStack(v, slice, context, t, dst);
  return Status::OK();
}

Status CopySliceStacks(const Reader& reader, const std::vector<SliceStackRequest>& requests, int64_t context,
                       float* dst, int num_threads) {
  return CopySliceStacks(reader, requests, context, dst, Output::kFloat32, num_threads);
}

Status CopySliceStacks(const Reader& reader, const std::vector<SliceStackRequest>& requests, int64_t context, void* dst,
                       Output output, int num_threads) {
  if (requests.empty()) return Status::OK();
  struct Job {
    VolumeRef v;
    int64_t slice;
  };
  std::vector<Job> jobs;
  jobs.reserve(requests.size());
  int64_t oh = -1, ow = -1;
  for (const SliceStackRequest& r : requests) {
    PS_ASSIGN_OR_RETURN(VolumeRef v, CheckedVolume(reader, r.sample, r.field));
    PS_RETURN_IF_ERROR(CheckSlice(reader, r.sample, r.field, v, r.slice, context));
    Status st = r.transform.Check(v.H, v.W);
    if (!st.ok()) return st.WithContext("slice stack of " + reader.Describe(r.sample, r.field));
    const std::pair<int64_t, int64_t> out = r.transform.OutputSize(v.H, v.W);
    if (oh < 0) {
      oh = out.first;
      ow = out.second;
    } else if (out.first != oh || out.second != ow) {
      return Status::InvalidArgument("batch of slice stacks mixes output sizes " + std::to_string(oh) + "x" +
                                     std::to_string(ow) + " and " + std::to_string(out.first) + "x" +
                                     std::to_string(out.second) + " (" + reader.Describe(r.sample, r.field) + ")");
    }
    if (output == Output::kStored && !jobs.empty() && v.dtype != jobs.front().v.dtype)
      return Status::InvalidArgument("batch of stored-dtype slice stacks mixes " +
                                     std::string(DTypeName(jobs.front().v.dtype)) + " and " +
                                     std::string(DTypeName(v.dtype)) + " (" + reader.Describe(r.sample, r.field) + ")");
    jobs.push_back(Job{v, r.slice});
  }
  // Out of the page cache every page of a slice is a fault: ask for each
  // stack's slices (contiguous in an (S,H,W) record) before copying any.
  for (const Job& j : jobs) PrefetchStack(reader, j.v, j.slice, context);
  const size_t es = output == Output::kStored ? jobs.front().v.es() : sizeof(float);
  const int64_t item = (2 * context + 1) * oh * ow * static_cast<int64_t>(es);
  const int64_t n = static_cast<int64_t>(jobs.size());
  ParallelBlocks(n, num_threads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      CopyStack(jobs[i].v, jobs[i].slice, context, requests[i].transform, static_cast<uint8_t*>(dst) + i * item,
                output);
  });
  return Status::OK();
}

SliceTransform DrawSliceTransform(uint64_t seed, uint64_t epoch, uint64_t index, int64_t H, int64_t W, int64_t crop_h,
                                  int64_t crop_w, SliceFlip flip, bool rot90) {
  constexpr uint64_t kSliceTag = 0x534C4943;  // "SLIC"
  // Uniform in [0, n) on the high 32 bits (n < 2^32), as the sequence was pinned.
  auto Below32 = [](uint64_t h, uint64_t n) { return static_cast<int64_t>(splitmix::Below32(h, n)); };
  const uint64_t key = splitmix::Key(seed, epoch, index, kSliceTag);
  SliceTransform t;
  if (crop_h > 0 || crop_w > 0) {
    t.y = Below32(splitmix::Mix(key ^ 1), static_cast<uint64_t>(H - crop_h + 1));
    t.x = Below32(splitmix::Mix(key ^ 2), static_cast<uint64_t>(W - crop_w + 1));
    t.height = crop_h;
    t.width = crop_w;
  }
  if (flip != SliceFlip::kNone) {
    const uint64_t u = splitmix::Mix(key ^ 3);
    t.flip_v = (u & 1) != 0;
    t.flip_h = flip == SliceFlip::kIndependent ? ((u >> 1) & 1) != 0 : t.flip_v;
  }
  if (rot90) {
    const uint64_t v = splitmix::Mix(key ^ 4);
    t.rot90 = (v & 1) ? 1 + static_cast<int>(Below32(v, 3)) : 0;
  }
  return t;
}

}  // namespace patchstore
