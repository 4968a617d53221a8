// patchstore/store/status.h — errors as values.
//
// Every fallible operation in patchstore returns a Status or a Result<T>.
// An OK Status holds no allocation. A failed one carries a Code (what kind of
// failure, used by the Python binding to pick an exception type) and a
// message written as "<operation> <object>: <cause>", e.g.
//   reading patch [0:256,0:256] of 'video03/0042' field 'depth' in '/data/s':
//   record checksum mismatch
// Context is added on the way up with Status::WithContext().
//
// Thread-safety: Status and Result are values; distinct objects may be used
// from distinct threads freely.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace patchstore {

enum class Code : int {
  kOk = 0,
  kNotFound,         // unknown sample id, field or file   -> KeyError / FileNotFoundError
  kOutOfRange,       // patch or index outside the data    -> IndexError
  kInvalidArgument,  // a bad argument from the caller     -> ValueError
  kIOError,          // the OS or LMDB failed              -> OSError
  kCorruption,       // stored bytes fail validation       -> CorruptRecordError
  kUnsupported,      // a valid input we do not handle     -> ValueError
  kAlreadyExists,    // refusing to overwrite              -> FileExistsError
  kAborted,          // stopped on request (e.g. Ctrl-C)   -> RuntimeError
  kInternal,         // a bug in patchstore                -> RuntimeError
};

const char* CodeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(Code code, std::string message);

  static Status OK() { return Status(); }
  static Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
  static Status OutOfRange(std::string m) { return {Code::kOutOfRange, std::move(m)}; }
  static Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status IOError(std::string m) { return {Code::kIOError, std::move(m)}; }
  static Status Corruption(std::string m) { return {Code::kCorruption, std::move(m)}; }
  static Status Unsupported(std::string m) { return {Code::kUnsupported, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {Code::kAlreadyExists, std::move(m)}; }
  static Status Aborted(std::string m) { return {Code::kAborted, std::move(m)}; }
  static Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }
  // An I/O error from errno: "<what>: <strerror(err)>".
  static Status FromErrno(const std::string& what, int err);

  bool ok() const { return rep_ == nullptr; }
  Code code() const { return rep_ ? rep_->code : Code::kOk; }
  // The message without the code name; empty when OK.
  const std::string& message() const;
  // "OK" or "<CodeName>: <message>".
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>". OK stays OK.
  Status WithContext(const std::string& context) const;

 private:
  struct Rep {
    Code code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;
};

namespace internal {
// Prints the status to stderr and aborts. Used by Result::value() on an error.
[[noreturn]] void DieOnError(const Status& status);
}  // namespace internal

// Result<T> holds either a value or a failed Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit on purpose
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) v_ = Status::Internal("Result constructed from OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::OK() : std::get<Status>(v_); }

  // The value. On an error, prints "patchstore: Result::value() on an error:
  // <status>" to stderr and aborts (as Arrow's ValueOrDie): check ok() first.
  T& value() & { return *CheckedValue(); }
  const T& value() const& { return *const_cast<Result*>(this)->CheckedValue(); }
  T&& value() && { return std::move(*CheckedValue()); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  T* CheckedValue() {
    if (T* v = std::get_if<T>(&v_)) return v;
    internal::DieOnError(std::get<Status>(v_));
  }
  std::variant<T, Status> v_;
};

}  // namespace patchstore

#define PS_CONCAT_INNER_(a, b) a##b
#define PS_CONCAT_(a, b) PS_CONCAT_INNER_(a, b)

// Returns from the current function if `expr` (a Status) is not OK.
#define PS_RETURN_IF_ERROR(expr)          \
  do {                                    \
    ::patchstore::Status _ps_st = (expr); \
    if (!_ps_st.ok()) return _ps_st;      \
  } while (0)

// `PS_ASSIGN_OR_RETURN(auto x, Foo());` — unwraps a Result or returns its Status.
#define PS_ASSIGN_OR_RETURN(lhs, rexpr) PS_ASSIGN_OR_RETURN_IMPL_(PS_CONCAT_(_ps_r_, __LINE__), lhs, rexpr)
#define PS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                              \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
