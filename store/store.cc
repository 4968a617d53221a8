#include "patchstore/store/store.h"
#include "patchstore/store/copy.h"
#include "store/filesystem.h"

#include <lmdb.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

namespace patchstore {

// One open LMDB environment. Created by Writer::Open or Snapshot::Open.
class Env;
Result<std::shared_ptr<Env>> OpenReadEnv(const std::string& path, bool no_lock);

class Env {
 public:
  ~Env();
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

  MDB_env* raw() const { return env_; }
  const std::string& path() const { return path_; }
  bool read_only() const { return read_only_; }
  bool no_lock() const { return no_lock_; }
  // True when called in the process that opened the environment.
  bool InOpeningProcess() const;

  MDB_dbi meta_dbi = 0, ids_dbi = 0, records_dbi = 0, index_dbi = 0, geometry_dbi = 0;

 private:
  friend class Writer;
  friend class Snapshot;
  friend Result<std::shared_ptr<Env>> OpenReadEnv(const std::string& path, bool no_lock);
  Env() = default;
  MDB_env* env_ = nullptr;
  std::string path_;
  bool read_only_ = true;
  bool no_lock_ = false;
  pid_t pid_ = 0;
};

// Formats an LMDB return code as a Status: "<what> '<path>': <mdb_strerror>".
Status LmdbError(const std::string& what, const std::string& path, int rc);

namespace {

constexpr unsigned kMaxReaders = 1024;  // fixed by the first opener; keep it large
constexpr unsigned kMaxDbs = 8;
constexpr char kMetaKey[] = "store";
constexpr char kSealedIndexKey[] = "sealed_index";
constexpr char kInputOrderKey[] = "input_order";

MDB_val Val(const void* p, size_t n) { return MDB_val{n, const_cast<void*>(p)}; }

bool IsPermissionError(int rc) { return rc == EACCES || rc == EROFS || rc == EPERM; }

// Checks that data.mdb holds every page LMDB believes it has, so no access
// can run past the end of the file (which would raise SIGBUS).
Status CheckFileSize(MDB_env* env, const std::string& path) {
  MDB_envinfo info;
  MDB_stat st;
  int rc = mdb_env_info(env, &info);
  if (rc == 0) rc = mdb_env_stat(env, &st);
  if (rc != 0) return LmdbError("reading environment info of", path, rc);
  struct stat sb;
  const std::string data = path + "/data.mdb";
  if (::stat(data.c_str(), &sb) != 0) return Status::FromErrno("stat '" + data + "'", errno);
  const uint64_t need = (static_cast<uint64_t>(info.me_last_pgno) + 1) * st.ms_psize;
  if (static_cast<uint64_t>(sb.st_size) < need)
    return Status::Corruption("opening store '" + path + "': data.mdb is truncated (" + std::to_string(sb.st_size) +
                              " bytes, LMDB needs " + std::to_string(need) + ")");
  return Status::OK();
}

Status OpenDbis(Env* env, MDB_txn* txn, unsigned flags) {
  struct {
    const char* name;
    MDB_dbi* dbi;
  } dbs[] = {{"meta", &env->meta_dbi}, {"ids", &env->ids_dbi}, {"records", &env->records_dbi}};
  for (auto& d : dbs) {
    int rc = mdb_dbi_open(txn, d.name, flags, d.dbi);
    if (rc == MDB_NOTFOUND)
      return Status::NotFound("opening store '" + env->path() + "': no '" + d.name +
                              "' database (not a patchstore store?)");
    if (rc != 0) return LmdbError(std::string("opening database '") + d.name + "' of", env->path(), rc);
  }
  return Status::OK();
}

Result<StoreMeta> ReadMeta(MDB_txn* txn, MDB_dbi dbi, const std::string& path) {
  MDB_val k = Val(kMetaKey, sizeof(kMetaKey) - 1), v;
  int rc = mdb_get(txn, dbi, &k, &v);
  if (rc == MDB_NOTFOUND) return Status::Corruption("opening store '" + path + "': metadata record missing");
  if (rc != 0) return LmdbError("reading metadata of", path, rc);
  auto meta = StoreMeta::Decode(std::string_view(static_cast<const char*>(v.mv_data), v.mv_size));
  if (!meta.ok()) return meta.status().WithContext("opening store '" + path + "'");
  return meta;
}

// Builds the sealed index (FORMAT.md) from the ids and index databases.
// With `input_ordinal`, also writes the input order (kInputOrderKey) when
// every id has an ordinal.
Status PutSealedIndex(Env* env, MDB_txn* txn, uint64_t count, bool* map_full = nullptr,
                      const Writer::OrdinalOf& input_ordinal = nullptr) {
  std::string blob = BeginSealedIndex(count);
  std::vector<uint64_t> ordinals;
  bool all_ordinals = static_cast<bool>(input_ordinal);
  MDB_cursor* ic = nullptr;
  int rc = mdb_cursor_open(txn, env->ids_dbi, &ic);
  if (rc != 0) return LmdbError("sealing: reading ids of", env->path(), rc);
  MDB_val k, v;
  uint64_t n = 0;
  Status st;
  for (rc = mdb_cursor_get(ic, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(ic, &k, &v, MDB_NEXT), ++n) {
    uint64_t idx = 0;
    if (!DecodeIndexKey(k.mv_data, k.mv_size, &idx) || idx != n) {
      st = Status::Corruption("sealing '" + env->path() + "': ids are not dense");
      break;
    }
    auto id = DecodeIdValue(idx, v.mv_data, v.mv_size);
    if (!id.ok()) {
      st = id.status().WithContext("sealing '" + env->path() + "'");
      break;
    }
    MDB_val sv;
    MDB_val sk{k.mv_size, k.mv_data};
    int src = mdb_get(txn, env->index_dbi, &sk, &sv);
    if (src != 0) {
      st = src == MDB_NOTFOUND ? Status::Corruption("sealing '" + env->path() + "': sample #" + std::to_string(idx) +
                                                    " has no index entry")
                               : LmdbError("sealing: reading the index of", env->path(), src);
      break;
    }
    AppendSealedIndexEntry(&blob, *id, std::string_view(static_cast<const char*>(sv.mv_data), sv.mv_size));
    uint64_t ordinal = 0;
    if (all_ordinals && input_ordinal(*id, &ordinal)) ordinals.push_back(ordinal);
    else all_ordinals = false;
  }
  mdb_cursor_close(ic);
  if (!st.ok()) return st;
  if (rc != MDB_NOTFOUND) return LmdbError("sealing: reading ids of", env->path(), rc);
  if (n != count)
    return Status::Corruption("sealing '" + env->path() + "': " + std::to_string(n) + " ids for " +
                              std::to_string(count) + " samples");
  FinishSealedIndex(&blob);
  MDB_val bk = Val(kSealedIndexKey, sizeof(kSealedIndexKey) - 1), bv = Val(blob.data(), blob.size());
  rc = mdb_put(txn, env->meta_dbi, &bk, &bv, 0);
  if (rc == MDB_MAP_FULL && map_full != nullptr) *map_full = true;
  if (rc != 0) return LmdbError("sealing: writing the sealed index of", env->path(), rc);
  if (all_ordinals) {
    const std::string order = EncodeInputOrder(ordinals);
    MDB_val ok = Val(kInputOrderKey, sizeof(kInputOrderKey) - 1), ov = Val(order.data(), order.size());
    rc = mdb_put(txn, env->meta_dbi, &ok, &ov, 0);
    if (rc == MDB_MAP_FULL && map_full != nullptr) *map_full = true;
    if (rc != 0) return LmdbError("sealing: writing the input order of", env->path(), rc);
  }
  return Status::OK();
}

// Refuses a data.mdb or lock.mdb that is not a regular file before LMDB
// opens it: opening a FIFO blocks forever, a device or directory is no store.
// `must_exist`: a missing file is an error too.
Status CheckStoreFile(const std::string& dir, const char* name, bool must_exist) {
  const std::string file = dir + "/" + name;
  struct stat sb;
  if (::stat(file.c_str(), &sb) != 0) {
    const int err = errno;
    if (err == ENOENT && !must_exist) return Status::OK();
    if (err == ENOENT)
      return Status::NotFound("opening store '" + dir + "': no " + name + " (not a patchstore store?)");
    if (err == EACCES)
      return Status::IOError("opening store '" + dir + "': permission denied reading the directory (cannot see " +
                             name + ")");
    return Status::FromErrno("opening store '" + dir + "': " + name, err);
  }
  if (!S_ISREG(sb.st_mode)) {
    const char* what = S_ISFIFO(sb.st_mode)                         ? "a FIFO"
                       : S_ISDIR(sb.st_mode)                        ? "a directory"
                       : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "a device"
                       : S_ISSOCK(sb.st_mode)                       ? "a socket"
                                                                    : "not a regular file";
    return Status::IOError("opening store '" + dir + "': " + name + " is " + what + ", not a regular file; refused");
  }
  if (sb.st_size == 0 && must_exist && std::string(name) == "data.mdb")
    return Status::Corruption("opening store '" + dir +
                              "': data.mdb is empty (0 bytes): truncated, or no ingest "
                              "has written to it yet");
  return Status::OK();
}

// Replaces LMDB's read-only shared map of a reader by a private
// copy-on-write map of the same file at the same address. Views handed out
// stay read-only by contract, but a write through one (torch.from_numpy
// ignores NumPy's read-only flag) then changes this process's copy of that
// page instead of raising SIGSEGV; the store file never changes. Pages not
// written are the page cache's, as before (no copy, no extra memory).
// LMDB does not say where its map is: a key read in a transaction points
// into it, and /proc/self/maps gives the mapping holding that key.
// MAP_NORESERVE: a map larger than RAM + swap is not charged up front.
// mremap swaps the mappings atomically; on any failure LMDB's map stays.
void PrivatizeMap(MDB_env* env) {
  MDB_envinfo info;
  int fd = -1;
  if (mdb_env_info(env, &info) != 0 || mdb_env_get_fd(env, &fd) != 0 || fd < 0) return;
  uintptr_t inside = 0;
  {
    MDB_txn* txn = nullptr;
    if (mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn) != 0) return;
    MDB_dbi main_dbi;
    MDB_cursor* cur = nullptr;
    MDB_val k, v;
    if (mdb_dbi_open(txn, nullptr, 0, &main_dbi) == 0 && mdb_cursor_open(txn, main_dbi, &cur) == 0) {
      if (mdb_cursor_get(cur, &k, &v, MDB_FIRST) == 0) inside = reinterpret_cast<uintptr_t>(k.mv_data);
      mdb_cursor_close(cur);
    }
    mdb_txn_abort(txn);
  }
  if (inside == 0) return;  // nothing committed: no views to protect
  FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) return;
  unsigned long start = 0, end = 0, offset = 0;
  char perms[8] = {0}, line[512];
  bool found = false;
  while (std::fgets(line, sizeof line, maps) != nullptr) {
    if (std::sscanf(line, "%lx-%lx %7s %lx", &start, &end, perms, &offset) == 4 && start <= inside && inside < end) {
      found = true;
      break;
    }
  }
  std::fclose(maps);
  const size_t size = info.me_mapsize;
  if (!found || offset != 0 || perms[3] != 's' || perms[1] == 'w' || end - start != size) return;
  void* priv = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd, 0);
  if (priv == MAP_FAILED) return;
  if (::mremap(priv, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(start)) == MAP_FAILED) {
    ::munmap(priv, size);
    return;
  }
  // The new mapping replaces LMDB's, and with it the MADV_RANDOM that
  // MDB_NORDAHEAD applied: apply it again (random access, no readahead).
  ::madvise(reinterpret_cast<void*>(start), size, MADV_RANDOM);
}

// Walks a database keyed by IndexKey(sample) in key order; stops at the
// first error (a malformed key, or the visitor's).
Status WalkByIndex(MDB_txn* txn, MDB_dbi dbi, const std::string& what, const std::string& path,
                   const std::function<Status(uint64_t, const MDB_val&)>& visit) {
  MDB_cursor* cur = nullptr;
  int rc = mdb_cursor_open(txn, dbi, &cur);
  if (rc != 0) return LmdbError("reading " + what + " of", path, rc);
  MDB_val k, v;
  Status st;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    uint64_t idx;
    if (!DecodeIndexKey(k.mv_data, k.mv_size, &idx)) {
      st = Status::Corruption("reading " + what + " of '" + path + "': malformed key");
      break;
    }
    st = visit(idx, v);
    if (!st.ok()) break;
  }
  mdb_cursor_close(cur);
  if (!st.ok()) return st;
  if (rc != MDB_NOTFOUND) return LmdbError("reading " + what + " of", path, rc);
  return Status::OK();
}

}  // namespace

#ifndef PATCHSTORE_VERSION
#error "PATCHSTORE_VERSION is defined by CMakeLists.txt from the VERSION file"
#endif
const char* ToolVersion() { return PATCHSTORE_VERSION; }

Status LmdbError(const std::string& what, const std::string& path, int rc) {
  std::string msg = what + " '" + path + "': " + mdb_strerror(rc);
  if (rc == EIO || rc == ENOSPC || rc == EDQUOT) {
    // LMDB reports a short write (a full disk mid-write) as EIO: say when
    // the file system holding the store is (nearly) full.
    struct statvfs vf;
    if (::statvfs(path.c_str(), &vf) == 0) {
      const uint64_t free_bytes = static_cast<uint64_t>(vf.f_bavail) * vf.f_frsize;
      if (free_bytes < (uint64_t{64} << 20))
        msg += " (the file system holding the store is full: " + std::to_string(free_bytes) + " bytes free)";
    }
  }
  if (rc == ENOENT) return Status::NotFound(msg);
  if (rc == MDB_CORRUPTED || rc == MDB_INVALID || rc == MDB_PAGE_NOTFOUND || rc == MDB_VERSION_MISMATCH)
    return Status::Corruption(msg);
  return Status::IOError(msg);
}

Env::~Env() {
  // Never touch LMDB in a forked child: closing would release the parent's
  // lock-table state. The child leaks the handle instead (the OS reclaims it).
  if (env_ != nullptr && InOpeningProcess()) mdb_env_close(env_);
}

bool Env::InOpeningProcess() const { return ::getpid() == pid_; }

// ---------------------------------------------------------------------------
// Snapshot

Result<std::shared_ptr<Env>> OpenReadEnv(const std::string& path, bool no_lock) {
  auto env = std::shared_ptr<Env>(new Env());
  env->path_ = path;
  env->read_only_ = true;
  env->no_lock_ = no_lock;
  env->pid_ = ::getpid();
  int rc = mdb_env_create(&env->env_);
  if (rc != 0) return LmdbError("creating environment for", path, rc);
  mdb_env_set_maxdbs(env->env_, kMaxDbs);
  mdb_env_set_maxreaders(env->env_, kMaxReaders);
  // MDB_NORDAHEAD: readers access records at random (one window of a frame,
  // one slice of a volume); with the kernel's readahead every page fault
  // would read up to read_ahead_kb around it. Streaming commands ask for
  // readahead explicitly (Snapshot::Advise).
  unsigned flags = MDB_RDONLY | MDB_NOTLS | MDB_NORDAHEAD | (no_lock ? MDB_NOLOCK : 0);
  rc = mdb_env_open(env->env_, path.c_str(), flags, 0644);
  if (rc != 0) {
    mdb_env_close(env->env_);
    env->env_ = nullptr;
    if (IsPermissionError(rc) && !no_lock) return Status(Code::kIOError, "EACCES");  // caller retries
    return LmdbError("opening store", path, rc);
  }
  PS_RETURN_IF_ERROR(CheckFileSize(env->env_, path));
  PrivatizeMap(env->env_);
  return env;
}

Result<std::shared_ptr<Snapshot>> Snapshot::Open(const std::string& path, const SnapshotOptions& options) {
  if (path.find('\0') != std::string::npos)
    return Status::InvalidArgument("opening store '" + path + "': the path contains a NUL byte");
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    if (std::filesystem::exists(path, ec))
      return Status::InvalidArgument("opening store '" + path +
                                     "': not a directory (a store is a directory "
                                     "holding data.mdb)");
    return Status::NotFound("opening store '" + path + "': no such directory");
  }
  PS_RETURN_IF_ERROR(CheckStoreFile(path, "data.mdb", true));
  PS_RETURN_IF_ERROR(CheckStoreFile(path, "lock.mdb", false));

  bool no_lock = options.force_no_lock;
  // No lock.mdb yet (a copied store, a fresh mount): look without creating
  // one first; a sealed store is then read as it is, and only an unsealed
  // one gets its lock file (below).
  bool probing = false;
  if (!no_lock && options.auto_no_lock && !std::filesystem::exists(path + "/lock.mdb", ec)) no_lock = probing = true;
  for (int attempt = 0; attempt < 4; ++attempt) {
    auto env_r = OpenReadEnv(path, no_lock);
    if (!env_r.ok()) {
      if (!no_lock && options.auto_no_lock && env_r.status().message() == "EACCES") {
        no_lock = true;  // read-only directory or lock file: read without the lock table
        continue;
      }
      if (env_r.status().message() == "EACCES")
        return Status::IOError("opening store '" + path + "': permission denied on lock.mdb");
      return env_r.status();
    }
    auto snap = std::shared_ptr<Snapshot>(new Snapshot());
    snap->env_ = std::move(env_r).value();
    Env* env = snap->env_.get();
    if (!no_lock) {
      int dead = 0;
      mdb_reader_check(env->raw(), &dead);  // clear slots of killed readers
    }
    MDB_txn* read_txn = nullptr;
    int rc = mdb_txn_begin(env->raw(), nullptr, MDB_RDONLY, &read_txn);
    if (rc == MDB_MAP_RESIZED) {
      mdb_env_set_mapsize(env->raw(), 0);  // LMDB maps again: make the new map private too
      PrivatizeMap(env->raw());
      rc = mdb_txn_begin(env->raw(), nullptr, MDB_RDONLY, &read_txn);
    }
    snap->txn_ = read_txn;
    if (rc == MDB_READERS_FULL)
      return Status::IOError("opening store '" + path + "': LMDB reader table full (" + std::to_string(kMaxReaders) +
                             " slots); too many concurrent readers");
    if (rc != 0) return LmdbError("starting read transaction on", path, rc);
    {
      // An environment in which no ingest has committed yet (the writer was
      // stopped between creating data.mdb and its first commit) holds no
      // databases at all: that is an empty store, not a damaged one.
      MDB_stat main_stat;
      MDB_dbi main_dbi;
      if (mdb_dbi_open(static_cast<MDB_txn*>(snap->txn_), nullptr, 0, &main_dbi) == 0 &&
          mdb_stat(static_cast<MDB_txn*>(snap->txn_), main_dbi, &main_stat) == 0 && main_stat.ms_entries == 0) {
        if (probing) {  // not sealed: read it with the lock table
          probing = no_lock = false;
          continue;
        }
        snap->empty_ = true;
        snap->meta_.tool_version = ToolVersion();
        return snap;
      }
    }
    PS_RETURN_IF_ERROR(OpenDbis(env, static_cast<MDB_txn*>(snap->txn_), 0));
    PS_ASSIGN_OR_RETURN(snap->meta_, ReadMeta(static_cast<MDB_txn*>(snap->txn_), env->meta_dbi, path));
    if (snap->meta_.format_version < kStoreFormatVersion && !options.allow_old_format)
      return Status::Unsupported("opening store '" + path + "': it has store format " +
                                 std::to_string(snap->meta_.format_version) + " (written by patchstore " +
                                 snap->meta_.tool_version + "); this patchstore reads format " +
                                 std::to_string(kStoreFormatVersion) + ". Run `patchstore upgrade " + path +
                                 "` once: it adds the sample index and keeps every record");
    {
      int irc = mdb_dbi_open(static_cast<MDB_txn*>(snap->txn_), "index", 0, &env->index_dbi);
      if (irc == 0) {
        snap->has_index_ = true;
      } else if (irc != MDB_NOTFOUND) {
        return LmdbError("opening database 'index' of", path, irc);
      } else if (snap->meta_.format_version >= 2) {
        return Status::Corruption("opening store '" + path + "': format " + std::to_string(snap->meta_.format_version) +
                                  " store without its 'index' database");
      }
    }
    {
      // Volume geometry (FORMAT.md): optional, absent in stores written
      // before it existed.
      int grc = mdb_dbi_open(static_cast<MDB_txn*>(snap->txn_), "geometry", 0, &env->geometry_dbi);
      if (grc == 0) snap->has_geometry_ = true;
      else if (grc != MDB_NOTFOUND) return LmdbError("opening database 'geometry' of", path, grc);
    }
    if (probing && !snap->meta_.sealed) {
      probing = no_lock = false;  // a live store: readers take slots in the lock table
      continue;
    }
    if (snap->meta_.sealed && !no_lock && options.auto_no_lock) {
      // A sealed store never changes: read it without the lock table so that
      // killed readers cannot leak slots. Reopen that way.
      no_lock = true;
      continue;
    }
    MDB_stat st;
    rc = mdb_stat(static_cast<MDB_txn*>(snap->txn_), env->ids_dbi, &st);
    if (rc != 0) return LmdbError("reading ids database of", path, rc);
    snap->id_count_ = st.ms_entries;
    if (snap->id_count_ != snap->meta_.sample_count)
      return Status::Corruption("opening store '" + path + "': metadata says " +
                                std::to_string(snap->meta_.sample_count) + " samples but the ids database holds " +
                                std::to_string(snap->id_count_));
    if (snap->has_index_) {
      rc = mdb_stat(static_cast<MDB_txn*>(snap->txn_), env->index_dbi, &st);
      if (rc != 0) return LmdbError("reading index database of", path, rc);
      if (st.ms_entries != snap->meta_.sample_count)
        return Status::Corruption("opening store '" + path + "': metadata says " +
                                  std::to_string(snap->meta_.sample_count) + " samples but the index holds " +
                                  std::to_string(st.ms_entries) + " summaries");
    }
    return snap;
  }
  return Status::Internal("opening store '" + path + "': could not settle on a lock mode");
}

Status Snapshot::CheckUnchanged() const {
  // A reader with a slot in the lock table pins its pages; only a reader
  // without one (a sealed store) can see them reused by a later writer.
  if (!no_lock() || txn_ == nullptr || !env_->InOpeningProcess()) return Status::OK();
  MDB_envinfo info;
  if (mdb_env_info(env_->raw(), &info) != 0) return Status::OK();
  const size_t mine = mdb_txn_id(static_cast<MDB_txn*>(txn_));
  if (info.me_last_txnid == mine) return Status::OK();
  return Status::IOError("reading store '" + path() +
                         "': the store changed since this reader opened it (another "
                         "process wrote to it after it was sealed; transaction " +
                         std::to_string(mine) + " -> " + std::to_string(info.me_last_txnid) +
                         "); its pages may be reused: reopen the store");
}

const std::string& Snapshot::path() const { return env_->path(); }
bool Snapshot::no_lock() const { return env_->no_lock(); }

Snapshot::~Snapshot() {
  if (txn_ != nullptr && env_ && env_->InOpeningProcess()) mdb_txn_abort(static_cast<MDB_txn*>(txn_));
}

Status Snapshot::ForEachId(const std::function<Status(uint64_t, std::string_view)>& visit) const {
  if (empty_) return Status::OK();
  return WalkByIndex(static_cast<MDB_txn*>(txn_), env_->ids_dbi, "ids", path(),
                     [&](uint64_t idx, const MDB_val& v) -> Status {
                       auto id = DecodeIdValue(idx, v.mv_data, v.mv_size);
                       if (!id.ok()) return id.status().WithContext("reading ids of '" + path() + "'");
                       return visit(idx, *id);
                     });
}

Status Snapshot::ForEachRecord(const std::function<Status(uint64_t, uint16_t, const uint8_t*, size_t)>& visit) const {
  if (empty_) return Status::OK();
  MDB_cursor* cur = nullptr;
  int rc = mdb_cursor_open(static_cast<MDB_txn*>(txn_), env_->records_dbi, &cur);
  if (rc != 0) return LmdbError("reading records of", path(), rc);
  MDB_val k, v;
  Status st;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    uint64_t idx;
    uint16_t field;
    if (!DecodeRecordKey(k.mv_data, k.mv_size, &idx, &field)) {
      st = Status::Corruption("reading records of '" + path() + "': malformed key");
      break;
    }
    st = visit(idx, field, static_cast<const uint8_t*>(v.mv_data), v.mv_size);
    if (!st.ok()) break;
  }
  mdb_cursor_close(cur);
  if (!st.ok()) return st;
  if (rc != MDB_NOTFOUND) return LmdbError("reading records of", path(), rc);
  return Status::OK();
}

Result<std::string_view> Snapshot::GetRecord(uint64_t sample, uint16_t field) const {
  if (empty_) return Status::NotFound("record not found");
  auto key = RecordKey(sample, field);
  MDB_val k = Val(key.data(), key.size()), v;
  int rc = mdb_get(static_cast<MDB_txn*>(txn_), env_->records_dbi, &k, &v);
  if (rc == MDB_NOTFOUND) return Status::NotFound("record not found");
  if (rc != 0) return LmdbError("reading record of", path(), rc);
  return std::string_view(static_cast<const char*>(v.mv_data), v.mv_size);
}

Result<std::vector<uint64_t>> Snapshot::InputOrder() const {
  if (empty_ || !meta_.sealed) return Status::NotFound("store '" + path() + "' records no input order");
  MDB_val k = Val(kInputOrderKey, sizeof(kInputOrderKey) - 1), v;
  int rc = mdb_get(static_cast<MDB_txn*>(txn_), env_->meta_dbi, &k, &v);
  if (rc == MDB_NOTFOUND) return Status::NotFound("store '" + path() + "' records no input order");
  if (rc != 0) return LmdbError("reading the input order of", path(), rc);
  auto order = DecodeInputOrder(v.mv_data, v.mv_size);
  if (!order.ok()) return order.status().WithContext("store '" + path() + "'");
  if (order->size() != id_count_)
    return Status::Corruption("store '" + path() + "': the input order lists " + std::to_string(order->size()) +
                              " samples, the store holds " + std::to_string(id_count_));
  return order;
}

Result<std::optional<VolumeGeometry>> Snapshot::Geometry(uint64_t sample) const {
  if (empty_ || !has_geometry_) return std::optional<VolumeGeometry>();
  auto key = IndexKey(sample);
  MDB_val k = Val(key.data(), key.size()), v;
  int rc = mdb_get(static_cast<MDB_txn*>(txn_), env_->geometry_dbi, &k, &v);
  if (rc == MDB_NOTFOUND) return std::optional<VolumeGeometry>();
  if (rc != 0) return LmdbError("reading the geometry of", path(), rc);
  auto g = DecodeVolumeGeometry(sample, v.mv_data, v.mv_size);
  if (!g.ok())
    return g.status().WithContext("reading the geometry of sample #" + std::to_string(sample) + " of '" + path() + "'");
  return std::optional<VolumeGeometry>(*g);
}

Status Snapshot::ForEachGeometry(const std::function<Status(uint64_t, const uint8_t*, size_t)>& visit) const {
  if (empty_ || !has_geometry_) return Status::OK();
  return WalkByIndex(static_cast<MDB_txn*>(txn_), env_->geometry_dbi, "the geometry", path(),
                     [&](uint64_t idx, const MDB_val& v) -> Status {
                       return visit(idx, static_cast<const uint8_t*>(v.mv_data), v.mv_size);
                     });
}

Result<std::string_view> Snapshot::SealedIndex() const {
  if (empty_ || !meta_.sealed) return Status::NotFound("store '" + path() + "' is not sealed");
  MDB_val k = Val(kSealedIndexKey, sizeof(kSealedIndexKey) - 1), v;
  int rc = mdb_get(static_cast<MDB_txn*>(txn_), env_->meta_dbi, &k, &v);
  if (rc == MDB_NOTFOUND) return Status::NotFound("store '" + path() + "' has no sealed index");
  if (rc != 0) return LmdbError("reading the sealed index of", path(), rc);
  return std::string_view(static_cast<const char*>(v.mv_data), v.mv_size);
}

Status Snapshot::ForEachSummary(const std::function<Status(uint64_t, const SampleSummary&)>& visit) const {
  if (empty_) return Status::OK();
  if (!has_index_) return Status::NotFound("store '" + path() + "' has no sample index (format 1)");
  return WalkByIndex(static_cast<MDB_txn*>(txn_), env_->index_dbi, "the sample index", path(),
                     [&](uint64_t idx, const MDB_val& v) -> Status {
                       auto sum = DecodeSampleSummary(idx, v.mv_data, v.mv_size);
                       if (!sum.ok())
                         return sum.status().WithContext("reading the sample index of '" + path() + "' at sample #" +
                                                         std::to_string(idx));
                       return visit(idx, *sum);
                     });
}

void Snapshot::Advise(Access access, const void* data, size_t size) const {
  if (empty_ || !env_ || !env_->InOpeningProcess() || data == nullptr || size == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  uintptr_t begin = reinterpret_cast<uintptr_t>(data), end = begin + size;
  if (access == Access::kDontNeed) {
    // Only whole pages inside the range: never drop a neighbour's page.
    begin = (begin + page - 1) & ~(page - 1);
    end &= ~(page - 1);
  } else {
    begin &= ~(page - 1);
  }
  if (end <= begin) return;
  int advice = MADV_NORMAL;
  switch (access) {
    case Access::kRandom: advice = MADV_RANDOM; break;
    case Access::kSequential: advice = MADV_SEQUENTIAL; break;
    case Access::kWillNeed: advice = MADV_WILLNEED; break;
    case Access::kDontNeed: advice = MADV_DONTNEED; break;
  }
  if (access == Access::kWillNeed) {
    // Linux reads at most the device's readahead window (read_ahead_kb,
    // or its largest request) of one MADV_WILLNEED range: a larger range
    // (a whole frame or volume record) goes in pieces that each fit it.
    constexpr uintptr_t kPiece = uintptr_t{1} << 20;
    for (uintptr_t at = begin; at < end; at += kPiece)
      ::madvise(reinterpret_cast<void*>(at), std::min(kPiece, end - at), advice);
    return;
  }
  ::madvise(reinterpret_cast<void*>(begin), end - begin, advice);
}

bool Snapshot::Resident(const void* data) const {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  unsigned char resident = 0;
  void* first = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(data) & ~(page - 1));
  return ::mincore(first, 1, &resident) == 0 && (resident & 1);
}

bool Snapshot::Resident(const void* data, size_t size) const {
  if (data == nullptr || size == 0) return false;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(data) + size + page - 1) & ~(page - 1);
  std::vector<unsigned char> vec((e - b) / page);
  if (::mincore(reinterpret_cast<void*>(b), e - b, vec.data()) != 0) return false;
  for (unsigned char v : vec)
    if (!(v & 1)) return false;
  return true;
}

std::vector<std::pair<uintptr_t, uintptr_t>> PlanWillNeed(const std::vector<std::pair<const void*, size_t>>& ranges,
                                                          uintptr_t page, const ResidencyFn& residency) {
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  // The ranges as runs of whole pages, merged where they share or touch pages.
  thread_local std::vector<std::pair<uintptr_t, uintptr_t>> runs;
  runs.clear();
  for (const auto& [p, n] : ranges) {
    if (n == 0) continue;
    const uintptr_t b = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
    const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + n + page - 1) & ~(page - 1);
    if (!runs.empty() && b <= runs.back().second && e >= runs.back().first) {
      runs.back().first = std::min(runs.back().first, b);
      runs.back().second = std::max(runs.back().second, e);
    } else {
      runs.emplace_back(b, e);
    }
  }
  thread_local std::vector<unsigned char> resident;
  for (size_t i = 0; i < runs.size();) {
    // A cluster: runs [i, j) upwards, each within the gap of the last, the
    // whole within the span (a run longer than the span alone).
    const uintptr_t lo = runs[i].first;
    uintptr_t hi = runs[i].second;
    size_t j = i + 1;
    while (j < runs.size() && runs[j].first >= hi && runs[j].first - hi <= kWillNeedGapPages * page &&
           runs[j].second - lo <= kWillNeedSpanPages * page)
      hi = runs[j++].second;
    resident.resize((hi - lo) / page);
    if (!residency(lo, hi, resident.data())) {
      out.insert(out.end(), runs.begin() + static_cast<std::ptrdiff_t>(i),
                 runs.begin() + static_cast<std::ptrdiff_t>(j));
    } else {
      for (size_t k = i; k < j; ++k)
        for (uintptr_t a = runs[k].first; a < runs[k].second; a += page)
          if (!(resident[(a - lo) / page] & 1)) {
            out.push_back(runs[k]);
            break;
          }
    }
    i = j;
  }
  return out;
}

void Snapshot::WillNeed(const std::vector<std::pair<const void*, size_t>>& ranges) const {
  if (empty_ || !env_ || !env_->InOpeningProcess() || ranges.empty()) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  auto mincore = [](uintptr_t b, uintptr_t e, unsigned char* vec) {
    return ::mincore(reinterpret_cast<void*>(b), e - b, vec) == 0;
  };
  for (const auto& [b, e] : PlanWillNeed(ranges, page, mincore))
    ::madvise(reinterpret_cast<void*>(b), e - b, MADV_WILLNEED);
}

// ---------------------------------------------------------------------------
// Writer

Result<std::unique_ptr<Writer>> Writer::Open(const std::string& path, const WriterOptions& options) {
  if (path.find('\0') != std::string::npos)
    return Status::InvalidArgument("opening store '" + path + "' for writing: the path contains a NUL byte");
  PS_RETURN_IF_ERROR(CheckWriterFilesystem(path));
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return Status::IOError("creating store directory '" + path + "': " + ec.message());
  PS_RETURN_IF_ERROR(CheckStoreFile(path, "data.mdb", false));
  PS_RETURN_IF_ERROR(CheckStoreFile(path, "lock.mdb", false));

  // One writer per store: an advisory lock that dies with the process.
  const std::string lock_path = path + "/ingest.lock";
  int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) return Status::FromErrno("opening '" + lock_path + "'", errno);
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    ::close(lock_fd);
    if (err == EWOULDBLOCK)
      return Status::IOError("opening store '" + path + "' for writing: another process is writing to it");
    return Status::FromErrno("locking '" + lock_path + "'", err);
  }

  auto w = std::unique_ptr<Writer>(new Writer());
  w->lock_fd_ = lock_fd;  // held (locked) for the writer's life
  auto env = std::shared_ptr<Env>(new Env());
  env->path_ = path;
  env->read_only_ = false;
  env->pid_ = ::getpid();
  int rc = mdb_env_create(&env->env_);
  if (rc != 0) return LmdbError("creating environment for", path, rc);
  mdb_env_set_maxdbs(env->env_, kMaxDbs);
  mdb_env_set_maxreaders(env->env_, kMaxReaders);
  {
    // Room for the writes ahead, beyond what the file already holds (LMDB
    // maps at least the file): an upgrade adds the sample index in the
    // opening transaction, before the map could grow.
    struct stat sb;
    uint64_t map = options.initial_map_size;
    const std::string data = path + "/data.mdb";
    // Headroom of an eighth of the file (at least 256 MiB): a format-1
    // upgrade adds under 400 bytes per sample, and every sample holds at
    // least one 4 KiB record.
    if (::stat(data.c_str(), &sb) == 0) {
      const uint64_t file = static_cast<uint64_t>(sb.st_size);
      map = std::max<uint64_t>(map, file + std::max<uint64_t>(uint64_t{256} << 20, file / 8));
    }
    mdb_env_set_mapsize(env->env_, map);
  }
  unsigned flags = MDB_NOTLS | (options.durable ? 0 : MDB_NOSYNC);
  rc = mdb_env_open(env->env_, path.c_str(), flags, 0644);
  w->env_ = env;
  if (rc != 0) return LmdbError("opening store for writing", path, rc);
  PS_RETURN_IF_ERROR(CheckFileSize(env->env_, path));
  MDB_envinfo info;
  mdb_env_info(env->env_, &info);
  w->map_size_ = info.me_mapsize;

  MDB_txn* txn = nullptr;
  rc = mdb_txn_begin(env->env_, nullptr, 0, &txn);
  if (rc != 0) return LmdbError("starting write transaction on", path, rc);
  Status st = OpenDbis(env.get(), txn, MDB_CREATE);
  if (st.ok()) {
    rc = mdb_dbi_open(txn, "index", MDB_CREATE, &env->index_dbi);
    if (rc != 0) st = LmdbError("opening database 'index' of", path, rc);
  }
  if (st.ok()) {
    rc = mdb_dbi_open(txn, "geometry", MDB_CREATE, &env->geometry_dbi);
    if (rc != 0) st = LmdbError("opening database 'geometry' of", path, rc);
  }
  if (st.ok()) {
    MDB_val k = Val(kMetaKey, sizeof(kMetaKey) - 1), v;
    rc = mdb_get(txn, env->meta_dbi, &k, &v);
    if (rc == MDB_NOTFOUND) {
      w->meta_.kind = options.kind;
      w->meta_.tool_version = ToolVersion();
      // Commit the (empty) metadata with the databases, so the store is a
      // valid empty store from its first commit on.
      const std::string text = w->meta_.Encode();
      MDB_val mv = Val(text.data(), text.size());
      rc = mdb_put(txn, env->meta_dbi, &k, &mv, 0);
      if (rc != 0) st = LmdbError("writing metadata to", path, rc);
    } else if (rc != 0) {
      st = LmdbError("reading metadata of", path, rc);
    } else {
      auto meta = ReadMeta(txn, env->meta_dbi, path);
      if (!meta.ok()) {
        st = meta.status();
      } else {
        w->meta_ = std::move(meta).value();
        if (w->meta_.kind != options.kind)
          st = Status::InvalidArgument("opening store '" + path + "' for writing: it holds " + w->meta_.kind +
                                       ", not " + options.kind);
        else if (w->meta_.format_version < kStoreFormatVersion)
          st = w->Upgrade(txn);  // in the opening transaction: all or nothing
      }
    }
  }
  if (st.ok()) {
    MDB_cursor* cur = nullptr;
    rc = mdb_cursor_open(txn, env->ids_dbi, &cur);
    MDB_val k, v;
    uint64_t n = 0;
    for (rc = rc ? rc : mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
      uint64_t idx = 0;
      if (!DecodeIndexKey(k.mv_data, k.mv_size, &idx)) {
        st = Status::Corruption("opening store '" + path + "' for writing: malformed id key");
        break;
      }
      auto id = DecodeIdValue(idx, v.mv_data, v.mv_size);
      if (!id.ok()) {
        st = id.status().WithContext("opening store '" + path + "' for writing");
        break;
      }
      w->ids_.emplace(*id);
      ++n;
    }
    if (cur) mdb_cursor_close(cur);
    if (!st.ok()) {
    } else if (rc != MDB_NOTFOUND) st = LmdbError("reading ids of", path, rc);
    else if (n != w->meta_.sample_count)
      st = Status::Corruption("opening store '" + path + "' for writing: metadata says " +
                              std::to_string(w->meta_.sample_count) + " samples but the ids database holds " +
                              std::to_string(n));
  }
  if (!st.ok()) {
    mdb_txn_abort(txn);
    return st;
  }
  rc = mdb_txn_commit(txn);  // persists the created databases
  if (rc != 0) return LmdbError("creating databases in", path, rc);
  return w;
}

Writer::~Writer() {
  env_.reset();
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

Result<uint16_t> Writer::EnsureField(const FieldMeta& field) {
  int i = meta_.FieldIndex(field.name);
  if (i >= 0) {
    const FieldMeta& f = meta_.fields[i];
    if (f.channels != field.channels)
      return Status::InvalidArgument("field '" + field.name + "' has " + std::to_string(f.channels) +
                                     " channels in the store but " + std::to_string(field.channels) + " here");
    if (f.layout != field.layout)
      return Status::InvalidArgument("field '" + field.name + "' has another layout in the store");
    if (f.dtype != field.dtype)
      return Status::InvalidArgument("field '" + field.name + "' holds " + DTypeName(f.dtype) + " in the store but " +
                                     DTypeName(field.dtype) + " here");
    if (f.tile != field.tile)
      return Status::InvalidArgument(
          "field '" + field.name + "' is stored " +
          (f.tile ? "in " + std::to_string(f.tile) + "-pixel tiles" : std::string("in rows")) + " in the store but " +
          (field.tile ? "in " + std::to_string(field.tile) + "-pixel tiles" : std::string("in rows")) + " here");
    return static_cast<uint16_t>(i);
  }
  if (field.name.empty()) return Status::InvalidArgument("empty field name");
  if (meta_.fields.size() + 1 >= kAuxFieldBase) return Status::InvalidArgument("too many fields");
  // Block counts for every record of a new 1-channel image mask, so that a
  // sampler decides most candidate windows without reading the mask
  // (FORMAT.md "Mask block counts"). Fields of older stores keep none.
  FieldMeta added = field;
  if (!(added.is_mask && added.channels == 1 && added.layout == Layout::kCHW && !added.has_sat)) added.mask_blocks = 0;
  else if (added.mask_blocks == 0) added.mask_blocks = static_cast<uint16_t>(kDefaultMaskBlock);
  else if (!ValidMaskBlock(added.mask_blocks))
    return Status::InvalidArgument("field '" + field.name + "': mask block edge must be in 8..4096, got " +
                                   std::to_string(added.mask_blocks));
  meta_.fields.push_back(std::move(added));
  return static_cast<uint16_t>(meta_.fields.size() - 1);
}

Status Writer::Grow() {
  uint64_t next = map_size_ * 2;
  int rc = mdb_env_set_mapsize(env_->raw(), next);
  if (rc != 0) return LmdbError("growing the map of", env_->path(), rc);
  MDB_envinfo info;
  mdb_env_info(env_->raw(), &info);
  map_size_ = info.me_mapsize;
  return Status::OK();
}

// One LMDB write transaction (InWriteTxn): what a step inside it needs.
class WriteTxn {
 public:
  WriteTxn(MDB_txn* txn, const std::string& path, bool* map_full) : txn_(txn), path_(path), map_full_(map_full) {}
  MDB_txn* txn() const { return txn_; }
  // An LMDB error as a Status ("<what> '<path>': ..."); MDB_MAP_FULL sets
  // *map_full as well, so that GrowingAsNeeded grows the map and retries.
  Status Lmdb(const std::string& what, int rc) const {
    if (rc == MDB_MAP_FULL) {
      *map_full_ = true;
      return Status::IOError("map full");
    }
    return LmdbError(what, path_, rc);
  }

 private:
  MDB_txn* txn_;
  const std::string& path_;
  bool* map_full_;
};

namespace {

// Begins a write transaction, runs `body` in it and commits it; aborts it
// when `body` fails. *map_full tells whether LMDB's map was full (in the
// body or at commit).
Status InWriteTxn(Env* env, bool* map_full, const std::function<Status(WriteTxn&)>& body) {
  *map_full = false;
  MDB_txn* txn = nullptr;
  int rc = mdb_txn_begin(env->raw(), nullptr, 0, &txn);
  if (rc != 0) return LmdbError("starting write transaction on", env->path(), rc);
  WriteTxn t(txn, env->path(), map_full);
  Status st = body(t);
  if (!st.ok()) {
    mdb_txn_abort(txn);
    return st;
  }
  rc = mdb_txn_commit(txn);  // frees txn whatever the result
  return rc == 0 ? Status::OK() : t.Lmdb("committing to", rc);
}

// Writes the block counts of mask record (index, field) — finalized header
// `mask`, payload at `payload` — as its auxiliary record (FORMAT.md "Mask
// block counts"), in `t`. The table is computed before the put: a put may
// move or spill the transaction's dirty pages, the mask's among them.
// Errors: LMDB's as t.Lmdb(lmdb_what, code) (map full included), others
// with `context`.
Status PutMaskBlocks(WriteTxn& t, MDB_dbi dbi, uint64_t index, uint16_t field, const RecordHeader& mask,
                     const void* payload, uint32_t b, const std::string& context, const std::string& lmdb_what) {
  auto bh = MaskBlocksHeader(mask, b);
  if (!bh.ok()) return bh.status().WithContext(context);
  std::vector<uint32_t> table(bh->payload_bytes / sizeof(uint32_t));
  ComputeMaskBlocks(mask, payload, b, table.data());
  auto key = RecordKey(index, static_cast<uint16_t>(kAuxFieldBase + field));
  MDB_val k = Val(key.data(), key.size());
  MDB_val v{bh->record_bytes(), nullptr};
  const int rc = mdb_put(t.txn(), dbi, &k, &v, MDB_NOOVERWRITE | MDB_RESERVE);
  if (rc != 0) return t.Lmdb(lmdb_what, rc);
  auto* base = static_cast<uint8_t*>(v.mv_data);
  uint8_t* body = base + kRecordHeaderSize;
  if (reinterpret_cast<uintptr_t>(body) % kPayloadAlignment != 0)
    return Status::Internal("LMDB placed a record payload at an unaligned address").WithContext(context);
  std::memcpy(body, table.data(), bh->payload_bytes);
  std::memset(body + bh->payload_bytes, 0, bh->body_bytes - bh->payload_bytes);
  bh->body_checksum = Checksum64(body, bh->body_bytes);
  EncodeRecordHeader(*bh, base);
  return Status::OK();
}

}  // namespace

Status Writer::TryWrite(const std::vector<SampleInput>& samples, bool* map_full) {
  StoreMeta next = meta_;
  PS_RETURN_IF_ERROR(InWriteTxn(env_.get(), map_full, [&](WriteTxn& t) { return WriteSamples(t, samples, &next); }));
  meta_ = std::move(next);
  for (const SampleInput& s : samples) ids_.insert(s.id);
  return Status::OK();
}

Status Writer::WriteSamples(WriteTxn& t, const std::vector<SampleInput>& samples, StoreMeta* next_meta) {
  const std::string& path = env_->path();
  MDB_txn* txn = t.txn();
  int rc = 0;

  // Guard against a second writer that slipped past the lock (e.g. a copy of
  // the store written elsewhere): the stored count must be ours.
  {
    MDB_val k = Val(kMetaKey, sizeof(kMetaKey) - 1), v;
    rc = mdb_get(txn, env_->meta_dbi, &k, &v);
    if (rc == 0) {
      auto stored = StoreMeta::Decode(std::string_view(static_cast<const char*>(v.mv_data), v.mv_size));
      if (stored.ok() && stored->sample_count != meta_.sample_count)
        return Status::Aborted("writing to '" + path + "': the store was changed by another writer");
    }
  }

  StoreMeta& next = *next_meta;
  next.sealed = false;
  {
    // Unsealing: the sealed index describes the samples of the sealed store
    // only; it goes in the same transaction as the first new sample.
    MDB_val bk = Val(kSealedIndexKey, sizeof(kSealedIndexKey) - 1);
    rc = mdb_del(txn, env_->meta_dbi, &bk, nullptr);
    if (rc != 0 && rc != MDB_NOTFOUND) return t.Lmdb("removing the sealed index of", rc);
    // So does the input order of a shard: the next seal writes it again.
    MDB_val ok = Val(kInputOrderKey, sizeof(kInputOrderKey) - 1);
    rc = mdb_del(txn, env_->meta_dbi, &ok, nullptr);
    if (rc != 0 && rc != MDB_NOTFOUND) return t.Lmdb("removing the input order of", rc);
  }
  uint64_t index = meta_.sample_count;
  std::unordered_set<std::string> batch_ids;
  for (const SampleInput& s : samples) {
    if (ids_.count(s.id) || !batch_ids.insert(s.id).second)
      return Status::AlreadyExists("writing sample '" + s.id + "' to '" + path + "': id already present");
    auto ikey = IndexKey(index);
    const std::string idval = EncodeIdValue(index, s.id);
    MDB_val k = Val(ikey.data(), ikey.size()), v = Val(idval.data(), idval.size());
    rc = mdb_put(txn, env_->ids_dbi, &k, &v, MDB_NOOVERWRITE);
    if (rc != 0) return t.Lmdb("writing id of sample '" + s.id + "' to", rc);
    SampleSummary summary;
    summary.fields.resize(meta_.fields.size());
    for (const RecordInput& r : s.records) {
      RecordHeader h = r.header;
      Status st = FinalizeHeader(&h);
      if (!st.ok()) return st.WithContext("writing sample '" + s.id + "'");
      if (r.field < meta_.fields.size() && h.dtype != meta_.fields[r.field].dtype)
        return Status::InvalidArgument("writing sample '" + s.id + "' to '" + path + "': field '" +
                                       meta_.fields[r.field].name + "' holds " +
                                       DTypeName(meta_.fields[r.field].dtype) + ", the record " + DTypeName(h.dtype));
      if (r.field < meta_.fields.size() && h.tile != meta_.fields[r.field].tile)
        return Status::InvalidArgument(
            "writing sample '" + s.id + "' to '" + path + "': field '" + meta_.fields[r.field].name +
            "' has tile size " + std::to_string(meta_.fields[r.field].tile) + ", the record " + std::to_string(h.tile));
      auto rkey = RecordKey(index, r.field);
      MDB_val rk = Val(rkey.data(), rkey.size());
      MDB_val rv{h.record_bytes(), nullptr};
      rc = mdb_put(txn, env_->records_dbi, &rk, &rv, MDB_NOOVERWRITE | MDB_RESERVE);
      if (rc != 0) return t.Lmdb("writing sample '" + s.id + "' to", rc);
      auto* base = static_cast<uint8_t*>(rv.mv_data);
      uint8_t* body = base + kRecordHeaderSize;
      if (reinterpret_cast<uintptr_t>(body) % kPayloadAlignment != 0)
        return Status::Internal("LMDB placed a record payload at an unaligned address");
      if (r.fill) {
        st = r.fill(body);
        if (!st.ok()) return st.WithContext("writing sample '" + s.id + "'");
      } else if (r.data != nullptr) {
        std::memcpy(body, r.data, h.payload_bytes);
      } else {
        return Status::Internal("record without data");
      }
      std::memset(body + h.payload_bytes, 0, h.body_bytes - h.payload_bytes);
      h.body_checksum = Checksum64(body, h.body_bytes);
      EncodeRecordHeader(h, base);
      if (r.field < summary.fields.size())
        summary.fields[r.field] = SummarizeRecord(h, base, meta_.fields[r.field].is_mask);
      if (r.field < meta_.fields.size() && meta_.fields[r.field].mask_blocks != 0) {
        // The mask's block counts, derived from the record just written, in
        // the same transaction.
        PS_RETURN_IF_ERROR(PutMaskBlocks(t, env_->records_dbi, index, r.field, h, body,
                                         meta_.fields[r.field].mask_blocks,
                                         "writing sample '" + s.id + "' field '" + meta_.fields[r.field].name + "'",
                                         "writing the mask block counts of sample '" + s.id + "' to"));
      }
    }
    const std::string sval = EncodeSampleSummary(index, summary);
    MDB_val sk = Val(ikey.data(), ikey.size()), sv = Val(sval.data(), sval.size());
    rc = mdb_put(txn, env_->index_dbi, &sk, &sv, MDB_NOOVERWRITE);
    if (rc != 0) return t.Lmdb("writing the index entry of sample '" + s.id + "' to", rc);
    if (s.geometry) {
      Status gs = CheckVolumeGeometry(*s.geometry);
      if (!gs.ok()) return gs.WithContext("writing the geometry of sample '" + s.id + "' to '" + path + "'");
      const std::string gval = EncodeVolumeGeometry(index, *s.geometry);
      MDB_val gv = Val(gval.data(), gval.size());
      rc = mdb_put(txn, env_->geometry_dbi, &sk, &gv, MDB_NOOVERWRITE);
      if (rc != 0) return t.Lmdb("writing the geometry of sample '" + s.id + "' to", rc);
    }
    ++index;
  }
  next.sample_count = index;
  const std::string text = next.Encode();
  MDB_val mk = Val(kMetaKey, sizeof(kMetaKey) - 1), mv = Val(text.data(), text.size());
  rc = mdb_put(txn, env_->meta_dbi, &mk, &mv, 0);
  if (rc != 0) return t.Lmdb("writing metadata to", rc);
  return Status::OK();
}

// Format 1 -> 2: a summary per sample from its records' headers (and the
// valid count of each mask record), written with the new metadata in the
// caller's transaction. Records are read in key order, i.e. mostly in file
// order, with the kernel's readahead.
Status Writer::Upgrade(void* txn_ptr) {
  MDB_txn* txn = static_cast<MDB_txn*>(txn_ptr);
  const std::string& path = env_->path();
  const uint16_t from = meta_.format_version;
  if (from < kOldestUpgradableStoreFormat)
    return Status::Unsupported("upgrading store '" + path + "': format " + std::to_string(from) + " is too old");
  const size_t nf = meta_.fields.size();
  {
    // The metadata's count sizes the allocation below: check it against the
    // ids database first (a damaged or hostile count is an error, not an
    // abort on a huge allocation).
    MDB_stat ist;
    int src = mdb_stat(txn, env_->ids_dbi, &ist);
    if (src != 0) return LmdbError("upgrading: reading ids of", path, src);
    if (ist.ms_entries != meta_.sample_count)
      return Status::Corruption("upgrading store '" + path + "': metadata says " + std::to_string(meta_.sample_count) +
                                " samples but the ids database holds " + std::to_string(ist.ms_entries) +
                                " (run `patchstore verify`)");
  }
  std::vector<SampleSummary> sums(meta_.sample_count);
  for (auto& s : sums) s.fields.resize(nf);
  MDB_cursor* cur = nullptr;
  int rc = mdb_cursor_open(txn, env_->records_dbi, &cur);
  if (rc != 0) return LmdbError("upgrading: reading records of", path, rc);
  MDB_val k, v;
  Status st;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    uint64_t idx;
    uint16_t field;
    if (!DecodeRecordKey(k.mv_data, k.mv_size, &idx, &field)) {
      st = Status::Corruption("upgrading store '" + path + "': malformed record key (run `patchstore verify`)");
      break;
    }
    if (field >= kAuxFieldBase) continue;
    if (idx >= sums.size() || field >= nf) {
      st = Status::Corruption("upgrading store '" + path + "': record of sample #" + std::to_string(idx) + " field #" +
                              std::to_string(field) + " has no sample or field (run `patchstore verify`)");
      break;
    }
    auto h = ParseRecordHeader(v.mv_data, v.mv_size);
    if (!h.ok()) {
      st = h.status().WithContext("upgrading store '" + path + "': sample #" + std::to_string(idx) + " field '" +
                                  meta_.fields[field].name + "' (run `patchstore verify`)");
      break;
    }
    sums[idx].fields[field] = SummarizeRecord(*h, v.mv_data, meta_.fields[field].is_mask);
  }
  mdb_cursor_close(cur);
  if (!st.ok()) return st;
  if (rc != MDB_NOTFOUND) return LmdbError("upgrading: reading records of", path, rc);
  for (uint64_t i = 0; i < sums.size(); ++i) {
    auto key = IndexKey(i);
    const std::string val = EncodeSampleSummary(i, sums[i]);
    MDB_val sk = Val(key.data(), key.size()), sv = Val(val.data(), val.size());
    rc = mdb_put(txn, env_->index_dbi, &sk, &sv, 0);
    if (rc != 0) return LmdbError("upgrading: writing the sample index of", path, rc);
  }
  if (meta_.sealed) PS_RETURN_IF_ERROR(PutSealedIndex(env_.get(), txn, meta_.sample_count));
  meta_.format_version = kStoreFormatVersion;
  const std::string text = meta_.Encode();
  MDB_val mk = Val(kMetaKey, sizeof(kMetaKey) - 1), mv = Val(text.data(), text.size());
  rc = mdb_put(txn, env_->meta_dbi, &mk, &mv, 0);
  if (rc != 0) return LmdbError("upgrading: writing metadata of", path, rc);
  upgraded_from_ = from;
  return Status::OK();
}

Status Writer::GrowingAsNeeded(const std::string& what, const std::function<Status(bool* map_full)>& attempt) {
  for (int tries = 0; tries < 40; ++tries) {
    bool map_full = false;
    Status st = attempt(&map_full);
    if (!map_full) return st;
    PS_RETURN_IF_ERROR(Grow());
  }
  return Status::IOError(what + " '" + env_->path() + "': map could not grow enough");
}

Status Writer::WriteBatch(const std::vector<SampleInput>& samples) {
  return GrowingAsNeeded("writing to", [&](bool* map_full) { return TryWrite(samples, map_full); });
}

Status Writer::CommitMeta() { return WriteBatch({}); }

Result<std::vector<std::string>> Writer::AddMaskBlocks(const AddMaskBlocksProgress& progress, uint64_t batch,
                                                       const std::vector<std::string>& rewrite) {
  std::vector<uint16_t> fields;
  std::vector<std::string> names;
  for (size_t f = 0; f < meta_.fields.size(); ++f) {
    const FieldMeta& m = meta_.fields[f];
    const bool redo = std::find(rewrite.begin(), rewrite.end(), m.name) != rewrite.end();
    if (m.is_mask && m.channels == 1 && m.layout == Layout::kCHW && !m.has_sat && (m.mask_blocks == 0 || redo)) {
      fields.push_back(static_cast<uint16_t>(f));
      names.push_back(m.name);
    }
  }
  if (fields.empty()) return names;
  // Batches of samples, one transaction each (a huge store's tables are not
  // one transaction's dirty pages); the last one also sets the fields'
  // mask_blocks, so readers use no table before all are written.
  const uint64_t n = meta_.sample_count;
  batch = std::max<uint64_t>(batch, 1);
  uint64_t lo = 0;
  do {
    const uint64_t hi = n - lo > batch ? lo + batch : n;
    StoreMeta next = meta_;
    PS_RETURN_IF_ERROR(GrowingAsNeeded("writing to", [&](bool* map_full) {
      return InWriteTxn(env_.get(), map_full, [&](WriteTxn& t) {
        PS_RETURN_IF_ERROR(PutMaskBlocksOf(t, fields, lo, hi));
        if (hi < n) {
          // First of several: mark the store as being upgraded.
          if (lo != 0) return Status::OK();
          next.attributes[kUpgradingAttribute] = "mask block counts";
        } else {
          next.attributes.erase(kUpgradingAttribute);
          for (uint16_t f : fields) next.fields[f].mask_blocks = static_cast<uint16_t>(kDefaultMaskBlock);
        }
        const std::string text = next.Encode();
        MDB_val mk = Val(kMetaKey, sizeof(kMetaKey) - 1), mv = Val(text.data(), text.size());
        int rc = mdb_put(t.txn(), env_->meta_dbi, &mk, &mv, 0);
        return rc == 0 ? Status::OK() : t.Lmdb("writing metadata to", rc);
      });
    }));
    if (hi == n || lo == 0) meta_ = std::move(next);
    lo = hi;
    if (progress && !progress(lo, n) && lo < n)
      return Status::Aborted("adding mask block counts to '" + env_->path() + "': stopped after " + std::to_string(lo) +
                             " of " + std::to_string(n) + " samples; run `patchstore upgrade` again to finish");
  } while (lo < n);
  return names;
}

Status Writer::PutMaskBlocksOf(WriteTxn& t, const std::vector<uint16_t>& fields, uint64_t lo, uint64_t hi) {
  const std::string& path = env_->path();
  MDB_txn* txn = t.txn();
  for (uint64_t i = lo; i < hi; ++i) {
    for (uint16_t f : fields) {
      const std::string& name = meta_.fields[f].name;
      auto key = RecordKey(i, f);
      MDB_val k = Val(key.data(), key.size()), v;
      int rc = mdb_get(txn, env_->records_dbi, &k, &v);
      if (rc == MDB_NOTFOUND) continue;  // the sample has no such record
      if (rc != 0) return t.Lmdb("reading a mask record of", rc);
      const std::string where = "adding mask block counts to '" + path + "': sample #" + std::to_string(i) +
                                " field '" + name + "'";
      auto h = ParseRecordHeader(v.mv_data, v.mv_size);
      Status body = h.ok() ? VerifyRecordBody(*h, v.mv_data) : h.status();
      if (!body.ok()) return body.WithContext(where + " (run `patchstore verify`)");
      // Block counts left by a newer writer whose metadata key an older one
      // dropped (it rewrites metadata without unknown keys), or by an
      // interrupted AddMaskBlocks: replace them.
      auto akey = RecordKey(i, static_cast<uint16_t>(kAuxFieldBase + f));
      MDB_val ak = Val(akey.data(), akey.size()), av;
      rc = mdb_get(txn, env_->records_dbi, &ak, &av);
      if (rc == 0) {
        auto ah = ParseRecordHeader(av.mv_data, av.mv_size);
        if (!ah.ok() || ah->layout != Layout::kBlocks)
          return Status::Corruption(where + ": another auxiliary record is already there (run `patchstore verify`)");
        rc = mdb_del(txn, env_->records_dbi, &ak, nullptr);
      }
      if (rc != 0 && rc != MDB_NOTFOUND) return t.Lmdb("replacing mask block counts in", rc);
      PS_RETURN_IF_ERROR(PutMaskBlocks(t, env_->records_dbi, i, f, *h,
                                       static_cast<const uint8_t*>(v.mv_data) + kRecordHeaderSize, kDefaultMaskBlock,
                                       where, "writing mask block counts to"));
    }
  }
  return Status::OK();
}

Status Writer::Seal(const OrdinalOf& input_ordinal) {
  // The sealed index is one value as large as all ids and summaries: after
  // a long ingest the map may be full; grow and try again, as WriteBatch does.
  return GrowingAsNeeded("sealing", [&](bool* map_full) { return TrySeal(map_full, input_ordinal); });
}

Status Writer::TrySeal(bool* map_full, const OrdinalOf& input_ordinal) {
  StoreMeta next = meta_;
  next.sealed = true;
  PS_RETURN_IF_ERROR(InWriteTxn(env_.get(), map_full, [&](WriteTxn& t) {
    const std::string text = next.Encode();
    MDB_val mk = Val(kMetaKey, sizeof(kMetaKey) - 1), mv = Val(text.data(), text.size());
    int rc = mdb_put(t.txn(), env_->meta_dbi, &mk, &mv, 0);
    if (rc != 0) return t.Lmdb("sealing", rc);
    return PutSealedIndex(env_.get(), t.txn(), next.sample_count, map_full, input_ordinal);
  }));
  int rc = mdb_env_sync(env_->raw(), 1);
  if (rc != 0) return LmdbError("syncing", env_->path(), rc);
  meta_ = std::move(next);
  return Status::OK();
}

Result<uint16_t> UpgradeStore(const std::string& path) {
  std::string kind;
  {
    SnapshotOptions so;
    so.allow_old_format = true;
    PS_ASSIGN_OR_RETURN(auto snap, Snapshot::Open(path, so));
    if (snap->meta().format_version >= kStoreFormatVersion) return snap->meta().format_version;
    kind = snap->meta().kind;
  }
  WriterOptions wo;
  wo.kind = kind;
  PS_ASSIGN_OR_RETURN(auto writer, Writer::Open(path, wo));  // upgrades in its opening transaction
  return writer->upgraded() ? writer->upgraded_from() : kStoreFormatVersion;
}

namespace {

std::vector<MaskBlocksGap> MaskBlocksGapsOf(const Snapshot& snap) {
  std::vector<MaskBlocksGap> out;
  const StoreMeta& meta = snap.meta();
  for (size_t f = 0; f < meta.fields.size(); ++f) {
    const FieldMeta& m = meta.fields[f];
    if (!(m.is_mask && m.channels == 1 && m.layout == Layout::kCHW && !m.has_sat && m.mask_blocks != 0)) continue;
    MaskBlocksGap gap;
    gap.field = m.name;
    uint64_t first = 0;
    for (uint64_t s = 0; s < snap.id_count(); ++s) {
      if (!snap.GetRecord(s, static_cast<uint16_t>(f)).ok()) continue;  // no mask record: none needed
      if (snap.GetRecord(s, static_cast<uint16_t>(kAuxFieldBase + f)).status().code() != Code::kNotFound) continue;
      if (gap.samples++ == 0) first = s;
    }
    if (gap.samples == 0) continue;
    (void)snap.ForEachId([&](uint64_t i, std::string_view id) {
      if (i == first) gap.first_id = std::string(id);
      return i >= first ? Status::Aborted("found") : Status::OK();
    });
    out.push_back(std::move(gap));
  }
  return out;
}

}  // namespace

Result<std::vector<MaskBlocksGap>> FindMaskBlocksGaps(const std::string& path) {
  PS_ASSIGN_OR_RETURN(auto snap, Snapshot::Open(path));
  return MaskBlocksGapsOf(*snap);
}

Result<std::vector<std::string>> AddMaskBlocks(const std::string& path, const AddMaskBlocksProgress& progress,
                                               uint64_t batch, std::vector<MaskBlocksGap>* gaps) {
  std::string kind;
  std::vector<std::string> rewrite;
  {
    PS_ASSIGN_OR_RETURN(auto snap, Snapshot::Open(path));
    kind = snap->meta().kind;
    std::vector<MaskBlocksGap> found = MaskBlocksGapsOf(*snap);
    for (const MaskBlocksGap& g : found) rewrite.push_back(g.field);
    if (gaps) *gaps = std::move(found);
    // Nothing to do: no writer (no lock file, no refusal while another
    // process writes, none on a read-only copy).
    bool lacking = !rewrite.empty();
    for (const FieldMeta& m : snap->meta().fields)
      lacking |= m.is_mask && m.channels == 1 && m.layout == Layout::kCHW && !m.has_sat && m.mask_blocks == 0;
    if (!lacking) return std::vector<std::string>{};
  }
  WriterOptions wo;
  wo.kind = kind;
  PS_ASSIGN_OR_RETURN(auto writer, Writer::Open(path, wo));
  return writer->AddMaskBlocks(progress, batch, rewrite);
}

// ---------------------------------------------------------------------------
// Compacting copy

Status CopyStoreCompact(const std::string& src, const std::string& dst_dir) {
  std::error_code ec;
  bool empty = std::filesystem::is_directory(dst_dir, ec);
  for (auto it = std::filesystem::directory_iterator(dst_dir, ec);
       empty && !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    empty = it->path().filename() == kStagingMarker;  // a staging folder's own marker (store/copy.h)
  if (!empty || ec)
    return Status::InvalidArgument("copying '" + src + "' to '" + dst_dir +
                                   "': the destination must be an empty directory");
  // Validates the source as readers do (a store, its format, its size).
  PS_ASSIGN_OR_RETURN(auto snap, Snapshot::Open(src));
  auto env = OpenReadEnv(src, snap->no_lock());
  if (!env.ok() && env.status().message() == "EACCES") env = OpenReadEnv(src, true);
  if (!env.ok()) return env.status();
  const int rc = mdb_env_copy2((*env)->raw(), dst_dir.c_str(), MDB_CP_COMPACT);
  if (rc != 0) return LmdbError("copying store '" + src + "' to", dst_dir, rc);
  return Status::OK();
}

// ---------------------------------------------------------------------------
// Network filesystems

const char* NetworkFilesystemName(long f_type) {
  switch (static_cast<unsigned long>(f_type) & 0xffffffffUL) {
    case 0x6969UL: return "NFS";      // NFS_SUPER_MAGIC
    case 0xFF534D42UL: return "SMB";  // CIFS_SUPER_MAGIC
    case 0xFE534D42UL: return "SMB";  // SMB2_SUPER_MAGIC
    case 0x517BUL: return "SMB";      // SMB_SUPER_MAGIC
    default: return nullptr;
  }
}

Status CheckWriterFilesystemType(const std::string& path, long f_type) {
  const char* name = NetworkFilesystemName(f_type);
  if (name == nullptr) return Status::OK();
  return Status::Unsupported("opening store '" + path + "' for writing: it is on " + name +
                             ", a network filesystem, where LMDB's locks and memory map are not coherent "
                             "between machines (readers can see a damaged store). Write the store on local disk, "
                             "then copy the sealed store to the share with `patchstore copy` (sealed stores are "
                             "read from shared and read-only mounts without a lock file)");
}

Status CheckWriterFilesystem(const std::string& path) {
  std::filesystem::path p = path.empty() ? std::filesystem::path(".") : std::filesystem::path(path);
  std::error_code ec;
  // The nearest existing folder: the store may not exist yet.
  for (int i = 0; i < 64 && !std::filesystem::exists(p, ec); ++i) {
    if (!p.has_parent_path() || p.parent_path() == p) break;
    p = p.parent_path();
  }
  struct statfs fs;
  if (::statfs(p.c_str(), &fs) != 0) return Status::OK();  // the open that follows reports the real problem
  return CheckWriterFilesystemType(path, static_cast<long>(fs.f_type));
}

}  // namespace patchstore
