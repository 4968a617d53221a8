// Staging folders of new stores (store/copy.h).
#include "patchstore/store/copy.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace patchstore {
namespace fs = std::filesystem;
namespace {

// The bytes of a small file (/proc, a marker), "" when it cannot be read.
// (No iostreams in store/: see store/numbers.h.)
std::string ReadSmallFile(const std::string& path) {
  std::string out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || out.size() > (1u << 20)) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

// The words of `text` (separated by spaces, tabs or newlines).
std::vector<std::string> Words(const std::string& text) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    const size_t begin = i;
    while (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    if (i > begin) out.push_back(text.substr(begin, i - begin));
  }
  return out;
}

std::string BootId() {
  std::string s = ReadSmallFile("/proc/sys/kernel/random/boot_id");
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Field 22 of /proc/PID/stat (clock ticks after boot), "" when unknown.
std::string StartTime(long pid) {
  std::string s = ReadSmallFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = s.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return "";
  const std::vector<std::string> words = Words(s.substr(close + 1));  // fields 3, 4, ...
  return words.size() >= 20 ? words[19] : "";
}

std::string HostName() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

// The marker text: "pid=P boot=B start=S host=H\n".
struct Owner {
  long pid = 0;
  std::string boot, start, host;
  bool Parse(const std::string& text) {
    bool have_pid = false;
    for (const std::string& tok : Words(text)) {
      const size_t eq = tok.find('=');
      if (eq == std::string::npos) continue;
      const std::string k = tok.substr(0, eq), v = tok.substr(eq + 1);
      if (k == "pid") have_pid = (pid = std::strtol(v.c_str(), nullptr, 10)) > 0;
      if (k == "boot") boot = v;
      if (k == "start") start = v;
      if (k == "host") host = v;
    }
    return have_pid && !boot.empty();
  }
  std::string Describe() const { return "pid " + std::to_string(pid) + (host.empty() ? "" : " on " + host); }
};

std::string Canonical(const std::string& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(fs::absolute(p, ec), ec);
  if (ec) c = fs::absolute(p, ec).lexically_normal();
  std::string s = c.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// `inner` equals `outer` or lies below it.
bool Inside(const std::string& inner, const std::string& outer) {
  if (inner == outer) return true;
  const std::string prefix = outer == "/" ? outer : outer + "/";
  return inner.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

bool IsStagingFolderName(const std::string& path, std::string* dst_name) {
  std::string name = fs::path(path).filename().string();
  if (name.empty()) name = fs::path(path).parent_path().filename().string();
  const size_t infix = std::char_traits<char>::length(kStagingInfix);
  if (name.size() < infix + 7) return false;
  const size_t at = name.size() - 6 - infix;
  if (name.compare(at, infix, kStagingInfix) != 0) return false;
  for (size_t i = name.size() - 6; i < name.size(); ++i)
    if (!std::isalnum(static_cast<unsigned char>(name[i]))) return false;
  if (dst_name) *dst_name = name.substr(0, at);
  return true;
}

// `p` without trailing slashes ("/" stays).
std::string WithoutTrailingSlashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

Status CheckCopyPaths(const std::string& src, const std::string& dst_given) {
  const std::string dst = WithoutTrailingSlashes(dst_given);
  if (dst.empty()) return Status::InvalidArgument("copy: the destination path is empty (DST must name the new store)");
  std::error_code ec;
  if (fs::exists(fs::symlink_status(dst, ec)))
    return Status::AlreadyExists("copy to '" + dst + "': it exists; copy writes a new store and overwrites nothing");
  fs::path parent = fs::path(dst).parent_path();
  if (parent.empty()) parent = ".";
  if (!fs::is_directory(parent, ec))
    return Status::NotFound("copy to '" + dst + "': no folder '" + parent.string() + "'");
  if (fs::path(dst).filename().empty() || fs::path(dst).filename() == "." || fs::path(dst).filename() == "..")
    return Status::InvalidArgument("copy to '" + dst + "': DST must end in the new store's name");
  if (src.empty()) return Status::OK();
  const std::string s = Canonical(src), d = Canonical(dst);
  if (s == d) return Status::InvalidArgument("copy '" + src + "' to '" + dst + "': both name the same folder");
  if (Inside(d, s))
    return Status::InvalidArgument("copy '" + src + "' to '" + dst +
                                   "': the destination lies inside the source store; copy it elsewhere");
  if (Inside(s, d))
    return Status::InvalidArgument("copy '" + src + "' to '" + dst + "': the source lies inside the destination");
  return Status::OK();
}

std::vector<StagingLeftover> CleanStagingFolders(const std::string& dst) {
  std::vector<StagingLeftover> out;
  std::error_code ec;
  fs::path parent = fs::path(dst).parent_path();
  const std::string base = fs::path(dst).filename().string();
  if (base.empty()) return out;
  if (parent.empty()) parent = ".";
  std::vector<std::string> candidates;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    std::string name;
    std::error_code ec2;
    if (e.is_directory(ec2) && !e.is_symlink(ec2) && IsStagingFolderName(e.path().string(), &name) && name == base)
      candidates.push_back(e.path().string());
  }
  std::sort(candidates.begin(), candidates.end());
  const std::string my_boot = BootId(), my_host = HostName();
  for (const std::string& c : candidates) {
    StagingLeftover l;
    l.path = c;
    const std::string marker = c + "/" + kStagingMarker;
    const int fd = ::open(marker.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      l.note = errno == ENOENT ? "no staging marker (left by an older patchstore, or a copy starting now); remove it "
                                 "with 'rm -r' when no copy to '" +
                                     dst + "' runs"
                               : std::string("its staging marker cannot be opened: ") + std::strerror(errno);
      out.push_back(std::move(l));
      continue;
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      Owner o;
      o.Parse(ReadSmallFile(marker));
      l.live = err == EWOULDBLOCK;
      l.note = l.live ? "being written by a running copy (" + o.Describe() + ")"
                      : std::string("its staging marker cannot be locked: ") + std::strerror(err);
      ::close(fd);
      out.push_back(std::move(l));
      continue;
    }
    Owner o;
    const bool parsed = o.Parse(ReadSmallFile(marker));
    if (!parsed) {
      l.note = "its staging marker is empty (a copy starting now, or one killed as it started); remove it with "
               "'rm -r' when no copy to '" +
               dst + "' runs";
    } else if (o.host != my_host) {
      l.note = "written by " + o.Describe() + ", another host: remove it with 'rm -r' when no copy runs there";
    } else if (o.boot == my_boot && !o.start.empty() && StartTime(o.pid) == o.start) {
      l.live = true;
      l.note = "being written by a running copy (" + o.Describe() + ")";
    } else {
      fs::remove_all(c, ec);
      l.removed = !ec;
      l.note = ec ? "left by an interrupted copy (" + o.Describe() +
                        ", no longer running); removing it failed: " + ec.message()
                  : "left by an interrupted copy (" + o.Describe() + ", no longer running)";
    }
    ::close(fd);  // after the removal: the lock guards it
    out.push_back(std::move(l));
  }
  return out;
}

Result<std::unique_ptr<StagedStore>> StagedStore::Create(const std::string& src, const std::string& dst_given,
                                                         std::vector<StagingLeftover>* cleaned) {
  PS_RETURN_IF_ERROR(CheckCopyPaths(src, dst_given));
  const std::string dst = WithoutTrailingSlashes(dst_given);
  std::vector<StagingLeftover> found = CleanStagingFolders(dst);
  if (cleaned) *cleaned = std::move(found);
  std::string tmpl = dst + kStagingInfix + "XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr)
    return Status::FromErrno("copy to '" + dst + "': creating the staging folder '" + tmpl + "'", errno);
  std::unique_ptr<StagedStore> s(new StagedStore());
  s->path_ = tmpl;
  s->dst_ = dst;
  const std::string marker = tmpl + "/" + kStagingMarker;
  s->fd_ = ::open(marker.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (s->fd_ < 0) return Status::FromErrno("copy to '" + dst + "': creating '" + marker + "'", errno);
  // Locked before the text is written: a marker with text is locked while
  // its owner lives (a cleaner holding the lock for a moment makes us wait).
  if (::flock(s->fd_, LOCK_EX) != 0) return Status::FromErrno("copy to '" + dst + "': locking '" + marker + "'", errno);
  const std::string text = "pid=" + std::to_string(::getpid()) + " boot=" + BootId() +
                           " start=" + StartTime(::getpid()) + " host=" + HostName() + "\n";
  if (::write(s->fd_, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    return Status::FromErrno("copy to '" + dst + "': writing '" + marker + "'", errno);
  // Test hook: hold the staged folder this long before writing (tests kill
  // a copy here with SIGKILL, or start a second copy beside it).
  if (const char* pause = std::getenv("PATCHSTORE_TEST_STAGING_PAUSE_S"); pause && *pause)
    ::sleep(static_cast<unsigned>(std::strtoul(pause, nullptr, 10)));
  return s;
}

StagedStore::~StagedStore() {
  if (!committed_ && !path_.empty()) {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  if (fd_ >= 0) ::close(fd_);
}

Status StagedStore::Commit() {
  const std::string marker = path_ + "/" + kStagingMarker;
  // Without its marker the folder is never removed by a cleaner (only named).
  if (::unlink(marker.c_str()) != 0 && errno != ENOENT)
    return Status::FromErrno("copy to '" + dst_ + "': removing '" + marker + "'", errno);
  ::chmod(path_.c_str(), 0755);  // mkdtemp made it 0700; a store folder is readable as any other
  std::error_code ec;
  fs::rename(path_, dst_, ec);
  if (ec == std::errc::directory_not_empty || ec == std::errc::file_exists)
    return Status::AlreadyExists("copy to '" + dst_ + "': '" + dst_ +
                                 "' appeared while this copy ran (written by another copy or program): it is left as "
                                 "it is, and this copy (verified, in '" +
                                 path_ + "') is removed");
  if (ec) return Status::IOError("copy to '" + dst_ + "': renaming '" + path_ + "': " + ec.message());
  committed_ = true;
  return Status::OK();
}

std::vector<std::string> StoresInFolder(const std::string& dir, std::vector<std::string>* skipped) {
  std::error_code ec;
  std::vector<std::string> out, staging;
  if (!fs::is_directory(dir, ec) || fs::exists(fs::path(dir) / "data.mdb", ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::error_code ec2;
    if (!e.is_directory(ec2)) continue;
    if (IsStagingFolderName(e.path().string())) {
      staging.push_back(e.path().string());
      continue;
    }
    if (fs::is_regular_file(e.path() / "data.mdb", ec2)) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  std::sort(staging.begin(), staging.end());
  if (skipped) *skipped = std::move(staging);
  return out;
}

std::string SkippedStagingWarning(const std::string& dir, const std::vector<std::string>& skipped) {
  if (skipped.empty()) return "";
  std::string names;
  for (const std::string& s : skipped) names += (names.empty() ? "'" : ", '") + fs::path(s).filename().string() + "'";
  return "'" + dir + "': skipped " + std::to_string(skipped.size()) + " staging folder" +
         (skipped.size() == 1 ? " " : "s ") + names +
         " of unfinished copies (not stores of the set; the next 'patchstore copy' to the same destination removes "
         "those of interrupted copies, or remove them with 'rm -r' when no copy runs)";
}

}  // namespace patchstore
