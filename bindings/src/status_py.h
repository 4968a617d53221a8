// patchstore/bindings/src/status_py.h — the one place where a Status becomes
// a Python exception.
//
// Both extension modules (_patchstore for reading, _ingest for ingest and
// export) raise through RaiseStatus, so a Status code maps to the same
// Python exception everywhere:
//
//   NotFound         KeyError            (unknown sample id or field; a
//                                         group or dataset missing from an
//                                         HDF5 input of ingest_hdf5)
//                    FileNotFoundError   (when opening a store, or a missing
//                                         input file in ingest / export)
//   OutOfRange       IndexError
//   InvalidArgument  ValueError
//   Unsupported      ValueError
//   IOError          OSError
//   Corruption       patchstore.CorruptRecordError (a subclass of OSError)
//   AlreadyExists    FileExistsError
//   Aborted          RuntimeError
//   Internal         RuntimeError
//
// The message is the Status message unchanged: the C++ layers already name
// the store, the sample id and the field.
#pragma once

#include <pybind11/pybind11.h>

#include "patchstore/store/status.h"

namespace patchstore_py {

namespace py = pybind11;

// What the failing call was doing; decides what NotFound means.
enum class Where {
  kLookup,  // an id or field lookup: NotFound -> KeyError
  kFiles,   // opening a store, ingest, export: NotFound -> FileNotFoundError
};

// The exception class patchstore.CorruptRecordError. Created once by
// _patchstore's module init; _ingest fetches it from there.
inline PyObject*& CorruptRecordErrorSlot() {
  static PyObject* type = nullptr;  // a strong reference, never released
  return type;
}

inline PyObject* CorruptRecordErrorType() {
  PyObject*& slot = CorruptRecordErrorSlot();
  if (slot == nullptr) {
    py::object t = py::module_::import("patchstore._patchstore").attr("CorruptRecordError");
    slot = t.release().ptr();
  }
  return slot;
}

// Sets the Python exception for `st` and throws py::error_already_set.
// REQUIRES: !st.ok(), the GIL is held.
[[noreturn]] inline void RaiseStatus(const patchstore::Status& st, Where where = Where::kLookup) {
  using patchstore::Code;
  PyObject* type = PyExc_RuntimeError;
  switch (st.code()) {
    case Code::kNotFound: type = where == Where::kFiles ? PyExc_FileNotFoundError : PyExc_KeyError; break;
    case Code::kOutOfRange: type = PyExc_IndexError; break;
    case Code::kInvalidArgument:
    case Code::kUnsupported: type = PyExc_ValueError; break;
    case Code::kIOError: type = PyExc_OSError; break;
    case Code::kCorruption: type = CorruptRecordErrorType(); break;
    case Code::kAlreadyExists: type = PyExc_FileExistsError; break;
    case Code::kOk:  // a caller bug; report it rather than crash
    case Code::kAborted:
    case Code::kInternal: type = PyExc_RuntimeError; break;
  }
  const std::string& msg = st.ok() ? std::string("RaiseStatus called with OK") : st.message();
  // Messages quote ids and paths, which may hold any bytes (not UTF-8, NUL):
  // decode with backslash escapes so the exception is always the one meant,
  // never a UnicodeDecodeError or a message cut at a NUL.
  PyObject* text = PyUnicode_DecodeUTF8(msg.data(), static_cast<Py_ssize_t>(msg.size()), "backslashreplace");
  if (text == nullptr) throw py::error_already_set();
  PyErr_SetObject(type, text);
  Py_DECREF(text);
  throw py::error_already_set();
}

// Unwraps a Result or raises.
template <typename T>
T Unwrap(patchstore::Result<T> r, Where where = Where::kLookup) {
  if (!r.ok()) RaiseStatus(r.status(), where);
  return std::move(r).value();
}

inline void Check(const patchstore::Status& st, Where where = Where::kLookup) {
  if (!st.ok()) RaiseStatus(st, where);
}

}  // namespace patchstore_py
