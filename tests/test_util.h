// Helpers shared by the GoogleTest suites: scratch directories.
#pragma once

#include <string>

namespace patchstore::testing {

// A fresh, empty directory under $TMPDIR (or /tmp), removed with the object.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs a shell command, returns its exit status (or -1) and, if `output` is
// given, what it printed on stdout and stderr.
int RunCommand(const std::string& command, std::string* output = nullptr);

}  // namespace patchstore::testing

#include <cstdint>
#include <vector>

#include "patchstore/store/status.h"

namespace patchstore::testing {

// The value that WriteSyntheticStore puts at (sample s, field f, channel c,
// row y, column x): exact in float32 for the small sizes tests use.
inline float SyntheticValue(uint64_t s, int f, int64_t c, int64_t y, int64_t x) {
  return static_cast<float>(s * 1000000 + f * 200000 + c * 10000 + y * 100 + x);
}

struct SyntheticField {
  const char* name;
  int channels;
};

// Writes `samples` samples with ids "s/<index>" and the given fields, all
// H x W, with SyntheticValue() contents, using the store Writer directly.
// `batch` samples per commit; `seal` marks the store finished.
Status WriteSyntheticStore(const std::string& path, uint64_t samples, const std::vector<SyntheticField>& fields,
                           int64_t H, int64_t W, bool seal = true, uint64_t batch = 4,
                           uint64_t initial_map_size = uint64_t{1} << 30);

}  // namespace patchstore::testing
