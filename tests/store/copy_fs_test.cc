// CopyStoreCompact (patchstore copy) and the writer's refusal of network filesystems.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "store/copy.h"
#include "store/filesystem.h"
#include "patchstore/store/store.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::TempDir;

TEST(CopyStore, CompactCopyHoldsTheSameSamples) {
  TempDir dir;
  ASSERT_TRUE(testing::WriteSyntheticStore(dir / "src.ps", 9, {{"a", 2}}, 8, 10).ok());
  std::filesystem::create_directory(dir / "dst.ps");
  ASSERT_TRUE(CopyStoreCompact(dir / "src.ps", dir / "dst.ps").ok());
  auto a = Snapshot::Open(dir / "src.ps").value();
  auto b = Snapshot::Open(dir / "dst.ps").value();
  EXPECT_EQ(b->meta().Encode(), a->meta().Encode());
  ASSERT_EQ(b->id_count(), 9u);
  for (uint64_t s = 0; s < 9; ++s) {
    auto ra = a->GetRecord(s, 0).value();
    auto rb = b->GetRecord(s, 0).value();
    EXPECT_EQ(ra, rb);
  }
  EXPECT_TRUE(b->meta().sealed);
  EXPECT_FALSE(std::filesystem::exists(dir / "dst.ps/lock.mdb"));  // a sealed copy is read lock-free
}

TEST(CopyStore, RefusesANonEmptyDestinationAndAMissingSource) {
  TempDir dir;
  ASSERT_TRUE(testing::WriteSyntheticStore(dir / "src.ps", 2, {{"a", 1}}, 4, 4).ok());
  std::filesystem::create_directory(dir / "full");
  std::ofstream(dir / "full/x") << "x";
  Status st = CopyStoreCompact(dir / "src.ps", dir / "full");
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("must be an empty directory"), std::string::npos);
  std::filesystem::create_directory(dir / "empty");
  EXPECT_EQ(CopyStoreCompact(dir / "nothing.ps", dir / "empty").code(), Code::kNotFound);
  EXPECT_TRUE(std::filesystem::is_empty(dir / "empty"));
}

TEST(WriterFilesystem, NetworkFilesystemsAreRefusedLocalOnesNot) {
  Status nfs = CheckWriterFilesystemType("/mnt/share/x.ps", 0x6969);
  EXPECT_EQ(nfs.code(), Code::kUnsupported);
  EXPECT_NE(nfs.message().find("'/mnt/share/x.ps' for writing: it is on NFS"), std::string::npos);
  EXPECT_NE(nfs.message().find("patchstore copy"), std::string::npos);
  EXPECT_EQ(CheckWriterFilesystemType("/x", static_cast<long>(0xFE534D42)).code(), Code::kUnsupported);
  EXPECT_TRUE(CheckWriterFilesystemType("/x", 0xEF53).ok());      // ext4
  EXPECT_TRUE(CheckWriterFilesystemType("/x", 0x01021994).ok());  // tmpfs
  TempDir dir;
  EXPECT_TRUE(CheckWriterFilesystem(dir / "not/yet/created.ps").ok());  // the nearest existing folder is local
}

}  // namespace
}  // namespace patchstore
