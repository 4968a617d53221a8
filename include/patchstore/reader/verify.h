// patchstore/reader/verify.h — full integrity check of a store.
//
// Recomputes every record's checksum (headers, bodies, padding, ids and the
// metadata), and checks that every sample has a record for every field, that
// ids are unique, that each record agrees with its field (dtype, layout,
// rank, channels, tile edge, and for raw-source records the normalisation:
// everything a read refuses) and with the sample index, and that each
// field's normalisation passes CheckNormalizationFor (store/format.h).
// Reads the whole store once; O(bytes).
//
// Thread-safety: reentrant; safe while other processes read the store.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "patchstore/store/status.h"

namespace patchstore {

struct VerifyProblem {
  std::string id;     // sample id, or "" when the sample is unknown
  std::string field;  // field name, or ""
  std::string message;
};

struct VerifyReport {
  uint64_t samples = 0;
  uint64_t records = 0;
  uint64_t bytes = 0;  // record bytes checked
  std::vector<VerifyProblem> problems;
  bool ok() const { return problems.empty(); }
};

// Opens the store and checks it. Returns an error Status only when the store
// cannot be opened at all (then the message says why); damaged records are
// listed in the report. `progress(done, total)` is called per record.
Result<VerifyReport> VerifyStore(const std::string& path,
                                 const std::function<void(uint64_t, uint64_t)>& progress = nullptr);

}  // namespace patchstore
