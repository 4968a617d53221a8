// patchstore/bindings/src/volume_py.cc — patchstore._patchstore.SliceIndex
// SliceOptions, SliceSampler and copy_slice_stacks: a thin skin over
// reader/volume.h and reader/slice_sampler.h.
//
// The Python layer (patchstore/_volumes.py, patchstore/torch/slice_dataset.py)
// owns fork handling and pickling; here are the O(1) index lookups, the
// draws (reader/volume.h DrawSliceTransform, reader/slice_sampler.h
// SliceSampler: the one counter-based generator) and the batch copy.
//
// Buffers crossing the boundary (all C-contiguous, checked with the GIL held,
// then read or written with it released):
//   refs        int64 (n, 2): (sample index, slice)
//   transforms  int64 (n, 7): (y, x, height, width, flip_v, flip_h, rot90),
//               a SliceTransform per row (crop, then flips, then np.rot90)
//   lookups     int64 (n, 3): (sample index, slice, depth) per flat slice
//               index
//   outs        float32 (n, 2c+1, h, w), one per field, disjoint
#include "volume_py.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "buffer_py.h"
#include "patchstore/reader/reader.h"
#include "patchstore/reader/slice_sampler.h"
#include "patchstore/reader/volume.h"
#include "slice_options_py.h"
#include "status_py.h"

namespace patchstore_py {
namespace {

using patchstore::Reader;
using patchstore::SliceIndex;
using patchstore::SliceStackRequest;
using patchstore::SliceTransform;
using patchstore::Status;

constexpr int64_t kTransformColumns = 7;

struct PySliceIndex {
  SliceIndex ix;
  std::string path;  // for messages
};

// A read-only C-contiguous int64 buffer of `columns` columns (1-D when
// columns == 0); returns its rows.
const int64_t* Int64Rows(BufferHold& b, const py::handle& obj, int64_t columns, const std::string& what,
                         const std::string& context, int64_t* rows) {
  if (!b.Get(obj.ptr(), PyBUF_STRIDES | PyBUF_FORMAT))
    throw py::value_error(context + ": " + what + " must be an int64 array, got " + TypeName(obj));
  const Py_buffer& v = b.view();
  const bool shape_ok = columns == 0 ? v.ndim == 1 : (v.ndim == 2 && v.shape[1] == columns);
  if (v.itemsize != 8 || !FormatIs(v.format, "qlQL") || !shape_ok || !PyBuffer_IsContiguous(&v, 'C')) {
    const std::string want = columns == 0 ? "(n,)" : "(n, " + std::to_string(columns) + ")";
    throw py::value_error(context + ": " + what + " must be a C-contiguous int64 " + want + " array");
  }
  *rows = v.ndim == 0 ? 0 : static_cast<int64_t>(v.shape[0]);
  return static_cast<const int64_t*>(v.buf);
}

SliceTransform TransformOf(const int64_t* row) {
  SliceTransform t;
  t.y = row[0];
  t.x = row[1];
  t.height = row[2];
  t.width = row[3];
  t.flip_v = row[4] != 0;
  t.flip_h = row[5] != 0;
  t.rot90 = static_cast<int>(((row[6] % 4) + 4) % 4);
  return t;
}

std::unique_ptr<PySliceIndex> BuildIndex(const std::shared_ptr<Reader>& reader, const py::object& samples) {
  std::vector<uint64_t> list;
  const bool all = samples.is_none();
  if (!all) {
    BufferHold b;
    int64_t n = 0;
    const int64_t* s = Int64Rows(b, samples, 0, "samples", "indexing slices of '" + reader->path() + "'", &n);
    list.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      if (s[i] < 0)
        throw py::index_error("indexing slices of '" + reader->path() + "': sample index " + std::to_string(s[i]) +
                              " is negative");
      list[i] = static_cast<uint64_t>(s[i]);
    }
  }
  auto out = std::make_unique<PySliceIndex>();
  out->path = reader->path();
  patchstore::Result<SliceIndex> r = Status::Internal("index not built");
  {
    py::gil_scoped_release nogil;  // one header parse per record
    r = all ? SliceIndex::Build(*reader) : SliceIndex::Build(*reader, list);
  }
  out->ix = Unwrap(std::move(r));
  return out;
}

uint64_t VolumeOf(const PySliceIndex& p, int64_t v) {
  if (v < 0 || static_cast<uint64_t>(v) >= p.ix.volume_count())
    throw py::index_error("volume " + std::to_string(v) + " out of range [0, " + std::to_string(p.ix.volume_count()) +
                          ") of the slice index of '" + p.path + "'");
  return static_cast<uint64_t>(v);
}

// out[k] = (sample, slice, depth) of flat slice index indices[k]. O(1) each.
void Lookup(const PySliceIndex& p, const py::object& indices, const py::object& out) {
  const std::string context = "looking up slices of '" + p.path + "'";
  BufferHold in;
  int64_t n = 0;
  const int64_t* idx = Int64Rows(in, indices, 0, "indices", context, &n);
  auto hold = WritableBuffer(out, {n, 3}, "qlQL", 8, "int64", "out", context);
  int64_t* dst = static_cast<int64_t*>(hold->view().buf);
  const SliceIndex& ix = p.ix;
  for (int64_t k = 0; k < n; ++k)
    if (idx[k] < 0 || static_cast<uint64_t>(idx[k]) >= ix.size())
      throw py::index_error("slice index " + std::to_string(idx[k]) + " out of range [0, " + std::to_string(ix.size()) +
                            ") in '" + p.path + "'");
  // Two array reads per item: not worth releasing the GIL for.
  for (int64_t k = 0; k < n; ++k) {
    const patchstore::SliceRef r = ix[static_cast<uint64_t>(idx[k])];
    dst[3 * k] = static_cast<int64_t>(r.sample);
    dst[3 * k + 1] = r.slice;
    dst[3 * k + 2] = r.depth;
  }
}

// Copies n stacks of each of `fields` into outs[f] (n, 2c+1, h, w); one
// CopySliceStacks per field, all with the GIL released.
void CopySliceStacks(const std::shared_ptr<Reader>& reader, const py::object& refs_obj,
                     const py::object& transforms_obj, const std::vector<std::string>& fields,
                     const py::object& context_obj, const py::sequence& outs, int num_threads) {
  const std::string ctx = "copying slice stacks of '" + reader->path() + "'";
  // One context for every field, or one per field.
  std::vector<int64_t> contexts;
  if (PyIndex_Check(context_obj.ptr())) {
    contexts.assign(fields.size(), context_obj.cast<int64_t>());
  } else {
    contexts = context_obj.cast<std::vector<int64_t>>();
    if (contexts.size() != fields.size())
      throw py::value_error(ctx + ": " + std::to_string(contexts.size()) + " contexts for " +
                            std::to_string(fields.size()) + " fields");
  }
  for (int64_t c : contexts)
    if (c < 0) throw py::value_error(ctx + ": context " + std::to_string(c) + " is negative");
  BufferHold rb;
  int64_t n = 0;
  const int64_t* refs = Int64Rows(rb, refs_obj, 2, "refs", ctx, &n);
  const int64_t* tr = nullptr;
  BufferHold tb;
  if (!transforms_obj.is_none()) {
    int64_t nt = 0;
    tr = Int64Rows(tb, transforms_obj, kTransformColumns, "transforms", ctx, &nt);
    if (nt != n)
      throw py::value_error(ctx + ": " + std::to_string(n) + " refs but " + std::to_string(nt) + " transforms");
  }
  if (static_cast<size_t>(py::len(outs)) != fields.size())
    throw py::value_error(ctx + ": " + std::to_string(py::len(outs)) + " output buffers for " +
                          std::to_string(fields.size()) + " fields");
  std::vector<int> field_index;
  for (const std::string& f : fields) field_index.push_back(Unwrap(reader->FieldIndex(f)));
  const uint64_t samples = reader->size();
  std::vector<SliceStackRequest> base(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = refs[2 * i];
    if (s < 0 || static_cast<uint64_t>(s) >= samples)
      throw py::index_error(ctx + ": item " + std::to_string(i) + " names sample " + std::to_string(s) +
                            ", outside [0, " + std::to_string(samples) + ")");
    base[i].sample = static_cast<uint64_t>(s);
    base[i].slice = refs[2 * i + 1];
    if (tr) base[i].transform = TransformOf(tr + kTransformColumns * i);
  }
  // The output plane of the first item decides the shape every out must have;
  // CopySliceStacks checks that all items agree.
  int64_t oh = 0, ow = 0;
  if (n > 0 && !fields.empty()) {
    // The header only: Volume() would also request the whole record.
    const patchstore::RecordHeader h = Unwrap(reader->Header(base[0].sample, field_index[0]));
    if (h.layout != patchstore::Layout::kSHW || h.rank != 3)
      Unwrap(patchstore::Volume(*reader, base[0].sample, field_index[0]));  // raises its "not a volume" error
    const int64_t H = static_cast<int64_t>(h.shape[1]), W = static_cast<int64_t>(h.shape[2]);
    Status st = base[0].transform.Check(H, W);
    if (!st.ok()) RaiseStatus(st.WithContext("slice stack of " + reader->Describe(base[0].sample, field_index[0])));
    std::tie(oh, ow) = base[0].transform.OutputSize(H, W);
  }
  std::vector<std::unique_ptr<BufferHold>> holds;
  std::vector<std::pair<std::string, const BufferHold*>> named;
  std::vector<void*> dsts;
  std::vector<patchstore::Output> kinds(fields.size());
  for (size_t f = 0; f < fields.size(); ++f) {
    const std::string what = "out['" + fields[f] + "']";
    holds.push_back(OutputBuffer(outs[f], {n, 2 * contexts[f] + 1, oh, ow}, reader->meta().fields[field_index[f]].dtype,
                                 what, ctx, &kinds[f]));
    dsts.push_back(holds.back()->view().buf);
    named.emplace_back(what, holds.back().get());
  }
  CheckDisjoint(named, ctx);
  if (n == 0) return;
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  Status st;
  {
    py::gil_scoped_release nogil;
    std::vector<SliceStackRequest> reqs = base;
    for (size_t f = 0; f < fields.size() && st.ok(); ++f) {
      for (SliceStackRequest& r : reqs) r.field = field_index[f];
      st = patchstore::CopySliceStacks(*reader, reqs, contexts[f], dsts[f], kinds[f], num_threads);
    }
  }
  Check(st);
}

patchstore::SliceFlip FlipOf(const std::string& flip, const std::string& ctx) {
  if (flip == "independent") return patchstore::SliceFlip::kIndependent;
  if (flip == "both") return patchstore::SliceFlip::kBoth;
  if (flip.empty()) return patchstore::SliceFlip::kNone;
  throw py::value_error(ctx + ": flip must be '', 'both' or 'independent'");
}

// out[k] = DrawSliceTransform(seed, epoch, indices[k], heights[k], widths[k], ...) as a transform row.
void DrawTransforms(uint64_t seed, uint64_t epoch, const py::object& indices_obj, const py::object& heights_obj,
                    const py::object& widths_obj, int64_t crop_h, int64_t crop_w, const std::string& flip, bool rot90,
                    const py::object& out) {
  const std::string ctx = "drawing slice transforms";
  BufferHold ib, hb, wb;
  int64_t n = 0, nh = 0, nw = 0;
  const int64_t* idx = Int64Rows(ib, indices_obj, 0, "indices", ctx, &n);
  const int64_t* hs = Int64Rows(hb, heights_obj, 0, "heights", ctx, &nh);
  const int64_t* ws = Int64Rows(wb, widths_obj, 0, "widths", ctx, &nw);
  if (nh != n || nw != n) throw py::value_error(ctx + ": indices, heights and widths differ in length");
  const patchstore::SliceFlip f = FlipOf(flip, ctx);
  for (int64_t k = 0; k < n; ++k)
    if (idx[k] < 0 || crop_h > hs[k] || crop_w > ws[k] || crop_h < 0 || crop_w < 0)
      throw py::value_error(ctx + ": item " + std::to_string(k) + " has a negative index or a crop larger than its " +
                            std::to_string(hs[k]) + "x" + std::to_string(ws[k]) + " plane");
  auto hold = WritableBuffer(out, {n, kTransformColumns}, "qlQL", 8, "int64", "out", ctx);
  int64_t* dst = static_cast<int64_t*>(hold->view().buf);
  for (int64_t k = 0; k < n; ++k) {
    const SliceTransform t = patchstore::DrawSliceTransform(seed, epoch, static_cast<uint64_t>(idx[k]), hs[k], ws[k],
                                                            crop_h, crop_w, f, rot90);
    int64_t* row = dst + kTransformColumns * k;
    row[0] = t.y;
    row[1] = t.x;
    row[2] = t.height;
    row[3] = t.width;
    row[4] = t.flip_v;
    row[5] = t.flip_h;
    row[6] = t.rot90;
  }
}

py::tuple TransformTuple(const SliceTransform& t) {
  return py::make_tuple(t.y, t.x, t.height, t.width, static_cast<int>(t.flip_v), static_cast<int>(t.flip_h), t.rot90);
}

// DrawSliceTransform for one item, as a (y, x, height, width, flip_v, flip_h,
// rot90) tuple of ints.
py::tuple DrawTransform(uint64_t seed, uint64_t epoch, int64_t index, int64_t H, int64_t W, int64_t crop_h,
                        int64_t crop_w, const std::string& flip, bool rot90) {
  const std::string ctx = "drawing a slice transform";
  const patchstore::SliceFlip f = FlipOf(flip, ctx);
  if (index < 0 || crop_h < 0 || crop_w < 0 || crop_h > H || crop_w > W)
    throw py::value_error(ctx + ": item " + std::to_string(index) + " has a negative index or a crop larger than its " +
                          std::to_string(H) + "x" + std::to_string(W) + " plane");
  return TransformTuple(
      patchstore::DrawSliceTransform(seed, epoch, static_cast<uint64_t>(index), H, W, crop_h, crop_w, f, rot90));
}

// A SliceSampler and the path of its store, for messages.
struct PySliceSampler {
  std::unique_ptr<patchstore::SliceSampler> sampler;
  std::string path;
};

std::unique_ptr<PySliceSampler> MakeSliceSampler(const std::shared_ptr<Reader>& reader,
                                                 const patchstore::SliceOptions& options, const py::object& flags) {
  std::vector<uint8_t> given;
  const bool have = !flags.is_none();
  if (have) {
    if (!py::isinstance<py::bytes>(flags))
      throw py::type_error("SliceSampler: flags must be the bytes of SliceSampler.flags, got " +
                           py::repr(flags).cast<std::string>());
    const std::string b = flags.cast<std::string>();
    given.assign(b.begin(), b.end());
  }
  auto out = std::make_unique<PySliceSampler>();
  out->path = reader->path();
  patchstore::Result<std::unique_ptr<patchstore::SliceSampler>> r = Status::Internal("sampler not built");
  {
    py::gil_scoped_release nogil;  // may read the masks
    r = patchstore::SliceSampler::Create(reader, options, have ? &given : nullptr);
  }
  out->sampler = Unwrap(std::move(r));
  return out;
}

// Whether drawing items reads mask voxels (mask-aware crops): then the GIL
// is released while they are drawn.
bool ReadsMasks(const PySliceSampler& p) { return p.sampler->mask_field() >= 0 && !p.sampler->options().crop.none(); }

constexpr int64_t kItemColumns = 12;

void ItemRow(const patchstore::SliceItem& it, int64_t* row) {
  const SliceTransform& t = it.transform;
  const int64_t v[kItemColumns] = {static_cast<int64_t>(it.ref.sample),
                                   it.ref.slice,
                                   it.out_h,
                                   it.out_w,
                                   t.y,
                                   t.x,
                                   t.height,
                                   t.width,
                                   t.flip_v,
                                   t.flip_h,
                                   t.rot90,
                                   it.positive};
  std::memcpy(row, v, sizeof v);
}

// out[k] = the row of item indices[k] in `epoch` (kItemColumns int64: sample, slice, out_h, out_w, then the
// 7 transform columns, then positive), drawn with the GIL released.
void DrawItems(const PySliceSampler& p, uint64_t epoch, const py::object& indices, const py::object& out) {
  const std::string ctx = "drawing slice items of '" + p.path + "'";
  BufferHold in;
  int64_t n = 0;
  const int64_t* idx = Int64Rows(in, indices, 0, "indices", ctx, &n);
  auto hold = WritableBuffer(out, {n, kItemColumns}, "qlQL", 8, "int64", "out", ctx);
  int64_t* dst = static_cast<int64_t*>(hold->view().buf);
  const uint64_t size = p.sampler->size();
  for (int64_t k = 0; k < n; ++k)
    if (idx[k] < 0 || static_cast<uint64_t>(idx[k]) >= size)
      throw py::index_error("slice item " + std::to_string(idx[k]) + " out of range [0, " + std::to_string(size) +
                            ") of '" + p.path + "'");
  std::vector<patchstore::SliceItem> items(static_cast<size_t>(n));
  Status st;
  if (ReadsMasks(p)) {
    py::gil_scoped_release nogil;
    st = p.sampler->Items(epoch, reinterpret_cast<const uint64_t*>(idx), static_cast<size_t>(n), items.data());
  } else {
    st = p.sampler->Items(epoch, reinterpret_cast<const uint64_t*>(idx), static_cast<size_t>(n), items.data());
  }
  Check(st);
  for (int64_t k = 0; k < n; ++k) ItemRow(items[k], dst + kItemColumns * k);
}

}  // namespace

void BindVolumes(py::module_& m) {
  BindSliceOptions(m);
  py::class_<PySliceSampler>(
      m, "SliceSampler",
      "patchstore::SliceSampler: the items of a SliceDataset (reader/slice_sampler.h): which slice, its crop,\n"
      "flips and turn, mask-aware on request. Use patchstore.torch.SliceDataset.")
      .def(py::init(&MakeSliceSampler), py::arg("reader"), py::arg("options"), py::arg("flags") = py::none(),
           "SliceSampler::Create; `flags`: the bytes of `flags` of a sampler with the same options on the same\n"
           "store (no mask is read then). ValueError for bad options or stores, KeyError for an unknown field or\n"
           "id.")
      .def("__len__", [](const PySliceSampler& p) { return p.sampler->size(); })
      .def_property_readonly(
          "kept",
          [](const PySliceSampler& p) {
            std::vector<uint64_t> out;
            const SliceIndex& ix = p.sampler->index();
            for (uint64_t v = 0; v < ix.volume_count(); ++v) out.push_back(ix.sample(v));
            return out;
          },
          "Sample indices of the served volumes, in service order.")
      .def_property_readonly(
          "skipped", [](const PySliceSampler& p) { return p.sampler->skipped(); },
          "Sample indices of the volumes that give no item.")
      .def_property_readonly(
          "skipped_report", [](const PySliceSampler& p) { return p.sampler->SkippedReport(); },
          "SliceSampler::SkippedReport: '' or one line for a warning.")
      .def_property_readonly(
          "skipped_slices", [](const PySliceSampler& p) { return p.sampler->skipped_slices(); },
          "Slices of the served volumes that are not items (min_valid).")
      .def_property_readonly(
          "flags",
          [](const PySliceSampler& p) {
            const std::vector<uint8_t>& f = p.sampler->slice_flags();
            return py::bytes(reinterpret_cast<const char*>(f.data()), f.size());
          },
          "One byte per slice of the served volumes (bit 0: has a qualifying window, bit 1: one that is not).")
      .def_property_readonly(
          "contexts",
          [](const PySliceSampler& p) {
            std::vector<int64_t> out;
            for (size_t f = 0; f < p.sampler->options().fields.size(); ++f) out.push_back(p.sampler->context(f));
            return out;
          },
          "The context of each served field, in fields order.")
      .def(
          "item_slices",
          [](const PySliceSampler& p) {
            const uint64_t n = p.sampler->size();
            std::string b(static_cast<size_t>(n) * 8, '\0');
            for (uint64_t i = 0; i < n; ++i) {
              const int64_t f = static_cast<int64_t>(p.sampler->item_slice(i));
              std::memcpy(&b[static_cast<size_t>(i) * 8], &f, 8);
            }
            return py::bytes(b);
          },
          "The flat slice (of the served volumes' index) of every item, as int64 bytes.")
      .def("draw", &DrawItems, py::arg("epoch"), py::arg("indices"), py::arg("out"),
           "SliceSampler::Items: writes a row of 12 int64 per item index (1-D int64) into out (n, 12): sample,\n"
           "slice, out_h, out_w, y, x, height, width, flip_v, flip_h, rot90, positive. IndexError (nothing\n"
           "written) for an index outside [0, len).")
      .def(
          "draw_item",
          [](const PySliceSampler& p, uint64_t epoch, int64_t i) {
            if (i < 0) throw py::index_error("slice item " + std::to_string(i) + " is negative");
            patchstore::Result<patchstore::SliceItem> r = Status::Internal("not drawn");
            if (ReadsMasks(p)) {
              py::gil_scoped_release nogil;
              r = p.sampler->Item(epoch, static_cast<uint64_t>(i));
            } else {  // a few hashes: not worth releasing the GIL
              r = p.sampler->Item(epoch, static_cast<uint64_t>(i));
            }
            const patchstore::SliceItem it = Unwrap(std::move(r));
            return py::make_tuple(it.ref.sample, it.ref.slice, it.out_h, it.out_w, TransformTuple(it.transform),
                                  it.positive);
          },
          py::arg("epoch"), py::arg("index"),
          "SliceSampler::Item: (sample, slice, out_h, out_w, (y, x, height, width, flip_v, flip_h, rot90),\n"
          "positive) of item `index` in `epoch`.");
  py::class_<PySliceIndex>(
      m, "SliceIndex",
      "patchstore::SliceIndex: every (volume, slice) pair of a volume store as one flat index, O(1) lookups.\n"
      "A plain value (no store handle). Use patchstore.Store.slice_index().")
      .def(py::init(&BuildIndex), py::arg("reader"), py::arg("samples") = py::none(),
           "SliceIndex::Build over all samples, or over `samples` (a 1-D int64 array) in that order.\n"
           "ValueError for a store that does not hold volumes or volumes whose fields differ in shape.")
      .def("__len__", [](const PySliceIndex& p) { return p.ix.size(); })
      .def_property_readonly("volume_count", [](const PySliceIndex& p) { return p.ix.volume_count(); })
      .def(
          "sample", [](const PySliceIndex& p, int64_t v) { return p.ix.sample(VolumeOf(p, v)); }, py::arg("volume"))
      .def(
          "depth", [](const PySliceIndex& p, int64_t v) { return p.ix.depth(VolumeOf(p, v)); }, py::arg("volume"))
      .def(
          "height", [](const PySliceIndex& p, int64_t v) { return p.ix.height(VolumeOf(p, v)); }, py::arg("volume"))
      .def(
          "width", [](const PySliceIndex& p, int64_t v) { return p.ix.width(VolumeOf(p, v)); }, py::arg("volume"))
      .def(
          "select_giving_items",
          [](const PySliceIndex& p, const std::shared_ptr<Reader>& reader, int64_t crop_h, int64_t crop_w) {
            const patchstore::VolumeSelection sel = patchstore::SelectVolumesGivingItems(*reader, p.ix, crop_h, crop_w);
            return py::make_tuple(sel.kept, sel.skipped, sel.skipped_text);
          },
          py::arg("reader"), py::arg("crop_h"), py::arg("crop_w"),
          "patchstore::SelectVolumesGivingItems: (kept, skipped, skipped_text): the sample indices of the volumes\n"
          "that give items with a crop of crop_h x crop_w (0, 0: whole slices) and of the others, in index order,\n"
          "and the first four skipped described for messages. `reader`: the store this index was built from.")
      .def(
          "first",
          [](const PySliceIndex& p, int64_t v) {
            if (v == static_cast<int64_t>(p.ix.volume_count())) return p.ix.size();
            return p.ix.first(VolumeOf(p, v));
          },
          py::arg("volume"), "Flat index of slice 0 of `volume`; first(volume_count) == len.")
      .def(
          "at",
          [](const PySliceIndex& p, int64_t i) {
            if (i < 0) throw py::index_error("slice index " + std::to_string(i) + " is negative");
            patchstore::SliceRef r = Unwrap(p.ix.At(static_cast<uint64_t>(i)));
            return py::make_tuple(r.sample, r.slice, r.depth);
          },
          py::arg("index"), "(sample, slice, depth) of flat slice index `index`. O(1).")
      .def("lookup", &Lookup, py::arg("indices"), py::arg("out"),
           "Writes (sample, slice, depth) of each flat index (1-D int64 array) into out, int64 (n, 3).\n"
           "IndexError (nothing written) when an index is outside [0, len).");

  m.def("draw_slice_transforms", &DrawTransforms, py::arg("seed"), py::arg("epoch"), py::arg("indices"),
        py::arg("heights"), py::arg("widths"), py::arg("crop_h"), py::arg("crop_w"), py::arg("flip"), py::arg("rot90"),
        py::arg("out"),
        "patchstore::DrawSliceTransform for each flat item index: SliceDataset's crop/flip/turn draws.\n"
        "indices, heights, widths: 1-D int64; flip '' | 'both' | 'independent'; out: int64 (n, 7) rows.");
  m.def("draw_slice_transform", &DrawTransform, py::arg("seed"), py::arg("epoch"), py::arg("index"), py::arg("height"),
        py::arg("width"), py::arg("crop_h"), py::arg("crop_w"), py::arg("flip"), py::arg("rot90"),
        "patchstore::DrawSliceTransform for one item of an height x width plane: a (y, x, height, width,\n"
        "flip_v, flip_h, rot90) tuple of ints.");
  m.def("copy_slice_stacks", &CopySliceStacks, py::arg("reader"), py::arg("refs"), py::arg("transforms"),
        py::arg("fields"), py::arg("context"), py::arg("outs"), py::arg("num_threads") = 1,
        "patchstore::CopySliceStacks for each field, with the GIL released.\n"
        "refs: int64 (n, 2) (sample, slice); transforms: None or int64 (n, 7) (y, x, height, width, flip_v,\n"
        "flip_h, rot90); context: one int for every field, or a list of one per field (c_f); outs: one\n"
        "writable C-contiguous (n, 2c_f+1, h, w) buffer per field (float32, or the field's stored dtype).\n"
        "Every item is checked before anything is copied.");
}

}  // namespace patchstore_py
