// HDF5 helpers: one lock for the (serial, not thread-safe) library, error
// stacks turned into text, and file types mapped to native memory types.
#include <string>
#include <vector>

#include "ingest/hdf5_internal.h"

namespace patchstore {
namespace hdf5 {
namespace {

std::mutex& LibraryMutex() {
  static std::mutex mu;
  return mu;
}

herr_t CollectError(unsigned /*n*/, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  std::string desc = e->desc ? e->desc : "";
  if (desc.empty()) {
    char buf[256] = {0};
    if (H5Eget_msg(e->min_num, nullptr, buf, sizeof buf) > 0) desc = buf;
  }
  if (!desc.empty()) out->push_back(desc);
  return 0;
}

}  // namespace

Hdf5Lock::Hdf5Lock() : lock_(LibraryMutex()) {
  H5Eget_auto2(H5E_DEFAULT, &old_func_, &old_data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

Hdf5Lock::~Hdf5Lock() { H5Eset_auto2(H5E_DEFAULT, old_func_, old_data_); }

std::string TakeErrorStack() {
  std::vector<std::string> msgs;  // outermost (API) first
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, CollectError, &msgs);
  H5Eclear2(H5E_DEFAULT);
  if (msgs.empty()) return "unknown HDF5 error";
  // The API-level message says what failed, the innermost one why.
  std::string s = msgs.front();
  if (msgs.size() > 1 && msgs.back() != msgs.front()) s += " (" + msgs.back() + ")";
  return "HDF5: " + s;
}

const char* TypeClassName(H5T_class_t c) {
  switch (c) {
    case H5T_INTEGER: return "integer";
    case H5T_FLOAT: return "float";
    case H5T_TIME: return "time";
    case H5T_STRING: return "string";
    case H5T_BITFIELD: return "bitfield";
    case H5T_OPAQUE: return "opaque";
    case H5T_COMPOUND: return "compound";
    case H5T_REFERENCE: return "reference";
    case H5T_ENUM: return "enum";
    case H5T_VLEN: return "variable-length";
    case H5T_ARRAY: return "array";
    default: return "unknown";
  }
}

Result<NumericType> MapNumericType(hid_t file_type) {
  NumericType t;
  H5T_class_t cls = H5Tget_class(file_type);
  hid_t int_type = file_type;
  Hid super;
  const bool is_enum = cls == H5T_ENUM;
  if (is_enum) {
    super = Hid(H5Tget_super(file_type), H5Tclose);
    if (!super.valid() || H5Tget_class(super.get()) != H5T_INTEGER)
      return Status::Unsupported("type enum (of a non-integer base) is not numeric");
    int_type = super.get();
    cls = H5T_INTEGER;
  }
  if (cls == H5T_INTEGER) {
    const size_t size = H5Tget_size(int_type);
    const bool is_signed = H5Tget_sign(int_type) == H5T_SGN_2;
    hid_t native = -1;
    switch (size) {
      case 1:
        t.source = is_signed ? SourceType::kInt8 : SourceType::kUInt8;
        t.mem = is_signed ? NumericType::Mem::kInt8 : NumericType::Mem::kUInt8;
        native = is_signed ? H5T_NATIVE_INT8 : H5T_NATIVE_UINT8;
        break;
      case 2:
        t.source = is_signed ? SourceType::kInt16 : SourceType::kUInt16;
        t.mem = is_signed ? NumericType::Mem::kInt16 : NumericType::Mem::kUInt16;
        native = is_signed ? H5T_NATIVE_INT16 : H5T_NATIVE_UINT16;
        break;
      case 4:
        t.source = is_signed ? SourceType::kInt32 : SourceType::kUInt32;
        t.mem = is_signed ? NumericType::Mem::kInt32 : NumericType::Mem::kUInt32;
        native = is_signed ? H5T_NATIVE_INT32 : H5T_NATIVE_UINT32;
        break;
      case 8:
        t.source = is_signed ? SourceType::kInt64 : SourceType::kUInt64;
        t.mem = is_signed ? NumericType::Mem::kInt64 : NumericType::Mem::kUInt64;
        native = is_signed ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT64;
        break;
      default: return Status::Unsupported("type: " + std::to_string(size * 8) + "-bit integers are not supported");
    }
    t.mem_size = size;
    t.describe = std::string(is_signed ? "int" : "uint") + std::to_string(size * 8);
    if (is_enum) {
      // Read as the native form of the enum itself: its bytes are the
      // native integer base (HDF5 has no enum -> integer conversion).
      t.memtype = Hid(H5Tget_native_type(file_type, H5T_DIR_ASCEND), H5Tclose);
      if (!t.memtype.valid() || H5Tget_size(t.memtype.get()) != size)
        return Status::Unsupported("type enum(" + t.describe + ") has no native form of the same size");
      t.describe = "enum(" + t.describe + ")";
    } else {
      t.memtype = Hid(H5Tcopy(native), H5Tclose);
    }
    return t;
  }
  if (cls == H5T_FLOAT) {
    const size_t size = H5Tget_size(file_type);
    if (size <= 4) {
      t.source = size == 2 ? SourceType::kFloat16 : size == 4 ? SourceType::kFloat32 : SourceType::kUnknown;
      t.mem = NumericType::Mem::kFloat;
      t.mem_size = 4;
      t.memtype = Hid(H5Tcopy(H5T_NATIVE_FLOAT), H5Tclose);
    } else {
      t.source = size == 8 ? SourceType::kFloat64 : SourceType::kUnknown;
      t.mem = NumericType::Mem::kDouble;
      t.mem_size = 8;
      t.memtype = Hid(H5Tcopy(H5T_NATIVE_DOUBLE), H5Tclose);
    }
    t.describe = "float" + std::to_string(size * 8);
    return t;
  }
  return Status::Unsupported(std::string("type ") + TypeClassName(cls) + " is not numeric");
}

}  // namespace hdf5
}  // namespace patchstore
