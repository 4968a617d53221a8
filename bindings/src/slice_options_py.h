// patchstore/bindings/src/slice_options_py.h — patchstore::SliceOptions as
// Python sees it, generated from the option table (PATCHSTORE_SLICE_OPTIONS,
// reader/slice_sampler.h), as sampler_options_py.h does for the frames
// sampler's.
//
// Both extension modules include it: _patchstore binds the class
// `SliceOptions` (one property per table row under its Python keyword, plus
// the parts the Python layer converts into: fields, samples) and
// SLICE_OPTIONS; _ingest (the volume montage) reads the same attributes
// from such an object (SliceOptionsFrom). Conversions only check that a
// value fits the C++ type (TypeError / ValueError naming the option);
// SliceOptions::Validate is the one check of the values.
//
// Python spellings of the types the frames table has not:
//   context  C (int, every field) or {field: C}; read back the same way
//   crop     None, S (S x S) or (h, w); read back None or (h, w)
//   flip     False, True or "independent"
//   clamp    None, (lo, hi) for every field, or {field: (lo, hi) or None};
//            read back None, (lo, hi) or {field: (lo, hi)}
//   output   "float32" or "stored"
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "patchstore/reader/slice_sampler.h"
#include "sampler_options_py.h"

namespace patchstore_py {
namespace py = pybind11;

namespace slice_options_detail {

using sampler_options_detail::Repr;
using sampler_options_detail::SetNamed;

inline std::pair<double, double> Pair(py::handle v, const std::string& name, const std::string& of) {
  if (py::isinstance<py::str>(v) || !py::isinstance<py::sequence>(v) || py::len(v) != 2)
    throw py::type_error(name + " for " + of + " must be (lo, hi), got " + Repr(v));
  py::sequence s = py::reinterpret_borrow<py::sequence>(v);
  double lo = 0, hi = 0;
  SetNamed(&lo, s[0], name);
  SetNamed(&hi, s[1], name);
  return {lo, hi};
}

template <class T>
void Set(T* dst, py::handle v, const std::string& member) {
  const std::string name = patchstore::SliceOptionSpelling(member);
  if constexpr (std::is_same_v<T, patchstore::SliceContext>) {
    patchstore::SliceContext c;
    if (py::isinstance<py::dict>(v)) {
      for (auto item : py::reinterpret_borrow<py::dict>(v)) {
        if (!py::isinstance<py::str>(item.first))
          throw py::type_error(name + " must name fields (str), got " + Repr(item.first));
        int64_t n = 0;
        SetNamed(&n, item.second, name + " for '" + item.first.cast<std::string>() + "'");
        c.fields.emplace_back(item.first.cast<std::string>(), n);
      }
    } else {
      if (PyBool_Check(v.ptr()) || !PyIndex_Check(v.ptr()))
        throw py::type_error(name + " must be a number of slices or a dict {field: slices}, got " + Repr(v));
      SetNamed(&c.all, v, name);
    }
    *dst = std::move(c);
  } else if constexpr (std::is_same_v<T, patchstore::CropSize>) {
    patchstore::CropSize c;
    if (v.is_none()) {
    } else if (py::isinstance<py::str>(v) || PyBool_Check(v.ptr())) {
      throw py::type_error(name + " must be None, S or (h, w), got " + Repr(v));
    } else if (PyIndex_Check(v.ptr())) {
      SetNamed(&c.h, v, name);
      c.w = c.h;
    } else if (py::isinstance<py::sequence>(v) && py::len(v) == 2) {
      py::sequence s = py::reinterpret_borrow<py::sequence>(v);
      SetNamed(&c.h, s[0], name);
      SetNamed(&c.w, s[1], name);
    } else {
      throw py::type_error(name + " must be None, S or (h, w), got " + Repr(v));
    }
    // 0 x 0 is C++'s "no crop": a crop of 0 is refused here, not taken for None.
    if (!v.is_none() && c.none()) throw py::value_error(name + " must be positive (None: no crop), got " + Repr(v));
    *dst = c;
  } else if constexpr (std::is_same_v<T, patchstore::SliceFlip>) {
    if (PyBool_Check(v.ptr())) {
      *dst = v.ptr() == Py_True ? patchstore::SliceFlip::kBoth : patchstore::SliceFlip::kNone;
    } else if (py::isinstance<py::str>(v) && v.cast<std::string>() == "independent") {
      *dst = patchstore::SliceFlip::kIndependent;
    } else if (PyLong_CheckExact(v.ptr()) && (PyLong_AsLong(v.ptr()) == 0 || PyLong_AsLong(v.ptr()) == 1)) {
      *dst = PyLong_AsLong(v.ptr()) == 1 ? patchstore::SliceFlip::kBoth : patchstore::SliceFlip::kNone;
    } else {
      throw py::value_error(name + " must be False, True or 'independent', got " + Repr(v));
    }
  } else if constexpr (std::is_same_v<T, std::vector<patchstore::SliceClamp>>) {
    std::vector<patchstore::SliceClamp> out;
    if (v.is_none()) {
    } else if (py::isinstance<py::dict>(v)) {
      for (auto item : py::reinterpret_borrow<py::dict>(v)) {
        if (!py::isinstance<py::str>(item.first))
          throw py::type_error(name + " must name fields (str), got " + Repr(item.first));
        if (item.second.is_none()) continue;
        const std::string f = item.first.cast<std::string>();
        const auto [lo, hi] = Pair(item.second, name, "'" + f + "'");
        out.push_back({f, lo, hi});
      }
    } else {
      const auto [lo, hi] = Pair(v, name, "every field");
      out.push_back({"", lo, hi});
    }
    *dst = std::move(out);
  } else if constexpr (std::is_same_v<T, patchstore::Output>) {
    const std::string s = py::isinstance<py::str>(v) ? v.cast<std::string>() : std::string();
    if (s == "float32") *dst = patchstore::Output::kFloat32;
    else if (s == "stored") *dst = patchstore::Output::kStored;
    else throw py::value_error(name + " must be 'float32' or 'stored', got " + Repr(v));
  } else {
    SetNamed(dst, v, name);
  }
}

template <class T>
py::object Get(const T& v) {
  if constexpr (std::is_same_v<T, patchstore::SliceContext>) {
    if (v.fields.empty()) return py::int_(v.all);
    py::dict d;
    if (v.all != 0) d["*"] = v.all;  // "every other field" (the CLI's "1,CT=0"); Python never sets it
    for (const auto& [f, c] : v.fields) d[py::str(f)] = c;
    return std::move(d);
  } else if constexpr (std::is_same_v<T, patchstore::CropSize>) {
    if (v.none()) return py::none();
    return py::make_tuple(v.h, v.w);
  } else if constexpr (std::is_same_v<T, patchstore::SliceFlip>) {
    if (v == patchstore::SliceFlip::kIndependent) return py::str("independent");
    return py::bool_(v == patchstore::SliceFlip::kBoth);
  } else if constexpr (std::is_same_v<T, std::vector<patchstore::SliceClamp>>) {
    if (v.empty()) return py::none();
    if (v.size() == 1 && v[0].field.empty()) return py::make_tuple(v[0].lo, v[0].hi);
    py::dict d;
    for (const auto& c : v) d[py::str(c.field.empty() ? "*" : c.field)] = py::make_tuple(c.lo, c.hi);
    return std::move(d);
  } else if constexpr (std::is_same_v<T, patchstore::Output>) {
    return py::str(v == patchstore::Output::kStored ? "stored" : "float32");
  } else {
    return py::cast(v);
  }
}

// The members the Python layer converts into besides the table's rows.
#define PATCHSTORE_SLICE_OPTION_PARTS(X) X(fields) X(samples)

inline bool SetByName(patchstore::SliceOptions* o, const std::string& name, py::handle v) {
#define PATCHSTORE_SLICE_SET_ROW(m, pyname, cli, doc) \
  if (name == pyname) {                               \
    Set(&o->m, v, #m);                                \
    return true;                                      \
  }
  PATCHSTORE_SLICE_OPTIONS(PATCHSTORE_SLICE_SET_ROW)
#undef PATCHSTORE_SLICE_SET_ROW
#define PATCHSTORE_SLICE_SET_PART(m) \
  if (name == #m) {                  \
    Set(&o->m, v, #m);               \
    return true;                     \
  }
  PATCHSTORE_SLICE_OPTION_PARTS(PATCHSTORE_SLICE_SET_PART)
#undef PATCHSTORE_SLICE_SET_PART
  return false;
}

}  // namespace slice_options_detail

// A SliceOptions from any object with the attributes of the bound class
// (a patchstore._patchstore.SliceOptions, possibly from the other module).
inline patchstore::SliceOptions SliceOptionsFrom(py::handle obj) {
  patchstore::SliceOptions o;
#define PATCHSTORE_SLICE_FROM_ROW(m, pyname, cli, doc) slice_options_detail::Set(&o.m, obj.attr(pyname), #m);
  PATCHSTORE_SLICE_OPTIONS(PATCHSTORE_SLICE_FROM_ROW)
#undef PATCHSTORE_SLICE_FROM_ROW
#define PATCHSTORE_SLICE_FROM_PART(m) slice_options_detail::Set(&o.m, obj.attr(#m), #m);
  PATCHSTORE_SLICE_OPTION_PARTS(PATCHSTORE_SLICE_FROM_PART)
#undef PATCHSTORE_SLICE_FROM_PART
  return o;
}

// Binds SliceOptions and SLICE_OPTIONS (a tuple of (Python keyword, CLI flag
// or "", doc, C++ member) rows, in table order) into `m`.
inline void BindSliceOptions(py::module_& m) {
  using patchstore::SliceOptions;
  py::class_<SliceOptions> c(
      m, "SliceOptions",
      "patchstore::SliceOptions: SliceDataset's options in C++ types, defaults from C++. Properties are the\n"
      "Python keywords of SLICE_OPTIONS plus the parts patchstore converts into (fields, samples).\n"
      "validate() is SliceOptions::Validate (ValueError).");
  c.def(py::init([](py::kwargs kw) {
          SliceOptions o;
          for (auto item : kw) {
            const std::string name = item.first.cast<std::string>();
            if (!slice_options_detail::SetByName(&o, name, item.second))
              throw py::type_error("SliceOptions: unexpected option '" + name + "'");
          }
          return o;
        }),
        "Default options, with the given ones set.");
#define PATCHSTORE_SLICE_BIND_ROW(mem, pyname, cli, doc)                              \
  c.def_property(                                                                     \
      pyname, [](const SliceOptions& o) { return slice_options_detail::Get(o.mem); }, \
      [](SliceOptions& o, py::handle v) { slice_options_detail::Set(&o.mem, v, #mem); }, doc);
  PATCHSTORE_SLICE_OPTIONS(PATCHSTORE_SLICE_BIND_ROW)
#undef PATCHSTORE_SLICE_BIND_ROW
#define PATCHSTORE_SLICE_BIND_PART(mem)                                             \
  c.def_property(                                                                   \
      #mem, [](const SliceOptions& o) { return slice_options_detail::Get(o.mem); }, \
      [](SliceOptions& o, py::handle v) { slice_options_detail::Set(&o.mem, v, #mem); });
  PATCHSTORE_SLICE_OPTION_PARTS(PATCHSTORE_SLICE_BIND_PART)
#undef PATCHSTORE_SLICE_BIND_PART
  c.def("validate", [](const SliceOptions& o) {
    patchstore::Status st = o.Validate();
    if (!st.ok()) throw py::value_error(st.message());
  });
  c.def(
      "context_of", [](const SliceOptions& o, const std::string& field) { return o.context.Of(field); },
      py::arg("field"), "The context of `field` (SliceContext::Of).");
  c.def("__repr__", [](const SliceOptions& o) {
    std::string s = "SliceOptions(fields=" + py::repr(py::cast(o.fields)).cast<std::string>();
#define PATCHSTORE_SLICE_REPR_ROW(mem, pyname, cli, doc) \
  s += std::string(", ") + pyname + "=" + py::repr(slice_options_detail::Get(o.mem)).cast<std::string>();
    PATCHSTORE_SLICE_OPTIONS(PATCHSTORE_SLICE_REPR_ROW)
#undef PATCHSTORE_SLICE_REPR_ROW
    return s + ")";
  });
  py::list rows;
#define PATCHSTORE_SLICE_TABLE_ROW(mem, pyname, cli, doc) rows.append(py::make_tuple(pyname, cli, doc, #mem));
  PATCHSTORE_SLICE_OPTIONS(PATCHSTORE_SLICE_TABLE_ROW)
#undef PATCHSTORE_SLICE_TABLE_ROW
  m.attr("SLICE_OPTIONS") = py::tuple(rows);
}

}  // namespace patchstore_py
