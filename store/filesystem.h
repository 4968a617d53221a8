// store/filesystem.h — which filesystems a writer refuses
// (internal; docs/guide/shared-filesystems.md).
//
// LMDB's writer needs working POSIX locks and a memory map coherent with
// write(); network filesystems (NFS, SMB) give neither across machines, so a
// store written there can be corrupted for its readers. Writers refuse them;
// write on local disk and copy the sealed store to the share
// (`patchstore copy`). Sealed stores are READ from network or read-only
// mounts without a lock file (Snapshot::Open).
#pragma once

#include <string>

#include "patchstore/store/status.h"

namespace patchstore {

// "NFS", "SMB" for those statfs f_type magics, else nullptr.
const char* NetworkFilesystemName(long f_type);

// OK unless the filesystem holding `path` (or its nearest existing parent)
// is a network filesystem: then Unsupported naming the path, the filesystem
// and what to do instead. `what` starts the message ("ingest into").
Status CheckWriterFilesystem(const std::string& path);

// The same decision for a given f_type (for tests).
Status CheckWriterFilesystemType(const std::string& path, long f_type);

}  // namespace patchstore
