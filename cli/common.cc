// Helpers shared by the subcommands (see common.h).
#include "cli/common.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "patchstore/store/copy.h"

namespace patchstore::cli {

void AddExitCodes(CLI::App* cmd, const std::string& codes) {
  const std::string footer = cmd->get_footer();
  cmd->footer(footer + (footer.empty() ? "" : "\n") + "Exit codes: " + codes);
}

std::string Printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

int Fail(const Status& st) { return Fail(st.message()); }

int Fail(const std::string& message) {
  std::cerr << "patchstore: error: " << message << "\n";
  return 1;
}

std::vector<std::string> StoresIn(const std::string& path) {
  // Staging folders of unfinished copies are skipped and named (patchstore/store/copy.h).
  std::vector<std::string> skipped;
  std::vector<std::string> out = StoresInFolder(path, &skipped);
  if (!out.empty() && !skipped.empty())
    std::cerr << "patchstore: warning: " << SkippedStagingWarning(path, skipped) << "\n";
  return out;
}

Result<std::shared_ptr<Reader>> OpenStoreOrSet(const std::string& path) {
  std::vector<std::string> set = StoresIn(path);
  if (set.empty()) return Reader::Open(path);
  return Reader::OpenSet(set);
}

std::string CommandLine(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) s += (i ? " " : "") + std::string(argv[i]);
  return s;
}

bool ParseWindow(const std::string& s, double* lo, double* hi, bool* is_auto) {
  *is_auto = s == "auto";
  if (*is_auto) return true;
  const size_t comma = s.find(',');
  if (comma == std::string::npos) return false;
  char* end = nullptr;
  const std::string a = s.substr(0, comma), b = s.substr(comma + 1);
  *lo = std::strtod(a.c_str(), &end);
  if (a.empty() || *end) return false;
  *hi = std::strtod(b.c_str(), &end);
  if (b.empty() || *end) return false;
  return std::isfinite(*lo) && std::isfinite(*hi) && *lo < *hi;
}

}  // namespace patchstore::cli
