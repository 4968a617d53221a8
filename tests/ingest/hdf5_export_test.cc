// Export of volume stores: h5 round trip (bit-exact, source or SHW order)
// and PNG slices with a window.
#include <gtest/gtest.h>

#include <opencv2/imgcodecs.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "ingest/hdf5_test_util.h"
#include "patchstore/ingest/ingest.h"
#include "patchstore/ingest/ingest_hdf5.h"
#include "patchstore/reader/reader.h"
#include "test_util.h"

namespace patchstore {
namespace {

namespace fs = std::filesystem;
using testing::CompareVolume;
using testing::H5Out;
using testing::RandomValues;
using testing::RunCommand;
using testing::SourceIndex;
using testing::TempDir;

using Dims = std::array<hsize_t, 3>;
size_t Count(const Dims& d) { return d[0] * d[1] * d[2]; }
std::vector<hsize_t> V(const Dims& d) { return {d[0], d[1], d[2]}; }

// Reads a float dataset of rank 3 (dims and values).
bool ReadFloat(const std::string& file, const std::string& path, Dims* dims, std::vector<float>* out) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return false;
  hid_t ds = H5Dopen2(f, path.c_str(), H5P_DEFAULT);
  bool ok = ds >= 0;
  if (ok) {
    hid_t space = H5Dget_space(ds);
    ok = H5Sget_simple_extent_ndims(space) == 3;
    if (ok) {
      H5Sget_simple_extent_dims(space, dims->data(), nullptr);
      out->resize(Count(*dims));
      hid_t type = H5Dget_type(ds);
      ok = H5Tequal(type, H5T_IEEE_F32LE) > 0 &&
           H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->data()) >= 0;
      H5Tclose(type);
    }
    H5Sclose(space);
    H5Dclose(ds);
  }
  H5Fclose(f);
  return ok;
}

class Hdf5ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ct_ = RandomValues<int16_t>(Count(d1_), 1, -1024, 3071);
    mr_ = RandomValues<float>(Count(d1_), 2, -3, 3);
    mr_[0] = std::numeric_limits<float>::quiet_NaN();
    mr_[1] = -0.0f;
    mr_[2] = std::numeric_limits<float>::denorm_min();
    mr2_ = RandomValues<float>(Count(d2_), 3, 0, 1);
    ct2_ = RandomValues<int16_t>(Count(d2_), 4, -10, 10);
    {
      H5Out f(dir_ / "train.h5");
      ASSERT_TRUE(f.Write("MR/p1", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, V(d1_), mr_.data(), {6, 7, 2}, 4));
      ASSERT_TRUE(f.Write("CT/p1", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d1_), ct_.data()));
      H5Out g(dir_ / "val.h5");
      ASSERT_TRUE(g.Write("MR/p9", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, V(d2_), mr2_.data()));
      ASSERT_TRUE(g.Write("CT/p9", H5T_STD_I16LE, H5T_NATIVE_INT16, V(d2_), ct2_.data()));
    }
    Hdf5IngestOptions o;
    o.files = {dir_ / "train.h5", dir_ / "val.h5"};
    o.store = store_;
    o.groups = {"MR", "CT"};
    o.durable = false;
    auto r = IngestHdf5(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  TempDir dir_;
  const std::string store_ = dir_ / "v.ps";
  Dims d1_{12, 14, 5}, d2_{3, 4, 6};
  std::vector<int16_t> ct_, ct2_;
  std::vector<float> mr_, mr2_;
};

TEST_F(Hdf5ExportTest, H5RoundTripIsBitExactInSourceOrder) {
  ExportOptions eo;
  eo.store = store_;
  eo.outdir = dir_ / "out";
  eo.format = "h5";
  auto r = Export(eo);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->files_written, 1u);
  const std::string file = dir_ / "out/volumes.h5";
  ASSERT_EQ(r->paths, std::vector<std::string>{file});
  Dims dims;
  std::vector<float> got;
  ASSERT_TRUE(ReadFloat(file, "/MR/train/p1", &dims, &got));
  EXPECT_EQ(dims, d1_);
  ASSERT_EQ(got.size(), mr_.size());
  EXPECT_EQ(std::memcmp(got.data(), mr_.data(), got.size() * 4), 0);  // NaN, -0, subnormal: same bits
  ASSERT_TRUE(ReadFloat(file, "/CT/val/p9", &dims, &got));
  EXPECT_EQ(dims, d2_);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], static_cast<float>(ct2_[i]));

  // Ingesting the export again gives the same records, bit for bit.
  Hdf5IngestOptions o;
  o.files = {file};
  o.store = dir_ / "again.ps";
  o.groups = {"MR/train=MR", "CT/train=CT"};
  o.durable = false;
  auto again = IngestHdf5(o);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto a = Reader::Open(store_);
  auto b = Reader::Open(o.store);
  ASSERT_TRUE(a.ok() && b.ok());
  for (int f = 0; f < 2; ++f)
    EXPECT_EQ((*a)->Header(*(*a)->Find("train/p1"), f)->body_checksum,
              (*b)->Header(*(*b)->Find("p1"), f)->body_checksum);
}

TEST_F(Hdf5ExportTest, H5InShwOrder) {
  ExportOptions eo;
  eo.store = store_;
  eo.outdir = dir_ / "out";
  eo.format = "h5";
  eo.axis_order = "shw";
  eo.ids = {"val/p9"};
  eo.fields = {"CT"};
  ASSERT_TRUE(Export(eo).ok());
  Dims dims;
  std::vector<float> got;
  ASSERT_TRUE(ReadFloat(dir_ / "out/volumes.h5", "/CT/val/p9", &dims, &got));
  EXPECT_EQ(dims, (Dims{6, 3, 4}));
  for (uint64_t s = 0; s < 6; ++s)
    for (uint64_t h = 0; h < 3; ++h)
      for (uint64_t w = 0; w < 4; ++w)
        ASSERT_EQ(got[(s * 3 + h) * 4 + w], static_cast<float>(ct2_[SourceIndex(d2_, 2, s, h, w)]));
  eo.axis_order = "xyz";
  EXPECT_EQ(Export(eo).status().code(), Code::kInvalidArgument);
  eo.axis_order = "";
  eo.format = "exr";
  EXPECT_EQ(Export(eo).status().code(), Code::kUnsupported);
}

TEST_F(Hdf5ExportTest, PngSlicesWithAWindow) {
  ExportOptions eo;
  eo.store = store_;
  eo.outdir = dir_ / "png";
  eo.fields = {"CT"};
  eo.ids = {"train/p1"};
  auto r = Export(eo);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->files_written, 5u);  // one per slice
  const fs::path dir = dir_ / "png/train/p1/CT";
  ASSERT_TRUE(fs::exists(dir / "0000.png"));
  ASSERT_TRUE(fs::exists(dir / "0004.png"));
  EXPECT_FALSE(fs::exists(dir / "0005.png"));
  // Default window: the volume's min..max.
  const double lo = *std::min_element(ct_.begin(), ct_.end()), hi = *std::max_element(ct_.begin(), ct_.end());
  for (int s = 0; s < 5; ++s) {
    char name[16];
    std::snprintf(name, sizeof name, "%04d.png", s);
    cv::Mat img = cv::imread((dir / name).string(), cv::IMREAD_UNCHANGED);
    ASSERT_EQ(img.type(), CV_8UC1);
    ASSERT_EQ(img.rows, 12);
    ASSERT_EQ(img.cols, 14);
    for (int y = 0; y < 12; ++y)
      for (int x = 0; x < 14; ++x) {
        const double v = ct_[SourceIndex(d1_, 2, s, y, x)];
        ASSERT_EQ(img.at<uint8_t>(y, x), static_cast<int>(std::nearbyint((v - lo) / (hi - lo) * 255)));
      }
  }
  // An explicit window clips.
  eo.has_window = true;
  eo.window_lo = 0;
  eo.window_hi = 100;
  eo.outdir = dir_ / "win";
  ASSERT_TRUE(Export(eo).ok());
  cv::Mat img = cv::imread((dir_ / "win/train/p1/CT/0002.png"), cv::IMREAD_UNCHANGED);
  for (int y = 0; y < 12; ++y)
    for (int x = 0; x < 14; ++x) {
      const double v = std::min<double>(std::max<double>(ct_[SourceIndex(d1_, 2, 2, y, x)], 0), 100);
      ASSERT_EQ(img.at<uint8_t>(y, x), static_cast<int>(std::nearbyint(v * 2.55)));
    }
}

TEST_F(Hdf5ExportTest, H5ExportOfFramesIsRefused) {
  ASSERT_TRUE(testing::WriteSyntheticStore(dir_ / "f.ps", 1, {{"rgb", 3}}, 4, 5).ok());
  ExportOptions eo;
  eo.store = dir_ / "f.ps";
  eo.outdir = dir_ / "o";
  eo.format = "h5";
  EXPECT_EQ(Export(eo).status().code(), Code::kUnsupported);
}

TEST_F(Hdf5ExportTest, CommandLinePngExport) {
  std::string out;
  EXPECT_EQ(RunCommand(std::string(PATCHSTORE_CLI) + " export " + store_ + " " + (dir_ / "cli"), &out), 0) << out;
  EXPECT_TRUE(fs::exists(dir_ / "cli/val/p9/MR/0005.png"));
}

}  // namespace
}  // namespace patchstore
