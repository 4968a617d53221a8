// Tiled records and compact encodings on the read side (issue 13): every read
// path of a store holding uint8/uint16/int16 source values (+ normalisation),
// float16, or tiles gives output bit-identical to the float32 row store of
// the same data; damaged tiled / compact records are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include "patchstore/reader/reader.h"
#include "patchstore/reader/sampler.h"
#include "patchstore/reader/tensor_view.h"
#include "patchstore/reader/verify.h"
#include "patchstore/reader/volume.h"
#include "patchstore/store/store.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::TempDir;

constexpr int64_t kH = 37, kW = 45;  // not multiples of 8 or 16
constexpr uint64_t kSamples = 3;

// The source value of (sample, field, channel, y, x) for a dtype's range.
int32_t SourceValue(DType d, uint64_t s, int f, int64_t c, int64_t y, int64_t x) {
  const uint32_t h = static_cast<uint32_t>((s * 7919 + f * 104729 + c * 1299709 + y * 15485863 + x * 32452843) ^
                                           (y * x * 2654435761u));
  if (f == 1 && ((y * 3 + x * 5 + static_cast<int64_t>(s)) % 4 == 0)) return 0;  // mask zeros
  switch (d) {
    case DType::kUInt8: return static_cast<int32_t>(h % 256);
    case DType::kUInt16: return static_cast<int32_t>(h % 65536);
    case DType::kInt16: return static_cast<int32_t>(h % 65536) - 32768;
    default: return static_cast<int32_t>(h % 4096);
  }
}

struct Encoding {
  DType dtype = DType::kFloat32;  // of the records
  uint16_t tile = 0;
};

// Writes a frames store with "rgb" (3 channels) and "mask" (1 channel) whose
// logical values are norm.Apply(source): float32 records hold those values,
// raw-source records the source values, float16 records `half_bits` values
// (then the float32 store holds ToFloat32 of them, see Float16Reference).
std::string WriteStore(const TempDir& dir, const std::string& name, DType source_dtype, const Normalization& norm,
                       Encoding enc, bool float16_reference = false, int64_t height = kH, int64_t width = kW) {
  const std::string path = dir / name;
  testing::StoreSpec spec;
  spec.fields = {testing::StoreField{"rgb", 3}, testing::StoreField{"mask", 1, /*mask=*/true}};
  for (testing::StoreField& f : spec.fields) {
    f.dtype = enc.dtype;
    f.tile = enc.tile;
    f.norm = norm;
    f.source_type = SourceType::kUnknown;
  }
  spec.fields[1].mask_blocks = 8;  // kH x kW: 5 x 6 blocks, the last ones cut
  spec.ids = testing::NumberedIds(kSamples);
  spec.height = height;
  spec.width = width;
  spec.value = [&](uint64_t s, int f, int64_t c, int64_t y, int64_t x) -> double {
    const int32_t v = SourceValue(source_dtype, s, f, c, y, x);
    const uint16_t half = static_cast<uint16_t>(v * 13 + 0x2c00 + c) & 0x7bff;  // finite halves
    switch (enc.dtype) {
      case DType::kFloat32: return float16_reference ? ToFloat32(Float16{half}) : norm.Apply(v);
      case DType::kFloat16: return half;  // the bits
      default: return v;                  // raw source values
    }
  };
  spec.batch = 1;
  Status st = testing::WriteStore(path, spec);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return path;
}

void ExpectSameFloats(const float* a, const float* b, size_t n, const std::string& what) {
  ASSERT_EQ(std::memcmp(a, b, n * sizeof(float)), 0) << what;
}

// The values of a view, row-major (a window view of a float32 row record
// is strided: copied element by element here).
std::vector<float> Values(const TensorView& v) {
  TensorView f = AsFloat32(v);
  EXPECT_EQ(f.dtype, DType::kFloat32);
  EXPECT_TRUE(v.dtype == DType::kFloat32 || f.contiguous());
  std::vector<float> out(static_cast<size_t>(f.elements()));
  size_t i = 0;
  for (int64_t c = 0; c < f.shape[0]; ++c)
    for (int64_t y = 0; y < f.shape[1]; ++y)
      for (int64_t x = 0; x < f.shape[2]; ++x)
        out[i++] = *reinterpret_cast<const float*>(f.bytes() + c * f.strides[0] + y * f.strides[1] + x * f.strides[2]);
  return out;
}

// Every read path of `r` gives the bytes of the float32 row store `ref`.
void ExpectSameReads(const Reader& ref, const Reader& r) {
  ASSERT_EQ(ref.size(), r.size());
  const std::vector<std::array<int64_t, 4>> windows = {{0, 0, kH, kW},   {0, 0, 8, 8},   {3, 5, 16, 16}, {7, 9, 17, 23},
                                                       {21, 29, 16, 16}, {36, 44, 1, 1}, {5, 0, 30, 45}};
  for (uint64_t s = 0; s < r.size(); ++s)
    for (int f = 0; f < 2; ++f) {
      const std::string at = "sample " + std::to_string(s) + " field " + std::to_string(f);
      const std::vector<float> whole = Values(ref.Get(s, f).value());
      const std::vector<float> got = Values(r.Get(s, f).value());
      ASSERT_EQ(whole.size(), got.size());
      ExpectSameFloats(whole.data(), got.data(), whole.size(), "Get " + at);
      for (const auto& wd : windows) {
        const std::string win = at + " window " + std::to_string(wd[0]) + "," + std::to_string(wd[1]);
        const std::vector<float> a = Values(ref.Patch(s, f, wd[0], wd[1], wd[2], wd[3]).value());
        const std::vector<float> b = Values(r.Patch(s, f, wd[0], wd[1], wd[2], wd[3]).value());
        ExpectSameFloats(a.data(), b.data(), a.size(), "Patch " + win);
        std::vector<float> c(a.size(), -7.0f);
        ASSERT_TRUE(r.CopyPatch(s, f, wd[0], wd[1], wd[2], wd[3], c.data()).ok());
        ExpectSameFloats(a.data(), c.data(), a.size(), "CopyPatch " + win);
      }
    }
  // CopyPatches on two threads.
  std::vector<PatchRequest> reqs;
  for (uint64_t s = 0; s < r.size(); ++s)
    for (int64_t k = 0; k < 4; ++k) reqs.push_back({s, 0, k * 5 + 1, k * 7 + 2});
  std::vector<float> a(reqs.size() * 3 * 16 * 16), b(a.size(), -7.0f);
  ASSERT_TRUE(ref.CopyPatches(reqs, 16, 16, a.data(), 1).ok());
  ASSERT_TRUE(r.CopyPatches(reqs, 16, 16, b.data(), 2).ok());
  ExpectSameFloats(a.data(), b.data(), a.size(), "CopyPatches");
  // Summed-area tables of the mask: the same table, so the same valid windows;
  // the same again computed in strips into a scratch buffer reused across
  // samples (what window lists are built from; 37 rows: strips of 16, 16, 5).
  std::vector<uint32_t> scratch;
  for (uint64_t s = 0; s < r.size(); ++s) {
    SatView sa = ref.Sat(s, 1, false).value(), sb = r.Sat(s, 1, false).value();
    ASSERT_EQ(std::memcmp(sa.data, sb.data, static_cast<size_t>((kH + 1) * (kW + 1)) * 4), 0) << "Sat " << s;
    SatView sc = r.Sat(s, 1, false, &scratch).value();
    ASSERT_EQ(sc.data, scratch.data());
    ASSERT_EQ(std::make_tuple(sc.planes, sc.H, sc.W), std::make_tuple(int64_t{1}, kH, kW));
    ASSERT_EQ(std::memcmp(sa.data, sc.data, static_cast<size_t>((kH + 1) * (kW + 1)) * 4), 0) << "scratch Sat " << s;
    EXPECT_EQ(sc.Count(0, 0, 0, kH, kW), r.summary(s, 1).valid_count);
    EXPECT_EQ(ref.summary(s, 1).valid_count, r.summary(s, 1).valid_count);
  }
}

// PatchSampler batches with flips and quarter turns: same windows, same bytes.
// CountNonZero (a mask requirement's count, read in place) equals the
// count of non-zero values CopyWindow gives, on both stores, for windows at
// tile edges, inside one tile and across the whole record. Returns how
// many windows held both zero and non-zero values.
int ExpectSameCounts(const Reader& ref, const Reader& r) {
  int mixed = 0;
  const int64_t windows[][4] = {
      {0, 0, kH, kW}, {3, 5, 10, 12}, {8, 16, 8, 8}, {9, 17, 1, 27}, {kH - 16, kW - 16, 16, 16}};
  for (uint64_t s = 0; s < kSamples; ++s)
    for (int f = 0; f < 2; ++f)
      for (const auto& w : windows) {
        const WindowSource a = ref.Window(s, f, w[0], w[1], w[2], w[3]).value();
        const WindowSource b = r.Window(s, f, w[0], w[1], w[2], w[3]).value();
        std::vector<float> values(static_cast<size_t>(b.C * w[2] * w[3]));
        CopyWindow(b, Transform{}, values.data());
        uint64_t brute = 0;
        for (float v : values) brute += (v != 0.0f && !std::isnan(v)) ? 1u : 0u;
        SCOPED_TRACE("sample " + std::to_string(s) + " field " + std::to_string(f) + " window at " +
                     std::to_string(w[0]) + "," + std::to_string(w[1]));
        EXPECT_EQ(CountNonZero(b), brute);
        EXPECT_EQ(CountNonZero(a), brute);
        mixed += brute > 0 && brute < values.size() ? 1 : 0;
      }
  return mixed;
}

// Output::kStored (the bytes shipped to a GPU): gathering `wins` from `r`
// in each field's stored dtype gives the record's own elements, moved as the
// float32 gather moves them (the record read whole by Get, cut and turned by
// CopyTransformedStored), and converting each with the field's table
// (ConvertElement, what patchstore.torch.to_float applies on the device)
// gives `want`, the float32 row store's output, bit for bit.
void ExpectStoredGatherConverts(const Reader& r, const PatchSampler& s, const std::vector<Window>& wins,
                                const std::vector<const float*>& want) {
  const int64_t n = static_cast<int64_t>(wins.size()), P = s.height();
  for (size_t f = 0; f < 2; ++f) {
    const DType dtype = s.field_dtype(f);
    ASSERT_EQ(dtype, r.meta().fields[f].dtype);
    const int64_t C = s.channels()[f];
    const size_t es = DTypeSize(dtype), item = static_cast<size_t>(C * P * P);
    std::vector<uint8_t> got(n * item * es + 1, 0xa5);  // one guard byte
    std::vector<GatherTarget> outs(2);
    std::vector<float> other(static_cast<size_t>(n * s.channels()[1 - f] * P * P));
    outs[f] = {got.data(), Output::kStored};
    outs[1 - f] = {other.data(), Output::kFloat32};
    ASSERT_TRUE(s.GatherWindowsTo(wins, outs).ok());
    ASSERT_EQ(got.back(), 0xa5) << "wrote past the stored output";
    VisitDType(dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* stored = reinterpret_cast<const T*>(got.data());
      std::vector<T> expect(item);
      for (int64_t i = 0; i < n; ++i) {
        TensorView whole = r.Get(wins[i].sample, static_cast<int>(f)).value();
        const T* plane = whole.data_as<T>();
        const int64_t H = whole.shape[1], W = whole.shape[2];
        for (int64_t c = 0; c < C; ++c)
          CopyTransformedStored(plane + c * H * W, W, wins[i].y, wins[i].x, P, P, wins[i].transform(),
                                expect.data() + c * P * P);
        ASSERT_EQ(std::memcmp(expect.data(), stored + i * item, item * es), 0)
            << "stored window " << i << " field " << f;
        for (size_t j = 0; j < item; ++j) {
          const float v = ConvertElement(stored[i * item + j], r.field_table(static_cast<int>(f)));
          ASSERT_EQ(std::memcmp(&v, want[f] + i * item + j, sizeof(float)), 0)
              << "converted window " << i << " field " << f << " element " << j;
        }
      }
    });
    // The whole batch at once (ConvertStored, what to_float runs on the CPU),
    // on one and on three threads: the same bytes.
    for (int threads : {1, 3}) {
      std::vector<float> conv(static_cast<size_t>(n) * item + 1, -7.0f);
      ConvertStored(dtype, r.field_table(static_cast<int>(f)), got.data(), n * static_cast<int64_t>(item), conv.data(),
                    threads);
      ASSERT_EQ(conv.back(), -7.0f) << "wrote past the output";
      ASSERT_EQ(std::memcmp(conv.data(), want[f], n * item * sizeof(float)), 0)
          << "ConvertStored field " << f << " on " << threads << " threads";
    }
  }
}

void ExpectSameBatches(std::shared_ptr<Reader> ref, std::shared_ptr<Reader> r) {
  for (uint64_t seed : {1u, 2u, 7u}) {
    SamplerOptions o;
    o.fields = {"rgb", "mask"};
    o.patch_size = 16;
    o.require = "mask";
    o.flip = o.rot90 = true;
    o.seed = seed;
    o.num_threads = 2;
    auto sa = PatchSampler::Create(ref, o).value();
    auto sb = PatchSampler::Create(r, o).value();
    const int64_t n = 12;
    std::vector<float> a0(n * 3 * 256), a1(n * 256), b0(a0.size(), -7.0f), b1(a1.size(), -7.0f);
    std::vector<Window> wa, wb;
    ASSERT_TRUE(sa->Next(n, {a0.data(), a1.data()}, &wa).ok());
    ASSERT_TRUE(sb->Next(n, {b0.data(), b1.data()}, &wb).ok());
    ASSERT_EQ(wa.size(), wb.size());
    bool turned = false;
    for (size_t i = 0; i < wa.size(); ++i) {
      EXPECT_EQ(wa[i].sample, wb[i].sample);
      EXPECT_EQ(wa[i].y, wb[i].y);
      EXPECT_EQ(wa[i].x, wb[i].x);
      EXPECT_EQ(wa[i].rot, wb[i].rot);
      turned = turned || wa[i].rot % 2 == 1;
    }
    EXPECT_TRUE(turned);  // the transposing path is exercised
    ExpectSameFloats(a0.data(), b0.data(), a0.size(), "sampler rgb seed " + std::to_string(seed));
    ExpectSameFloats(a1.data(), b1.data(), a1.size(), "sampler mask seed " + std::to_string(seed));
    ExpectStoredGatherConverts(*r, *sb, wb, {a0.data(), a1.data()});
    if (::testing::Test::HasFatalFailure()) return;
  }
}

Normalization Norm(NormKind k, double scale, double offset, bool clamp = false, double lo = 0, double hi = 0) {
  Normalization n;
  n.kind = k;
  n.scale = scale;
  n.offset = offset;
  n.clamp = clamp;
  n.clamp_lo = lo;
  n.clamp_hi = hi;
  return n;
}

struct Case {
  DType dtype;
  Normalization norm;
  const char* what;
};

std::vector<Case> Cases() {
  return {
      {DType::kUInt8, Norm(NormKind::kSymmetric, 255, 0), "uint8 symmetric"},
      {DType::kUInt8, Norm(NormKind::kUnit, 255, 0), "uint8 unit"},
      {DType::kUInt8, Norm(NormKind::kBinary, 255, 0), "uint8 binary"},
      {DType::kUInt8, Norm(NormKind::kNone, 1, 0), "uint8 none"},
      {DType::kUInt16, Norm(NormKind::kUnit, 65535, 0), "uint16 unit"},
      {DType::kUInt16, Norm(NormKind::kSymmetric, 65535, 0, true, -0.5, 0.25), "uint16 symmetric clamped"},
      {DType::kInt16, Norm(NormKind::kAffine, 0.001, -2.5), "int16 affine"},
      {DType::kInt16, Norm(NormKind::kRange, -1000, 3000), "int16 range"},
      {DType::kUInt16, Norm(NormKind::kRange, 100, 40000, true, -0.75, 0.5), "uint16 range clamped"},
  };
}

// The mask block counts the writer derived from each mask record count
// exactly what a reader counts in every block (edge blocks cut at kH, kW),
// and bound the count of every window: exact for windows of whole blocks.
// Returns the windows whose bounds differ (the ones a sampler counts).
void ExpectExactBlockCounts(const Reader& r, int* undecided) {
  for (uint64_t s = 0; s < kSamples; ++s) {
    auto v = r.MaskBlocks(s, 1);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    if (!v.ok()) return;
    EXPECT_EQ(v->B, 8);
    EXPECT_EQ(v->by, 5);
    EXPECT_EQ(v->bx, 6);
    std::vector<float> m(static_cast<size_t>(kH * kW));
    EXPECT_TRUE(r.CopyPatch(s, 1, 0, 0, kH, kW, m.data()).ok());
    auto brute = [&](int64_t y, int64_t x, int64_t h, int64_t w) {
      uint64_t c = 0;
      for (int64_t yy = y; yy < y + h; ++yy)
        for (int64_t xx = x; xx < x + w; ++xx) c += (m[yy * kW + xx] != 0.0f && !std::isnan(m[yy * kW + xx]));
      return c;
    };
    for (int64_t j = 0; j < 5; ++j)
      for (int64_t i = 0; i < 6; ++i)
        ASSERT_EQ(v->Sum(j, i, j + 1, i + 1),
                  brute(j * 8, i * 8, std::min<int64_t>(8, kH - j * 8), std::min<int64_t>(8, kW - i * 8)))
            << "sample " << s << " block " << j << "," << i;
    for (int64_t h : {int64_t{1}, int64_t{9}, int64_t{16}, int64_t{23}, kH})
      for (int64_t w : {int64_t{1}, int64_t{8}, int64_t{17}, int64_t{30}, kW})
        for (int64_t y = 0; y + h <= kH; y += 3)
          for (int64_t x = 0; x + w <= kW; x += 5) {
            uint64_t lo = 0, hi = 0;
            v->Bounds(y, x, h, w, &lo, &hi);
            const uint64_t c = brute(y, x, h, w);
            ASSERT_LE(lo, c) << y << "," << x << " " << h << "x" << w;
            ASSERT_GE(hi, c) << y << "," << x << " " << h << "x" << w;
            *undecided += lo != hi;
            if (y % 8 == 0 && x % 8 == 0 && (h % 8 == 0 || y + h == kH) && (w % 8 == 0 || x + w == kW)) {
              ASSERT_EQ(lo, hi) << y << "," << x << " " << h << "x" << w;
            }
          }
  }
  auto none = r.MaskBlocks(0, 0);  // rgb is not a mask
  EXPECT_EQ(none.status().code(), Code::kNotFound);
  EXPECT_EQ(r.MaskBlockEdge(0, 0), 0u);
}

TEST(Encodings, CompactAndTiledStoresReadBitIdenticalToFloat32Rows) {
  int mixed = 0;  // count windows with zeros and non-zeros (masks of unit, binary, none)
  for (const Case& k : Cases()) {
    SCOPED_TRACE(k.what);
    TempDir dir;
    auto ref = Reader::Open(WriteStore(dir, "ref.ps", k.dtype, k.norm, {DType::kFloat32, 0})).value();
    for (Encoding e : {Encoding{k.dtype, 0}, Encoding{k.dtype, 8}, Encoding{k.dtype, 16}, Encoding{DType::kFloat32, 8},
                       Encoding{DType::kFloat32, 16}}) {
      SCOPED_TRACE(std::string(DTypeName(e.dtype)) + " tile " + std::to_string(e.tile));
      auto r = Reader::Open(WriteStore(dir, std::string(DTypeName(e.dtype)) + std::to_string(e.tile) + ".ps", k.dtype,
                                       k.norm, e))
                   .value();
      if (StoresRawSource(e.dtype)) {
        ASSERT_NE(r->field_table(0), nullptr);
        EXPECT_EQ(r->Get(0, 0)->lut, r->field_table(0));
      } else {
        EXPECT_EQ(r->field_table(0), nullptr);
      }
      ExpectSameReads(*ref, *r);
      if (::testing::Test::HasFatalFailure()) return;
      mixed += ExpectSameCounts(*ref, *r);
      int undecided = 0;
      ExpectExactBlockCounts(*r, &undecided);
      if (::testing::Test::HasFatalFailure()) return;
      EXPECT_GT(undecided, 0);
      ExpectSameBatches(ref, r);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  EXPECT_GT(mixed, 100);
}

// The usual tile edges (32, 64) copy a window's whole-tile runs by a kernel
// of their own (CopyTiledWindow): on a record several tiles wide (70 x 141,
// no edge dividing it), windows with whole-tile runs, partial ones and both
// give the float32 row store's bytes, for every source type and edge (24:
// the general kernel); so do both layouts streamed (CopyWindow's `stream`).
TEST(Encodings, WholeTileRunsOfTheUsualTileEdgesReadBitIdenticalToFloat32Rows) {
  constexpr int64_t H = 70, W = 141;
  const int64_t windows[][4] = {{0, 0, H, W}, {1, 3, 67, 130}, {0, 64, 64, 64}, {5, 32, 33, 96}, {6, 70, 9, 7}};
  for (const Case& k : Cases()) {
    SCOPED_TRACE(k.what);
    TempDir dir;
    auto ref = Reader::Open(WriteStore(dir, "ref.ps", k.dtype, k.norm, {DType::kFloat32, 0}, false, H, W)).value();
    for (uint16_t tile : {uint16_t{24}, uint16_t{32}, uint16_t{64}})
      for (DType dtype : {k.dtype, DType::kFloat32}) {
        const std::string name = std::string(DTypeName(dtype)) + std::to_string(tile);
        SCOPED_TRACE(name);
        auto r = Reader::Open(WriteStore(dir, name + ".ps", k.dtype, k.norm, {dtype, tile}, false, H, W)).value();
        for (uint64_t s = 0; s < kSamples; ++s)
          for (int f = 0; f < 2; ++f)
            for (const auto& w : windows) {
              const WindowSource a = ref->Window(s, f, w[0], w[1], w[2], w[3]).value();
              const WindowSource b = r->Window(s, f, w[0], w[1], w[2], w[3]).value();
              ASSERT_EQ(b.tile, tile);
              std::vector<float> va(static_cast<size_t>(a.C * w[2] * w[3])), vb(va.size() + 1, -7.0f);
              CopyWindow(a, Transform{}, va.data());
              CopyWindow(b, Transform{}, vb.data());
              const std::string where = "sample " + std::to_string(s) + " field " + std::to_string(f) + " window at " +
                                        std::to_string(w[0]) + "," + std::to_string(w[1]);
              ExpectSameFloats(va.data(), vb.data(), va.size(), where);
              EXPECT_EQ(vb.back(), -7.0f);  // nothing written past the window
              // Streamed (non-temporal stores) into an aligned buffer and one
              // a float off alignment (the plain-copy fallback): the same
              // values, nothing written outside the window.
              for (const WindowSource* src : {&a, &b})
                for (size_t skew : {size_t{0}, size_t{1}}) {
                  std::vector<float> vs(va.size() + 2 * skew + 1, -7.0f);
                  CopyWindow(*src, Transform{}, vs.data() + skew, /*stream=*/true);
                  ExpectSameFloats(va.data(), vs.data() + skew, va.size(),
                                   where + (src == &a ? " rows" : " tiles") + " streamed, skew " +
                                       std::to_string(skew));
                  EXPECT_EQ(vs.back(), -7.0f);
                  if (skew) {
                    EXPECT_EQ(vs[0], -7.0f);
                  }
                }
            }
      }
  }
}

// Each field's table converts by the fastest rule that gives Apply's bits
// for every stored value: through ConvertElement, through ConvertRun over
// all values at once, and through runs of every length 1..40 at offsets
// across the range (vector bodies, heads and tails, nothing written past a
// run). Range normalisation (computed in double) keeps the lookup.
TEST(Encodings, ValueTableRulesReproduceEveryValue) {
  using Rule = ValueTable::Rule;
  struct K {
    DType dtype;
    Normalization norm;
    Rule rule;
  };
  std::vector<K> ks;
  const Rule want[] = {Rule::kAffine, Rule::kAffine, Rule::kNonZero, Rule::kAffine, Rule::kAffine,
                       Rule::kAffine, Rule::kAffine, Rule::kLookup,  Rule::kLookup};
  for (size_t i = 0; i < Cases().size(); ++i) ks.push_back({Cases()[i].dtype, Cases()[i].norm, want[i]});
  ks.push_back({DType::kUInt8, Norm(NormKind::kAffine, 1.0 / 3, 0.1, true, 0.2, 50.5), Rule::kAffine});
  ks.push_back({DType::kInt16, Norm(NormKind::kUnit, 4095, 0), Rule::kAffine});
  ks.push_back({DType::kUInt16, Norm(NormKind::kBinary, 65535, 0), Rule::kNonZero});
  for (const K& k : ks) {
    SCOPED_TRACE(std::string(DTypeName(k.dtype)) + " " + k.norm.ToString());
    auto table = MakeValueTable(k.dtype, k.norm);
    EXPECT_EQ(table->rule, k.rule);
    VisitDType(k.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_integral_v<T>) {
        const int64_t lo = std::is_signed_v<T> ? -32768 : 0, count = int64_t{1} << (8 * sizeof(T));
        std::vector<T> all(static_cast<size_t>(count));
        std::vector<float> want_bits(all.size()), got(all.size() + 64);
        for (int64_t i = 0; i < count; ++i) {
          all[static_cast<size_t>(i)] = static_cast<T>(lo + i);
          want_bits[static_cast<size_t>(i)] = k.norm.Apply(static_cast<double>(lo + i));
          const float e = ConvertElement(all[static_cast<size_t>(i)], table.get());
          ASSERT_EQ(std::memcmp(&e, &want_bits[static_cast<size_t>(i)], 4), 0) << "value " << lo + i;
        }
        ConvertRun(all.data(), count, got.data(), table.get());
        ASSERT_EQ(std::memcmp(got.data(), want_bits.data(), want_bits.size() * 4), 0);
        for (int64_t n = 1; n <= 40; ++n)
          for (int64_t at = 0; at + n <= count; at += 997) {
            std::fill(got.begin(), got.end(), -7.0f);
            ConvertRun(all.data() + at, n, got.data() + 1, table.get());
            ASSERT_EQ(std::memcmp(got.data() + 1, want_bits.data() + at, static_cast<size_t>(n) * 4), 0)
                << "run of " << n << " at " << at;
            ASSERT_EQ(got[0], -7.0f);
            ASSERT_EQ(got[static_cast<size_t>(n) + 1], -7.0f) << "run of " << n << " wrote past its end";
          }
      }
    });
  }
}

TEST(Encodings, Float16RecordsReadAsTheirExactFloat32Values) {
  TempDir dir;
  const Normalization none = Norm(NormKind::kNone, 1, 0);
  auto ref = Reader::Open(WriteStore(dir, "ref.ps", DType::kUInt16, none, {DType::kFloat32, 0}, true)).value();
  for (uint16_t tile : {0, 16}) {
    auto r = Reader::Open(
                 WriteStore(dir, "h" + std::to_string(tile) + ".ps", DType::kUInt16, none, {DType::kFloat16, tile}))
                 .value();
    EXPECT_EQ(r->Get(0, 0)->dtype, DType::kFloat16);
    ExpectSameReads(*ref, *r);
    ExpectSameBatches(ref, r);
  }
}

TEST(Encodings, TiledViewsAreRowMajorCopiesOfTheStoredDType) {
  TempDir dir;
  const Normalization unit = Norm(NormKind::kUnit, 255, 0);
  auto r = Reader::Open(WriteStore(dir, "t.ps", DType::kUInt8, unit, {DType::kUInt8, 8})).value();
  TensorView v = r->Patch(1, 0, 3, 5, 10, 12).value();
  EXPECT_EQ(v.dtype, DType::kUInt8);
  EXPECT_EQ(v.shape[0], 3);
  EXPECT_TRUE(v.contiguous());
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t y = 0; y < 10; ++y)
      for (int64_t x = 0; x < 12; ++x)
        ASSERT_EQ(v.data_as<uint8_t>()[(c * 10 + y) * 12 + x], SourceValue(DType::kUInt8, 1, 0, c, 3 + y, 5 + x));
  // The table converts: value 255 -> 1.0f, 0 -> 0.0f (unit).
  EXPECT_EQ(v.lut->values[255], 1.0f);
  EXPECT_EQ(v.lut->values[0], 0.0f);
  EXPECT_EQ(v.lut->values[51], 51.0f / 255.0f);
  // A view outlives its Reader (it owns the copy and the table).
  r.reset();
  EXPECT_EQ(AsFloat32(v).data_as<float>()[0], unit.Apply(SourceValue(DType::kUInt8, 1, 0, 0, 3, 5)));
}

TEST(Encodings, WindowByteRangesOfATiledWindowAreOneRangePerTileRow) {
  TempDir dir;
  const Normalization none = Norm(NormKind::kNone, 1, 0);
  auto r = Reader::Open(WriteStore(dir, "t.ps", DType::kUInt16, none, {DType::kUInt16, 8})).value();
  // kW = 45: 6 tiles per tile row, 3 channels x 8 x 8 x 2 bytes = 384 bytes per tile.
  WindowSource s = r->Window(0, 0, 7, 9, 10, 16).value();  // rows 7..16: tile rows 0..2; cols 9..24: tiles 1..3
  auto ranges = WindowByteRanges(s);
  ASSERT_EQ(ranges.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(static_cast<const uint8_t*>(ranges[i].first), s.payload + (i * 6 + 1) * 384) << i;
    EXPECT_EQ(ranges[i].second, 3u * 384) << i;
  }
  WindowSource rows = r->Window(0, 0, 0, 0, 2, 4).value();
  rows.tile = 0;  // as a row record: one range per row per channel
  EXPECT_EQ(WindowByteRanges(rows).size(), 6u);
}

TEST(Encodings, CompactVolumesSliceBitIdenticalToFloat32) {
  TempDir dir;
  const Normalization affine = Norm(NormKind::kAffine, 0.5, -100);
  auto write = [&](const std::string& name, DType dtype) {
    const std::string path = dir / name;
    const int64_t S = 5, H = 9, W = 11;
    testing::StoreSpec spec;
    spec.kind = "volumes";
    spec.fields = {testing::StoreField{"ct"}};
    spec.fields[0].dtype = dtype;
    spec.fields[0].norm = affine;
    spec.fields[0].source_type = SourceType::kUnknown;
    spec.ids = {"v"};
    spec.depth = S;
    spec.height = H;
    spec.width = W;
    spec.value = [&](uint64_t, int, int64_t p, int64_t y, int64_t x) -> double {
      const uint64_t i = static_cast<uint64_t>((p * H + y) * W + x);
      const int16_t v = static_cast<int16_t>(static_cast<int32_t>(i * 2654435761u % 65536) - 32768);
      return dtype == DType::kInt16 ? static_cast<double>(v) : static_cast<double>(affine.Apply(v));
    };
    EXPECT_TRUE(testing::WriteStore(path, spec).ok());
    return Reader::Open(path).value();
  };
  auto ref = write("f.ps", DType::kFloat32), r = write("i.ps", DType::kInt16);
  EXPECT_EQ(Values(Volume(*ref, 0, 0).value()), Values(Volume(*r, 0, 0).value()));
  for (int64_t slice : {0, 2, 4}) {
    TensorView a = SliceStack(*ref, 0, 0, slice, 1).value(), b = SliceStack(*r, 0, 0, slice, 1).value();
    EXPECT_EQ(b.dtype, DType::kFloat32);
    EXPECT_EQ(Values(a), Values(b)) << slice;
    for (int rot = 0; rot < 4; ++rot) {
      SliceTransform t;
      t.y = 1;
      t.x = 2;
      t.height = 6;
      t.width = 6;
      t.flip_h = rot == 1;
      t.rot90 = rot;
      std::vector<float> fa(3 * 36), fb(fa.size(), -7.0f);
      ASSERT_TRUE(CopySliceStack(*ref, 0, 0, slice, 1, t, fa.data()).ok());
      ASSERT_TRUE(CopySliceStack(*r, 0, 0, slice, 1, t, fb.data()).ok());
      EXPECT_EQ(fa, fb) << slice << " rot " << rot;
    }
  }
  std::vector<SliceStackRequest> reqs(3);
  for (int i = 0; i < 3; ++i) reqs[i].slice = i;
  std::vector<float> fa(3 * 3 * 99), fb(fa.size(), -7.0f);
  ASSERT_TRUE(CopySliceStacks(*ref, reqs, 1, fa.data(), 2).ok());
  ASSERT_TRUE(CopySliceStacks(*r, reqs, 1, fb.data(), 2).ok());
  EXPECT_EQ(fa, fb);
  // Stored-dtype stacks (Output::kStored): int16 source values, cropped and
  // turned as the float32 stacks are, converting to those bit for bit.
  for (int i = 0; i < 3; ++i) {
    reqs[i].transform.y = i;
    reqs[i].transform.x = 1;
    reqs[i].transform.height = reqs[i].transform.width = 7;
    reqs[i].transform.flip_v = i == 1;
    reqs[i].transform.rot90 = i;
  }
  std::vector<float> fc(3 * 3 * 49);
  std::vector<int16_t> raw(fc.size() + 1, 12345);
  ASSERT_TRUE(CopySliceStacks(*ref, reqs, 1, fc.data(), 2).ok());
  ASSERT_TRUE(CopySliceStacks(*r, reqs, 1, raw.data(), Output::kStored, 2).ok());
  ASSERT_EQ(raw.back(), 12345) << "wrote past the stored output";
  for (size_t j = 0; j < fc.size(); ++j) {
    const float v = ConvertElement(raw[j], r->field_table(0));
    ASSERT_EQ(std::memcmp(&v, &fc[j], sizeof(float)), 0) << "element " << j;
  }
}

// The stores tests/python/test_encodings.py reads through the Python
// package: written into $PATCHSTORE_ENCODED_STORES_DIR when set (else into a
// scratch directory, and checked here).
TEST(EncodingFixtures, WritesTheStoresOfThePythonSuite) {
  TempDir scratch;
  const char* env = std::getenv("PATCHSTORE_ENCODED_STORES_DIR");
  const std::string dir = env && *env ? env : scratch.path();
  struct Out {
    const char* name;
    Encoding enc;
    DType source;
  };
  const Normalization sym = Norm(NormKind::kSymmetric, 255, 0), unit16 = Norm(NormKind::kUnit, 65535, 0);
  TempDir unused;
  for (const auto& o :
       {Out{"ref8.ps", {DType::kFloat32, 0}, DType::kUInt8}, Out{"u8_tiles16.ps", {DType::kUInt8, 16}, DType::kUInt8},
        Out{"u8_rows.ps", {DType::kUInt8, 0}, DType::kUInt8}, Out{"f32_tiles8.ps", {DType::kFloat32, 8}, DType::kUInt8},
        Out{"ref16.ps", {DType::kFloat32, 0}, DType::kUInt16},
        Out{"u16_tiles8.ps", {DType::kUInt16, 8}, DType::kUInt16}}) {
    const bool is16 = o.source == DType::kUInt16;
    const std::string written = WriteStore(unused, o.name, o.source, is16 ? unit16 : sym, o.enc);
    std::filesystem::rename(written, dir + "/" + o.name);
    auto r = Reader::Open(dir + "/" + o.name);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ((*r)->field(0).tile, o.enc.tile);
  }
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(EncodingDamage, ATiledRecordWithAFlippedTileByteIsRefusedNamingSampleAndField) {
  TempDir dir;
  const Normalization unit = Norm(NormKind::kUnit, 255, 0);
  const std::string path = WriteStore(dir, "t.ps", DType::kUInt8, unit, {DType::kUInt8, 8});
  const std::string data = path + "/data.mdb", good = ReadAll(data);
  // Every record header: flip each bit of the tile bytes (14, 15) of all of them.
  std::vector<size_t> headers;
  for (size_t at = good.find("PSR1"); at != std::string::npos; at = good.find("PSR1", at + 1)) headers.push_back(at);
  ASSERT_GE(headers.size(), kSamples * 2);
  for (int bit = 0; bit < 16; ++bit) {
    std::string bad = good;
    for (size_t h : headers) bad[h + 14 + bit / 8] ^= static_cast<char>(1 << (bit % 8));
    WriteAll(data, bad);
    auto r = Reader::Open(path);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto g = (*r)->Get(1, 0);
    ASSERT_FALSE(g.ok()) << bit;
    EXPECT_EQ(g.status().code(), Code::kCorruption);
    EXPECT_NE(g.status().message().find("'s/1' field 'rgb'"), std::string::npos) << g.status().message();
    float out[64];
    EXPECT_FALSE((*r)->CopyPatch(1, 0, 0, 0, 4, 4, out).ok());
  }
}

// Damaged or misplaced block counts are refused by name (reader)
// and listed by verify; they never decide a draw.
TEST(EncodingDamage, DamagedMaskBlockCountsAreRefusedAndListedByVerify) {
  TempDir dir;
  const Normalization binary = Norm(NormKind::kBinary, 255, 0);
  const std::string path = WriteStore(dir, "t.ps", DType::kUInt8, binary, {DType::kUInt8, 8});
  ASSERT_TRUE(VerifyStore(path).value().ok());
  const std::string data = path + "/data.mdb", good = ReadAll(data);
  std::vector<size_t> blocks;  // headers of layout BLOCKS (byte 10)
  for (size_t at = good.find("PSR1"); at != std::string::npos; at = good.find("PSR1", at + 1))
    if (good[at + 10] == static_cast<char>(Layout::kBlocks)) blocks.push_back(at);
  ASSERT_EQ(blocks.size(), kSamples);
  // One flipped byte of each table's body (entry (1, 1), 128 bytes after the
  // header start + 112): the body checksum disagrees.
  std::string bad = good;
  for (size_t h : blocks) bad[h + kRecordHeaderSize + 4 * 8] ^= 0x10;
  WriteAll(data, bad);
  {
    auto r = Reader::Open(path).value();
    auto v = r->MaskBlocks(1, 1);
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(v.status().code(), Code::kCorruption);
    EXPECT_NE(v.status().message().find("mask block counts of 's/1' field 'mask'"), std::string::npos)
        << v.status().message();
    SamplerOptions o;
    o.fields = {"rgb"};
    o.patch_size = 16;
    o.require = "mask";
    o.mask_index = MaskIndex::kWindows;
    auto sampler = PatchSampler::Create(r, o).value();
    std::vector<float> out(16 * 16 * 3 * 3);
    Status g = sampler->Gather(0, 0, 3, {out.data()});
    EXPECT_EQ(g.code(), Code::kCorruption) << g.ToString();
    auto rep = VerifyStore(path).value();
    ASSERT_EQ(rep.problems.size(), kSamples);
    for (const auto& p : rep.problems) EXPECT_EQ(p.field, "mask (block counts)");
  }
  // The counts of sample 0 replaced by sample 1's (a valid checksum, the
  // wrong values): verify recomputes them from the mask.
  {
    WriteAll(data, good);
    auto r = Reader::Open(path).value();
    const std::string zero = std::string(r->snapshot()->GetRecord(0, kAuxFieldBase + 1).value());
    const std::string one = std::string(r->snapshot()->GetRecord(1, kAuxFieldBase + 1).value());
    ASSERT_EQ(zero.size(), one.size());
    ASSERT_NE(zero, one);
    std::string swapped = good;
    const size_t at0 = good.find(zero);
    ASSERT_NE(at0, std::string::npos);
    swapped.replace(at0, one.size(), one);
    WriteAll(data, swapped);
    auto rep = VerifyStore(path).value();
    ASSERT_EQ(rep.problems.size(), 1u);
    EXPECT_EQ(rep.problems[0].id, "s/0");
    EXPECT_NE(rep.problems[0].message.find("mask block counts disagree with the mask"), std::string::npos)
        << rep.problems[0].message;
  }
}

// A store of uint8 binary masks in 16-pixel tiles, 70 x 90 (3 x 3 blocks of
// 32, the last ones cut), with or without mask block counts: `old` writes
// the field flagged as holding summed-area tables (so the writer gives it no
// block counts) and then clears the flag, which is what a store written
// before block counts existed looks like.
std::string WriteMaskOnlyStore(const TempDir& dir, const std::string& name, bool old) {
  const std::string path = dir / name;
  const int64_t H = 70, W = 90;
  {
    WriterOptions wo;
    wo.durable = false;
    auto w = Writer::Open(path, wo).value();
    FieldMeta fm;
    fm.name = "mask";
    fm.channels = 1;
    fm.dtype = DType::kUInt8;
    fm.tile = 16;
    fm.norm = Norm(NormKind::kBinary, 255, 0);
    fm.is_mask = true;
    fm.has_sat = old;
    EXPECT_TRUE(w->EnsureField(fm).ok());
    std::vector<SampleInput> batch;
    std::vector<std::vector<uint8_t>> bufs;
    for (uint64_t s = 0; s < 4; ++s) {
      std::vector<uint8_t> rows(H * W);
      for (int64_t i = 0; i < H * W; ++i)
        rows[i] = ((i * 7 + static_cast<int64_t>(s) * 13) % 11 < static_cast<int64_t>(s)) ? 255 : 0;
      const TileGrid g{1, H, W, 16};
      bufs.emplace_back(static_cast<size_t>(g.elements()));
      TileCHW(rows.data(), 1, g, bufs.back().data());
      SampleInput in;
      in.id = "m" + std::to_string(s);
      RecordInput r;
      r.header.dtype = DType::kUInt8;
      r.header.shape = {1, H, W, 0};
      r.header.tile = 16;
      r.header.norm = fm.norm;
      r.data = bufs.back().data();
      in.records = {r};
      batch.push_back(std::move(in));
    }
    EXPECT_TRUE(w->WriteBatch(batch).ok());
    if (old) {
      w->mutable_meta().fields[0].has_sat = false;
      EXPECT_TRUE(w->CommitMeta().ok());
    }
    EXPECT_TRUE(w->Seal().ok());
  }
  return path;
}

TEST(MaskBlockCounts, UpgradeGivesAStoreWrittenBeforeThemTheCountsIngestWrites) {
  TempDir dir;
  const std::string ref = WriteMaskOnlyStore(dir, "new.ps", false), old = WriteMaskOnlyStore(dir, "old.ps", true);
  {
    auto r = Reader::Open(old).value();
    EXPECT_EQ(r->MaskBlockEdge(0, 0), 0u);
    EXPECT_EQ(r->MaskBlocks(0, 0).status().code(), Code::kNotFound);
    ASSERT_TRUE(VerifyStore(old).value().ok());
  }
  // Stopped after its first transaction (3 of the 4 samples): the tables
  // written so far are there but unused (no mask_blocks yet), and verify
  // calls them stale.
  auto stopped = AddMaskBlocks(
      old, [](uint64_t, uint64_t) { return false; }, 3);
  ASSERT_EQ(stopped.status().code(), Code::kAborted);
  EXPECT_NE(stopped.status().message().find("stopped after 3 of 4 samples"), std::string::npos)
      << stopped.status().message();
  EXPECT_EQ(Reader::Open(old).value()->MaskBlocks(0, 0).status().code(), Code::kNotFound);
  {
    auto rep = VerifyStore(old).value();
    ASSERT_EQ(rep.problems.size(), 3u);
    EXPECT_NE(rep.problems[2].message.find("`patchstore upgrade` was interrupted"), std::string::npos)
        << rep.problems[2].message;
  }
  // Run again to the end, in transactions of 3 samples: progress after each.
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  auto added = AddMaskBlocks(
      old, [&](uint64_t done, uint64_t total) { return calls.emplace_back(done, total), true; }, 3);
  ASSERT_TRUE(added.ok()) << added.status().ToString();
  EXPECT_EQ(*added, std::vector<std::string>{"mask"});
  EXPECT_EQ(calls, (std::vector<std::pair<uint64_t, uint64_t>>{{3, 4}, {4, 4}}));
  EXPECT_TRUE(AddMaskBlocks(old).value().empty());  // nothing left to do
  auto a = Reader::Open(ref).value(), b = Reader::Open(old).value();
  ASSERT_EQ(b->size(), 4u);
  EXPECT_EQ(b->MaskBlockEdge(0, 0), kDefaultMaskBlock);
  for (uint64_t s = 0; s < 4; ++s) {
    const MaskBlocksView x = a->MaskBlocks(s, 0).value(), y = b->MaskBlocks(s, 0).value();
    ASSERT_EQ(std::make_tuple(x.B, x.by, x.bx), std::make_tuple(int64_t{32}, int64_t{3}, int64_t{3}));
    ASSERT_EQ(std::make_tuple(y.B, y.by, y.bx), std::make_tuple(x.B, x.by, x.bx));
    EXPECT_EQ(std::vector<uint32_t>(x.data, x.data + 16), std::vector<uint32_t>(y.data, y.data + 16)) << s;
    EXPECT_EQ(static_cast<uint64_t>(y.data[15]), b->Summary(s, 0)->valid_count) << s;  // the whole mask
  }
  EXPECT_GT(a->MaskBlocks(3, 0)->data[15], 0u);
  auto rep = VerifyStore(old).value();
  EXPECT_TRUE(rep.ok()) << (rep.problems.empty() ? "" : rep.problems[0].message);

  // An older writer appending to the store rewrites its metadata without
  // the mask_blocks key and leaves the records: verify calls them stale,
  // readers count again, and upgrade rewrites them.
  {
    WriterOptions wo;
    wo.durable = false;
    auto w = Writer::Open(ref, wo).value();
    w->mutable_meta().fields[0].mask_blocks = 0;
    ASSERT_TRUE(w->CommitMeta().ok());
  }
  rep = VerifyStore(ref).value();
  ASSERT_EQ(rep.problems.size(), 4u);
  EXPECT_NE(rep.problems[0].message.find("stale mask block counts"), std::string::npos) << rep.problems[0].message;
  EXPECT_EQ(Reader::Open(ref).value()->MaskBlocks(0, 0).status().code(), Code::kNotFound);
  EXPECT_EQ(AddMaskBlocks(ref).value(), std::vector<std::string>{"mask"});
  rep = VerifyStore(ref).value();
  EXPECT_TRUE(rep.ok()) << (rep.problems.empty() ? "" : rep.problems[0].message);
  auto c = Reader::Open(ref).value();
  for (uint64_t s = 0; s < 4; ++s) {
    const MaskBlocksView x = c->MaskBlocks(s, 0).value(), y = b->MaskBlocks(s, 0).value();
    EXPECT_EQ(std::vector<uint32_t>(x.data, x.data + 16), std::vector<uint32_t>(y.data, y.data + 16)) << s;
  }
}

TEST(EncodingDamage, ARawSourceRecordWhoseNormalisationDisagreesWithItsFieldIsRefused) {
  TempDir dir;
  const Normalization unit = Norm(NormKind::kUnit, 255, 0);
  const std::string path = WriteStore(dir, "t.ps", DType::kUInt8, unit, {DType::kUInt8, 16});
  {
    // The field's normalisation changes afterwards: every record disagrees.
    WriterOptions wo;
    wo.durable = false;
    auto w = Writer::Open(path, wo).value();
    w->mutable_meta().fields[0].norm = Norm(NormKind::kSymmetric, 255, 0);
    ASSERT_TRUE(w->CommitMeta().ok());
  }
  auto r = Reader::Open(path).value();
  for (Status st : {r->Get(2, 0).status(), r->Patch(2, 0, 0, 0, 4, 4).status(), r->Window(2, 0, 0, 0, 4, 4).status()}) {
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), Code::kCorruption);
    EXPECT_NE(st.message().find("'s/2' field 'rgb'"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("normalisation disagrees"), std::string::npos) << st.message();
  }
  EXPECT_TRUE(r->Get(2, 1).ok());  // the mask field still agrees
}

}  // namespace
}  // namespace patchstore
