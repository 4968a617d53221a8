// patchstore/bindings/src/sampler_py.h — patchstore._patchstore.Sampler, the
// binding of patchstore::PatchSampler (reader/sampler.h).
#pragma once

#include <pybind11/pybind11.h>

namespace patchstore_py {

// Adds the Sampler class to module `m` (patchstore._patchstore).
void BindSampler(pybind11::module_& m);

}  // namespace patchstore_py
