// patchstore/bindings/src/buffer_py.h — caller buffers (buffer protocol)
// checked once, then written with the GIL released.
//
// Used by Reader.copy_patches and the Sampler's gathers: a buffer is taken
// with PyObject_GetBuffer (which keeps the exporter alive and, for NumPy,
// stops it from being resized) and released when the BufferHold dies, after
// the copy. No NumPy C API: the module works with any NumPy (1.x or 2.x).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "patchstore/reader/reader.h"
#include "patchstore/store/dtype.h"

namespace patchstore_py {

namespace py = pybind11;

// A Py_buffer released on scope exit.
class BufferHold {
 public:
  BufferHold() { std::memset(&view_, 0, sizeof(view_)); }
  ~BufferHold() {
    if (held_) PyBuffer_Release(&view_);
  }
  BufferHold(const BufferHold&) = delete;
  BufferHold& operator=(const BufferHold&) = delete;
  // Returns false (with the Python error cleared) when `obj` does not export
  // a buffer with these flags.
  bool Get(PyObject* obj, int flags) {
    if (PyObject_GetBuffer(obj, &view_, flags) != 0) {
      PyErr_Clear();
      return false;
    }
    held_ = true;
    return true;
  }
  Py_buffer& view() { return view_; }

 private:
  Py_buffer view_;
  bool held_ = false;
};

// "f", "<f", "=f", "@f" (and the int64 codes) in native little-endian order.
inline bool FormatIs(const char* format, const char* codes) {
  if (format == nullptr) return false;
  if (*format == '@' || *format == '=' || *format == '<') ++format;
  return format[0] != '\0' && format[1] == '\0' && std::strchr(codes, format[0]) != nullptr;
}

inline std::string TypeName(const py::handle& obj) { return std::string(py::str(py::type::of(obj).attr("__name__"))); }

inline std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// A writable C-contiguous buffer of `shape` with item format `codes` and
// size `itemsize` taken from `obj`, or a ValueError naming `what` ("out['rgb']")
// and `context` ("PatchSampler.batch on '/data/frames.ps'").
// `shape` must match exactly (same number of dimensions and extents).
inline std::unique_ptr<BufferHold> WritableBuffer(const py::handle& obj, const std::vector<int64_t>& shape,
                                                  const char* codes, Py_ssize_t itemsize, const char* type_name,
                                                  const std::string& what, const std::string& context) {
  auto b = std::make_unique<BufferHold>();
  if (!b->Get(obj.ptr(), PyBUF_STRIDES | PyBUF_FORMAT | PyBUF_WRITABLE)) {
    BufferHold ro;
    if (ro.Get(obj.ptr(), PyBUF_STRIDES | PyBUF_FORMAT))
      throw py::value_error(context + ": " + what + " is read-only (got a read-only " + TypeName(obj) + ")");
    throw py::value_error(context + ": " + what + " must be a writable " + type_name +
                          " buffer (a NumPy array or a CPU torch tensor), got " + TypeName(obj));
  }
  Py_buffer& v = b->view();
  if (v.itemsize != itemsize || !FormatIs(v.format, codes))
    throw py::value_error(context + ": " + what + " must hold " + type_name + " (got format '" +
                          (v.format ? v.format : "B") + "')");
  std::vector<int64_t> have(static_cast<size_t>(v.ndim));
  for (int i = 0; i < v.ndim; ++i) have[i] = v.shape ? static_cast<int64_t>(v.shape[i]) : v.len / itemsize;
  if (have != shape)
    throw py::value_error(context + ": " + what + " has shape " + ShapeString(have) + ", expected " +
                          ShapeString(shape));
  if (!PyBuffer_IsContiguous(&v, 'C')) throw py::value_error(context + ": " + what + " must be C-contiguous");
  return b;
}

// A gather's output buffer for a field stored as `stored`: float32 (the
// normalised values, Output::kFloat32) or of the stored dtype itself
// (Output::kStored: the elements as stored, for conversion after a copy to
// the GPU), told apart by the buffer's format; otherwise a ValueError naming
// both accepted types.
inline std::unique_ptr<BufferHold> OutputBuffer(const py::handle& obj, const std::vector<int64_t>& shape,
                                                patchstore::DType stored, const std::string& what,
                                                const std::string& context, patchstore::Output* output) {
  *output = patchstore::Output::kFloat32;
  BufferHold probe;
  if (stored != patchstore::DType::kFloat32 && probe.Get(obj.ptr(), PyBUF_STRIDES | PyBUF_FORMAT) &&
      probe.view().itemsize == static_cast<Py_ssize_t>(patchstore::DTypeSize(stored)) &&
      FormatIs(probe.view().format, patchstore::DTypeFormat(stored))) {
    *output = patchstore::Output::kStored;
    const std::string name = patchstore::DTypeName(stored);
    return WritableBuffer(obj, shape, patchstore::DTypeFormat(stored), probe.view().itemsize, name.c_str(), what,
                          context);
  }
  const std::string accepted = stored == patchstore::DType::kFloat32
                                   ? std::string("float32")
                                   : "float32 or " + std::string(patchstore::DTypeName(stored)) +
                                         " (the field's stored dtype)";
  return WritableBuffer(obj, shape, "f", 4, accepted.c_str(), what, context);
}

// Throws ValueError when two of the buffers share memory.
inline void CheckDisjoint(const std::vector<std::pair<std::string, const BufferHold*>>& bufs,
                          const std::string& context) {
  for (size_t i = 0; i < bufs.size(); ++i)
    for (size_t j = i + 1; j < bufs.size(); ++j) {
      const Py_buffer& a = const_cast<BufferHold*>(bufs[i].second)->view();
      const Py_buffer& b = const_cast<BufferHold*>(bufs[j].second)->view();
      const auto a0 = reinterpret_cast<uintptr_t>(a.buf), b0 = reinterpret_cast<uintptr_t>(b.buf);
      if (a.len > 0 && b.len > 0 && a0 < b0 + static_cast<uintptr_t>(b.len) && b0 < a0 + static_cast<uintptr_t>(a.len))
        throw py::value_error(context + ": " + bufs[i].first + " and " + bufs[j].first + " share memory");
    }
}

}  // namespace patchstore_py
