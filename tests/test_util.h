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
