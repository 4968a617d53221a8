// patchstore/reader/tensor_view.h — a borrowed-or-owned view of typed data.
//
// A TensorView is a pointer, an element type (DType), a shape and byte
// strides, plus an `owner` that keeps the memory alive. Views handed out by
// patchstore::Reader point into the LMDB memory map and carry the dtype of
// the record (float32 for every store ingest writes today); their owner holds
// the read transaction and the environment, so a view stays valid for as long
// as any copy of it lives, even after the Reader that made it is destroyed.
//
// Reading the elements: `data_as<float>()` returns the pointer typed, after
// checking that the view holds float32; asking for the wrong type aborts the
// process with a message (a programming error, like an out-of-range
// std::span index: the dtype of a view is known before its data is read).
// Code that accepts several dtypes dispatches once with VisitDType
// (store/dtype.h) and calls data_as<T>() inside. `data` is the untyped
// address, for byte-level work (memcpy, prefetch, pointer identity).
//
// Views are read-only: the map is mapped PROT_READ and writing through the
// pointer faults.
//
// Thread-safety: a TensorView is an immutable value; any number of threads
// may read through copies of it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "patchstore/store/dtype.h"

namespace patchstore {

// How the stored values of a raw-source record (uint8/uint16/int16, compact
// encodings: FORMAT.md "Encodings") become the normalised float32 a reader
// returns. `values` is the table of every normalised value, built with
// Normalization::Apply, the function ingest uses (uint8 and uint16 indexed
// by value, int16 by value + 32768): it defines the result. `rule` is a
// faster equal way to compute the same values on long runs, where a table
// lookup per element does not vectorise:
//   kLookup:  values[v]
//   kAffine:  ((float)v / div) * mul + add, then clamped to [lo, hi] when
//             `clamp` (the float32 steps of Normalization::Apply)
//   kNonZero: v != 0 ? 1.0f : 0.0f
// A rule other than kLookup is chosen only when it gives the bits of
// `values` for every possible v (MakeValueTable in reader/reader.h checks
// each one), so every path of ConvertRun (reader/transform.h) returns the
// same floats.
struct ValueTable {
  enum class Rule : uint8_t { kLookup, kAffine, kNonZero };
  const float* values = nullptr;
  Rule rule = Rule::kLookup;
  bool clamp = false;
  float div = 1.0f, mul = 1.0f, add = 0.0f;
  float lo = 0.0f, hi = 0.0f;
};

struct TensorView {
  const void* data = nullptr;     // the first element; untyped (see data_as)
  DType dtype = DType::kFloat32;  // the type of every element
  int rank = 0;
  std::array<int64_t, 4> shape{};
  std::array<int64_t, 4> strides{};   // in bytes
  std::shared_ptr<const void> owner;  // keeps `data` (and `lut`) valid
  // Raw-source records (uint8/uint16/int16, compact encodings: the values
  // of the source file, FORMAT.md "Encodings"): the field's table of
  // normalised values (`lut->values`: float32[256] or float32[65536], int16
  // indexed by value + 32768), which every conversion to float32 applies
  // (ConvertElement, ConvertRun in reader/transform.h). Null for
  // float32/float16 views (already normalised).
  const ValueTable* lut = nullptr;

  // `data` as `const T*`. Aborts with a message naming both dtypes when T is
  // not the C++ type of `dtype` (DTypeOf<T>::value != dtype).
  template <class T>
  const T* data_as() const {
    if (DTypeOf<T>::value != dtype)
      DTypeFatal("TensorView::data_as<T>() with T other than the view's dtype (asked, held)", DTypeOf<T>::value, dtype);
    return static_cast<const T*>(data);
  }
  // `data` as bytes, for byte-offset arithmetic with `strides`.
  const uint8_t* bytes() const { return static_cast<const uint8_t*>(data); }
  // Bytes per element.
  int64_t itemsize() const { return static_cast<int64_t>(DTypeSize(dtype)); }

  int64_t elements() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
  bool contiguous() const {
    int64_t s = itemsize();
    for (int i = rank - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != s) return false;
      s *= shape[i];
    }
    return true;
  }
};

// Copies a rank-3 view (C, h, w) of any dtype into `dst`, a contiguous
// C*h*w float32 buffer, converting each element with ToFloat32 (store/dtype.h;
// through `v.lut` for raw-source records; a memcpy of each row for float32).
// The one copy kernel behind Reader::CopyPatch and CopyPatches.
// REQUIRES: v.rank == 3.
void CopyToFloat32(const TensorView& v, float* dst);

// The normalised float32 values of a view: `v` itself when it holds float32
// (no copy), else a contiguous float32 copy (converted through `v.lut`) that
// the returned view owns. For code that reads values (export, montage, the
// Python buffers) whatever the record's encoding. REQUIRES: 1 <= v.rank <= 3.
TensorView AsFloat32(const TensorView& v);

}  // namespace patchstore
