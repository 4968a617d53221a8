// ingest/hdf5_internal.h — HDF5 helpers shared by HDF5 ingest and
// export (ingest-private; nothing outside ingest/ includes this).
//
// Debian's libhdf5 is the serial (not thread-safe) build, so every use of
// the library in patchstore happens under Hdf5Lock(), one thread at a time.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "patchstore/ingest/ingest.h"
#include "patchstore/store/format.h"
#include "patchstore/store/status.h"

namespace patchstore {
namespace hdf5 {

// Serialises all HDF5 calls in this process and, while held, keeps HDF5's
// automatic error-stack printing off (failures become Status messages).
class Hdf5Lock {
 public:
  Hdf5Lock();
  ~Hdf5Lock();
  Hdf5Lock(const Hdf5Lock&) = delete;
  Hdf5Lock& operator=(const Hdf5Lock&) = delete;

 private:
  std::unique_lock<std::mutex> lock_;
  H5E_auto2_t old_func_ = nullptr;
  void* old_data_ = nullptr;
};

// An owned HDF5 identifier, closed with the function it was created for.
class Hid {
 public:
  using Closer = herr_t (*)(hid_t);
  Hid() = default;
  Hid(hid_t id, Closer close) : id_(id), close_(close) {}
  ~Hid() { reset(); }
  Hid(Hid&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = H5I_INVALID_HID; }
  Hid& operator=(Hid&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer close_ = nullptr;
};

// The HDF5 error stack of the calling thread as a short cause, e.g.
// "can't read data (inflate() failed)", then clears the stack. Returns
// "unknown HDF5 error" when the stack is empty.
std::string TakeErrorStack();

// The memory type used to read a file type, and what it was.
struct NumericType {
  SourceType source = SourceType::kUnknown;
  // Element kind in memory after H5Dread with `memtype`.
  enum class Mem { kInt8, kUInt8, kInt16, kUInt16, kInt32, kUInt32, kInt64, kUInt64, kFloat, kDouble } mem;
  size_t mem_size = 0;
  Hid memtype;           // native type to pass to H5Dread
  std::string describe;  // "int16", "float64", "enum(int8)", ...
};

// Maps a dataset's file type to the native memory type patchstore reads it
// with. Integer and float types of any byte order; enums (h5py stores bool
// as an enum of int8) read as their integer base. Unsupported for strings,
// compounds, arrays, references and other non-numeric classes.
Result<NumericType> MapNumericType(hid_t file_type);

// The name of a type class ("string", "compound", ...).
const char* TypeClassName(H5T_class_t c);

}  // namespace hdf5

class Reader;
// Writes the volume records of `samples` x `fields` as one HDF5 file,
// OUTDIR/volumes.h5 (layout in ingest/ingest_hdf5.h). Called by Export().
Result<ExportSummary> ExportVolumesHdf5(const ExportOptions& o, const Reader& reader,
                                        const std::vector<uint64_t>& samples, const std::vector<int>& fields);

}  // namespace patchstore
