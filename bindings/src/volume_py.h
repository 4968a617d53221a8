// patchstore/bindings/src/volume_py.h — slices of volume stores for Python:
// patchstore._patchstore.SliceIndex and copy_slice_stacks, the binding of
// reader/volume.h (Reader.volume and Reader.slice_stack are bound with the
// Reader in reader_module.cc).
#pragma once

#include <pybind11/pybind11.h>

namespace patchstore_py {

// Adds SliceIndex and copy_slice_stacks to module `m` (patchstore._patchstore).
void BindVolumes(pybind11::module_& m);

}  // namespace patchstore_py
