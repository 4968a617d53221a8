// patchstore/reader/tensor_view.h — a borrowed-or-owned view of float32 data.
//
// A TensorView is a pointer, a shape and byte strides, plus an `owner` that
// keeps the memory alive. Views handed out by patchstore::Reader point into
// the LMDB memory map; their owner holds the read transaction and the
// environment, so a view stays valid for as long as any copy of it lives,
// even after the Reader that made it is destroyed.
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

namespace patchstore {

struct TensorView {
  const float* data = nullptr;
  int rank = 0;
  std::array<int64_t, 4> shape{};
  std::array<int64_t, 4> strides{};  // in bytes
  std::shared_ptr<const void> owner;  // keeps `data` valid

  int64_t elements() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
  bool contiguous() const {
    int64_t s = 4;
    for (int i = rank - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != s) return false;
      s *= shape[i];
    }
    return true;
  }
};

}  // namespace patchstore
