// patchstore/bindings/src/view_py.h — the View class shared by the reader
// module's translation units (reader_module.cc registers it; volume_py.cc
// returns it too).
#pragma once

#include "patchstore/reader/tensor_view.h"

namespace patchstore_py {

// A read-only float32 view: into the store's memory map, or (a slice stack
// that crosses the end of a volume) into a buffer the view owns. Exported
// read-only through the buffer protocol; `v.owner` keeps the memory valid.
struct View {
  patchstore::TensorView v;
};

}  // namespace patchstore_py
