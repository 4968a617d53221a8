// HDF5 volume ingest: bit-exact slices for every layout and type, every
// error case, external data refused, resume, ids, CLI.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "ingest/hdf5_test_util.h"
#include "patchstore/ingest/ingest_hdf5.h"
#include "patchstore/reader/reader.h"
#include "patchstore/reader/verify.h"
#include "patchstore/reader/volume.h"
#include "store/shard.h"
#include "test_util.h"

namespace patchstore {
namespace {

namespace fs = std::filesystem;
using testing::CompareVolume;
using testing::H5Out;
using testing::RandomValues;
using testing::RunCommand;
using testing::TempDir;

using Dims = std::array<hsize_t, 3>;

size_t Count(const Dims& d) { return d[0] * d[1] * d[2]; }
std::vector<hsize_t> V(const Dims& d) { return {d[0], d[1], d[2]}; }

Hdf5IngestOptions Options(const std::vector<std::string>& files, const std::string& store,
                          const std::vector<std::string>& groups) {
  Hdf5IngestOptions o;
  o.files = files;
  o.store = store;
  o.groups = groups;
  o.durable = false;
  return o;
}

std::shared_ptr<Reader> Open(const std::string& store) {
  auto r = Reader::Open(store);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : nullptr;
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string ReadText(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The seed's layout: groups MR, CT, MASK; (H, W, S) int16/int16/uint8,
// gzip-chunked, two patients of different sizes.
struct SeedFile {
  Dims d1{20, 24, 10}, d2{9, 13, 7};
  std::vector<int16_t> mr1, ct1, mr2, ct2;
  std::vector<uint8_t> m1, m2;
  void Write(const std::string& path) {
    mr1 = RandomValues<int16_t>(Count(d1), 1, -1000, 3000);
    ct1 = RandomValues<int16_t>(Count(d1), 2, -1024, 3071);
    m1 = RandomValues<uint8_t>(Count(d1), 3, 0, 3);
    mr2 = RandomValues<int16_t>(Count(d2), 4, -1000, 3000);
    ct2 = RandomValues<int16_t>(Count(d2), 5, -1024, 3071);
    m2 = RandomValues<uint8_t>(Count(d2), 6, 0, 3);
    H5Out f(path);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f.Write("MR/patient001", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d1), mr1.data(), {8, 8, 4}, 4, true));
    ASSERT_TRUE(f.Write("CT/patient001", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d1), ct1.data(), {20, 24, 3}, 6));
    ASSERT_TRUE(f.Write("MASK/patient001", H5T_STD_U8LE, H5T_NATIVE_UINT8, V(d1), m1.data()));
    ASSERT_TRUE(f.Write("MR/patient002", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d2), mr2.data(), {4, 5, 7}, 1));
    ASSERT_TRUE(f.Write("CT/patient002", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d2), ct2.data(), {9, 13, 1}, 9, true));
    ASSERT_TRUE(f.Write("MASK/patient002", H5T_STD_U8LE, H5T_NATIVE_UINT8, V(d2), m2.data(), {3, 3, 3}, 1));
  }
  void Check(const Reader& r) const {
    EXPECT_EQ(CompareVolume(r, "patient001", "MR", mr1, d1, 2), "");
    EXPECT_EQ(CompareVolume(r, "patient001", "CT", ct1, d1, 2), "");
    EXPECT_EQ(CompareVolume(r, "patient001", "MASK", m1, d1, 2), "");
    EXPECT_EQ(CompareVolume(r, "patient002", "MR", mr2, d2, 2), "");
    EXPECT_EQ(CompareVolume(r, "patient002", "CT", ct2, d2, 2), "");
    EXPECT_EQ(CompareVolume(r, "patient002", "MASK", m2, d2, 2), "");
  }
};

class Hdf5IngestTest : public ::testing::Test {
 protected:
  TempDir dir_;
};

TEST_F(Hdf5IngestTest, HwsGzipSourcesGiveBitExactSlices) {
  SeedFile seed;
  seed.Write(dir_ / "seed.h5");
  // Default slabs, then one chunk row per slab (every slab boundary case).
  for (uint64_t slab : {uint64_t{64} << 20, uint64_t{1}}) {
    const std::string store = dir_ / ("s" + std::to_string(slab) + ".ps");
    auto o = Options({dir_ / "seed.h5"}, store, {"MR", "CT", "MASK"});
    o.slab_bytes = slab;
    std::vector<Progress> progress;
    o.progress = [&](const Progress& p) { progress.push_back(p); };
    auto r = IngestHdf5(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->samples_total, 2u);
    EXPECT_EQ(r->samples_written, 2u);
    EXPECT_EQ(r->samples_failed, 0u);
    EXPECT_EQ(r->bytes_written, (Count(seed.d1) + Count(seed.d2)) * 4 * 3);
    ASSERT_FALSE(progress.empty());
    EXPECT_EQ(progress.back().done, 2u);
    EXPECT_EQ(progress.back().total, 2u);
    auto reader = Open(store);
    ASSERT_TRUE(reader);
    const StoreMeta& m = reader->meta();
    EXPECT_EQ(m.kind, "volumes");
    EXPECT_TRUE(m.sealed);
    EXPECT_EQ(m.attributes.at("slice_axis"), "2");
    EXPECT_EQ(m.attributes.at("hdf5_group.CT"), "CT");
    ASSERT_EQ(m.fields.size(), 3u);
    EXPECT_EQ(m.fields[0].name, "MR");
    EXPECT_EQ(m.fields[2].name, "MASK");
    for (const FieldMeta& f : m.fields) {
      EXPECT_EQ(f.channels, 1u);
      EXPECT_EQ(f.layout, Layout::kSHW);
      EXPECT_EQ(f.source_format, "hdf5");
      EXPECT_FALSE(f.is_mask);  // a group named MASK keeps its labels
      EXPECT_EQ(f.norm.kind, NormKind::kNone);
    }
    EXPECT_EQ(m.fields[0].source_type, SourceType::kInt16);
    EXPECT_EQ(m.fields[2].source_type, SourceType::kUInt8);
    EXPECT_EQ(reader->id(0), "patient001");
    auto h = reader->Header(1, 2);
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(h->layout, Layout::kSHW);
    EXPECT_EQ(h->source_type, SourceType::kUInt8);
    EXPECT_EQ(h->shape[0], 7u);
    EXPECT_EQ(h->shape[1], 9u);
    EXPECT_EQ(h->shape[2], 13u);
    seed.Check(*reader);
    auto ix = SliceIndex::Build(*reader);
    ASSERT_TRUE(ix.ok());
    EXPECT_EQ(ix->size(), 17u);
    auto v = VerifyStore(store);
    ASSERT_TRUE(v.ok());
    EXPECT_TRUE(v->ok());
  }
}

TEST_F(Hdf5IngestTest, AnySliceAxis) {
  const Dims shw{6, 11, 13}, hsw{11, 6, 13};
  auto a = RandomValues<float>(Count(shw), 10, -5, 5);
  auto b = RandomValues<float>(Count(hsw), 11, -5, 5);
  a[3] = std::numeric_limits<float>::quiet_NaN();
  a[4] = -0.0f;
  a[5] = std::numeric_limits<float>::denorm_min();
  {
    H5Out f(dir_ / "shw.h5");
    // The seed's advice: (S, H, W) with one chunk per slice.
    ASSERT_TRUE(f.Write("MR/p", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, V(shw), a.data(), {1, 11, 13}, 4));
    ASSERT_TRUE(f.Write("CT/p", H5T_IEEE_F32BE, H5T_NATIVE_FLOAT, V(shw), a.data(), {2, 4, 13}));
    H5Out g(dir_ / "hsw.h5");
    ASSERT_TRUE(g.Write("MR/p", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, V(hsw), b.data(), {11, 2, 13}, 1));
    ASSERT_TRUE(g.Write("CT/p", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, V(hsw), b.data()));
  }
  for (uint64_t slab : {uint64_t{64} << 20, uint64_t{1}}) {
    auto o = Options({dir_ / "shw.h5"}, dir_ / ("a" + std::to_string(slab)), {"MR", "CT"});
    o.slice_axis = 0;
    o.slab_bytes = slab;
    auto r = IngestHdf5(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto reader = Open(o.store);
    EXPECT_EQ(reader->meta().attributes.at("slice_axis"), "0");
    EXPECT_EQ(CompareVolume(*reader, "p", "MR", a, shw, 0), "");
    EXPECT_EQ(CompareVolume(*reader, "p", "CT", a, shw, 0), "");
    // The same source sliced along axis 1 (-2).
    o.files = {dir_ / "hsw.h5"};
    o.store = dir_ / ("b" + std::to_string(slab));
    o.slice_axis = -2;
    r = IngestHdf5(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    reader = Open(o.store);
    EXPECT_EQ(reader->meta().attributes.at("slice_axis"), "1");
    EXPECT_EQ(CompareVolume(*reader, "p", "MR", b, hsw, 1), "");
    EXPECT_EQ(CompareVolume(*reader, "p", "CT", b, hsw, 1), "");
  }
  auto o = Options({dir_ / "shw.h5"}, dir_ / "c", {"MR"});
  o.slice_axis = 3;
  EXPECT_EQ(IngestHdf5(o).status().code(), Code::kInvalidArgument);
}

TEST_F(Hdf5IngestTest, AnyNumericTypeBecomesFloat32) {
  const Dims d{5, 6, 4};
  const size_t n = Count(d);
  auto i8 = RandomValues<int8_t>(n, 20, -128, 127);
  auto u16 = RandomValues<uint16_t>(n, 21, 0, 65535);
  auto i32 = RandomValues<int32_t>(n, 22, -2e9, 2e9);
  auto u32 = RandomValues<uint32_t>(n, 23, 0, 4e9);
  auto i64 = RandomValues<int64_t>(n, 24, -9e18, 9e18);
  auto u64 = RandomValues<uint64_t>(n, 25, 0, 1.8e19);
  auto f64 = RandomValues<double>(n, 26, -1e6, 1e6);
  f64[0] = 1e300;  // overflows float32: +inf, as NumPy's astype
  f64[1] = 0.1;    // rounds to nearest
  f64[2] = std::numeric_limits<double>::quiet_NaN();
  std::vector<int8_t> flags(n);
  for (size_t i = 0; i < n; ++i) flags[i] = (i * 7) % 3 == 0;
  {
    H5Out f(dir_ / "types.h5");
    ASSERT_TRUE(f.Write("i8/p", H5T_STD_I8LE, H5T_NATIVE_INT8, V(d), i8.data(), {5, 6, 1}, 1));
    ASSERT_TRUE(f.Write("u16be/p", H5T_STD_U16BE, H5T_NATIVE_UINT16, V(d), u16.data()));
    ASSERT_TRUE(f.Write("i32/p", H5T_STD_I32LE, H5T_NATIVE_INT32, V(d), i32.data(), {2, 2, 2}, 1, true));
    ASSERT_TRUE(f.Write("u32/p", H5T_STD_U32LE, H5T_NATIVE_UINT32, V(d), u32.data()));
    ASSERT_TRUE(f.Write("i64/p", H5T_STD_I64BE, H5T_NATIVE_INT64, V(d), i64.data()));
    ASSERT_TRUE(f.Write("u64/p", H5T_STD_U64LE, H5T_NATIVE_UINT64, V(d), u64.data()));
    ASSERT_TRUE(f.Write("f64/p", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, V(d), f64.data(), {5, 6, 2}, 3));
    // h5py's bool: an enum of int8 {FALSE: 0, TRUE: 1}.
    hid_t e = H5Tenum_create(H5T_NATIVE_INT8);
    int8_t v0 = 0, v1 = 1;
    H5Tenum_insert(e, "FALSE", &v0);
    H5Tenum_insert(e, "TRUE", &v1);
    ASSERT_TRUE(f.Write("bool/p", e, e, V(d), flags.data()));
    H5Tclose(e);
  }
  auto o = Options({dir_ / "types.h5"}, dir_ / "t.ps", {"i8", "u16be", "i32", "u32", "i64", "u64", "f64", "bool"});
  auto r = IngestHdf5(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Not silent: the 32/64-bit integers above 2^24 that float32 rounds, and
  // the float64 value beyond float32 stored as inf, are reported once each.
  std::vector<std::string> rounded, beyond;
  for (const std::string& w : r->warnings) {
    if (w.find("exceed 2^24 = 16777216 and are rounded") != std::string::npos) rounded.push_back(w.substr(0, 30));
    if (w.find("its float64 value 1e+300 is beyond float32") != std::string::npos) beyond.push_back(w);
  }
  EXPECT_EQ(rounded, (std::vector<std::string>{"dataset 'p' in group 'i32' of ", "dataset 'p' in group 'u32' of ",
                                               "dataset 'p' in group 'i64' of ", "dataset 'p' in group 'u64' of "}));
  EXPECT_EQ(beyond.size(), 1u);
  auto reader = Open(o.store);
  EXPECT_EQ(CompareVolume(*reader, "p", "i8", i8, d, 2), "");
  EXPECT_EQ(CompareVolume(*reader, "p", "u16be", u16, d, 2), "");
  EXPECT_EQ(CompareVolume(*reader, "p", "i32", i32, d, 2), "");
  EXPECT_EQ(CompareVolume(*reader, "p", "u32", u32, d, 2), "");
  EXPECT_EQ(CompareVolume(*reader, "p", "i64", i64, d, 2), "");
  EXPECT_EQ(CompareVolume(*reader, "p", "u64", u64, d, 2), "");
  EXPECT_EQ(CompareVolume(*reader, "p", "f64", f64, d, 2), "");
  EXPECT_EQ(CompareVolume(*reader, "p", "bool", flags, d, 2), "");
  EXPECT_TRUE(std::isinf(reader->Get(0, 6)->data_as<float>()[0]));
  const SourceType want[] = {SourceType::kInt8,  SourceType::kUInt16, SourceType::kInt32,   SourceType::kUInt32,
                             SourceType::kInt64, SourceType::kUInt64, SourceType::kFloat64, SourceType::kInt8};
  for (int f = 0; f < 8; ++f) EXPECT_EQ(reader->field(f).source_type, want[f]) << reader->field(f).name;
}

TEST_F(Hdf5IngestTest, NormalisationAndMasksOnRequest) {
  const Dims d{8, 9, 5};
  auto mr = RandomValues<uint8_t>(Count(d), 30, 0, 256);
  auto ct = RandomValues<int16_t>(Count(d), 31, -1500, 1500);
  auto mask = RandomValues<uint8_t>(Count(d), 32, 0, 3);
  {
    H5Out f(dir_ / "n.h5");
    ASSERT_TRUE(f.Write("MR/p", H5T_STD_U8LE, H5T_NATIVE_UINT8, V(d), mr.data(), {8, 9, 2}, 2));
    ASSERT_TRUE(f.Write("CT/p", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), ct.data(), {4, 9, 5}, 2));
    ASSERT_TRUE(f.Write("MASK/p", H5T_STD_U8LE, H5T_NATIVE_UINT8, V(d), mask.data()));
  }
  auto o = Options({dir_ / "n.h5"}, dir_ / "n.ps", {"MR", "CT", "MASK=mask"});
  o.norm["MR"] = "symmetric";
  o.norm["CT"] = "affine:0.001,0+clamp:-1,1";
  o.mask_fields = {"mask"};
  auto r = IngestHdf5(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto reader = Open(o.store);
  const Normalization sym = *ParseNormalization("symmetric", 255);
  const Normalization aff = *ParseNormalization("affine:0.001,0+clamp:-1,1", 0);
  EXPECT_EQ(CompareVolume<uint8_t>(*reader, "p", "MR", mr, d, 2, [&](uint8_t x) { return sym.Apply(x); }), "");
  EXPECT_EQ(CompareVolume<int16_t>(*reader, "p", "CT", ct, d, 2, [&](int16_t x) { return aff.Apply(x); }), "");
  EXPECT_EQ(CompareVolume<uint8_t>(*reader, "p", "mask", mask, d, 2, [](uint8_t x) { return x ? 1.f : 0.f; }), "");
  EXPECT_TRUE(reader->field(2).is_mask);
  EXPECT_EQ(reader->field(2).norm.kind, NormKind::kBinary);
  EXPECT_EQ(reader->Header(0, 1)->norm, aff);
  EXPECT_EQ(reader->meta().attributes.at("hdf5_group.mask"), "MASK");

  // symmetric needs a uint8/uint16 source: an error naming the dataset.
  auto bad = Options({dir_ / "n.h5"}, dir_ / "bad.ps", {"MR", "CT"});
  bad.norm["CT"] = "symmetric";
  auto e = IngestHdf5(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(Contains(e.status().message(), "dataset 'p' in group 'CT'")) << e.status().message();
  EXPECT_TRUE(Contains(e.status().message(), "uint8 or uint16")) << e.status().message();
  bad.norm["CT"] = "cubic";
  EXPECT_EQ(IngestHdf5(bad).status().code(), Code::kInvalidArgument);
  bad.norm.clear();
  bad.mask_fields = {"MASK"};  // not a field of this ingest
  EXPECT_EQ(IngestHdf5(bad).status().code(), Code::kInvalidArgument);
}

// Three patients; p2 lacks a CT. Stop: p1 committed, error names the file,
// the group and the dataset. Skip: p1 and p3, p2 in the report.
TEST_F(Hdf5IngestTest, PatientMissingFromOneGroup) {
  const Dims d{4, 5, 3};
  auto x = RandomValues<int16_t>(Count(d), 40, 0, 100);
  const std::string file = dir_ / "m.h5";
  {
    H5Out f(file);
    for (const char* p : {"p1", "p2", "p3"}) {
      ASSERT_TRUE(f.Write(std::string("MR/") + p, H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), x.data()));
      if (std::string(p) != "p2") {
        ASSERT_TRUE(f.Write(std::string("CT/") + p, H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), x.data()));
      }
    }
  }
  auto o = Options({file}, dir_ / "stop.ps", {"MR", "CT"});
  auto r = IngestHdf5(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  const std::string msg = r.status().message();
  EXPECT_TRUE(Contains(msg, "dataset 'p2' in group 'CT' of '" + file + "'")) << msg;
  EXPECT_TRUE(Contains(msg, "missing (present in group 'MR')")) << msg;
  EXPECT_TRUE(Contains(msg, "stopped after 1 new volumes")) << msg;
  auto reader = Open(o.store);
  EXPECT_EQ(reader->size(), 1u);
  EXPECT_FALSE(reader->sealed());

  o.store = dir_ / "skip.ps";
  o.skip_errors = true;
  r = IngestHdf5(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->samples_written, 2u);
  EXPECT_EQ(r->samples_failed, 1u);
  EXPECT_EQ(r->report_path, o.store + "/ingest-errors.tsv");
  const std::string report = ReadText(r->report_path);
  EXPECT_EQ(report.rfind("p2\t" + file + "\treading dataset 'p2' in group 'CT'", 0), 0u) << report;
  reader = Open(o.store);
  EXPECT_EQ(reader->size(), 2u);
  EXPECT_EQ(reader->id(1), "p3");
  EXPECT_FALSE(reader->sealed());
}

TEST_F(Hdf5IngestTest, ShapeRankAndTypeErrorsNameTheDataset) {
  const Dims d{4, 5, 3}, e{4, 5, 2};
  auto x = RandomValues<int16_t>(Count(d), 41, 0, 100);
  const std::string file = dir_ / "bad.h5";
  {
    H5Out f(file);
    ASSERT_TRUE(f.Write("MR/shape", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), x.data()));
    ASSERT_TRUE(f.Write("CT/shape", H5T_STD_I16LE, H5T_NATIVE_INT16, V(e), x.data()));
    ASSERT_TRUE(f.Write("MR/rank", H5T_STD_I16LE, H5T_NATIVE_INT16, {20, 3}, x.data()));
    ASSERT_TRUE(f.Write("CT/rank", H5T_STD_I16LE, H5T_NATIVE_INT16, {20, 3}, x.data()));
    hid_t str = H5Tcopy(H5T_C_S1);
    H5Tset_size(str, 4);
    std::vector<char> text(Count(d) * 4, 'a');
    ASSERT_TRUE(f.Write("MR/text", str, str, V(d), text.data()));
    ASSERT_TRUE(f.Write("CT/text", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), x.data()));
    H5Tclose(str);
    ASSERT_TRUE(f.Write("MR/zgood", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), x.data()));
    ASSERT_TRUE(f.Write("CT/zgood", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), x.data()));
  }
  auto o = Options({file}, dir_ / "s.ps", {"MR", "CT"});
  o.skip_errors = true;
  auto r = IngestHdf5(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->samples_written, 1u);
  EXPECT_EQ(r->samples_failed, 3u);
  ASSERT_EQ(r->errors.size(), 3u);
  // Volumes in name order: rank, shape, text.
  EXPECT_TRUE(Contains(r->errors[0], "reading dataset 'rank' in group 'MR' of '" + file + "': rank 2 (shape 20x3)"))
      << r->errors[0];
  EXPECT_TRUE(Contains(r->errors[1],
                       "dataset 'shape' in group 'CT' of '" + file + "': shape 4x5x2 differs from 4x5x3 in group 'MR'"))
      << r->errors[1];
  EXPECT_TRUE(Contains(r->errors[2], "dataset 'text' in group 'MR'")) << r->errors[2];
  EXPECT_TRUE(Contains(r->errors[2], "type string is not numeric")) << r->errors[2];
  o.skip_errors = false;
  o.store = dir_ / "t.ps";
  EXPECT_EQ(IngestHdf5(o).status().code(), Code::kInvalidArgument);
}

// Damaged files: not HDF5, truncated, a flipped byte inside a compressed
// chunk (found only while streaming).
TEST_F(Hdf5IngestTest, CorruptFilesAreErrorsNotCrashes) {
  const Dims d{16, 16, 8};
  auto x = RandomValues<int16_t>(Count(d), 42, -1000, 1000);
  const std::string file = dir_ / "c.h5";
  {
    H5Out f(file);
    for (const char* p : {"p1", "p2", "p3"})
      for (const char* g : {"MR", "CT"})
        ASSERT_TRUE(f.Write(std::string(g) + "/" + p, H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), x.data(), {8, 8, 4}, 6));
  }
  // Where is the first chunk of /CT/p2 stored?
  haddr_t addr = 0;
  hsize_t size = 0;
  {
    hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, "/CT/p2", H5P_DEFAULT);
    hsize_t offset[3];
    unsigned mask = 0;
    hid_t space = H5Dget_space(ds);
    ASSERT_GE(H5Dget_chunk_info(ds, space, 0, offset, &mask, &addr, &size), 0);
    H5Sclose(space);
    H5Dclose(ds);
    H5Fclose(f);
  }
  ASSERT_GT(size, 16u);
  fs::copy_file(file, dir_ / "flip.h5");
  {
    std::fstream f(dir_ / "flip.h5", std::ios::in | std::ios::out | std::ios::binary);
    for (hsize_t i = size / 4; i < size / 4 + 8; ++i) {
      f.seekg(static_cast<std::streamoff>(addr + i));
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x5a);
      f.seekp(static_cast<std::streamoff>(addr + i));
      f.write(&c, 1);
    }
  }
  auto o = Options({dir_ / "flip.h5"}, dir_ / "stop.ps", {"MR", "CT"});
  auto r = IngestHdf5(o);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "dataset 'p2' in group 'CT' of '" + (dir_ / "flip.h5") + "'"))
      << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), "stopped after 1 new volumes")) << r.status().message();
  EXPECT_EQ(Open(o.store)->size(), 1u);
  o.store = dir_ / "skip.ps";
  o.skip_errors = true;
  r = IngestHdf5(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->samples_written, 2u);
  EXPECT_EQ(r->samples_failed, 1u);
  auto reader = Open(o.store);
  ASSERT_EQ(reader->size(), 2u);
  EXPECT_EQ(reader->id(0), "p1");
  EXPECT_EQ(reader->id(1), "p3");
  EXPECT_EQ(CompareVolume(*reader, "p3", "CT", x, d, 2), "");

  // Truncated to half: the file cannot be opened.
  fs::copy_file(file, dir_ / "trunc.h5");
  ASSERT_EQ(::truncate((dir_ / "trunc.h5").c_str(), static_cast<off_t>(fs::file_size(file) / 2)), 0);
  o = Options({dir_ / "trunc.h5"}, dir_ / "t.ps", {"MR", "CT"});
  r = IngestHdf5(o);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "opening HDF5 file '" + (dir_ / "trunc.h5") + "': HDF5: "))
      << r.status().message();
  // Not HDF5 at all; a missing file; skip mode records one line per file.
  std::ofstream(dir_ / "text.h5") << "hello, not hdf5\n";
  o = Options({dir_ / "text.h5", dir_ / "none.h5", file}, dir_ / "x.ps", {"MR", "CT"});
  r = IngestHdf5(o);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "opening HDF5 file '" + (dir_ / "text.h5") + "'"));
  o.skip_errors = true;
  r = IngestHdf5(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->samples_failed, 2u);
  EXPECT_EQ(r->samples_written, 3u);
  EXPECT_TRUE(Contains(r->errors[1], "no such file")) << r->errors[1];
  EXPECT_EQ(Open(o.store)->id(0), "c/p1");  // several files: ids carry the stem
}

TEST_F(Hdf5IngestTest, ExternalLinksRefusedUnlessAllowed) {
  const Dims d{4, 5, 3};
  auto x = RandomValues<int16_t>(Count(d), 43, 0, 100);
  {
    H5Out other(dir_ / "other.h5");
    ASSERT_TRUE(other.Write("MR/p1", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), x.data()));
    H5Out f(dir_ / "main.h5");
    ASSERT_TRUE(f.Group("MR"));
    ASSERT_GE(H5Lcreate_external((dir_ / "other.h5").c_str(), "/MR/p1", f.id(), "/MR/p1", H5P_DEFAULT, H5P_DEFAULT), 0);
    ASSERT_TRUE(f.Write("CT/p1", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), x.data()));
    // A group that is itself an external link.
    ASSERT_GE(H5Lcreate_external((dir_ / "other.h5").c_str(), "/MR", f.id(), "/EXT", H5P_DEFAULT, H5P_DEFAULT), 0);
    // A soft link inside the file is fine.
    ASSERT_GE(H5Lcreate_soft("/CT/p1", f.id(), "/SOFT", H5P_DEFAULT, H5P_DEFAULT), 0);
  }
  auto o = Options({dir_ / "main.h5"}, dir_ / "a.ps", {"MR", "CT"});
  auto r = IngestHdf5(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnsupported);
  EXPECT_TRUE(Contains(r.status().message(), "dataset 'p1' in group 'MR'")) << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), "external link to '" + (dir_ / "other.h5") + ":/MR/p1'"))
      << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), "--allow-external")) << r.status().message();
  o.store = dir_ / "b.ps";
  o.groups = {"EXT=MR", "CT"};
  r = IngestHdf5(o);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "opening group 'EXT'")) << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), "external link")) << r.status().message();

  for (auto groups : {std::vector<std::string>{"MR", "CT"}, std::vector<std::string>{"EXT=MR", "CT"}}) {
    o.store = dir_ / ("ok" + groups[0].substr(0, 2));
    o.groups = groups;
    o.allow_external = true;
    r = IngestHdf5(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto reader = Open(o.store);
    EXPECT_EQ(CompareVolume(*reader, "p1", "MR", x, d, 2), "");
    EXPECT_EQ(CompareVolume(*reader, "p1", "CT", x, d, 2), "");
  }
}

TEST_F(Hdf5IngestTest, SoftLinksInsideTheFileAreFollowed) {
  const Dims d{4, 5, 3};
  auto x = RandomValues<int16_t>(Count(d), 44, 0, 100);
  {
    H5Out f(dir_ / "s.h5");
    ASSERT_TRUE(f.Write("data/ct_p1", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), x.data()));
    ASSERT_TRUE(f.Write("MR/p1", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), x.data()));
    ASSERT_TRUE(f.Group("CT"));
    ASSERT_GE(H5Lcreate_soft("/data/ct_p1", f.id(), "/CT/p1", H5P_DEFAULT, H5P_DEFAULT), 0);
    ASSERT_GE(H5Lcreate_soft("/nowhere", f.id(), "/CT/p2", H5P_DEFAULT, H5P_DEFAULT), 0);
    ASSERT_TRUE(f.Write("MR/p2", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), x.data()));
    ASSERT_TRUE(f.Group("MR/subgroup_is_not_a_volume"));
  }
  auto o = Options({dir_ / "s.h5"}, dir_ / "s.ps", {"MR", "CT"});
  o.skip_errors = true;
  auto r = IngestHdf5(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->samples_total, 2u);
  EXPECT_EQ(r->samples_written, 1u);
  ASSERT_EQ(r->errors.size(), 1u);
  EXPECT_TRUE(Contains(r->errors[0], "dataset 'p2' in group 'CT'")) << r->errors[0];
  EXPECT_TRUE(Contains(r->errors[0], "soft link to nothing")) << r->errors[0];
  EXPECT_EQ(CompareVolume(*Open(o.store), "p1", "CT", x, d, 2), "");
}

TEST_F(Hdf5IngestTest, ExternalAndVirtualStorageRefusedUnlessAllowed) {
  const Dims d{4, 5, 3};
  auto x = RandomValues<int16_t>(Count(d), 45, 0, 100);
  const std::string raw = dir_ / "raw.bin";
  {
    std::ofstream(raw, std::ios::binary).write(reinterpret_cast<const char*>(x.data()), Count(d) * 2);
    H5Out f(dir_ / "e.h5");
    ASSERT_TRUE(f.Write("MR/p1", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), x.data()));
    ASSERT_TRUE(f.Group("CT"));
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    ASSERT_GE(H5Pset_external(dcpl, raw.c_str(), 0, Count(d) * 2), 0);
    hsize_t dims[3] = {d[0], d[1], d[2]};
    hid_t space = H5Screate_simple(3, dims, nullptr);
    hid_t ds = H5Dcreate2(f.id(), "/CT/p1", H5T_STD_I16LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(ds, 0);
    H5Dclose(ds);
    // A virtual dataset mapping /MR/p1 of this same file.
    hid_t vcpl = H5Pcreate(H5P_DATASET_CREATE);
    ASSERT_GE(H5Pset_virtual(vcpl, space, ".", "/MR/p1", space), 0);
    ASSERT_TRUE(f.Group("VDS"));
    ds = H5Dcreate2(f.id(), "/VDS/p1", H5T_STD_I16LE, space, H5P_DEFAULT, vcpl, H5P_DEFAULT);
    ASSERT_GE(ds, 0);
    H5Dclose(ds);
    H5Sclose(space);
    H5Pclose(dcpl);
    H5Pclose(vcpl);
  }
  for (const char* g : {"CT", "VDS"}) {
    auto o = Options({dir_ / "e.h5"}, dir_ / (std::string(g) + ".ps"), {"MR", g});
    auto r = IngestHdf5(o);
    ASSERT_FALSE(r.ok()) << g;
    EXPECT_EQ(r.status().code(), Code::kUnsupported);
    EXPECT_TRUE(Contains(r.status().message(), std::string("dataset 'p1' in group '") + g + "'"))
        << r.status().message();
    EXPECT_TRUE(Contains(r.status().message(), std::string(g) == "CT" ? "external raw file" : "virtual dataset"))
        << r.status().message();
    o.allow_external = true;
    o.store += "2";
    r = IngestHdf5(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(CompareVolume(*Open(o.store), "p1", g, x, d, 2), "") << g;
  }
}

// External raw storage: relative names resolve from the HDF5 file's folder
// (not the working directory), and a raw file shorter than the dataset
// declares is refused naming it and where it was looked for, never read as
// zeros.
TEST_F(Hdf5IngestTest, ExternalRawStorageIsResolvedFromTheFilesFolderAndChecked) {
  const Dims d{3, 4, 2};
  auto x = RandomValues<int16_t>(Count(d), 47, -300, 300);
  const fs::path sub = fs::path(dir_.path()) / "sub";
  fs::create_directories(sub);
  const char* bytes = reinterpret_cast<const char*>(x.data());
  // Segment a: 4 bytes of padding, then elements 0..9; segment b: elements 10..23.
  auto write_raw = [&](size_t b_bytes) {
    std::ofstream a(sub / "seg_a.bin", std::ios::binary | std::ios::trunc);
    a.write("PADS", 4);
    a.write(bytes, 20);
    std::ofstream b(sub / "seg_b.bin", std::ios::binary | std::ios::trunc);
    b.write(bytes + 20, static_cast<std::streamsize>(b_bytes));
  };
  write_raw(28);
  {
    H5Out f((sub / "x.h5").string());
    ASSERT_TRUE(f.Write("MR/p1", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), x.data()));
    ASSERT_TRUE(f.Group("CT"));
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    ASSERT_GE(H5Pset_external(dcpl, "seg_a.bin", 4, 20), 0);
    ASSERT_GE(H5Pset_external(dcpl, "seg_b.bin", 0, 28), 0);
    hsize_t dims[3] = {d[0], d[1], d[2]};
    hid_t space = H5Screate_simple(3, dims, nullptr);
    hid_t ds = H5Dcreate2(f.id(), "/CT/p1", H5T_STD_I16LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(ds, 0);
    H5Dclose(ds);
    H5Sclose(space);
    H5Pclose(dcpl);
  }
  ASSERT_NE(fs::current_path(), sub);  // the names resolve from the file's folder, not from here
  auto o = Options({(sub / "x.h5").string()}, dir_ / "ok.ps", {"MR", "CT"});
  o.allow_external = true;
  auto r = IngestHdf5(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(CompareVolume(*Open(o.store), "p1", "CT", x, d, 2), "");

  write_raw(26);  // one element short
  o.store = dir_ / "short.ps";
  r = IngestHdf5(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().ToString();
  EXPECT_TRUE(Contains(r.status().message(), "external raw file 'seg_b.bin' (segment 1, looked for at '" +
                                                 (sub / "seg_b.bin").string() + "'"))
      << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), "holds 26 bytes; the dataset reads bytes 0..28 of it"))
      << r.status().message();

  fs::remove(sub / "seg_a.bin");
  o.store = dir_ / "missing.ps";
  r = IngestHdf5(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound) << r.status().ToString();
  EXPECT_TRUE(Contains(r.status().message(), "external raw file 'seg_a.bin' (segment 0, looked for at '" +
                                                 (sub / "seg_a.bin").string() + "', relative to the folder of '"))
      << r.status().message();
}

TEST_F(Hdf5IngestTest, UnavailableFilterIsNamed) {
  const Dims d{4, 5, 3};
  auto x = RandomValues<int16_t>(Count(d), 46, 0, 100);
  {
    H5Out f(dir_ / "lzf.h5");
    ASSERT_TRUE(f.Write("MR/p1", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), x.data()));
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hsize_t chunk[3] = {4, 5, 3}, dims[3] = {d[0], d[1], d[2]};
    H5Pset_chunk(dcpl, 3, chunk);
    // h5py's LZF filter, optional so that HDF5 lets us create the dataset
    // without the plugin.
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    herr_t set = H5Pset_filter(dcpl, 32000, H5Z_FLAG_OPTIONAL, 0, nullptr);
    hid_t space = H5Screate_simple(3, dims, nullptr);
    hid_t ds = set >= 0 ? H5Dcreate2(f.id(), "/CT/p1", H5T_STD_I16LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT) : -1;
    if (ds < 0 && f.Group("CT")) {
      ds = H5Dcreate2(f.id(), "/CT/p1", H5T_STD_I16LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    }
    if (ds < 0) GTEST_SKIP() << "this HDF5 cannot create a dataset with an unregistered filter";
    H5Dwrite(ds, H5T_NATIVE_INT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data());
    H5Dclose(ds);
    H5Sclose(space);
    H5Pclose(dcpl);
  }
  if (H5Zfilter_avail(32000) > 0) GTEST_SKIP() << "an LZF plugin is installed";
  auto o = Options({dir_ / "lzf.h5"}, dir_ / "l.ps", {"MR", "CT"});
  auto r = IngestHdf5(o);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "dataset 'p1' in group 'CT'")) << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), "filter 'lzf' (id 32000)")) << r.status().message();
}

TEST_F(Hdf5IngestTest, ResumeSkipsPresentVolumesAndFinishes) {
  const Dims d{6, 7, 4};
  auto x = RandomValues<int16_t>(Count(d), 47, -100, 100);
  const std::string file = dir_ / "r.h5";
  auto write = [&](bool with_p2_ct) {
    H5Out f(file);
    for (const char* p : {"p1", "p2", "p3"}) {
      ASSERT_TRUE(f.Write(std::string("MR/") + p, H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), x.data(), {3, 7, 2}, 1));
      if (with_p2_ct || std::string(p) != "p2") {
        ASSERT_TRUE(f.Write(std::string("CT/") + p, H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), x.data()));
      }
    }
  };
  write(false);
  auto o = Options({file}, dir_ / "r.ps", {"MR", "CT"});
  o.skip_errors = true;
  auto r = IngestHdf5(o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->samples_written, 2u);
  EXPECT_FALSE(Open(o.store)->sealed());
  // Fix the file, run again: p2 is added, the store sealed.
  write(true);
  r = IngestHdf5(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->samples_present, 2u);
  EXPECT_EQ(r->samples_written, 1u);
  auto reader = Open(o.store);
  EXPECT_TRUE(reader->sealed());
  ASSERT_EQ(reader->size(), 3u);
  EXPECT_EQ(reader->id(2), "p2");
  std::vector<uint64_t> sums;
  for (uint64_t s = 0; s < 3; ++s)
    for (int f = 0; f < 2; ++f) sums.push_back(reader->Header(s, f)->body_checksum);
  // Again: nothing new, nothing duplicated, same bytes.
  r = IngestHdf5(o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->samples_present, 3u);
  EXPECT_EQ(r->samples_written, 0u);
  reader = Open(o.store);
  ASSERT_EQ(reader->size(), 3u);
  std::vector<uint64_t> again;
  for (uint64_t s = 0; s < 3; ++s)
    for (int f = 0; f < 2; ++f) again.push_back(reader->Header(s, f)->body_checksum);
  EXPECT_EQ(sums, again);
  EXPECT_TRUE(reader->sealed());
  // The store remembers its slice axis and fields.
  o.slice_axis = 0;
  EXPECT_EQ(IngestHdf5(o).status().code(), Code::kInvalidArgument);
  o.slice_axis = -1;
  o.groups = {"CT", "MR"};
  EXPECT_EQ(IngestHdf5(o).status().code(), Code::kInvalidArgument);
}

TEST_F(Hdf5IngestTest, CancelStopsBetweenVolumesAndResumes) {
  SeedFile seed;
  seed.Write(dir_ / "seed.h5");
  auto o = Options({dir_ / "seed.h5"}, dir_ / "c.ps", {"MR", "CT", "MASK"});
  o.batch_bytes = 1;  // one commit per volume
  int polls = 0;
  o.cancelled = [&] { return ++polls > 1; };
  auto r = IngestHdf5(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kAborted);
  auto reader = Open(o.store);
  EXPECT_EQ(reader->size(), 1u);
  EXPECT_FALSE(reader->sealed());
  o.cancelled = nullptr;
  r = IngestHdf5(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->samples_present, 1u);
  EXPECT_EQ(r->samples_written, 1u);
  reader = Open(o.store);
  EXPECT_TRUE(reader->sealed());
  seed.Check(*reader);
}

TEST_F(Hdf5IngestTest, SeveralFilesAndIdSchemes) {
  const Dims d{4, 5, 3};
  auto x = RandomValues<uint8_t>(Count(d), 48, 0, 255);
  fs::create_directories(dir_ / "a");
  for (const std::string& name : {std::string("train.h5"), std::string("val.h5"), std::string("a/train.h5")}) {
    H5Out f(dir_ / name);
    ASSERT_TRUE(f.Write("MR/p1", H5T_STD_U8LE, H5T_NATIVE_UINT8, V(d), x.data()));
    ASSERT_TRUE(f.Write("MR/" + name.substr(name.size() - 6, 3), H5T_STD_U8LE, H5T_NATIVE_UINT8, V(d), x.data()));
  }
  auto o = Options({dir_ / "train.h5", dir_ / "val.h5"}, dir_ / "s.ps", {"MR"});
  auto r = IngestHdf5(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto reader = Open(o.store);
  ASSERT_EQ(reader->size(), 4u);
  EXPECT_EQ(reader->id(0), "train/ain");  // datasets in name order within a file
  EXPECT_EQ(reader->id(1), "train/p1");
  EXPECT_EQ(reader->id(2), "val/p1");
  // Same stem: refused.
  o.files = {dir_ / "train.h5", dir_ / "a/train.h5"};
  o.store = dir_ / "t.ps";
  r = IngestHdf5(o);
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(r.status().message(), "same stem 'train'")) << r.status().message();
  // Unprefixed names that collide: an error naming both files.
  o.files = {dir_ / "train.h5", dir_ / "val.h5"};
  o.ids = "name";
  o.store = dir_ / "n.ps";
  r = IngestHdf5(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kAlreadyExists);
  EXPECT_TRUE(Contains(r.status().message(), "id 'p1' is already used by '" + (dir_ / "train.h5") + "'"))
      << r.status().message();
  // One file with "stem".
  o.files = {dir_ / "val.h5"};
  o.ids = "stem";
  o.store = dir_ / "v.ps";
  ASSERT_TRUE(IngestHdf5(o).ok());
  EXPECT_EQ(Open(o.store)->id(0), "val/p1");
}

TEST_F(Hdf5IngestTest, RefusesFrameStoresAndMissingGroups) {
  SeedFile seed;
  seed.Write(dir_ / "seed.h5");
  auto o = Options({dir_ / "seed.h5"}, dir_ / "s.ps", {"MR", "PET"});
  auto r = IngestHdf5(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_TRUE(Contains(r.status().message(), "opening group 'PET' in '" + (dir_ / "seed.h5") + "': no such group"))
      << r.status().message();
  o.groups = {"MR", "MR"};
  EXPECT_EQ(IngestHdf5(o).status().code(), Code::kInvalidArgument);
  o.groups = {};
  EXPECT_EQ(IngestHdf5(o).status().code(), Code::kInvalidArgument);
  // A frames store cannot take volumes.
  {
    WriterOptions wo;
    wo.durable = false;
    auto w = Writer::Open(dir_ / "frames.ps", wo);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->CommitMeta().ok());
  }
  o = Options({dir_ / "seed.h5"}, dir_ / "frames.ps", {"MR"});
  EXPECT_EQ(IngestHdf5(o).status().code(), Code::kInvalidArgument);
}

// One file per patient: the --group paths name datasets at the root.
struct PatientFile {
  Dims d;
  std::vector<int16_t> mr;
  std::vector<float> ct;
  std::vector<uint8_t> mask;
  void Write(const std::string& path, Dims dims, uint32_t seed, const std::string& prefix = "") {
    d = dims;
    mr = RandomValues<int16_t>(Count(d), seed, -700, 2500);
    ct = RandomValues<float>(Count(d), seed + 1, -1000.5, 1900.25);
    mask = RandomValues<uint8_t>(Count(d), seed + 2, 0, 5);
    H5Out f(path);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f.Write(prefix + "MR", H5T_STD_I16BE, H5T_NATIVE_INT16, V(d), mr.data(), {3, 4, 2}, 5, true));
    ASSERT_TRUE(f.Write(prefix + "CT", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, V(d), ct.data()));
    ASSERT_TRUE(f.Write(prefix + "MASK", H5T_STD_U8LE, H5T_NATIVE_UINT8, V(d), mask.data(), {d[0], d[1], 1}, 2));
  }
  void Check(const Reader& r, const std::string& id, int axis = 2) const {
    EXPECT_EQ(CompareVolume(r, id, "MR", mr, d, axis), "") << id;
    EXPECT_EQ(CompareVolume(r, id, "CT", ct, d, axis), "") << id;
    EXPECT_EQ(CompareVolume(r, id, "MASK", mask, d, axis), "") << id;
  }
};

std::vector<std::string> Ids(const Reader& r) {
  std::vector<std::string> ids;
  for (uint64_t i = 0; i < r.size(); ++i) ids.emplace_back(r.id(i));
  std::sort(ids.begin(), ids.end());
  return ids;
}

TEST_F(Hdf5IngestTest, PerPatientFilesAreOneVolumeEach) {
  fs::create_directories(dir_ / "data");
  PatientFile a, b;
  a.Write(dir_ / "data/sub-07.h5", {11, 6, 5}, 70);
  b.Write(dir_ / "data/sub-12.h5", {7, 9, 13}, 120);
  const std::vector<std::string> files = {dir_ / "data/sub-07.h5", dir_ / "data/sub-12.h5"};
  for (const std::string ids : {"auto", "stem", "name"}) {
    auto o = Options(files, dir_ / ("p-" + ids + ".ps"), {"MR", "CT", "MASK"});
    o.ids = ids;
    auto r = IngestHdf5(o);
    ASSERT_TRUE(r.ok()) << ids << ": " << r.status().ToString();
    EXPECT_EQ(r->samples_written, 2u);
    EXPECT_EQ(r->bytes_written, (Count(a.d) + Count(b.d)) * 4 * 3);
    auto reader = Open(o.store);
    ASSERT_TRUE(reader);
    // The id is the file stem under every scheme (no dataset name to prefix).
    EXPECT_EQ(Ids(*reader), (std::vector<std::string>{"sub-07", "sub-12"})) << ids;
    EXPECT_TRUE(reader->meta().sealed);
    a.Check(*reader, "sub-07");
    b.Check(*reader, "sub-12");
    EXPECT_EQ(reader->field(0).source_type, SourceType::kInt16);
    EXPECT_EQ(reader->field(1).source_type, SourceType::kFloat32);
  }
  // Resume: both present, nothing written.
  auto o = Options(files, dir_ / "p-auto.ps", {"MR", "CT", "MASK"});
  auto again = IngestHdf5(o);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->samples_present, 2u);
  EXPECT_EQ(again->samples_written, 0u);
  // Nested dataset paths, renamed fields, another slice axis.
  PatientFile c;
  c.Write(dir_ / "nested.h5", {4, 10, 3}, 9, "scan/");
  o = Options({dir_ / "nested.h5"}, dir_ / "nested.ps", {"/scan/MR=MR", "/scan/CT=CT", "scan/MASK=MASK"});
  o.slice_axis = 0;
  auto r = IngestHdf5(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto reader = Open(o.store);
  ASSERT_TRUE(reader);
  EXPECT_EQ(Ids(*reader), std::vector<std::string>{"nested"});
  c.Check(*reader, "nested", 0);
}

TEST_F(Hdf5IngestTest, MixedLayoutsAreJudgedPerFile) {
  PatientFile a;
  a.Write(dir_ / "p3.h5", {5, 8, 6}, 33);
  SeedFile seed;
  seed.Write(dir_ / "cohort.h5");
  const std::vector<std::string> files = {dir_ / "cohort.h5", dir_ / "p3.h5"};
  auto o = Options(files, dir_ / "all.ps", {"MR", "CT", "MASK"});
  auto r = IngestHdf5(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->samples_written, 3u);
  auto reader = Open(o.store);
  ASSERT_TRUE(reader);
  EXPECT_EQ(Ids(*reader), (std::vector<std::string>{"cohort/patient001", "cohort/patient002", "p3"}));
  a.Check(*reader, "p3");
  EXPECT_EQ(CompareVolume(*reader, "cohort/patient002", "CT", seed.ct2, seed.d2, 2), "");
  // Shards of a mixed ingest: together every volume once, each where its id hashes.
  std::vector<std::string> together;
  for (uint32_t i = 0; i < 2; ++i) {
    auto s = Options(files, dir_ / ("shard" + std::to_string(i) + ".ps"), {"MR", "CT", "MASK"});
    s.shard_index = i;
    s.shard_count = 2;
    auto sr = IngestHdf5(s);
    ASSERT_TRUE(sr.ok()) << sr.status().ToString();
    auto sh = Open(s.store);
    ASSERT_TRUE(sh);
    for (const std::string& id : Ids(*sh)) {
      EXPECT_EQ(ShardOfId(id, 2), i) << id;
      together.push_back(id);
    }
    if (sh->Find("p3").ok()) a.Check(*sh, "p3");
  }
  std::sort(together.begin(), together.end());
  EXPECT_EQ(together, (std::vector<std::string>{"cohort/patient001", "cohort/patient002", "p3"}));
}

TEST_F(Hdf5IngestTest, FileOfNeitherLayoutListsItsRoot) {
  PatientFile good;
  good.Write(dir_ / "good.h5", {3, 4, 5}, 4);
  const std::vector<int16_t> v = RandomValues<int16_t>(6 * 2 * 3, 8, -5, 5);
  {
    // MR a group, CT a dataset: both layouts at once.
    H5Out f(dir_ / "both.h5");
    ASSERT_TRUE(f.Write("MR/x", H5T_STD_I16LE, H5T_NATIVE_INT16, {6, 2, 3}, v.data()));
    ASSERT_TRUE(f.Write("CT", H5T_STD_I16LE, H5T_NATIVE_INT16, {6, 2, 3}, v.data()));
    ASSERT_TRUE(f.Write("MASK", H5T_STD_I16LE, H5T_NATIVE_INT16, {6, 2, 3}, v.data()));
  }
  {
    // Datasets under other names.
    H5Out f(dir_ / "other.h5");
    ASSERT_TRUE(f.Write("image", H5T_STD_I16LE, H5T_NATIVE_INT16, {6, 2, 3}, v.data()));
    ASSERT_TRUE(f.Write("label", H5T_STD_I16LE, H5T_NATIVE_INT16, {6, 6}, v.data()));
    ASSERT_TRUE(f.Group("meta"));
  }
  auto o = Options({dir_ / "both.h5"}, dir_ / "b.ps", {"MR", "CT", "MASK"});
  auto r = IngestHdf5(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  std::string m = r.status().message();
  EXPECT_TRUE(Contains(m, "reading '" + (dir_ / "both.h5") +
                              "': --group 'MR' name groups but 'CT', 'MASK' name "
                              "datasets; a file is either layout, not both"))
      << m;
  EXPECT_TRUE(Contains(m, "The file holds at its root: dataset 'CT' (int16 6x2x3), dataset 'MASK' (int16 6x2x3), "
                          "group 'MR' (1 members)."))
      << m;
  EXPECT_TRUE(Contains(m, "Accepted layouts: (1) every --group names a group")) << m;
  EXPECT_FALSE(fs::exists(dir_ / "b.ps"));  // nothing written
  o.files = {dir_ / "other.h5"};
  r = IngestHdf5(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  m = r.status().message();
  EXPECT_TRUE(Contains(m, "opening group 'MR' in '" + (dir_ / "other.h5") +
                              "': no such group or dataset. The file "
                              "holds at its root: dataset 'image' (int16 6x2x3), dataset 'label' (int16 6x6), group "
                              "'meta' (0 members). Accepted layouts"))
      << m;
  // --on-error skip: the good file is ingested, the two others reported with
  // an empty id and their causes; the store stays unsealed.
  o.files = {dir_ / "both.h5", dir_ / "good.h5", dir_ / "other.h5"};
  o.skip_errors = true;
  o.store = dir_ / "skip.ps";
  r = IngestHdf5(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->samples_written, 1u);
  EXPECT_EQ(r->samples_failed, 2u);
  const std::string report = ReadText(r->report_path);
  EXPECT_TRUE(Contains(report, "\t" + (dir_ / "both.h5") + "\treading '")) << report;
  EXPECT_TRUE(Contains(report, "\t" + (dir_ / "other.h5") + "\topening group 'MR'")) << report;
  auto reader = Open(o.store);
  ASSERT_TRUE(reader);
  EXPECT_FALSE(reader->meta().sealed);
  good.Check(*reader, "good");
}

TEST_F(Hdf5IngestTest, PerPatientErrorsNameTheDataset) {
  PatientFile a;
  a.Write(dir_ / "a.h5", {5, 8, 6}, 1);
  {
    H5Out f(dir_ / "shape.h5");
    const auto v = RandomValues<int16_t>(5 * 8 * 7, 2, 0, 9);
    ASSERT_TRUE(f.Write("MR", H5T_STD_I16LE, H5T_NATIVE_INT16, {5, 8, 6}, v.data()));
    ASSERT_TRUE(f.Write("CT", H5T_STD_I16LE, H5T_NATIVE_INT16, {5, 8, 7}, v.data()));
  }
  auto o = Options({dir_ / "shape.h5"}, dir_ / "s.ps", {"MR", "CT"});
  auto r = IngestHdf5(o);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "reading dataset 'CT' of '" + (dir_ / "shape.h5") +
                                                 "': shape 5x8x7 differs from 5x8x6 of dataset 'MR'"))
      << r.status().message();
  // Two per-patient files with one stem in two folders: ids collide.
  fs::create_directories(dir_ / "x");
  fs::copy_file(dir_ / "a.h5", dir_ / "x/a.h5");
  o = Options({dir_ / "a.h5", dir_ / "x/a.h5"}, dir_ / "n.ps", {"MR", "CT", "MASK"});
  o.ids = "name";
  r = IngestHdf5(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kAlreadyExists);
  EXPECT_TRUE(Contains(r.status().message(), "reading per-patient file '" + (dir_ / "x/a.h5") +
                                                 "': id 'a' is "
                                                 "already used by '" +
                                                 (dir_ / "a.h5") +
                                                 "' (a per-patient file's id "
                                                 "is its file stem: rename one of the files)"))
      << r.status().message();
}

// --ids name --strict-ids: an id two files give is refused before anything
// is written (without --strict-ids the second file's volume fails, reported).
TEST_F(Hdf5IngestTest, StrictIdsRefusesIdsTwoFilesGiveBeforeWriting) {
  const Dims d{3, 6, 2};
  const auto x = RandomValues<int16_t>(Count(d), 61, -40, 40);
  for (const std::string name : {"site1.h5", "site2.h5"}) {
    H5Out f(dir_ / name);
    ASSERT_TRUE(f.Write("CT/a" + name.substr(4, 1), H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), x.data()));
    ASSERT_TRUE(f.Write("CT/shared", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d), x.data()));
  }
  auto o = Options({dir_ / "site1.h5", dir_ / "site2.h5"}, dir_ / "strict.ps", {"CT"});
  o.ids = "name";
  o.strict_ids = true;
  auto r = IngestHdf5(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "ingest: --strict-ids: 1 id(s) given by two files ('shared' in '" +
                                      (dir_ / "site1.h5") + "' and '" + (dir_ / "site2.h5") +
                                      "'): the same patient twice, or two patients under one id; nothing was "
                                      "written (use --ids stem to prefix ids with the file name)");
  EXPECT_FALSE(fs::exists(dir_ / "strict.ps"));
  // Without --strict-ids, skip mode: the clash is one failure, the rest written.
  o.strict_ids = false;
  o.skip_errors = true;
  r = IngestHdf5(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->samples_written, 3u);
  EXPECT_EQ(r->samples_failed, 1u);
  EXPECT_EQ(Ids(*Open(o.store)), (std::vector<std::string>{"a1", "a2", "shared"}));
}

// --shard "" (an unset shell variable) is refused, not an unsharded ingest.
TEST_F(Hdf5IngestTest, EmptyShardIsRefused) {
  PatientFile a;
  a.Write(dir_ / "p.h5", {3, 4, 2}, 6);
  const std::string cli = PATCHSTORE_CLI;
  std::string out;
  EXPECT_EQ(RunCommand(cli + " -q ingest hdf5 " + (dir_ / "p.h5") + " " + (dir_ / "h.ps") + " --group MR --shard ''",
                       &out),
            2)
      << out;
  EXPECT_TRUE(Contains(out, "patchstore: error: --shard '' is empty (an unset shell variable")) << out;
  EXPECT_FALSE(fs::exists(dir_ / "h.ps"));
  fs::create_directories(dir_ / "img");
  EXPECT_EQ(RunCommand(cli + " -q ingest images " + (dir_ / "i.ps") + " --root " + (dir_ / "img") +
                           " --field 'rgb={a}.png' --shard ''",
                       &out),
            2)
      << out;
  EXPECT_TRUE(Contains(out, "patchstore: error: --shard '' is empty")) << out;
  EXPECT_FALSE(fs::exists(dir_ / "i.ps"));
  uint32_t i = 9, n = 9;
  EXPECT_EQ(ParseShardSpec("", &i, &n).code(), Code::kInvalidArgument);
  EXPECT_EQ(i, 9u);
  EXPECT_TRUE(ParseShardSpec("2/5", &i, &n).ok());
  EXPECT_EQ(i, 2u);
  EXPECT_EQ(n, 5u);
}

TEST_F(Hdf5IngestTest, CommandLine) {
  SeedFile seed;
  seed.Write(dir_ / "seed.h5");
  const std::string cli = PATCHSTORE_CLI;
  const std::string store = dir_ / "cli.ps";
  std::string out;
  EXPECT_EQ(RunCommand(cli + " ingest hdf5 --help", &out), 0);
  EXPECT_TRUE(Contains(out, "--slice-axis")) << out;
  EXPECT_TRUE(Contains(out, "Examples:")) << out;
  EXPECT_EQ(RunCommand(cli + " -q ingest hdf5 " + (dir_ / "seed.h5") + " " + store +
                           " --group MR --group CT --group MASK=mask --mask mask --norm CT=affine:0.001,0",
                       &out),
            0)
      << out;
  EXPECT_TRUE(Contains(out, "ingested 2 new volumes (0 already present, 0 failed) of 2")) << out;
  EXPECT_TRUE(Contains(out, "store sealed")) << out;
  auto reader = Open(store);
  EXPECT_TRUE(reader->field(2).is_mask);
  EXPECT_EQ(reader->field(1).norm.kind, NormKind::kAffine);
  EXPECT_TRUE(Contains(reader->meta().attributes.at("ingest_command"), "--group MASK=mask"));
  EXPECT_EQ(RunCommand(cli + " info " + store, &out), 0) << out;
  EXPECT_TRUE(Contains(out, "kind:           volumes")) << out;
  // Usage errors: 2.
  EXPECT_EQ(RunCommand(cli + " ingest hdf5 " + (dir_ / "seed.h5") + " --group MR", &out), 2) << out;
  EXPECT_EQ(RunCommand(cli + " ingest hdf5 " + (dir_ / "seed.h5") + " " + store, &out), 2) << out;
  EXPECT_EQ(RunCommand(cli + " ingest hdf5 " + (dir_ / "seed.h5") + " x.ps --group MR --slice-axis 5", &out), 2) << out;
  EXPECT_EQ(RunCommand(cli + " ingest hdf5 " + (dir_ / "seed.h5") + " x.ps --group MR --norm MR", &out), 2) << out;
  // Failures: 1, with the dataset named.
  EXPECT_EQ(RunCommand(cli + " -q ingest hdf5 " + (dir_ / "seed.h5") + " " + (dir_ / "e.ps") +
                           " --group MR --norm MR=symmetric",
                       &out),
            1)
      << out;
  EXPECT_TRUE(Contains(out, "patchstore: error: ")) << out;
  EXPECT_TRUE(Contains(out, "dataset 'patient001' in group 'MR'")) << out;
}

}  // namespace
}  // namespace patchstore
