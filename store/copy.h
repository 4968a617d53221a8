// store/copy.h — compacting copy of a store (internal; used by
// `patchstore copy`).
#pragma once

#include <string>

#include "patchstore/store/status.h"

namespace patchstore {

// Writes a compacted copy of the store at `src` (LMDB's mdb_env_copy2 with
// MDB_CP_COMPACT: live pages only, free pages dropped, B-trees renumbered)
// as `dst_dir`/data.mdb. `dst_dir` must be an existing, empty directory.
// The copy is one consistent read transaction of `src`: a writer may go on
// appending meanwhile; the copy holds the samples committed when it began.
// Errors: NotFound / Corruption as Snapshot::Open for `src`; InvalidArgument
// when `dst_dir` is not an empty directory; IOError from the copy (e.g. the
// disk is full), naming both paths.
Status CopyStoreCompact(const std::string& src, const std::string& dst_dir);

}  // namespace patchstore
