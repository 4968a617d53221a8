// Many readers: concurrent processes with bit-exact data, killed readers that
// must not exhaust LMDB's reader table, and a live store read while it is
// being written (only committed samples visible, map growth survived).
#include <gtest/gtest.h>

#include <dirent.h>
#include <lmdb.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <random>
#include <thread>

#include "patchstore/reader/reader.h"
#include "patchstore/reader/verify.h"
#include "patchstore/store/store.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::SyntheticValue;
using testing::TempDir;
using testing::WriteSyntheticStore;

int EnvInt(const char* name, int dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : dflt;
}

int OpenFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (d && readdir(d)) ++n;
  if (d) closedir(d);
  return n;
}

// Reader slots in use, as LMDB's own reader list reports them.
int ReaderSlots(const std::string& path) {
  MDB_env* env = nullptr;
  mdb_env_create(&env);
  mdb_env_set_maxdbs(env, 8);
  if (mdb_env_open(env, path.c_str(), MDB_RDONLY, 0644) != 0) {
    mdb_env_close(env);
    return -1;
  }
  int lines = 0;
  mdb_reader_list(
      env,
      [](const char*, void* ctx) -> int {
        ++*static_cast<int*>(ctx);
        return 0;
      },
      &lines);
  mdb_env_close(env);
  return lines - 1;  // the first line is a header (or "(no active readers)")
}

TEST(Concurrency, ManyReaderProcessesReadBitExactData) {
  // CI: 64 processes x 20 s; PATCHSTORE_READERS / PATCHSTORE_READER_SECONDS for more.
  const int procs = EnvInt("PATCHSTORE_READERS", 64);
  const int seconds = EnvInt("PATCHSTORE_READER_SECONDS", 20);
  TempDir dir;
  const std::string path = dir / "s.ps";
  ASSERT_TRUE(WriteSyntheticStore(path, 16, {{"rgb", 3}, {"depth", 1}}, 48, 64).ok());
  auto* reads = static_cast<std::atomic<uint64_t>*>(
      mmap(nullptr, sizeof(std::atomic<uint64_t>) * procs, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(reads, MAP_FAILED);
  for (int p = 0; p < procs; ++p) new (&reads[p]) std::atomic<uint64_t>(0);
  std::vector<pid_t> pids;
  for (int p = 0; p < procs; ++p) {
    pid_t pid = fork();
    if (pid == 0) {
      auto r = Reader::Open(path);
      if (!r.ok()) _exit(2);
      std::mt19937 rng(static_cast<unsigned>(p) * 7919u);
      std::vector<float> buf(3 * 16 * 16);
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
      while (std::chrono::steady_clock::now() < end) {
        for (int i = 0; i < 64; ++i) {
          const uint64_t s = rng() % 16;
          const int f = static_cast<int>(rng() % 2);
          const int64_t y = rng() % 33, x = rng() % 49;
          if (!(*r)->CopyPatch(s, f, y, x, 16, 16, buf.data()).ok()) _exit(3);
          const int64_t C = f == 0 ? 3 : 1;
          for (int64_t c = 0; c < C; ++c)
            for (int64_t yy = 0; yy < 16; yy += 5)
              for (int64_t xx = 0; xx < 16; xx += 3)
                if (buf[(c * 16 + yy) * 16 + xx] != SyntheticValue(s, f, c, y + yy, x + xx)) _exit(4);
        }
        reads[p].fetch_add(64, std::memory_order_relaxed);
      }
      _exit(0);
    }
    ASSERT_GT(pid, 0);
    pids.push_back(pid);
  }
  int failures = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  uint64_t total = 0;
  for (int p = 0; p < procs; ++p) total += reads[p].load();
  munmap(reads, sizeof(std::atomic<uint64_t>) * procs);
  EXPECT_EQ(failures, 0);
  EXPECT_GT(total, static_cast<uint64_t>(procs));
  std::printf("[ readers ] %d processes x %d s: %llu bit-exact patch reads, %d errors\n", procs, seconds,
              static_cast<unsigned long long>(total), failures);
}

TEST(Concurrency, KilledReadersDoNotExhaustTheReaderTableOrLeakFds) {
  TempDir dir;
  const std::string path = dir / "live.ps";
  // An unsealed store: readers use LMDB's lock table.
  ASSERT_TRUE(WriteSyntheticStore(path, 4, {{"x", 1}}, 8, 8, /*seal=*/false).ok());
  const int cycles = EnvInt("PATCHSTORE_KILL_CYCLES", 200);
  const int fds_before = OpenFds();
  for (int c = 0; c < cycles; ++c) {
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    pid_t pid = fork();
    if (pid == 0) {
      close(ready[0]);
      auto r = Reader::Open(path);  // takes a reader slot
      char ok = r.ok() && (*r)->size() == 4 ? 'y' : 'n';
      if (write(ready[1], &ok, 1) != 1) _exit(1);
      pause();
      _exit(0);
    }
    close(ready[1]);
    char ok = 0;
    ASSERT_EQ(read(ready[0], &ok, 1), 1);
    close(ready[0]);
    ASSERT_EQ(ok, 'y') << "cycle " << c << ": reader failed to open (readers full?)";
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    // The parent opens and drops a reader each cycle too: no descriptor may leak.
    auto r = Reader::Open(path);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  EXPECT_EQ(OpenFds(), fds_before);
  // Opening cleared the stale slots of the killed readers.
  EXPECT_LE(ReaderSlots(path), 1);
  std::printf("[ readers ] %d SIGKILLed readers: no 'readers full', %d fds before and after, %d slots in use\n", cycles,
              fds_before, ReaderSlots(path));
}

TEST(Concurrency, LiveStoreReadWhileIngestWritesAndGrowsTheMap) {
  TempDir dir;
  const std::string path = dir / "live.ps";
  ASSERT_TRUE(WriteSyntheticStore(path, 1, {{"rgb", 3}}, 64, 64, false, 1, 64 << 10).ok());
  pid_t writer = fork();
  if (writer == 0) {
    // 60 more samples of 48 KiB, one per commit, from a 64 KiB map: it grows many times.
    Status st = WriteSyntheticStore(path, 61, {{"rgb", 3}}, 64, 64, true, 1, 64 << 10);
    _exit(st.ok() ? 0 : 1);
  }
  uint64_t last = 0;
  int opens = 0;
  bool done = false;
  while (!done) {
    int status = 0;
    done = waitpid(writer, &status, WNOHANG) == writer;
    if (done) {
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    auto r = Reader::Open(path);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ++opens;
    const uint64_t n = (*r)->size();
    ASSERT_GE(n, last);
    last = n;
    for (uint64_t s = 0; s < n; ++s) {
      ASSERT_TRUE((*r)->Verify(s, 0).ok()) << "sample " << s << " of " << n;
      auto v = (*r)->Get(s, 0);
      ASSERT_TRUE(v.ok());
      ASSERT_EQ(v->data_as<float>()[3 * 64 * 64 - 1], SyntheticValue(s, 0, 2, 63, 63));
    }
  }
  EXPECT_EQ(last, 61u);
  std::printf("[ live ] %d reader opens while writing 60 samples: every visible sample complete\n", opens);
}

}  // namespace
}  // namespace patchstore
