// patchstore/bindings/src/sampler_options_py.h — patchstore::SamplerOptions
// as Python sees it, generated from the option table
// (PATCHSTORE_SAMPLER_OPTIONS, reader/sampler.h).
//
// Both extension modules include it: _patchstore binds the class
// `SamplerOptions` (one property per table row, under its Python keyword,
// plus the parts the Python layer converts into: fields, patch_h, patch_w,
// samples, prefetch_next) and SAMPLER_OPTIONS; _ingest reads the same
// attributes from such an object (SamplerOptionsFrom), so no option is
// listed here by hand. Conversions only check that a value fits the C++
// type (TypeError / ValueError naming the option); SamplerOptions::Validate
// is the one check of the values.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "patchstore/reader/order.h"
#include "patchstore/reader/sampler.h"

namespace patchstore_py {
namespace py = pybind11;

namespace sampler_options_detail {

inline std::string Repr(py::handle v) { return py::repr(v).cast<std::string>(); }

// Converts `v` into *dst by the C++ type; `name` is the option as a user
// spells it, for the TypeError / ValueError.
template <class T>
void SetNamed(T* dst, py::handle v, const std::string& name) {
  if constexpr (std::is_same_v<T, bool>) {
    const int t = PyObject_IsTrue(v.ptr());
    if (t < 0) throw py::error_already_set();
    *dst = t != 0;
  } else if constexpr (std::is_integral_v<T>) {
    if (PyBool_Check(v.ptr()) || PyFloat_Check(v.ptr()) || !PyIndex_Check(v.ptr()))
      throw py::type_error(name + " must be an integer, got " + Repr(v));
    py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(v.ptr()));
    if (!i) throw py::error_already_set();
    if constexpr (std::is_unsigned_v<T>) {
      const unsigned long long x = PyLong_AsUnsignedLongLong(i.ptr());
      if (x == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
        PyErr_Clear();
        throw py::value_error(name + " must be 0 or a positive integer below 2**64, got " + Repr(v));
      }
      *dst = static_cast<T>(x);
    } else {
      int overflow = 0;
      const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
      if (overflow || x < std::numeric_limits<T>::min() || x > std::numeric_limits<T>::max())
        throw py::value_error(name + " " + Repr(v) + " does not fit a " + std::to_string(sizeof(T) * 8) +
                              "-bit integer");
      *dst = static_cast<T>(x);
    }
  } else if constexpr (std::is_same_v<T, double>) {
    if (PyBool_Check(v.ptr()) || !(PyFloat_Check(v.ptr()) || PyIndex_Check(v.ptr()) || PyNumber_Check(v.ptr())) ||
        PyUnicode_Check(v.ptr()))
      throw py::type_error(name + " must be a number, got " + Repr(v));
    const double x = PyFloat_AsDouble(v.ptr());
    if (x == -1.0 && PyErr_Occurred()) throw py::error_already_set();
    *dst = x;
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!py::isinstance<py::str>(v)) throw py::type_error(name + " must be a str, got " + Repr(v));
    *dst = v.cast<std::string>();
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    if (py::isinstance<py::str>(v) || !py::isinstance<py::sequence>(v))
      throw py::type_error(name + " must be a list of str, got " + Repr(v));
    std::vector<std::string> out;
    for (py::handle e : v) {
      if (!py::isinstance<py::str>(e)) throw py::type_error(name + " must hold str, got " + Repr(e));
      out.push_back(e.cast<std::string>());
    }
    *dst = std::move(out);
  } else if constexpr (std::is_same_v<T, std::vector<uint64_t>>) {
    if (py::isinstance<py::str>(v) || !py::isinstance<py::sequence>(v))
      throw py::type_error(name + " must be a list of sample indices, got " + Repr(v));
    std::vector<uint64_t> out;
    for (py::handle e : v) {
      uint64_t x = 0;
      SetNamed(&x, e, name);
      out.push_back(x);
    }
    *dst = std::move(out);
  } else if constexpr (std::is_same_v<T, patchstore::SamplingPolicy>) {
    if (!py::isinstance<py::str>(v)) throw py::type_error(name + " must be a policy name, got " + Repr(v));
    auto p = patchstore::ParseSamplingPolicy(v.cast<std::string>());
    if (!p.ok()) throw py::value_error(name + ": " + p.status().message());
    *dst = *p;
  } else if constexpr (std::is_same_v<T, patchstore::SampleOrder>) {
    if (!py::isinstance<py::str>(v)) throw py::type_error(name + " must be 'random' or 'locality', got " + Repr(v));
    auto p = patchstore::ParseSampleOrder(v.cast<std::string>());
    if (!p.ok()) throw py::value_error(name + " must be 'random' or 'locality', got " + Repr(v));
    *dst = *p;
  } else {
    static_assert(sizeof(T) == 0, "add the conversion of this option type");
  }
}

// SetNamed for a member of the sampler's table (or a part).
template <class T>
void Set(T* dst, py::handle v, const std::string& member) {
  SetNamed(dst, v, patchstore::SamplerOptionSpelling(member));
}

template <class T>
py::object Get(const T& v) {
  if constexpr (std::is_same_v<T, patchstore::SamplingPolicy>) {
    return py::str(patchstore::SamplingPolicyName(v));
  } else if constexpr (std::is_same_v<T, patchstore::SampleOrder>) {
    return py::str(patchstore::SampleOrderName(v));
  } else {
    return py::cast(v);
  }
}

// The members the Python layer converts into besides the table's rows.
#define PATCHSTORE_SAMPLER_OPTION_PARTS(X) X(fields) X(patch_h) X(patch_w) X(samples) X(prefetch_next)

// Sets the option called `name` (a Python keyword of the table, or a part);
// false for an unknown name.
inline bool SetByName(patchstore::SamplerOptions* o, const std::string& name, py::handle v) {
#define PATCHSTORE_SET_ROW(m, pyname, cli, doc) \
  if (name == pyname) {                         \
    Set(&o->m, v, #m);                          \
    return true;                                \
  }
  PATCHSTORE_SAMPLER_OPTIONS(PATCHSTORE_SET_ROW)
#undef PATCHSTORE_SET_ROW
#define PATCHSTORE_SET_PART(m) \
  if (name == #m) {            \
    Set(&o->m, v, #m);         \
    return true;               \
  }
  PATCHSTORE_SAMPLER_OPTION_PARTS(PATCHSTORE_SET_PART)
#undef PATCHSTORE_SET_PART
  return false;
}

}  // namespace sampler_options_detail

// A SamplerOptions from any object with the attributes of the bound class
// (a patchstore._patchstore.SamplerOptions, possibly from the other module).
inline patchstore::SamplerOptions SamplerOptionsFrom(py::handle obj) {
  patchstore::SamplerOptions o;
#define PATCHSTORE_FROM_ROW(m, pyname, cli, doc) sampler_options_detail::Set(&o.m, obj.attr(pyname), #m);
  PATCHSTORE_SAMPLER_OPTIONS(PATCHSTORE_FROM_ROW)
#undef PATCHSTORE_FROM_ROW
#define PATCHSTORE_FROM_PART(m) sampler_options_detail::Set(&o.m, obj.attr(#m), #m);
  PATCHSTORE_SAMPLER_OPTION_PARTS(PATCHSTORE_FROM_PART)
#undef PATCHSTORE_FROM_PART
  return o;
}

// Binds SamplerOptions and SAMPLER_OPTIONS (a tuple of (Python keyword, CLI
// flag or "", doc, C++ member) rows, in table order) into `m`.
inline void BindSamplerOptions(py::module_& m) {
  using patchstore::SamplerOptions;
  py::class_<SamplerOptions> c(
      m, "SamplerOptions",
      "patchstore::SamplerOptions: the sampler's options in C++ types, defaults from C++. Properties are the\n"
      "Python keywords of SAMPLER_OPTIONS plus the parts patchstore converts into (fields, patch_h, patch_w,\n"
      "samples, prefetch_next). validate() is SamplerOptions::Validate (ValueError).");
  c.def(py::init([](py::kwargs kw) {
          SamplerOptions o;
          for (auto item : kw) {
            const std::string name = item.first.cast<std::string>();
            if (!sampler_options_detail::SetByName(&o, name, item.second))
              throw py::type_error("SamplerOptions: unexpected option '" + name + "'");
          }
          return o;
        }),
        "Default options, with the given ones set.");
#define PATCHSTORE_BIND_ROW(mem, pyname, cli, doc)                                        \
  c.def_property(                                                                         \
      pyname, [](const SamplerOptions& o) { return sampler_options_detail::Get(o.mem); }, \
      [](SamplerOptions& o, py::handle v) { sampler_options_detail::Set(&o.mem, v, #mem); }, doc);
  PATCHSTORE_SAMPLER_OPTIONS(PATCHSTORE_BIND_ROW)
#undef PATCHSTORE_BIND_ROW
#define PATCHSTORE_BIND_PART(mem)                                                       \
  c.def_property(                                                                       \
      #mem, [](const SamplerOptions& o) { return sampler_options_detail::Get(o.mem); }, \
      [](SamplerOptions& o, py::handle v) { sampler_options_detail::Set(&o.mem, v, #mem); });
  PATCHSTORE_SAMPLER_OPTION_PARTS(PATCHSTORE_BIND_PART)
#undef PATCHSTORE_BIND_PART
  c.def("validate", [](const SamplerOptions& o) {
    patchstore::Status st = o.Validate();
    if (!st.ok()) throw py::value_error(st.message());
  });
  c.def("__repr__", [](const SamplerOptions& o) {
    std::string s = "SamplerOptions(fields=" + py::repr(py::cast(o.fields)).cast<std::string>();
#define PATCHSTORE_REPR_ROW(mem, pyname, cli, doc) \
  s += std::string(", ") + pyname + "=" + py::repr(sampler_options_detail::Get(o.mem)).cast<std::string>();
    PATCHSTORE_SAMPLER_OPTIONS(PATCHSTORE_REPR_ROW)
#undef PATCHSTORE_REPR_ROW
    return s + ")";
  });
  py::list rows;
#define PATCHSTORE_TABLE_ROW(mem, pyname, cli, doc) rows.append(py::make_tuple(pyname, cli, doc, #mem));
  PATCHSTORE_SAMPLER_OPTIONS(PATCHSTORE_TABLE_ROW)
#undef PATCHSTORE_TABLE_ROW
  m.attr("SAMPLER_OPTIONS") = py::tuple(rows);
}

}  // namespace patchstore_py
