#include "patchstore/reader/volume.h"

#include "patchstore/reader/parallel.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

namespace patchstore {
namespace {

int Rot(int k) { return ((k % 4) + 4) % 4; }

// The output plane as an affine map into the source plane: the element
// (i, j) of the output is src[origin + i * si + j * sj].
struct PlaneMap {
  int64_t oh = 0, ow = 0;
  int64_t origin = 0, si = 0, sj = 0;
};

PlaneMap MapPlane(int64_t H, int64_t W, int64_t row_stride, const SliceTransform& t) {
  const int64_t h = t.height ? t.height : H;
  const int64_t w = t.width ? t.width : W;
  // (r, c) in the flipped crop as r0 + ri*i + rj*j, c0 + ci*i + cj*j; the
  // cases are np.rot90's definitions for k = 0..3.
  int64_t r0 = 0, ri = 0, rj = 0, c0 = 0, ci = 0, cj = 0;
  PlaneMap m;
  switch (Rot(t.rot90)) {
    case 0: ri = 1; cj = 1; m.oh = h; m.ow = w; break;                       // (i, j)
    case 1: rj = 1; c0 = w - 1; ci = -1; m.oh = w; m.ow = h; break;          // (j, w-1-i)
    case 2: r0 = h - 1; ri = -1; c0 = w - 1; cj = -1; m.oh = h; m.ow = w; break;  // (h-1-i, w-1-j)
    default: r0 = h - 1; rj = -1; ci = 1; m.oh = w; m.ow = h; break;         // (h-1-j, i)
  }
  // Flips act on the cropped plane before the rotation: r -> h-1-r.
  if (t.flip_v) { r0 = h - 1 - r0; ri = -ri; rj = -rj; }
  if (t.flip_h) { c0 = w - 1 - c0; ci = -ci; cj = -cj; }
  m.origin = (t.y + r0) * row_stride + t.x + c0;
  m.si = ri * row_stride + ci;
  m.sj = rj * row_stride + cj;
  return m;
}

#if defined(__SSE2__)
inline __m128 Reverse4(__m128 v) { return _mm_shuffle_ps(v, v, _MM_SHUFFLE(0, 1, 2, 3)); }
#endif

// Mirrored row: d[j] = p[-j] for j in [0, n).
inline void CopyReversed(const float* p, int64_t n, float* d) {
  // From the end, so the source is read at ascending addresses.
  int64_t j = n;
#if defined(__SSE2__)
  for (; j >= 4; j -= 4) _mm_storeu_ps(d + j - 4, Reverse4(_mm_loadu_ps(p - j + 1)));
#endif
  for (; j > 0; --j) d[j - 1] = p[-(j - 1)];
}

// Output rows [i0, i0+in) x columns [j0, j0+jn) of a transposed map
// (|si| == 1: an output column is a source row).
inline void TransposeTile(const float* base, const PlaneMap& m, int64_t i0, int64_t in, int64_t j0, int64_t jn,
                          float* dst) {
  int64_t i = 0;
#if defined(__SSE2__)
  // 4x4 blocks: four contiguous source runs, one SSE transpose, four stores.
  for (; i + 4 <= in; i += 4) {
    int64_t j = 0;
    for (; j + 4 <= jn; j += 4) {
      const float* p = base + (i0 + i) * m.si + (j0 + j) * m.sj;
      __m128 r0, r1, r2, r3;
      if (m.si == 1) {
        r0 = _mm_loadu_ps(p);
        r1 = _mm_loadu_ps(p + m.sj);
        r2 = _mm_loadu_ps(p + 2 * m.sj);
        r3 = _mm_loadu_ps(p + 3 * m.sj);
      } else {
        r0 = Reverse4(_mm_loadu_ps(p - 3));
        r1 = Reverse4(_mm_loadu_ps(p + m.sj - 3));
        r2 = Reverse4(_mm_loadu_ps(p + 2 * m.sj - 3));
        r3 = Reverse4(_mm_loadu_ps(p + 3 * m.sj - 3));
      }
      _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
      float* d = dst + (i0 + i) * m.ow + j0 + j;
      _mm_storeu_ps(d, r0);
      _mm_storeu_ps(d + m.ow, r1);
      _mm_storeu_ps(d + 2 * m.ow, r2);
      _mm_storeu_ps(d + 3 * m.ow, r3);
    }
    for (; j < jn; ++j)
      for (int64_t k = 0; k < 4; ++k)
        dst[(i0 + i + k) * m.ow + j0 + j] = base[(i0 + i + k) * m.si + (j0 + j) * m.sj];
  }
#endif
  for (; i < in; ++i) {
    const float* p = base + (i0 + i) * m.si + j0 * m.sj;
    float* d = dst + (i0 + i) * m.ow + j0;
    for (int64_t j = 0; j < jn; ++j) d[j] = p[j * m.sj];
  }
}

// Writes the output plane. Loops run so that the source (the memory map,
// usually not in cache) is read at ascending addresses, which the hardware
// prefetchers follow; the output plane is small enough to stay in cache.
void ApplyPlane(const float* src, const PlaneMap& m, float* dst) {
  const float* base = src + m.origin;
  if (m.sj == 1 || m.sj == -1) {  // rows stay rows: copies or mirrored copies
    const size_t row = static_cast<size_t>(m.ow) * sizeof(float);
    for (int64_t k = 0; k < m.oh; ++k) {
      const int64_t i = m.si > 0 ? k : m.oh - 1 - k;
      if (m.sj == 1) std::memcpy(dst + i * m.ow, base + i * m.si, row);
      else CopyReversed(base + i * m.si, m.ow, dst + i * m.ow);
    }
    return;
  }
  // Transposed (odd rotations): source rows become output columns. Tiles of
  // 32 source rows x 32 columns; bands of source rows in address order.
  // (Callers stage planes from the map first: see TransformInto.)
  constexpr int64_t kTile = 32;
  const int64_t nj = (m.ow + kTile - 1) / kTile, ni = (m.oh + kTile - 1) / kTile;
  auto band = [&](int64_t tj) { return (m.sj > 0 ? tj : nj - 1 - tj) * kTile; };
  for (int64_t tj = 0; tj < nj; ++tj) {
    const int64_t j0 = band(tj);
    for (int64_t ti = 0; ti < ni; ++ti) {
      const int64_t i0 = (m.si > 0 ? ti : ni - 1 - ti) * kTile;
      TransposeTile(base, m, i0, std::min(kTile, m.oh - i0), j0, std::min(kTile, m.ow - j0), dst);
    }
  }
}

// Applies `t` to one plane of the map. Transposing straight out of the map
// reads 32 rows at a time, a pattern the hardware prefetchers follow badly
// (measured 2-3x slower than a copy); so odd rotations first copy the crop
// into a per-thread buffer (sequential reads) and transpose from cache.
void TransformInto(const float* plane, int64_t row_stride, const SliceTransform& t, const PlaneMap& m,
                   float* dst) {
  if (m.sj == 1 || m.sj == -1) {
    ApplyPlane(plane, m, dst);
    return;
  }
  const int64_t h = m.ow, w = m.oh;  // crop size (transposed output)
  thread_local std::vector<float> stage;
  if (stage.size() < static_cast<size_t>(h * w)) stage.resize(static_cast<size_t>(h * w));
  const float* crop = plane + t.y * row_stride + t.x;
  if (row_stride == w) {
    std::memcpy(stage.data(), crop, static_cast<size_t>(h * w) * sizeof(float));
  } else {
    for (int64_t r = 0; r < h; ++r)
      std::memcpy(stage.data() + r * w, crop + r * row_stride, static_cast<size_t>(w) * sizeof(float));
  }
  SliceTransform local = t;
  local.y = local.x = local.height = local.width = 0;
  ApplyPlane(stage.data(), MapPlane(h, w, w, local), dst);
}

struct VolumeRef {
  const float* data = nullptr;
  int64_t S = 0, H = 0, W = 0;
};

Result<VolumeRef> CheckedVolume(const Reader& reader, uint64_t sample, int field, TensorView* keep = nullptr) {
  PS_ASSIGN_OR_RETURN(TensorView v, Volume(reader, sample, field));
  VolumeRef r{v.data_as<float>(), v.shape[0], v.shape[1], v.shape[2]};
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

// Copies the (2c+1) planes, clamping slice indices to the volume.
void CopyStack(const VolumeRef& v, int64_t slice, int64_t context, const SliceTransform& t, const PlaneMap& m,
               bool identity, float* dst) {
  const int64_t plane = v.H * v.W;
  const int64_t out = identity ? plane : m.oh * m.ow;
  for (int64_t d = 0; d <= 2 * context; ++d) {
    const int64_t s = std::min(std::max<int64_t>(slice - context + d, 0), v.S - 1);
    if (identity) std::memcpy(dst + d * out, v.data + s * plane, static_cast<size_t>(plane) * sizeof(float));
    else TransformInto(v.data + s * plane, v.W, t, m, dst + d * out);
  }
}

}  // namespace

Result<TensorView> Volume(const Reader& reader, uint64_t sample, int field) {
  PS_ASSIGN_OR_RETURN(RecordHeader h, reader.Header(sample, field));
  if (h.layout != Layout::kSHW || h.rank != 3)
    return Status::InvalidArgument("reading " + reader.Describe(sample, field) +
                                   " as a volume: the record is not a (S, H, W) volume (store kind '" +
                                   reader.meta().kind + "')");
  return reader.Get(sample, field);
}

// ---------------------------------------------------------------------------
// SliceIndex

Result<SliceIndex> SliceIndex::Build(const Reader& reader) {
  std::vector<uint64_t> all(reader.size());
  for (uint64_t i = 0; i < all.size(); ++i) all[i] = i;
  return Build(reader, all);
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
      return Status::InvalidArgument("indexing slices of '" + reader.path() + "': sample " +
                                     reader.Describe(s, -1) + " listed twice");
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
  return Rot(rot90) % 2 ? std::make_pair(w, h) : std::make_pair(h, w);
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
  if (height <= 0 || width <= 0)
    return Status::InvalidArgument(crop() + ": height and width must both be positive");
  if (y < 0 || x < 0 || y > H - height || x > W - width)
    return Status::OutOfRange(crop() + " is outside the " + std::to_string(H) + "x" + std::to_string(W) + " slice");
  return Status::OK();
}

Status TransformPlane(const float* src, int64_t H, int64_t W, int64_t row_stride, const SliceTransform& t,
                      float* dst) {
  PS_RETURN_IF_ERROR(t.Check(H, W));
  TransformInto(src, row_stride, t, MapPlane(H, W, row_stride, t), dst);
  return Status::OK();
}

Result<TensorView> SliceStack(const Reader& reader, uint64_t sample, int field, int64_t slice, int64_t context) {
  TensorView vol;
  PS_ASSIGN_OR_RETURN(VolumeRef v, CheckedVolume(reader, sample, field, &vol));
  PS_RETURN_IF_ERROR(CheckSlice(reader, sample, field, v, slice, context));
  const int64_t n = 2 * context + 1;
  TensorView out = vol;
  out.shape[0] = n;
  if (slice - context >= 0 && slice + context < v.S) {
    out.data = v.data + (slice - context) * v.H * v.W;
    return out;
  }
  // Crossing an end: replicate the end slices into an owned buffer.
  std::shared_ptr<float> buf(new float[static_cast<size_t>(n * v.H * v.W)], std::default_delete<float[]>());
  CopyStack(v, slice, context, SliceTransform{}, PlaneMap{}, /*identity=*/true, buf.get());
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
  CopyStack(v, slice, context, t, MapPlane(v.H, v.W, v.W, t), t.identity(), dst);
  return Status::OK();
}

Status CopySliceStacks(const Reader& reader, const std::vector<SliceStackRequest>& requests, int64_t context,
                       float* dst, int num_threads) {
  if (requests.empty()) return Status::OK();
  struct Job {
    VolumeRef v;
    PlaneMap m;
    bool identity;
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
    Job j{v, MapPlane(v.H, v.W, v.W, r.transform), r.transform.identity(), r.slice};
    if (oh < 0) {
      oh = j.m.oh;
      ow = j.m.ow;
    } else if (j.m.oh != oh || j.m.ow != ow) {
      return Status::InvalidArgument("batch of slice stacks mixes output sizes " + std::to_string(oh) + "x" +
                                     std::to_string(ow) + " and " + std::to_string(j.m.oh) + "x" +
                                     std::to_string(j.m.ow) + " (" + reader.Describe(r.sample, r.field) + ")");
    }
    jobs.push_back(j);
  }
  // Out of the page cache every page of a slice is a fault: ask for each
  // stack's slices (contiguous in an (S,H,W) record) before copying any.
  for (const Job& j : jobs) {
    const int64_t lo = std::max<int64_t>(j.slice - context, 0), hi = std::min(j.slice + context, j.v.S - 1);
    const int64_t plane = j.v.H * j.v.W;
    reader.PrefetchBytes(j.v.data + lo * plane, static_cast<size_t>((hi - lo + 1) * plane) * sizeof(float));
  }
  const int64_t item = (2 * context + 1) * oh * ow;
  const int64_t n = static_cast<int64_t>(jobs.size());
  ParallelBlocks(n, num_threads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      CopyStack(jobs[i].v, jobs[i].slice, context, requests[i].transform, jobs[i].m, jobs[i].identity,
                dst + i * item);
  });
  return Status::OK();
}

namespace {

uint64_t SliceMix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// As _volumes._below: the high 32 bits times n, shifted down (n < 2^32).
int64_t SliceBelow(uint64_t h, uint64_t n) { return static_cast<int64_t>(((h >> 32) * n) >> 32); }

}  // namespace

SliceTransform DrawSliceTransform(uint64_t seed, uint64_t epoch, uint64_t index, int64_t H, int64_t W,
                                  int64_t crop_h, int64_t crop_w, SliceFlip flip, bool rot90) {
  constexpr uint64_t kSliceTag = 0x534C4943;  // "SLIC"
  const uint64_t key = SliceMix(SliceMix(SliceMix(SliceMix(seed) ^ epoch) ^ index) ^ kSliceTag);
  SliceTransform t;
  if (crop_h > 0 || crop_w > 0) {
    t.y = SliceBelow(SliceMix(key ^ 1), static_cast<uint64_t>(H - crop_h + 1));
    t.x = SliceBelow(SliceMix(key ^ 2), static_cast<uint64_t>(W - crop_w + 1));
    t.height = crop_h;
    t.width = crop_w;
  }
  if (flip != SliceFlip::kNone) {
    const uint64_t u = SliceMix(key ^ 3);
    t.flip_v = (u & 1) != 0;
    t.flip_h = flip == SliceFlip::kIndependent ? ((u >> 1) & 1) != 0 : t.flip_v;
  }
  if (rot90) {
    const uint64_t v = SliceMix(key ^ 4);
    t.rot90 = (v & 1) ? 1 + static_cast<int>(SliceBelow(v, 3)) : 0;
  }
  return t;
}

}  // namespace patchstore
