#include "patchstore/ingest/checks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

namespace patchstore {
namespace {

const char* KindOf(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  return "not a regular file";
}

}  // namespace

Status CheckRegularInput(const std::string& path, const std::string& what, bool allow_fifo) {
  struct stat sb;
  if (::stat(path.c_str(), &sb) != 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound("reading " + what + " '" + path + "': no such file");
    return Status::FromErrno("reading " + what + " '" + path + "'", err);
  }
  if (!S_ISREG(sb.st_mode) && !(allow_fifo && S_ISFIFO(sb.st_mode)))
    return Status::InvalidArgument("reading " + what + " '" + path + "': it is " + KindOf(sb.st_mode) +
                                   ", not a regular file");
  return Status::OK();
}

Status CheckReportPath(const std::string& path) {
  const std::string what = "failure report '" + path + "'";
  if (path.empty()) return Status::InvalidArgument("failure report: empty path");
  struct stat sb;
  if (::stat(path.c_str(), &sb) == 0) {
    if (!S_ISREG(sb.st_mode))
      return Status::InvalidArgument(what + ": it is " + std::string(KindOf(sb.st_mode)) + ", not a regular file");
    if (::access(path.c_str(), W_OK) != 0) return Status::FromErrno(what + ": cannot write it", errno);
    return Status::OK();
  }
  if (errno != ENOENT) return Status::FromErrno(what, errno);
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  if (::stat(dir.c_str(), &sb) != 0) {
    if (errno == ENOENT) return Status::NotFound(what + ": folder '" + dir + "' does not exist");
    return Status::FromErrno(what + ": folder '" + dir + "'", errno);
  }
  if (!S_ISDIR(sb.st_mode)) return Status::InvalidArgument(what + ": '" + dir + "' is not a folder");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return Status::FromErrno(what + ": cannot create files in '" + dir + "'", errno);
  return Status::OK();
}

Status CheckResumeSetting(StoreMeta* meta, const std::string& store, const std::string& key,
                          const std::string& value, const std::string& option) {
  auto it = meta->attributes.find(key);
  if (it != meta->attributes.end()) {
    if (it->second != value)
      return Status::InvalidArgument("ingest into '" + store + "': the store was filled with " + option + " '" +
                                     it->second + "', this ingest gives '" + value +
                                     "'; one field cannot mix two settings (use the same options or a new store)");
    return Status::OK();
  }
  if (meta->sample_count == 0) meta->attributes[key] = value;
  return Status::OK();
}

}  // namespace patchstore
