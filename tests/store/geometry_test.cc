// Volume geometry (FORMAT.md "Volume geometry"): the encoding, its checks,
// the writer's `geometry` database and the snapshot's reads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "patchstore/store/store.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::TempDir;

VolumeGeometry Oblique() {
  VolumeGeometry g;
  g.spacing = {0.75, 0.8, 2.5};
  g.origin = {-120.5, 33.25, 71};
  // A rotation about z by 30 degrees, then the axes swapped (determinant -1).
  const double c = std::cos(M_PI / 6), s = std::sin(M_PI / 6);
  g.direction = {c, -s, 0, s, c, 0, 0, 0, -1};
  g.qform_code = 1;
  g.sform_code = 2;
  g.flags = kGeometryReoriented;
  g.source_spacing = {2.5, 0.8, 0.75};
  g.source_size = {60, 256, 240};
  return g;
}

TEST(VolumeGeometry, RoundTripsBitForBit) {
  const VolumeGeometry g = Oblique();
  const std::string bytes = EncodeVolumeGeometry(7, g);
  ASSERT_EQ(bytes.size(), kVolumeGeometrySize);
  auto back = DecodeVolumeGeometry(7, bytes.data(), bytes.size());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(*back == g);
  EXPECT_EQ(back->qform_code, 1);
  EXPECT_EQ(back->sform_code, 2);
  EXPECT_EQ(back->source_size[1], 256u);
}

TEST(VolumeGeometry, ChecksumCoversTheKeyAndEveryByte) {
  const std::string bytes = EncodeVolumeGeometry(7, Oblique());
  // Under another sample's key: refused.
  auto moved = DecodeVolumeGeometry(8, bytes.data(), bytes.size());
  ASSERT_FALSE(moved.ok());
  EXPECT_EQ(moved.status().code(), Code::kCorruption);
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    EXPECT_FALSE(DecodeVolumeGeometry(7, bad.data(), bad.size()).ok()) << "byte " << i;
  }
  EXPECT_FALSE(DecodeVolumeGeometry(7, bytes.data(), bytes.size() - 1).ok());
}

TEST(VolumeGeometry, CheckRefusesNanZeroAndShearedGrids) {
  VolumeGeometry g;
  EXPECT_TRUE(CheckVolumeGeometry(g).ok());
  g.spacing[2] = std::numeric_limits<double>::quiet_NaN();
  Status st = CheckVolumeGeometry(g);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("spacing (1, 1, nan)"), std::string::npos) << st.message();
  g.spacing = {1, 0, 1};
  EXPECT_NE(CheckVolumeGeometry(g).message().find("positive"), std::string::npos);
  g = VolumeGeometry();
  g.direction = {1, 0.3, 0, 0, 1, 0, 0, 0, 1};  // sheared
  st = CheckVolumeGeometry(g);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("not orthonormal"), std::string::npos) << st.message();
  g = VolumeGeometry();
  g.origin[0] = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(CheckVolumeGeometry(g).ok());
}

TEST(VolumeGeometry, AffinesMapIndicesToLpsAndRas) {
  const VolumeGeometry g = Oblique();
  const auto lps = g.AffineLPS();
  const auto ras = g.AffineRAS();
  // (w, h, s) = (2, 3, 4): origin + D * diag(spacing) * (2, 3, 4).
  const double idx[3] = {2, 3, 4};
  for (int r = 0; r < 3; ++r) {
    double want = g.origin[r];
    for (int c = 0; c < 3; ++c) want += g.direction[r * 3 + c] * g.spacing[c] * idx[c];
    double got = lps[r * 4 + 3];
    for (int c = 0; c < 3; ++c) got += lps[r * 4 + c] * idx[c];
    EXPECT_DOUBLE_EQ(got, want);
    double got_ras = ras[r * 4 + 3];
    for (int c = 0; c < 3; ++c) got_ras += ras[r * 4 + c] * idx[c];
    EXPECT_DOUBLE_EQ(got_ras, r < 2 ? -want : want);
  }
  EXPECT_EQ(lps[15], 1);
  EXPECT_EQ(ras[12] + ras[13] + ras[14], 0);
}

TEST(VolumeGeometry, WriterStoresItWithTheSampleAndReadersFindIt) {
  TempDir dir;
  const std::string path = dir / "v.ps";
  {
    WriterOptions wo;
    wo.kind = "volumes";
    wo.durable = false;
    auto w = Writer::Open(path, wo);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    FieldMeta fm;
    fm.name = "CT";
    fm.layout = Layout::kSHW;
    auto f = (*w)->EnsureField(fm);
    ASSERT_TRUE(f.ok());
    std::vector<float> data(2 * 3 * 4, 1.5f);
    std::vector<SampleInput> batch(2);
    for (int i = 0; i < 2; ++i) {
      batch[i].id = i ? "without" : "with";
      RecordInput r;
      r.field = *f;
      r.header.layout = Layout::kSHW;
      r.header.rank = 3;
      r.header.shape = {2, 3, 4, 0};
      r.data = data.data();
      batch[i].records.push_back(r);
    }
    batch[0].geometry = Oblique();
    ASSERT_TRUE((*w)->WriteBatch(batch).ok());
    // A geometry that is not one (NaN spacing) is refused with the sample.
    std::vector<SampleInput> bad(1, batch[1]);
    bad[0].id = "bad";
    bad[0].geometry = VolumeGeometry();
    bad[0].geometry->spacing[0] = std::nan("");
    Status st = (*w)->WriteBatch(bad);
    EXPECT_EQ(st.code(), Code::kInvalidArgument);
    EXPECT_NE(st.message().find("'bad'"), std::string::npos) << st.message();
    ASSERT_TRUE((*w)->Seal().ok());
  }
  auto snap = Snapshot::Open(path);
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  EXPECT_TRUE((*snap)->has_geometry());
  auto g0 = (*snap)->Geometry(0);
  ASSERT_TRUE(g0.ok());
  ASSERT_TRUE(g0->has_value());
  EXPECT_TRUE(**g0 == Oblique());
  auto g1 = (*snap)->Geometry(1);
  ASSERT_TRUE(g1.ok());
  EXPECT_FALSE(g1->has_value());
  EXPECT_EQ((*snap)->meta().sample_count, 2u);  // the refused batch wrote nothing
}

}  // namespace
}  // namespace patchstore
