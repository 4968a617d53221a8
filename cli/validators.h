// patchstore/cli/validators.h — CLI11 checks that CLI::Range cannot make.
//
// CLI::Range lets NaN through (every comparison with NaN is false), and an
// unbounded option such as --window takes inf. These validators have no
// description, so --help text is unchanged.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <string>

namespace patchstore::cli {

// A number that is not NaN and not infinite.
inline CLI::Validator FiniteNumber() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (end == s.c_str()) return "";  // not a number at all: the type conversion says so
        if (!std::isfinite(v)) return "must be a finite number, got '" + s + "'";
        return "";
      },
      "", "");
}

// An integer >= 0.
inline CLI::Validator NonNegative() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        const long long v = std::strtoll(s.c_str(), &end, 10);
        if (end == s.c_str()) return "";
        if (v < 0) return "must be 0 or more, got '" + s + "'";
        return "";
      },
      "", "");
}

}  // namespace patchstore::cli
