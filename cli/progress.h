// patchstore/cli/progress.h — progress on stderr for long commands: a
// redrawn bar on a terminal, a plain line every few seconds in logs (never
// both), nothing with --quiet.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <string>

#include "patchstore/ingest/ingest.h"

namespace patchstore::cli {

// "1.5 GiB".
inline std::string HumanBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

// Ctrl-C during a long write: the first one asks the operation to stop after
// its current commit (Interrupted() turns true); a second one kills the
// process (committed data stays safe either way).
inline std::atomic<bool>& InterruptFlag() {
  static std::atomic<bool> flag{false};
  return flag;
}
inline void OnInterrupt(int) {
  if (InterruptFlag().exchange(true)) {
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
  }
}
inline void InstallInterruptHandler() { std::signal(SIGINT, OnInterrupt); }
inline bool Interrupted() { return InterruptFlag().load(); }

class ProgressPrinter {
 public:
  // `what` prefixes each line ("ingest"); `unit` names the items ("samples").
  // `counts_only`: no MB/s and failure count (for work that has neither).
  ProgressPrinter(std::string what, std::string unit, bool quiet, bool counts_only = false)
      : what_(std::move(what)), unit_(std::move(unit)), quiet_(quiet), counts_only_(counts_only), tty_(isatty(2)) {}

  void operator()(const Progress& p) {
    if (quiet_) return;
    if (!p.message.empty()) {
      // A notice (Progress::message), on lines of its own.
      std::cerr << (tty_ && mid_line_ ? "\n" : "") << p.message << "\n" << std::flush;
      mid_line_ = false;
      return;
    }
    if (p.done >= p.total && final_printed_) return;  // the last line once
    final_printed_ = p.done >= p.total;
    auto now = std::chrono::steady_clock::now();
    const double every = tty_ ? 0.2 : 5.0;
    if (p.done < p.total && std::chrono::duration<double>(now - last_).count() < every) return;
    last_ = now;
    const double mbs = p.seconds > 0 ? p.bytes / p.seconds / 1e6 : 0;
    char line[256];
    if (counts_only_) {
      std::snprintf(line, sizeof line, "%s%s: %llu/%llu %s, %.1f s%s", tty_ ? "\r" : "", what_.c_str(),
                    static_cast<unsigned long long>(p.done), static_cast<unsigned long long>(p.total), unit_.c_str(),
                    p.seconds, tty_ && p.done < p.total ? " " : "\n");
      std::cerr << line << std::flush;
      mid_line_ = tty_ && p.done < p.total;
    } else if (tty_) {
      const int width = 30;
      int filled = p.total ? static_cast<int>(width * p.done / p.total) : width;
      std::string bar(filled, '#');
      bar += std::string(width - filled, '.');
      std::snprintf(line, sizeof line, "\r%s [%s] %llu/%llu %s  %.0f MB/s  %llu failed ", what_.c_str(), bar.c_str(),
                    static_cast<unsigned long long>(p.done), static_cast<unsigned long long>(p.total), unit_.c_str(),
                    mbs, static_cast<unsigned long long>(p.failed));
      std::cerr << line << (p.done >= p.total ? "\n" : "") << std::flush;
      mid_line_ = p.done < p.total;
    } else {
      std::snprintf(line, sizeof line, "%s: %llu/%llu %s, %.0f MB/s, %llu failed, %.1f s\n", what_.c_str(),
                    static_cast<unsigned long long>(p.done), static_cast<unsigned long long>(p.total), unit_.c_str(),
                    mbs, static_cast<unsigned long long>(p.failed), p.seconds);
      std::cerr << line << std::flush;
    }
  }

 private:
  std::string what_, unit_;
  bool quiet_, counts_only_, tty_;
  bool final_printed_ = false;
  bool mid_line_ = false;  // a redrawn line is on the terminal, without its newline
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace patchstore::cli
