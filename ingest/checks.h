// patchstore/ingest/checks.h — checks an ingest makes before it starts
// (internal to ingest/; not installed).
#pragma once

#include <string>

#include "patchstore/store/format.h"
#include "patchstore/store/status.h"

namespace patchstore {

// OK when `path` is a regular file (symlinks followed). Otherwise an error
// naming `what` and `path` and saying what it is instead: NotFound when
// missing, InvalidArgument for a directory, FIFO, socket or device (a FIFO
// would block the reader forever), IOError for a permission problem.
// `allow_fifo`: let a FIFO through (an isolated decoder reads it under its
// time limit, so a FIFO that never delivers becomes a timeout).
Status CheckRegularInput(const std::string& path, const std::string& what, bool allow_fifo = false);

// The failure report of --on-error skip must be writable before the ingest
// starts: its folder exists and is writable, and an existing report is a
// writable regular file. Errors name the path and the cause.
Status CheckReportPath(const std::string& path);

// A setting that must stay the same across the ingests that fill one store
// (normalisation spec, ...): stored as meta.attributes[key]. A store that
// already holds samples but no such attribute (written by an older version)
// is not checked. InvalidArgument when the store says otherwise, naming
// `option` and both values; else records `value` (written with the next
// commit).
Status CheckResumeSetting(StoreMeta* meta, const std::string& store, const std::string& key,
                          const std::string& value, const std::string& option);

}  // namespace patchstore
