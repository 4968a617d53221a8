// patchstore/store/copy.h — compacting copy of a store, and the staging
// folder a new store is written in before it takes its name (used by
// `patchstore copy`, patchstore/ingest/convert.h and shard-set folders).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "patchstore/store/status.h"

namespace patchstore {

// Writes a compacted copy of the store at `src` (LMDB's mdb_env_copy2 with
// MDB_CP_COMPACT: live pages only, free pages dropped, B-trees renumbered)
// as `dst_dir`/data.mdb. `dst_dir` must be an existing directory holding
// nothing but a staging marker (StagedStore::path()).
// The copy is one consistent read transaction of `src`: a writer may go on
// appending meanwhile; the copy holds the samples committed when it began.
// Errors: NotFound / Corruption as Snapshot::Open for `src`; InvalidArgument
// when `dst_dir` is not such a directory; IOError from the copy (e.g. the
// disk is full), naming both paths.
Status CopyStoreCompact(const std::string& src, const std::string& dst_dir);

// OK when a new store may be written from `src` to `dst`: `dst` is a
// non-empty path (trailing slashes ignored) that does not exist, in an
// existing folder, and neither
// path lies inside the other nor names the same folder (compared after
// resolving symbolic links and `..`). `src` may be empty (no source).
// AlreadyExists when `dst` exists, NotFound when its folder does not;
// InvalidArgument (a usage error) naming the paths and the rule otherwise.
Status CheckCopyPaths(const std::string& src, const std::string& dst);

// Staging folders: a store written for `dst` is written in the folder
// "<dst>.copy-XXXXXX" next to it (XXXXXX: 6 letters or digits, mkdtemp),
// which holds the marker file kStagingMarker while its writer runs. The
// writer keeps an exclusive flock on the marker from before it writes the
// marker's text (pid, boot id, process start time, host) until the folder is
// renamed or removed, so a marker with text whose lock can be taken has no
// live owner, whatever pid was reused since (the text is checked too: a
// process of that pid with the same boot id and start time still running
// counts as the owner, for filesystems without working locks).
inline constexpr const char* kStagingMarker = ".patchstore-staging";
inline constexpr const char* kStagingInfix = ".copy-";

// True when the last component of `path` is "<name>.copy-XXXXXX" as above;
// `*dst_name` (if given) receives "<name>".
bool IsStagingFolderName(const std::string& path, std::string* dst_name = nullptr);

// One staging folder found for a destination.
struct StagingLeftover {
  std::string path;
  // True: its owner is gone (interrupted copy) and it was removed (or its
  // removal failed: `note` says why). False: left as it is; `note` says
  // whose it is or why it was kept.
  bool removed = false;
  bool live = false;  // a running process is writing it
  std::string note;
};

// The staging folders of earlier writes to `dst`, each removed when it has
// no live owner on this host (see above). Folders without a marker text
// (left by a patchstore older than staging markers, or one whose writer is
// starting this instant) and those written from another host are kept and
// named. Never fails: what could not be read is reported in `note`.
std::vector<StagingLeftover> CleanStagingFolders(const std::string& dst);

// A folder for a new store at `dst`, renamed to `dst` by Commit() and
// removed by the destructor otherwise.
//
//   std::vector<StagingLeftover> cleaned;
//   PS_ASSIGN_OR_RETURN(auto staged, StagedStore::Create(src, dst, &cleaned));
//   ... write the store in staged->path() ...
//   PS_RETURN_IF_ERROR(staged->Commit());
class StagedStore {
 public:
  // CheckCopyPaths(src, dst), then CleanStagingFolders(dst) (its findings in
  // `*cleaned` when given), then creates the staging folder and its marker
  // (then sleeps PATCHSTORE_TEST_STAGING_PAUSE_S seconds when that is set:
  // a hook for tests that interrupt a copy).
  // Errors: InvalidArgument from CheckCopyPaths; IOError naming the folder.
  static Result<std::unique_ptr<StagedStore>> Create(const std::string& src, const std::string& dst,
                                                     std::vector<StagingLeftover>* cleaned = nullptr);
  ~StagedStore();
  StagedStore(const StagedStore&) = delete;
  StagedStore& operator=(const StagedStore&) = delete;

  // The staging folder ("<dst>.copy-XXXXXX").
  const std::string& path() const { return path_; }
  const std::string& destination() const { return dst_; }
  // Removes the marker, makes the folder 0755 and renames it to the
  // destination. IOError naming both paths (the folder is then removed).
  Status Commit();

 private:
  StagedStore() = default;
  std::string path_, dst_;
  int fd_ = -1;
  bool committed_ = false;
};

// The stores of a folder read as a shard set: its subfolders holding a
// data.mdb, sorted by name, without staging folders (IsStagingFolderName),
// which are returned in `*skipped` (sorted) when given. Empty when `dir`
// is a store itself or no folder.
std::vector<std::string> StoresInFolder(const std::string& dir, std::vector<std::string>* skipped = nullptr);

// The warning for skipped staging folders of StoresInFolder ("" for none):
// names them and says how to remove them.
std::string SkippedStagingWarning(const std::string& dir, const std::vector<std::string>& skipped);

}  // namespace patchstore
