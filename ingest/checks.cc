#include "ingest/checks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
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

Status CheckResumeSetting(StoreMeta* meta, const std::string& store, const std::string& key, const std::string& value,
                          const std::string& option) {
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

Status CheckShard(StoreMeta* meta, const std::string& store, uint32_t shard_index, uint32_t shard_count) {
  if (shard_count > kMaxShardCount || (shard_count > 0 && shard_index >= shard_count) ||
      (shard_count == 0 && shard_index != 0))
    return Status::InvalidArgument("ingest: --shard " + std::to_string(shard_index) + "/" +
                                   std::to_string(shard_count) +
                                   ": needs 0 <= I < N <= " + std::to_string(kMaxShardCount));
  auto spec = [](uint32_t i, uint32_t n) {
    return n == 0 ? std::string("no --shard") : "--shard " + std::to_string(i) + "/" + std::to_string(n);
  };
  uint32_t have_index = 0, have_count = 0;
  PS_RETURN_IF_ERROR(ShardOfStore(*meta, &have_index, &have_count));
  if (have_count != 0) {
    if (have_index != shard_index || have_count != shard_count)
      return Status::InvalidArgument("ingest into '" + store + "': the store is shard " + std::to_string(have_index) +
                                     "/" + std::to_string(have_count) + " of a shard set, this ingest gives " +
                                     spec(shard_index, shard_count) +
                                     " (resume a shard with the same --shard, or use a new store)");
    return Status::OK();
  }
  if (shard_count == 0) return Status::OK();
  if (meta->sample_count > 0)
    return Status::InvalidArgument("ingest into '" + store + "': the store already holds " +
                                   std::to_string(meta->sample_count) + " samples ingested without --shard; " +
                                   spec(shard_index, shard_count) + " needs a new store per shard");
  meta->attributes[kShardAttribute] = std::to_string(shard_index) + "/" + std::to_string(shard_count);
  return Status::OK();
}

FailureReport::~FailureReport() {
  if (file_) std::fclose(file_);
}

void FailureReport::Add(IngestSummary* summary, const std::string& id, const std::string& file, const Status& st) {
  ++summary->samples_failed;
  if (summary->errors.size() < 100) summary->errors.push_back(st.message());
  if (!file_ && !failed_) {
    file_ = std::fopen(path_.c_str(), "w");  // this run's failures: an earlier run's report is replaced
    if (file_) summary->report_path = path_;
    else summary->report_error = "writing '" + path_ + "': " + std::strerror(errno);
    failed_ = file_ == nullptr;
  }
  if (!file_) return;
  std::string msg = st.message();
  std::replace(msg.begin(), msg.end(), '\t', ' ');
  std::replace(msg.begin(), msg.end(), '\n', ' ');
  std::fprintf(file_, "%s\t%s\t%s\n", id.c_str(), file.c_str(), msg.c_str());
  if (std::fflush(file_) != 0) {
    summary->report_error = "writing '" + path_ + "': " + std::strerror(errno);
    summary->report_path.clear();
  }
}

void FailureReport::Close(IngestSummary* summary, bool remove_stale) {
  // An earlier run's report would list files that have been fixed since.
  if (remove_stale && !file_ && !failed_ && summary->samples_failed == 0 && !path_.empty()) ::unlink(path_.c_str());
  if (file_ && std::fclose(file_) != 0 && summary->report_error.empty()) {
    summary->report_error = "writing '" + path_ + "': " + std::strerror(errno);
    summary->report_path.clear();
  }
  file_ = nullptr;
}

Result<Normalization> ResolveVolumeNorm(const std::string& spec_in, bool mask, SourceType source,
                                        const std::string& type_name, const std::string& field,
                                        const std::string& what) {
  const std::string spec = !spec_in.empty() ? spec_in : mask ? "binary" : "none";
  const double maxval = SourceMaxValue(source);
  const std::string base = spec.substr(0, spec.find("+clamp:"));
  if ((base == "unit" || base == "symmetric") && maxval == 0)
    return Status::InvalidArgument(what + ": normalisation '" + base + "' of field '" + field +
                                   "' needs a uint8 or uint16 source, not " + type_name + " (use affine:SCALE,OFFSET)");
  auto n = ParseNormalization(spec, maxval);
  Status fits = n.ok() ? CheckNormalizationFor(*n, source, spec) : n.status();
  if (!fits.ok()) return fits.WithContext(what + " for field '" + field + "'");
  return n;
}

namespace {

std::string ShowDoubleG9(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

}  // namespace

Status ValueCheck::AddFloatRange(double lo, double hi) {
  if (norm_.kind == NormKind::kNone && !norm_.clamp) {
    // No normalisation: float64 values beyond float32 become +-inf, as
    // NumPy's astype(float32) makes them; said, not refused (the user asked
    // for no transform, and NaN/inf are data elsewhere too).
    for (double x : {lo, hi})
      if (!std::isfinite(norm_.Apply(x)) && !beyond_) {
        beyond_ = true;
        warnings_.push_back(describe_ + ": its " + SourceTypeName(source_) + " value " + ShowDoubleG9(x) +
                            " is beyond float32 (largest 3.40282347e+38), which records hold, and is stored as " +
                            (x < 0 ? "-inf" : "inf") +
                            " (as NumPy's astype(float32)); map the field into float32 with --norm FIELD=range:LO,HI "
                            "(computed in float64; the other normalisations take the value as float32 first)");
      }
    return Status::OK();
  }
  return CheckNormalizationOn(norm_, lo, hi, false, norm_spec_,
                              std::string(SourceTypeName(source_)) + " value of this " + noun_);
}

std::vector<std::string> ValueCheck::Finish() {
  std::vector<std::string> out = std::move(warnings_);
  warnings_.clear();
  if (largest_ > (uint64_t{1} << 24))
    out.push_back(describe_ + ": " + SourceTypeName(source_) + " values up to " + std::to_string(largest_) +
                  " exceed 2^24 = 16777216 and are rounded to the nearest float32 (e.g. 16777217 is stored as "
                  "16777216)");
  return out;
}

}  // namespace patchstore
