// patchstore/bindings/src/view_py.h — the View class shared by the reader
// module's translation units (reader_module.cc registers it; volume_py.cc
// returns it too).
#pragma once

#include <pybind11/pybind11.h>

#include <utility>
#include <vector>

#include "patchstore/reader/tensor_view.h"
#include "patchstore/store/dtype.h"

namespace patchstore_py {

// A read-only view of the record's dtype: into the store's memory map, or (a
// slice stack that crosses the end of a volume) into a buffer the view owns.
// Exported read-only through the buffer protocol; `v.owner` keeps the memory
// valid.
struct View {
  patchstore::TensorView v;
};

// The buffer-protocol export of a View: the element size and format
// character come from the view's dtype ("f" float32, "B" uint8, "H" uint16,
// "h" int16, "e" float16, "I" uint32), so numpy.asarray(view).dtype is the
// stored dtype.
inline pybind11::buffer_info BufferInfo(const View& self) {
  const patchstore::TensorView& t = self.v;
  std::vector<pybind11::ssize_t> shape(t.rank), strides(t.rank);
  for (int i = 0; i < t.rank; ++i) {
    shape[i] = t.shape[i];
    strides[i] = t.strides[i];
  }
  return patchstore::VisitDType(t.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return pybind11::buffer_info(const_cast<T*>(t.data_as<T>()), static_cast<pybind11::ssize_t>(sizeof(T)),
                                 patchstore::DTypeFormat(decltype(tag)::dtype), t.rank, std::move(shape),
                                 std::move(strides), /*readonly=*/true);
  });
}

}  // namespace patchstore_py
