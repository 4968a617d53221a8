// patchstore/store/dtype.h — the element types a record can hold, and the one
// dispatch from a runtime DType to a compile-time C++ type.
//
// Every element type is one line of PATCHSTORE_FOR_EACH_DTYPE below: its
// enumerator, its byte in the record header (store/FORMAT.md), its C++ type,
// its name and its buffer-protocol format character (PEP 3118, what NumPy
// reads). The enum, DTypeOf<T>, DTypeName, DTypeSize, DTypeFormat and
// VisitDType are all generated from that list, so adding a dtype is one line
// here (plus a ToFloat32 overload when its C++ type is not arithmetic).
//
// VisitDType is the only switch on a DType in the project: code that handles
// several element types (copy kernels, verify, the Python buffer export) is
// written once as a generic lambda and instantiated for every dtype:
//
//   VisitDType(view.dtype, [&](auto tag) {
//     using T = typename decltype(tag)::type;   // float, uint8_t, Float16, ...
//     CopyRows<T>(view, dst);
//   });
//
// Thread-safety: everything here is a pure function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

namespace patchstore {

// IEEE 754 binary16, stored as its 16 bits (C++17 has no half type). Convert
// with ToFloat32 (exact: every float16 value is a float32 value).
struct Float16 {
  uint16_t bits = 0;
};

// X(enumerator, header byte, C++ type, name, buffer format)
// Header bytes are stored in records and the metadata: never renumber.
#define PATCHSTORE_FOR_EACH_DTYPE(X)     \
  X(kFloat32, 1, float, "float32", "f")  \
  X(kUInt32, 2, uint32_t, "uint32", "I") \
  X(kUInt8, 3, uint8_t, "uint8", "B")    \
  X(kUInt16, 4, uint16_t, "uint16", "H") \
  X(kInt16, 5, int16_t, "int16", "h")    \
  X(kFloat16, 6, ::patchstore::Float16, "float16", "e")

// The element type of a record or view: float32 (the default encoding),
// uint8 / uint16 / int16 (compact encodings: source values, FORMAT.md
// "Encodings"), float16 (on request), uint32 (summed-area tables of format-1
// stores).
enum class DType : uint8_t {
#define PATCHSTORE_DTYPE_ENUM_(e, code, T, name, fmt) e = code,
  PATCHSTORE_FOR_EACH_DTYPE(PATCHSTORE_DTYPE_ENUM_)
#undef PATCHSTORE_DTYPE_ENUM_
};

// Every dtype, in header-byte order.
inline constexpr DType kAllDTypes[] = {
#define PATCHSTORE_DTYPE_LIST_(e, code, T, name, fmt) DType::e,
    PATCHSTORE_FOR_EACH_DTYPE(PATCHSTORE_DTYPE_LIST_)
#undef PATCHSTORE_DTYPE_LIST_
};

// DTypeOf<T>::value: the DType of C++ type T (a compile error for others).
template <class T>
struct DTypeOf;
#define PATCHSTORE_DTYPE_OF_(e, code, T, name, fmt) \
  template <>                                       \
  struct DTypeOf<T> {                               \
    static constexpr DType value = DType::e;        \
  };
PATCHSTORE_FOR_EACH_DTYPE(PATCHSTORE_DTYPE_OF_)
#undef PATCHSTORE_DTYPE_OF_

// The argument VisitDType passes: `typename decltype(tag)::type` is the C++
// type, `decltype(tag)::dtype` the enumerator.
template <class T>
struct DTypeTag {
  using type = T;
  static constexpr DType dtype = DTypeOf<T>::value;
};

// True when `code` is the header byte of a known dtype. Check bytes read from
// a file with this before casting them to DType.
constexpr bool IsKnownDType(uint8_t code) {
  switch (code) {
#define PATCHSTORE_DTYPE_KNOWN_(e, c, T, name, fmt) case c:
    PATCHSTORE_FOR_EACH_DTYPE(PATCHSTORE_DTYPE_KNOWN_)
#undef PATCHSTORE_DTYPE_KNOWN_
    return true;
  }
  return false;
}

// The element size in bytes, or 0 for a value that is no DType.
constexpr size_t DTypeSize(DType t) {
  switch (t) {
#define PATCHSTORE_DTYPE_SIZE_(e, code, T, name, fmt) \
  case DType::e: return sizeof(T);
    PATCHSTORE_FOR_EACH_DTYPE(PATCHSTORE_DTYPE_SIZE_)
#undef PATCHSTORE_DTYPE_SIZE_
  }
  return 0;
}

// "float32", "uint8", ...; "unknown" for a value that is no DType.
constexpr const char* DTypeName(DType t) {
  switch (t) {
#define PATCHSTORE_DTYPE_NAME_(e, code, T, name, fmt) \
  case DType::e: return name;
    PATCHSTORE_FOR_EACH_DTYPE(PATCHSTORE_DTYPE_NAME_)
#undef PATCHSTORE_DTYPE_NAME_
  }
  return "unknown";
}

// The buffer-protocol (struct module) format of one element in native byte
// order: "f", "B", "H", "h", "I", "e"; nullptr for a value that is no DType.
constexpr const char* DTypeFormat(DType t) {
  switch (t) {
#define PATCHSTORE_DTYPE_FORMAT_(e, code, T, name, fmt) \
  case DType::e: return fmt;
    PATCHSTORE_FOR_EACH_DTYPE(PATCHSTORE_DTYPE_FORMAT_)
#undef PATCHSTORE_DTYPE_FORMAT_
  }
  return nullptr;
}

// Prints "patchstore: <what> (<a>, <b>)" with the two dtypes' names (or
// codes) to stderr and aborts: for programming errors (a DType that is not an
// enumerator; data_as<T>() of the wrong type), never for bad input, which is
// checked with IsKnownDType and reported as a Status.
[[noreturn]] inline void DTypeFatal(const char* what, DType a, DType b) {
  std::fprintf(stderr, "patchstore: %s (%s [code %u], %s [code %u])\n", what, DTypeName(a), static_cast<unsigned>(a),
               DTypeName(b), static_cast<unsigned>(b));
  std::fflush(stderr);
  std::abort();
}

// Calls f(DTypeTag<T>{}) with T the C++ type of `dtype` and returns what it
// returns (every instantiation must return the same type).
// REQUIRES: dtype is an enumerator (IsKnownDType); otherwise aborts.
template <class F>
decltype(auto) VisitDType(DType dtype, F&& f) {
  switch (dtype) {
#define PATCHSTORE_DTYPE_VISIT_(e, code, T, name, fmt) \
  case DType::e: return std::forward<F>(f)(DTypeTag<T>{});
    PATCHSTORE_FOR_EACH_DTYPE(PATCHSTORE_DTYPE_VISIT_)
#undef PATCHSTORE_DTYPE_VISIT_
  }
  DTypeFatal("VisitDType on a value that is no DType", dtype, dtype);
}

// Parses a name DTypeName returns. False for anything else.
inline bool ParseDTypeName(const char* name, DType* out) {
  for (DType t : kAllDTypes)
    if (std::strcmp(name, DTypeName(t)) == 0) {
      *out = t;
      return true;
    }
  return false;
}

// The value of one element as float32: a plain conversion (exact for every
// dtype but uint32 above 2^24). Normalisation is not applied here.
template <class T>
inline float ToFloat32(T v) {
  static_assert(std::is_arithmetic_v<T>, "give ToFloat32 an overload for this element type");
  return static_cast<float>(v);
}
inline float ToFloat32(Float16 h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  const uint32_t mant = h.bits & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float32.
    const float m = static_cast<float>(mant) * 0x1p-24f;
    std::memcpy(&bits, &m, 4);
    bits |= sign;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);  // infinity or NaN (payload kept)
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A mask element counts as valid when it is non-zero and not NaN.
template <class T>
inline bool IsValidMaskValue(T v) {
  return v != T(0) && v == v;
}
inline bool IsValidMaskValue(Float16 h) {
  const bool nan = (h.bits & 0x7c00u) == 0x7c00u && (h.bits & 0x3ffu) != 0;
  return (h.bits & 0x7fffu) != 0 && !nan;
}

}  // namespace patchstore
