#include "patchstore/store/status.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace patchstore {

const char* CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kNotFound: return "NotFound";
    case Code::kOutOfRange: return "OutOfRange";
    case Code::kInvalidArgument: return "InvalidArgument";
    case Code::kIOError: return "IOError";
    case Code::kCorruption: return "Corruption";
    case Code::kUnsupported: return "Unsupported";
    case Code::kAlreadyExists: return "AlreadyExists";
    case Code::kAborted: return "Aborted";
    case Code::kInternal: return "Internal";
  }
  return "Unknown";
}

Status::Status(Code code, std::string message) {
  if (code != Code::kOk) rep_ = std::make_shared<Rep>(Rep{code, std::move(message)});
}

Status Status::FromErrno(const std::string& what, int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer.
  const char* msg = strerror_r(err, buf, sizeof buf);
  return Status(Code::kIOError, what + ": " + msg);
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(rep_->code)) + ": " + rep_->message;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(rep_->code, context + ": " + rep_->message);
}

namespace internal {
void DieOnError(const Status& status) {
  std::fprintf(stderr, "patchstore: Result::value() on an error: %s\n", status.ToString().c_str());
  std::abort();
}
}  // namespace internal

}  // namespace patchstore
