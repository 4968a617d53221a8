// CopyStoreCompact (patchstore copy) and the writer's refusal of network filesystems.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "patchstore/store/copy.h"
#include "patchstore/store/store.h"
#include "store/filesystem.h"
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
  std::filesystem::remove(dir / "full/x");
  std::ofstream(dir / "full/" + kStagingMarker) << "pid=1 boot=b\n";  // only a staging marker: accepted
  EXPECT_TRUE(CopyStoreCompact(dir / "src.ps", dir / "full").ok());
  std::filesystem::create_directory(dir / "full2");
  std::ofstream(dir / "full2/y") << "y";
  st = CopyStoreCompact(dir / "src.ps", dir / "full2");
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("must be an empty directory"), std::string::npos);
  std::filesystem::create_directory(dir / "empty");
  EXPECT_EQ(CopyStoreCompact(dir / "nothing.ps", dir / "empty").code(), Code::kNotFound);
  EXPECT_TRUE(std::filesystem::is_empty(dir / "empty"));
}

TEST(CopyPaths, EmptyNestedAndSameDestinationsAreUsageErrors) {
  TempDir dir;
  ASSERT_TRUE(testing::WriteSyntheticStore(dir / "a.ps", 3, {{"v", 1}}, 5, 6).ok());
  std::filesystem::create_directory(dir / "outer");
  Status empty = CheckCopyPaths(dir / "a.ps", "");
  EXPECT_EQ(empty.code(), Code::kInvalidArgument);
  EXPECT_NE(empty.message().find("destination path is empty"), std::string::npos) << empty.message();
  Status inside = CheckCopyPaths(dir / "a.ps", dir / "a.ps/sub.ps");
  EXPECT_EQ(inside.code(), Code::kInvalidArgument);
  EXPECT_NE(inside.message().find("inside the source"), std::string::npos) << inside.message();
  // The same folder spelled through "..": it exists, so AlreadyExists.
  EXPECT_EQ(CheckCopyPaths(dir / "a.ps", dir / "outer/../a.ps").code(), Code::kAlreadyExists);
  // A source inside the destination (the destination not yet there).
  Status outer = CheckCopyPaths(dir / "new.ps/x.ps", dir / "new.ps");
  EXPECT_EQ(outer.code(), Code::kInvalidArgument);
  EXPECT_NE(outer.message().find("source lies inside the destination"), std::string::npos) << outer.message();
  // Through a symbolic link to the source: still inside it.
  std::filesystem::create_directory_symlink(dir / "a.ps", dir / "link");
  EXPECT_EQ(CheckCopyPaths(dir / "a.ps", dir / "link/deeper.ps").code(), Code::kInvalidArgument);
  EXPECT_EQ(CheckCopyPaths(dir / "a.ps", dir / "nofolder/b.ps").code(), Code::kNotFound);
  EXPECT_TRUE(CheckCopyPaths(dir / "a.ps", dir / "outer/a.ps").ok());
  EXPECT_TRUE(CheckCopyPaths(dir / "a.ps", dir / "a.ps2").ok());         // a name prefix is not nesting
  EXPECT_TRUE(CheckCopyPaths(dir / "a.ps", dir / "outer/c.ps//").ok());  // trailing slashes: the same name
  EXPECT_EQ(CheckCopyPaths(dir / "a.ps", dir / "a.ps/").code(), Code::kAlreadyExists);
  EXPECT_EQ(CheckCopyPaths(dir / "a.ps", "/").code(), Code::kAlreadyExists);
}

TEST(StagingFolders, NamesOfStagingFolders) {
  std::string dst;
  EXPECT_TRUE(IsStagingFolderName("/x/frames.ps.copy-Ab3xZ9", &dst));
  EXPECT_EQ(dst, "frames.ps");
  EXPECT_FALSE(IsStagingFolderName("/x/frames.ps.copy-Ab3x"));
  EXPECT_FALSE(IsStagingFolderName("/x/frames.ps.copy-Ab3x_9"));
  EXPECT_FALSE(IsStagingFolderName("/x/frames.ps"));
  EXPECT_FALSE(IsStagingFolderName("/x/.copy-abcdef"));
}

// A child process that stages a store for `dst`, writes a file in it, tells
// the parent through a pipe and waits to be killed.
pid_t StageInChild(const std::string& dst, std::string* staged_path) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    auto s = StagedStore::Create("", dst);
    std::string p = s.ok() ? (*s)->path() : std::string("!") + s.status().message();
    if (s.ok()) std::ofstream((*s)->path() + "/data.mdb") << "partial";
    p += "\n";
    if (::write(fds[1], p.data(), p.size()) < 0) ::_exit(1);
    for (;;) ::pause();
  }
  ::close(fds[1]);
  char buf[4096];
  std::string got;
  ssize_t n;
  while (got.find('\n') == std::string::npos && (n = ::read(fds[0], buf, sizeof(buf))) > 0) got.append(buf, n);
  ::close(fds[0]);
  if (!got.empty()) got.pop_back();
  *staged_path = got;
  return pid;
}

TEST(StagingFolders, ALaterStagingRemovesTheFolderOfAKilledWriterOnlyOnceItIsDead) {
  TempDir dir;
  const std::string dst = dir / "set/b.ps";
  std::filesystem::create_directory(dir / "set");
  std::string staged;
  const pid_t child = StageInChild(dst, &staged);
  ASSERT_GT(child, 0);
  ASSERT_TRUE(IsStagingFolderName(staged)) << staged;
  // Another destination's staging folder and a marker-less one (an older
  // patchstore's) are never removed.
  std::filesystem::create_directories(dir / "set/c.ps.copy-Qw3rty");
  std::filesystem::create_directories(dir / "set/b.ps.copy-00old0");
  std::ofstream(dir / "set/b.ps.copy-00old0/data.mdb") << "old";
  // The writer lives: its folder is kept and said to be live.
  auto found = CleanStagingFolders(dst);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].path, dir / "set/b.ps.copy-00old0");
  EXPECT_FALSE(found[0].removed);
  EXPECT_FALSE(found[0].live);
  EXPECT_NE(found[0].note.find("no staging marker"), std::string::npos) << found[0].note;
  EXPECT_EQ(found[1].path, staged);
  EXPECT_TRUE(found[1].live);
  EXPECT_FALSE(found[1].removed);
  EXPECT_NE(found[1].note.find("pid " + std::to_string(child)), std::string::npos) << found[1].note;
  EXPECT_TRUE(std::filesystem::exists(staged + "/data.mdb"));
  // Read as a shard set, the folder holding both leftovers yields no store
  // from them.
  ASSERT_TRUE(testing::WriteSyntheticStore(dir / "set/a.ps", 2, {{"v", 1}}, 3, 4).ok());
  std::vector<std::string> skipped;
  EXPECT_EQ(StoresInFolder(dir / "set", &skipped), std::vector<std::string>{dir / "set/a.ps"});
  EXPECT_EQ(skipped, (std::vector<std::string>{dir / "set/b.ps.copy-00old0", staged, dir / "set/c.ps.copy-Qw3rty"}));
  const std::string warning = SkippedStagingWarning(dir / "set", skipped);
  EXPECT_NE(warning.find("skipped 3 staging folders 'b.ps.copy-00old0', '" +
                         std::filesystem::path(staged).filename().string() + "', 'c.ps.copy-Qw3rty'"),
            std::string::npos)
      << warning;
  // Killed: the next staging for the same destination removes its folder
  // and makes its own.
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  std::vector<StagingLeftover> cleaned;
  auto next = StagedStore::Create("", dst, &cleaned);
  ASSERT_TRUE(next.ok()) << next.status().message();
  ASSERT_EQ(cleaned.size(), 2u);
  EXPECT_TRUE(cleaned[1].removed);
  EXPECT_NE(cleaned[1].note.find("interrupted copy (pid " + std::to_string(child)), std::string::npos)
      << cleaned[1].note;
  EXPECT_FALSE(std::filesystem::exists(staged));
  EXPECT_TRUE(std::filesystem::exists(dir / "set/b.ps.copy-00old0/data.mdb"));
  EXPECT_TRUE(std::filesystem::exists(dir / "set/c.ps.copy-Qw3rty"));
  // Committed: the folder becomes the destination without its marker.
  const std::string mine = (*next)->path();
  ASSERT_TRUE((*next)->Commit().ok());
  EXPECT_FALSE(std::filesystem::exists(mine));
  EXPECT_TRUE(std::filesystem::is_directory(dst));
  EXPECT_FALSE(std::filesystem::exists(dst + "/" + kStagingMarker));
}

TEST(StagingFolders, ADestinationThatAppearsMeanwhileIsLeftAndTheStagedCopyRemoved) {
  testing::TempDir dir;
  const std::string dst = dir / "race.ps";
  std::string staged;
  {
    auto s = StagedStore::Create("", dst);
    ASSERT_TRUE(s.ok()) << s.status().message();
    staged = (*s)->path();
    std::ofstream(staged + "/data.mdb") << "verified copy";
    // Another copy wins the race: DST now exists and holds a store.
    std::filesystem::create_directory(dst);
    std::ofstream(dst + "/data.mdb") << "the winner";
    Status st = (*s)->Commit();
    EXPECT_EQ(st.code(), Code::kAlreadyExists) << st.message();
    EXPECT_NE(st.message().find("'" + dst + "' appeared while this copy ran"), std::string::npos) << st.message();
  }
  std::ifstream winner(dst + "/data.mdb");
  std::string text((std::istreambuf_iterator<char>(winner)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "the winner");
  EXPECT_FALSE(std::filesystem::exists(staged)) << staged;
}

TEST(StagingFolders, AnUnlockedMarkerOfALiveProcessIsKeptAReusedPidIsNot) {
  TempDir dir;
  const std::string dst = dir / "v.ps";
  // Our own pid with our start time, not locked (as on a filesystem without
  // locks): a running owner, kept.
  std::string stat;
  {
    std::ifstream in("/proc/self/stat");
    std::getline(in, stat);
  }
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string tok, start;
  for (int field = 3; field <= 22 && (rest >> tok); ++field) start = tok;
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  const std::string live = dst + ".copy-L1ve00", reused = dst + ".copy-Reu5ed";
  std::filesystem::create_directory(live);
  std::filesystem::create_directory(reused);
  const std::string me = "pid=" + std::to_string(::getpid()) + " boot=" + boot + " host=" + host;
  std::ofstream(live + "/" + kStagingMarker) << me << " start=" << start << "\n";
  // The same pid, another start time: the pid was reused, the owner is gone.
  std::ofstream(reused + "/" + kStagingMarker) << me << " start=" << (std::stoull(start) + 7) << "\n";
  auto found = CleanStagingFolders(dst);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].path, live);
  EXPECT_TRUE(found[0].live);
  EXPECT_TRUE(std::filesystem::exists(live));
  EXPECT_EQ(found[1].path, reused);
  EXPECT_TRUE(found[1].removed);
  EXPECT_FALSE(std::filesystem::exists(reused));
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
