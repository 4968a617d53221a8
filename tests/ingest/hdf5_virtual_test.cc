// HDF5 virtual datasets with --allow-external (issue 14, items 2 and 12):
// a source chain that reaches its own dataset (which made libhdf5 recurse
// until SIGSEGV) and a missing source file or dataset (which HDF5 reads as
// fill values) are refused before any read, naming the dataset and source.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "ingest/hdf5_test_util.h"
#include "patchstore/ingest/ingest_hdf5.h"
#include "patchstore/reader/reader.h"
#include "test_util.h"

namespace patchstore {
namespace {

namespace fs = std::filesystem;
using testing::CompareVolume;
using testing::H5Out;
using testing::RandomValues;
using testing::TempDir;

constexpr hsize_t kD0 = 4, kD1 = 5, kD2 = 3;

// Adds virtual dataset `path` of shape kD0 x kD1 x kD2 (int16) mapping all
// of `src_dset` in `src_file` ("." = this file).
bool AddVirtual(hid_t file, const std::string& path, const std::string& src_file, const std::string& src_dset) {
  hsize_t dims[3] = {kD0, kD1, kD2};
  hid_t space = H5Screate_simple(3, dims, nullptr);
  hid_t vcpl = H5Pcreate(H5P_DATASET_CREATE);
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  bool ok = H5Pset_virtual(vcpl, space, src_file.c_str(), src_dset.c_str(), space) >= 0;
  hid_t ds = ok ? H5Dcreate2(file, path.c_str(), H5T_STD_I16LE, space, lcpl, vcpl, H5P_DEFAULT) : -1;
  ok = ds >= 0;
  if (ds >= 0) H5Dclose(ds);
  H5Pclose(lcpl);
  H5Pclose(vcpl);
  H5Sclose(space);
  return ok;
}

class Hdf5VirtualTest : public ::testing::Test {
 protected:
  void SetUp() override { x_ = RandomValues<int16_t>(kD0 * kD1 * kD2, 7, -100, 100); }

  // Writes MR/p1 (plain) into `f`.
  void WriteMr(H5Out& f) { ASSERT_TRUE(f.Write("MR/p1", H5T_STD_I16LE, H5T_NATIVE_INT16, {kD0, kD1, kD2}, x_.data())); }

  Result<IngestSummary> Ingest(const std::string& file, const std::string& store) {
    Hdf5IngestOptions o;
    o.files = {file};
    o.store = dir_ / store;
    o.groups = {"MR", "G"};
    o.allow_external = true;
    o.durable = false;
    return IngestHdf5(o);
  }

  void ExpectRefused(const Result<IngestSummary>& r, const std::string& cause) {
    ASSERT_FALSE(r.ok()) << "ingested a dataset that should have been refused";
    EXPECT_NE(r.status().message().find("dataset 'p1' in group 'G'"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(cause), std::string::npos) << r.status().message();
  }

  TempDir dir_;
  std::vector<int16_t> x_;
};

TEST_F(Hdf5VirtualTest, SourceThatIsItselfIsRefused) {
  {
    H5Out f(dir_ / "self.h5");
    WriteMr(f);
    ASSERT_TRUE(AddVirtual(f.id(), "/G/p1", ".", "/G/p1"));
  }
  auto r = Ingest(dir_ / "self.h5", "self.ps");
  ExpectRefused(r, "its virtual dataset sources lead back to '/G/p1'");
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
}

TEST_F(Hdf5VirtualTest, TwoDatasetCycleIsRefused) {
  {
    H5Out f(dir_ / "pair.h5");
    WriteMr(f);
    ASSERT_TRUE(AddVirtual(f.id(), "/G/p1", ".", "/H/q"));
    ASSERT_TRUE(AddVirtual(f.id(), "/H/q", ".", "/G/p1"));
  }
  ExpectRefused(Ingest(dir_ / "pair.h5", "pair.ps"), "(a cycle)");
}

TEST_F(Hdf5VirtualTest, ExternalLinkToSelfReferencingFileIsRefused) {
  {
    H5Out b(dir_ / "b.h5");
    ASSERT_TRUE(AddVirtual(b.id(), "/G/p1", ".", "/G/p1"));
  }
  {
    H5Out a(dir_ / "a.h5");
    WriteMr(a);
    ASSERT_TRUE(a.Group("G"));
    ASSERT_GE(H5Lcreate_external((dir_ / "b.h5").c_str(), "/G/p1", a.id(), "/G/p1", H5P_DEFAULT, H5P_DEFAULT), 0);
  }
  ExpectRefused(Ingest(dir_ / "a.h5", "a.ps"), "(a cycle)");
}

TEST_F(Hdf5VirtualTest, CycleAcrossTwoFilesIsRefused) {
  {
    H5Out b(dir_ / "b.h5");
    ASSERT_TRUE(AddVirtual(b.id(), "/back", "a.h5", "/G/p1"));
  }
  {
    H5Out a(dir_ / "a.h5");
    WriteMr(a);
    ASSERT_TRUE(AddVirtual(a.id(), "/G/p1", "b.h5", "/back"));
  }
  ExpectRefused(Ingest(dir_ / "a.h5", "a.ps"), "(a cycle)");
}

TEST_F(Hdf5VirtualTest, MissingSourceFileIsRefused) {
  {
    H5Out f(dir_ / "m.h5");
    WriteMr(f);
    ASSERT_TRUE(AddVirtual(f.id(), "/G/p1", "gone.h5", "/data"));
  }
  auto r = Ingest(dir_ / "m.h5", "m.ps");
  ExpectRefused(r, "virtual source 0 ('gone.h5':'/data'): the source file is missing");
  EXPECT_EQ(r.status().code(), Code::kNotFound);
}

TEST_F(Hdf5VirtualTest, MissingSourceDatasetIsRefused) {
  {
    H5Out s(dir_ / "src.h5");
    ASSERT_TRUE(s.Write("data", H5T_STD_I16LE, H5T_NATIVE_INT16, {kD0, kD1, kD2}, x_.data()));
  }
  {
    H5Out f(dir_ / "d.h5");
    WriteMr(f);
    ASSERT_TRUE(AddVirtual(f.id(), "/G/p1", "src.h5", "/other"));
  }
  ExpectRefused(Ingest(dir_ / "d.h5", "d.ps"), "'src.h5':'/other'): the source dataset is missing");
}

TEST_F(Hdf5VirtualTest, ValidSourceInAnotherFileIsIngestedExactly) {
  {
    H5Out s(dir_ / "src.h5");
    ASSERT_TRUE(s.Write("data", H5T_STD_I16LE, H5T_NATIVE_INT16, {kD0, kD1, kD2}, x_.data()));
  }
  {
    H5Out f(dir_ / "ok.h5");
    WriteMr(f);
    ASSERT_TRUE(AddVirtual(f.id(), "/G/p1", "src.h5", "/data"));
  }
  auto r = Ingest(dir_ / "ok.h5", "ok.ps");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto reader = Reader::Open(dir_ / "ok.ps");
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ(CompareVolume(**reader, "p1", "G", x_, {kD0, kD1, kD2}, 2), "");
}

}  // namespace
}  // namespace patchstore
