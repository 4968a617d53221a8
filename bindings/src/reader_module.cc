// patchstore/bindings/src/reader_module.cc — patchstore._patchstore, the
// reading half of the Python binding (no OpenCV, OpenEXR or HDF5 here).
//
// A thin skin over patchstore::Reader (with reader/volume.h's Volume and
// SliceStack as Reader.volume / slice_stack), plus patchstore::PatchSampler
// as the Sampler class (sampler_py.cc) and SliceIndex / copy_slice_stacks
// (volume_py.cc). The Python package (patchstore/_store.py, _sampler.py,
// _volumes.py, torch.py) builds the public API on top: id decoding, fork
// detection, pickling, NumPy/torch `out` handling.
//
// Zero copy: Reader::Get/Patch (and Volume, SliceStack inside a volume)
// return TensorViews whose `owner` holds the LMDB snapshot (a SliceStack
// crossing a volume's end owns its copied buffer instead). They are
// wrapped in a View object that exports the buffer protocol read-only;
// NumPy keeps the View (and so the snapshot) alive through the array's
// .base chain (array -> memoryview -> View).
//
// The GIL is released for opening (indexing), batch copies and checksum
// verification; everything else is O(1).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "buffer_py.h"
#include "patchstore/reader/reader.h"
#include "patchstore/reader/verify.h"
#include "patchstore/reader/volume.h"
#include "patchstore/store/copy.h"
#include "patchstore/store/format.h"
#include "sampler_py.h"
#include "status_py.h"
#include "view_py.h"
#include "volume_py.h"

namespace py = pybind11;
using patchstore::FieldMeta;
using patchstore::PatchRequest;
using patchstore::Reader;
using patchstore::ReaderOptions;
using patchstore::RecordHeader;
using patchstore::Status;
using patchstore::TensorView;
using patchstore_py::BufferHold;
using patchstore_py::Check;
using patchstore_py::FormatIs;
using patchstore_py::Unwrap;
using patchstore_py::View;
using patchstore_py::Where;

namespace {

const char* LayoutName(patchstore::Layout l) {
  switch (l) {
    case patchstore::Layout::kCHW: return "CHW";
    case patchstore::Layout::kSHW: return "SHW";
    case patchstore::Layout::kSAT: return "SAT";
    case patchstore::Layout::kBlocks: return "BLOCKS";
  }
  return "unknown";
}

py::tuple Shape(const TensorView& v) {
  py::tuple t(v.rank);
  for (int i = 0; i < v.rank; ++i) t[i] = py::int_(v.shape[i]);
  return t;
}

// Reads a 1-D int64 buffer (NumPy int64 array, array('q'), ...) into a vector.
std::vector<int64_t> Int64s(const py::object& obj, const char* what) {
  BufferHold b;
  if (!b.Get(obj.ptr(), PyBUF_ND | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS))
    throw py::value_error(std::string(what) + " must be a contiguous 1-D int64 buffer");
  const Py_buffer& v = b.view();
  if (v.itemsize != 8 || !FormatIs(v.format, "qlQL") || v.ndim > 1)
    throw py::value_error(std::string(what) + " must be a contiguous 1-D int64 buffer (got format '" +
                          (v.format ? v.format : "B") + "', " + std::to_string(v.ndim) + " dimensions)");
  std::vector<int64_t> out(static_cast<size_t>(v.len / 8));
  if (!out.empty()) std::memcpy(out.data(), v.buf, static_cast<size_t>(v.len));
  return out;
}

int FieldOf(const Reader& r, const std::string& name) { return Unwrap(r.FieldIndex(name)); }

uint64_t SampleOf(const Reader& r, int64_t sample) {
  if (sample < 0 || static_cast<uint64_t>(sample) >= r.size())
    throw py::index_error("sample index " + std::to_string(sample) + " out of range [0, " + std::to_string(r.size()) +
                          ") in '" + r.path() + "'");
  return static_cast<uint64_t>(sample);
}

py::dict FieldInfo(const FieldMeta& f) {
  py::dict d;
  d["name"] = f.name;
  d["channels"] = f.channels;
  d["layout"] = LayoutName(f.layout);
  d["tile"] = f.tile;
  d["dtype"] = patchstore::DTypeName(f.dtype);
  d["source_type"] = patchstore::SourceTypeName(f.source_type);
  d["norm"] = f.norm.ToString();
  d["channel_names"] = f.channel_names;
  d["is_mask"] = f.is_mask;
  d["has_sat"] = f.has_sat;
  d["mask_blocks"] = f.mask_blocks;
  d["source_format"] = f.source_format;
  return d;
}

py::dict HeaderInfo(const RecordHeader& h) {
  py::tuple shape(h.rank);
  for (int i = 0; i < h.rank; ++i) shape[i] = py::int_(h.shape[i]);
  py::dict d;
  d["shape"] = shape;
  d["layout"] = LayoutName(h.layout);
  d["dtype"] = patchstore::DTypeName(h.dtype);
  d["source_type"] = patchstore::SourceTypeName(h.source_type);
  d["norm"] = h.norm.ToString();
  d["payload_bytes"] = h.payload_bytes;
  d["checksum"] = h.body_checksum;
  return d;
}

py::dict SummaryInfo(const patchstore::RecordSummary& h) {
  py::tuple shape(h.rank);
  for (int i = 0; i < h.rank; ++i) shape[i] = py::int_(h.shape[i]);
  py::dict d;
  d["shape"] = shape;
  d["layout"] = LayoutName(h.layout);
  d["dtype"] = patchstore::DTypeName(h.dtype);
  d["payload_bytes"] = h.payload_bytes();
  d["valid_count"] = h.has_valid_count ? py::object(py::int_(h.valid_count)) : py::object(py::none());
  return d;
}

// Copies `n` windows of field `field` into `out` (see the docstring below).
void CopyPatches(const Reader& r, const py::object& samples_obj, const std::string& field, const py::object& ys_obj,
                 const py::object& xs_obj, int64_t h, int64_t w, const py::object& out, int num_threads) {
  const int f = FieldOf(r, field);
  const std::vector<int64_t> samples = Int64s(samples_obj, "ids");
  const std::vector<int64_t> ys = Int64s(ys_obj, "ys");
  const std::vector<int64_t> xs = Int64s(xs_obj, "xs");
  const size_t n = samples.size();
  if (ys.size() != n || xs.size() != n)
    throw py::value_error("read_patches on '" + r.path() + "': " + std::to_string(n) + " ids but " +
                          std::to_string(ys.size()) + " ys and " + std::to_string(xs.size()) + " xs");
  std::vector<PatchRequest> reqs(n);
  for (size_t i = 0; i < n; ++i) reqs[i] = PatchRequest{SampleOf(r, samples[i]), f, ys[i], xs[i]};
  // The first request decides the channel count (and reports bad sizes in
  // the Reader's words); CopyPatches checks that the others agree.
  if (n == 0) {
    if (h <= 0 || w <= 0)
      throw py::value_error("read_patches on '" + r.path() + "': height and width must be positive");
    return;
  }
  const int64_t channels = Unwrap(r.Window(reqs[0].sample, f, reqs[0].y, reqs[0].x, h, w)).C;

  BufferHold b;
  if (!b.Get(out.ptr(), PyBUF_STRIDES | PyBUF_FORMAT | PyBUF_WRITABLE))
    throw py::value_error("read_patches on '" + r.path() + "': out must be a writable buffer (got " +
                          std::string(py::str(py::type::of(out).attr("__name__"))) + ")");
  Py_buffer& v = b.view();
  if (v.itemsize != 4 || !FormatIs(v.format, "f"))
    throw py::value_error("read_patches on '" + r.path() + "': out must hold float32 (got format '" +
                          (v.format ? v.format : "B") + "')");
  if (!PyBuffer_IsContiguous(&v, 'C'))
    throw py::value_error("read_patches on '" + r.path() + "': out must be C-contiguous");
  const int64_t want = static_cast<int64_t>(n) * channels * h * w;
  const int64_t have = static_cast<int64_t>(v.len / 4);
  std::string want_shape = "(" + std::to_string(n) + "," + std::to_string(channels) + "," + std::to_string(h) + "," +
                           std::to_string(w) + ")";
  if (have != want)
    throw py::value_error("read_patches on '" + r.path() + "' field '" + field + "': out holds " +
                          std::to_string(have) + " floats, " + want_shape + " needs " + std::to_string(want));
  if (v.ndim == 4 &&
      (v.shape[0] != static_cast<Py_ssize_t>(n) || v.shape[1] != channels || v.shape[2] != h || v.shape[3] != w))
    throw py::value_error("read_patches on '" + r.path() + "' field '" + field + "': out has shape (" +
                          std::to_string(v.shape[0]) + "," + std::to_string(v.shape[1]) + "," +
                          std::to_string(v.shape[2]) + "," + std::to_string(v.shape[3]) + "), expected " + want_shape);
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  float* dst = static_cast<float*>(v.buf);
  Status st;
  {
    py::gil_scoped_release nogil;
    st = r.CopyPatches(reqs, h, w, dst, num_threads);
  }
  Check(st);
}

}  // namespace

PYBIND11_MODULE(_patchstore, m) {
  m.doc() = "patchstore._patchstore: the compiled reader behind the patchstore package.\n\n"
            "Use the Python API (patchstore.open, patchstore.Store); this module is an implementation detail.";
  // The version of the C++ build (VERSION at the source root); patchstore.__version__.
  m.attr("__version__") = patchstore::ToolVersion();

  // patchstore.CorruptRecordError: stored bytes fail validation. A subclass
  // of OSError, so `except OSError` also catches damaged stores.
  PyObject* corrupt = PyErr_NewExceptionWithDoc(
      "patchstore.CorruptRecordError",
      "A record or the store's metadata failed validation (bad checksum, impossible header, truncated file).\n\n"
      "Subclass of OSError. The message names the store, the sample id and the field.",
      PyExc_OSError, nullptr);
  if (corrupt == nullptr) throw py::error_already_set();
  m.add_object("CorruptRecordError", py::handle(corrupt));  // add_object takes its own reference
  patchstore_py::CorruptRecordErrorSlot() = corrupt;        // and the slot keeps ours

  py::class_<View>(m, "View", py::buffer_protocol(),
                   "A read-only view into the store's memory map (buffer protocol), of the record's dtype\n"
                   "(`dtype`; float32 for every store written today).\n\n"
                   "Holds the LMDB read transaction: the memory stays valid while this object lives.\n"
                   "Wrap it with numpy.asarray(view) (no copy).")
      .def_buffer([](View& self) { return patchstore_py::BufferInfo(self); })
      .def_property_readonly(
          "dtype", [](const View& self) { return patchstore::DTypeName(self.v.dtype); },
          "The element type: 'float32', 'uint8', ... (what numpy.asarray(view).dtype is).")
      .def_property_readonly("shape", [](const View& self) { return Shape(self.v); })
      .def_property_readonly("strides",
                             [](const View& self) {
                               py::tuple t(self.v.rank);
                               for (int i = 0; i < self.v.rank; ++i) t[i] = py::int_(self.v.strides[i]);
                               return t;
                             })
      .def_property_readonly("address", [](const View& self) { return reinterpret_cast<uintptr_t>(self.v.data); })
      .def("__repr__", [](const View& self) {
        std::string s = std::string("<patchstore View ") + patchstore::DTypeName(self.v.dtype) + " (";
        for (int i = 0; i < self.v.rank; ++i) s += (i ? "," : "") + std::to_string(self.v.shape[i]);
        return s + ")>";
      });

  py::class_<Reader, std::shared_ptr<Reader>>(
      m, "Reader",
      "patchstore::Reader: a read snapshot of one store, indexed once. Safe to share between threads;\n"
      "never use it in a forked child (in_opening_process() tells).")
      .def_static(
          "open",
          [](const std::string& path, bool verify_checksums, bool no_lock) {
            ReaderOptions o;
            o.verify_checksums = verify_checksums;
            o.no_lock = no_lock;
            patchstore::Result<std::shared_ptr<Reader>> r = Status::Internal("not opened");
            {
              py::gil_scoped_release nogil;
              r = Reader::Open(path, o);
            }
            return Unwrap(std::move(r), Where::kFiles);
          },
          py::arg("path"), py::arg("verify_checksums") = false, py::arg("no_lock") = false,
          "Opens the store at `path`. FileNotFoundError when there is none.")
      .def_static(
          "open_set",
          [](const std::vector<std::string>& paths, bool verify_checksums, bool no_lock, bool partial) {
            ReaderOptions o;
            o.verify_checksums = verify_checksums;
            o.no_lock = no_lock;
            o.partial_set = partial;
            patchstore::Result<std::shared_ptr<Reader>> r = Status::Internal("not opened");
            {
              py::gil_scoped_release nogil;
              r = Reader::OpenSet(paths, o);
            }
            return Unwrap(std::move(r), Where::kFiles);
          },
          py::arg("paths"), py::arg("verify_checksums") = false, py::arg("no_lock") = false, py::arg("partial") = false,
          "Opens several stores (a shard set) as one (patchstore::Reader::OpenSet).")
      .def("store_count", &Reader::store_count)
      .def("store_path",
           [](const Reader& r, size_t s) {
             if (s >= r.store_count()) throw py::index_error("no store #" + std::to_string(s));
             return r.store_path(s);
           })
      .def("store_begin",
           [](const Reader& r, size_t s) {
             if (s > r.store_count()) throw py::index_error("no store #" + std::to_string(s));
             return r.store_begin(s);
           })
      .def("store_of",
           [](const Reader& r, uint64_t sample) {
             if (sample >= r.size()) throw py::index_error("sample index out of range");
             return r.StoreOf(sample);
           })
      .def("local_index",
           [](const Reader& r, uint64_t sample) {
             if (sample >= r.size()) throw py::index_error("sample index out of range");
             return r.LocalIndex(sample);
           })
      .def_property_readonly("input_ordered", &Reader::input_ordered)
      .def_property_readonly("path", &Reader::path)
      .def_property_readonly("sealed", &Reader::sealed)
      .def_property_readonly("no_lock", &Reader::no_lock)
      .def_property_readonly("kind", [](const Reader& r) { return r.meta().kind; })
      .def_property_readonly("tool_version", [](const Reader& r) { return r.meta().tool_version; })
      .def_property_readonly("format_version", [](const Reader& r) { return r.meta().format_version; })
      .def_property_readonly("attributes", [](const Reader& r) { return r.meta().attributes; })
      .def("in_opening_process", &Reader::InOpeningProcess)
      .def("windows_read_ahead", &Reader::windows_read_ahead,
           "Reader::windows_read_ahead: windows whose bytes window reads requested before copying (tests).")
      .def("__len__", &Reader::size)
      .def(
          "geometry",
          [](const Reader& r, int64_t i) -> py::object {
            auto g = r.Geometry(SampleOf(r, i));
            if (!g.ok()) patchstore_py::RaiseStatus(g.status());
            if (!g->has_value()) return py::none();
            const patchstore::VolumeGeometry& v = **g;
            auto list = [](const auto& a) {
              py::list out;
              for (auto x : a) out.append(x);
              return out;
            };
            py::dict d;
            d["spacing"] = list(v.spacing);
            d["origin"] = list(v.origin);
            d["direction"] = list(v.direction);
            d["affine_lps"] = list(v.AffineLPS());
            d["affine_ras"] = list(v.AffineRAS());
            d["qform_code"] = v.qform_code;
            d["sform_code"] = v.sform_code;
            d["reoriented"] = (v.flags & patchstore::kGeometryReoriented) != 0;
            d["resampled"] = (v.flags & patchstore::kGeometryResampled) != 0;
            d["source_spacing"] = list(v.source_spacing);
            d["source_size"] = list(v.source_size);
            return std::move(d);
          },
          py::arg("index"),
          "Reader::Geometry of sample `index` as a dict of lists (spacing, origin, direction row-major, "
          "affine_lps / affine_ras 4x4 row-major, qform_code, sform_code, reoriented, resampled, source_spacing, "
          "source_size), or None.")
      .def(
          "id", [](const Reader& r, int64_t i) { return py::bytes(std::string(r.id(SampleOf(r, i)))); },
          py::arg("index"), "The id bytes of sample `index`.")
      .def(
          "ids",
          [](const Reader& r) {
            py::list out(r.size());
            for (uint64_t i = 0; i < r.size(); ++i) {
              std::string_view s = r.id(i);
              out[i] = py::bytes(s.data(), s.size());
            }
            return out;
          },
          "All ids as bytes, in index order.")
      .def(
          "identity",
          [](const Reader& r) {
            // XXH3-64 over the served content the index knows, in pieces of ~1 MiB whose digests are
            // hashed again: kind, fields (name, channels), then per sample its id and per field whether
            // it has a record, its logical shape and a mask's valid count. Not dtype, layout, tile or
            // normalisation: a re-laid-out or re-encoded copy of a store serves the same values.
            std::string buf, digests;
            auto flush = [&] {
              const uint64_t h = patchstore::Checksum64(buf.data(), buf.size());
              digests.append(reinterpret_cast<const char*>(&h), sizeof h);
              buf.clear();
            };
            auto u64 = [&](uint64_t v) { buf.append(reinterpret_cast<const char*>(&v), sizeof v); };
            auto str = [&](std::string_view s) {
              u64(s.size());
              buf.append(s.data(), s.size());
            };
            py::gil_scoped_release nogil;
            str(r.meta().kind);
            const int nf = r.field_count();
            u64(static_cast<uint64_t>(nf));
            for (int f = 0; f < nf; ++f) {
              str(r.field(f).name);
              u64(static_cast<uint64_t>(r.field(f).channels));
            }
            u64(r.size());
            for (uint64_t i = 0; i < r.size(); ++i) {
              str(r.id(i));
              for (int f = 0; f < nf; ++f) {
                const patchstore::RecordSummary& s = r.summary(i, f);
                u64(s.present ? 1 : 0);
                u64(s.rank);
                for (int d = 0; d < s.rank; ++d) u64(s.shape[d]);
                u64(s.has_valid_count ? s.valid_count + 1 : 0);
              }
              if (buf.size() >= (1u << 20)) flush();
            }
            flush();
            const uint64_t h = patchstore::Checksum64(digests.data(), digests.size());
            char hex[17];
            std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
            return std::string(hex);
          },
          "A 16-digit hex identity of the store's content as its index describes it (no record read): "
          "kind, field names and channels, the sample ids in index order, and each record's presence, "
          "logical shape and mask valid count. Equal for a re-laid-out or re-encoded copy (same ids, same "
          "shapes); different for another store or another subset of samples. Pixels are not hashed.")
      .def(
          "find", [](const Reader& r, const py::bytes& id) { return Unwrap(r.Find(std::string(id))); }, py::arg("id"),
          "The index of sample `id` (bytes). KeyError when absent.")
      .def(
          "field_index", [](const Reader& r, const std::string& name) { return FieldOf(r, name); }, py::arg("name"))
      .def(
          "fields",
          [](const Reader& r) {
            py::list out;
            for (const FieldMeta& f : r.meta().fields) out.append(FieldInfo(f));
            return out;
          },
          "Field descriptions in field-index order.")
      .def(
          "value_table",
          [](const Reader& r, const std::string& field) -> py::object {
            const patchstore::ValueTable* t = r.field_table(FieldOf(r, field));
            if (t == nullptr) return py::none();
            const size_t n = r.meta().fields[FieldOf(r, field)].dtype == patchstore::DType::kUInt8 ? 256 : 65536;
            return py::bytes(reinterpret_cast<const char*>(t->values), n * sizeof(float));
          },
          py::arg("field"),
          "The field's table of normalised values (Reader::field_table) as float32 bytes: 256 values for\n"
          "uint8, 65536 for uint16 and int16 (indexed by value + 32768); None for float32/float16 fields.\n"
          "table[v] is the float32 a read returns for stored element v, bit for bit.")
      .def(
          "convert_stored",
          [](const Reader& r, const std::string& field, const py::object& src, const py::object& dst, int num_threads) {
            const int f = FieldOf(r, field);
            const patchstore::DType dtype = r.meta().fields[f].dtype;
            const std::string ctx = "Reader.convert_stored('" + field + "')";
            auto in = std::make_unique<BufferHold>();
            if (!in->Get(src.ptr(), PyBUF_STRIDES | PyBUF_FORMAT) ||
                in->view().itemsize != static_cast<Py_ssize_t>(patchstore::DTypeSize(dtype)) ||
                !patchstore_py::FormatIs(in->view().format, patchstore::DTypeFormat(dtype)) ||
                !PyBuffer_IsContiguous(&in->view(), 'C'))
              throw py::value_error(ctx + ": src must be a C-contiguous buffer of " +
                                    std::string(patchstore::DTypeName(dtype)) + ", the field's stored dtype");
            const int64_t n = static_cast<int64_t>(in->view().len / in->view().itemsize);
            auto out = patchstore_py::WritableBuffer(dst, {n}, "f", 4, "float32", "dst", ctx);
            patchstore_py::CheckDisjoint({{"src", in.get()}, {"dst", out.get()}}, ctx);
            if (num_threads < 1)
              throw py::value_error(ctx + ": num_threads must be >= 1, got " + std::to_string(num_threads));
            const void* s = in->view().buf;
            float* d = static_cast<float*>(out->view().buf);
            const patchstore::ValueTable* table = r.field_table(f);
            py::gil_scoped_release nogil;
            patchstore::ConvertStored(dtype, table, s, n, d, num_threads);
          },
          py::arg("field"), py::arg("src"), py::arg("dst"), py::arg("num_threads") = 1,
          "Elements of `field` in its stored dtype (src: any C-contiguous buffer of them) into dst (a flat\n"
          "float32 buffer of as many elements): the float32 values a read returns, bit for bit, on num_threads\n"
          "threads with the GIL released.")
      .def(
          "header",
          [](const Reader& r, int64_t sample, const std::string& field) {
            return HeaderInfo(Unwrap(r.Header(SampleOf(r, sample), FieldOf(r, field))));
          },
          py::arg("sample"), py::arg("field"))
      .def(
          "summary",
          [](const Reader& r, int64_t sample, const std::string& field) {
            return SummaryInfo(Unwrap(r.Summary(SampleOf(r, sample), FieldOf(r, field))));
          },
          py::arg("sample"), py::arg("field"),
          "What the store's sample index says of one record (shape, layout, payload_bytes, valid_count of a "
          "mask), without reading the record.")
      .def(
          "get",
          [](const Reader& r, int64_t sample, const std::string& field) {
            const uint64_t s = SampleOf(r, sample);
            const int f = FieldOf(r, field);
            r.Prefetch(s, f);  // a whole-record view is usually read whole
            return View{patchstore::AsFloat32(Unwrap(r.Get(s, f)))};
          },
          py::arg("sample"), py::arg("field"), "A View of the whole record.")
      .def(
          "sample",
          [](const Reader& r, int64_t sample) {
            const uint64_t s = SampleOf(r, sample);
            py::list out;
            for (int f = 0; f < r.field_count(); ++f) r.Prefetch(s, f);
            for (int f = 0; f < r.field_count(); ++f) out.append(View{patchstore::AsFloat32(Unwrap(r.Get(s, f)))});
            return out;
          },
          py::arg("sample"), "Views of every field of one sample, in field order.")
      .def(
          "patch",
          [](const Reader& r, int64_t sample, const std::string& field, int64_t y, int64_t x, int64_t h, int64_t w) {
            return View{patchstore::AsFloat32(Unwrap(r.Patch(SampleOf(r, sample), FieldOf(r, field), y, x, h, w)))};
          },
          py::arg("sample"), py::arg("field"), py::arg("y"), py::arg("x"), py::arg("h"), py::arg("w"),
          "A View of the (C,h,w) window at (y, x): float32 normalised values; no copy for float32 row records,\n"
          "a copy for tiled or compact ones.")
      .def(
          "volume",
          [](const Reader& r, int64_t sample, const std::string& field) {
            return View{patchstore::AsFloat32(Unwrap(patchstore::Volume(r, SampleOf(r, sample), FieldOf(r, field))))};
          },
          py::arg("sample"), py::arg("field"),
          "patchstore::Volume: a View of the whole (S,H,W) volume. ValueError when the record is not a volume.")
      .def(
          "slice_stack",
          [](const Reader& r, int64_t sample, const std::string& field, int64_t slice, int64_t context) {
            return View{Unwrap(patchstore::SliceStack(r, SampleOf(r, sample), FieldOf(r, field), slice, context))};
          },
          py::arg("sample"), py::arg("field"), py::arg("slice"), py::arg("context") = 0,
          "patchstore::SliceStack: slices slice-context..slice+context as a (2c+1,H,W) View; zero-copy inside\n"
          "the volume, an owned copy with the end slice repeated where the stack crosses an end.\n"
          "IndexError for a slice outside [0, S); ValueError for a negative context or a non-volume record.")
      .def("copy_patches", &CopyPatches, py::arg("samples"), py::arg("field"), py::arg("ys"), py::arg("xs"),
           py::arg("h"), py::arg("w"), py::arg("out"), py::arg("num_threads") = 1,
           "Copies N windows into `out`, a writable C-contiguous float32 buffer of N*C*h*w elements.\n"
           "samples, ys, xs: 1-D int64 buffers of length N. The GIL is released during the copy.")
      .def(
          "verify",
          [](const Reader& r, int64_t sample, const std::string& field) {
            const uint64_t s = SampleOf(r, sample);
            const int f = FieldOf(r, field);
            Status st;
            {
              py::gil_scoped_release nogil;
              st = r.Verify(s, f);
            }
            Check(st);
          },
          py::arg("sample"), py::arg("field"), "Recomputes one record's checksum; CorruptRecordError on mismatch.")
      .def(
          "describe",
          [](const Reader& r, int64_t sample, const std::string& field) {
            return r.Describe(static_cast<uint64_t>(sample), r.meta().FieldIndex(field));
          },
          py::arg("sample"), py::arg("field"));

  // patchstore::VerifyStore, the checks of `patchstore verify`.
  m.def(
      "verify_store",
      [](const std::string& path) {
        patchstore::Result<patchstore::VerifyReport> r = Status::OK();
        {
          py::gil_scoped_release nogil;
          r = patchstore::VerifyStore(path);
        }
        if (!r.ok()) patchstore_py::RaiseStatus(r.status(), Where::kFiles);
        py::dict d;
        d["samples"] = r->samples;
        d["records"] = r->records;
        d["bytes"] = r->bytes;
        py::list problems;
        for (const patchstore::VerifyProblem& p : r->problems)
          problems.append(py::make_tuple(p.id, p.field, p.message));
        d["problems"] = problems;
        return d;
      },
      py::arg("path"),
      "patchstore::VerifyStore: {samples, records, bytes, problems: [(id, field, message)]}, the checks of\n"
      "`patchstore verify`; OSError when the store cannot be opened at all.");

  // The stores of a folder read as a shard set and the staging folders of
  // unfinished copies skipped there, with the warning naming them ("" for none).
  m.def(
      "stores_in_folder",
      [](const std::string& dir) {
        std::vector<std::string> skipped;
        std::vector<std::string> stores = patchstore::StoresInFolder(dir, &skipped);
        return py::make_tuple(stores, skipped, patchstore::SkippedStagingWarning(dir, skipped));
      },
      py::arg("dir"));

  // For tests of the Status -> exception table: raises what a Status with
  // this code and message raises (files: the FileNotFoundError context).
  m.def(
      "_raise_status",
      [](int code, const std::string& message, bool files) {
        patchstore_py::RaiseStatus(Status(static_cast<patchstore::Code>(code), message),
                                   files ? Where::kFiles : Where::kLookup);
      },
      py::arg("code"), py::arg("message"), py::arg("files") = false);

  patchstore_py::BindSampler(m);
  patchstore_py::BindVolumes(m);
}
