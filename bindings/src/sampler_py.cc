// patchstore/bindings/src/sampler_py.cc — patchstore._patchstore.Sampler: a
// thin skin over patchstore::PatchSampler (reader/sampler.h).
//
// The Python classes patchstore.PatchSampler, patchstore.torch.BatchLoader
// and patchstore.torch.PatchDataset are built on it (patchstore/_sampler.py,
// patchstore/torch.py): they own fork handling, pickling and torch.
//
// Windows cross the boundary as rows of an int64 (n, 6) buffer:
//   (sample index, y, x, flip bits, quarter turns, positive)
// written or read with the GIL released, like the float32 output buffers
// (one per field, each (n, C_f, h, w), C-contiguous, writable, disjoint).
//
// The stateful cursor (epoch, position in the epoch) lives here, not in
// PatchSampler::Next, so that it can be saved and restored (pickling, a
// fork): next() walks the epochs with PatchSampler::Gather exactly as Next
// does. A mutex serialises next() and the cursor setters; every other
// method is const on the PatchSampler and may run from many threads at once.
#include "sampler_py.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "buffer_py.h"
#include "patchstore/reader/order.h"
#include "patchstore/reader/reader.h"
#include "patchstore/reader/sampler.h"
#include "patchstore/reader/transform.h"
#include "sampler_options_py.h"
#include "status_py.h"

namespace patchstore_py {
namespace {

using patchstore::PatchSampler;
using patchstore::Reader;
using patchstore::SamplerOptions;
using patchstore::Status;
using patchstore::Window;

constexpr int64_t kWindowColumns = 6;

struct PySampler {
  std::shared_ptr<const Reader> reader;
  std::unique_ptr<PatchSampler> s;
  std::mutex mu;  // guards epoch and cursor
  uint64_t epoch = 0, cursor = 0;

  std::string Context(const char* method) const {
    return std::string("PatchSampler.") + method + " on '" + reader->path() + "'";
  }
};

py::tuple WindowTuple(const Window& w) {
  return py::make_tuple(w.sample, w.y, w.x, static_cast<int>(w.flip), static_cast<int>(w.rot), w.positive);
}

void StoreWindows(const std::vector<Window>& wins, int64_t* dst) {
  for (size_t i = 0; i < wins.size(); ++i) {
    int64_t* row = dst + i * kWindowColumns;
    row[0] = static_cast<int64_t>(wins[i].sample);
    row[1] = wins[i].y;
    row[2] = wins[i].x;
    row[3] = wins[i].flip;
    row[4] = wins[i].rot;
    row[5] = wins[i].positive ? 1 : 0;
  }
}

// The output buffers, one per field, each (n, C_f, h, w) of float32 or of
// the field's stored dtype (OutputBuffer), plus an optional (n, 6) int64
// window buffer; all checked with the GIL held.
struct Targets {
  std::vector<std::unique_ptr<BufferHold>> holds;
  std::vector<patchstore::GatherTarget> outs;
  std::unique_ptr<BufferHold> windows_hold;
  int64_t* windows = nullptr;
};

Targets TakeTargets(const PySampler& ps, const py::sequence& outs, const py::object& windows, int64_t n,
                    const std::string& context) {
  const SamplerOptions& o = ps.s->options();
  const auto& channels = ps.s->channels();
  if (static_cast<size_t>(py::len(outs)) != o.fields.size())
    throw py::value_error(context + ": " + std::to_string(py::len(outs)) + " output buffers for " +
                          std::to_string(o.fields.size()) + " fields");
  Targets t;
  std::vector<std::pair<std::string, const BufferHold*>> named;
  for (size_t f = 0; f < o.fields.size(); ++f) {
    const std::string what = "out['" + o.fields[f] + "']";
    patchstore::GatherTarget target;
    t.holds.push_back(OutputBuffer(outs[f], {n, channels[f], o.height(), o.width()}, ps.s->field_dtype(f), what,
                                   context, &target.output));
    target.data = t.holds.back()->view().buf;
    t.outs.push_back(target);
    named.emplace_back(what, t.holds.back().get());
  }
  if (!windows.is_none()) {
    t.windows_hold = WritableBuffer(windows, {n, kWindowColumns}, "qlQL", 8, "int64", "the window buffer", context);
    t.windows = static_cast<int64_t*>(t.windows_hold->view().buf);
    named.emplace_back("the window buffer", t.windows_hold.get());
  }
  CheckDisjoint(named, context);
  return t;
}

// Reads n windows from an int64 (n, 6) buffer, checking what GatherWindows
// does not (sample index, flip and rotation codes).
std::vector<Window> LoadWindows(const PySampler& ps, const py::object& obj, const std::string& context) {
  BufferHold b;
  if (!b.Get(obj.ptr(), PyBUF_STRIDES | PyBUF_FORMAT))
    throw py::value_error(context + ": windows must be an int64 (n, 6) array, got " + TypeName(obj));
  const Py_buffer& v = b.view();
  if (v.itemsize != 8 || !FormatIs(v.format, "qlQL") || v.ndim != 2 || v.shape[1] != kWindowColumns ||
      !PyBuffer_IsContiguous(&v, 'C'))
    throw py::value_error(context + ": windows must be a C-contiguous int64 (n, 6) array");
  const int64_t n = static_cast<int64_t>(v.shape[0]);
  const int64_t* src = static_cast<const int64_t*>(v.buf);
  std::vector<Window> wins(static_cast<size_t>(n));
  const uint64_t samples = ps.reader->size();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t* row = src + i * kWindowColumns;
    if (row[0] < 0 || static_cast<uint64_t>(row[0]) >= samples)
      throw py::index_error(context + ": window " + std::to_string(i) + " names sample " + std::to_string(row[0]) +
                            ", outside [0, " + std::to_string(samples) + ")");
    if (row[3] < 0 || row[3] > 3 || row[4] < 0 || row[4] > 3)
      throw py::value_error(context + ": window " + std::to_string(i) + " has flip " + std::to_string(row[3]) +
                            " and rotation " + std::to_string(row[4]) + " (both must be 0..3)");
    wins[i].sample = static_cast<uint64_t>(row[0]);
    wins[i].y = row[1];
    wins[i].x = row[2];
    wins[i].flip = static_cast<uint8_t>(row[3]);
    wins[i].rot = static_cast<uint8_t>(row[4]);
    wins[i].positive = row[5] != 0;
  }
  return wins;
}

// Windows [first, first + n) of `epoch` into the targets (Gather, checked).
Status GatherRange(const PySampler& ps, uint64_t epoch, uint64_t first, int64_t n, const Targets& t, int64_t offset) {
  const auto& channels = ps.s->channels();
  const int64_t hw = ps.s->height() * ps.s->width();
  std::vector<patchstore::GatherTarget> shifted = t.outs;
  for (size_t f = 0; f < t.outs.size(); ++f) {
    const size_t es = t.outs[f].output == patchstore::Output::kStored ? DTypeSize(ps.s->field_dtype(f)) : 4;
    shifted[f].data = static_cast<uint8_t*>(t.outs[f].data) + offset * channels[f] * hw * static_cast<int64_t>(es);
  }
  std::vector<Window> wins;
  Status st = ps.s->GatherTo(epoch, first, n, shifted, t.windows ? &wins : nullptr);
  if (st.ok() && t.windows) StoreWindows(wins, t.windows + offset * kWindowColumns);
  return st;
}

std::unique_ptr<PySampler> Create(std::shared_ptr<Reader> reader, const SamplerOptions& o) {
  auto ps = std::make_unique<PySampler>();
  ps->reader = reader;
  patchstore::Result<std::unique_ptr<PatchSampler>> r = Status::Internal("sampler not created");
  {
    py::gil_scoped_release nogil;  // reads every sample's headers (and masks' tables)
    r = PatchSampler::Create(reader, o);
  }
  ps->s = Unwrap(std::move(r));
  return ps;
}

// values (a writable int64 vector) shuffled in place by splitmix::Shuffle.
void ShuffleInPlace(const py::object& values, uint64_t seed, uint64_t epoch, uint64_t salt) {
  BufferHold probe;
  int64_t n = 0;
  if (probe.Get(values.ptr(), PyBUF_STRIDES | PyBUF_FORMAT)) n = static_cast<int64_t>(probe.view().len / 8);
  auto hold = WritableBuffer(values, {n}, "qlQL", 8, "int64", "values", "shuffle");
  int64_t* v = static_cast<int64_t*>(hold->view().buf);
  py::gil_scoped_release nogil;
  patchstore::splitmix::Shuffle(v, static_cast<uint64_t>(n), seed, epoch, salt);
}

// The locality order (reader/order.h) of items with the given record bytes
// (a uint64/int64 vector, storage order) as an int64 vector of positions.
py::bytes LocalityOrderOf(const py::object& bytes_obj, uint64_t budget, uint64_t seed, uint64_t epoch) {
  BufferHold b;
  if (!b.Get(bytes_obj.ptr(), PyBUF_ND | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) || b.view().itemsize != 8 ||
      !FormatIs(b.view().format, "qlQL") || b.view().ndim != 1)
    throw py::value_error("locality_order: item_bytes must be a contiguous 1-D 64-bit integer buffer");
  const uint64_t n = static_cast<uint64_t>(b.view().shape[0]);
  std::vector<uint64_t> bytes(static_cast<const uint64_t*>(b.view().buf),
                              static_cast<const uint64_t*>(b.view().buf) + n);
  std::vector<uint64_t> order;
  Status st;
  {
    py::gil_scoped_release nogil;
    st = patchstore::LocalityOrder(bytes.data(), n, budget, seed, epoch, &order);
  }
  Check(st);
  return py::bytes(reinterpret_cast<const char*>(order.data()), order.size() * sizeof(uint64_t));
}

}  // namespace

void BindSampler(py::module_& m) {
  m.def("shuffle", &ShuffleInPlace, py::arg("values"), py::arg("seed"), py::arg("epoch"), py::arg("salt"),
        "Shuffles a writable int64 vector in place: Fisher-Yates keyed by (seed, epoch, salt) with the\n"
        "samplers' counter-based generator (reader/transform.h splitmix::Shuffle).");
  m.def("locality_order", &LocalityOrderOf, py::arg("item_bytes"), py::arg("budget"), py::arg("seed"), py::arg("epoch"),
        "The locality-aware epoch order (reader/order.h LocalityOrder) of items in storage order with the\n"
        "given record bytes: a permutation of range(n) as uint64 bytes. ValueError for a budget of 0.");
  m.attr("DEFAULT_PREFETCH_BATCHES") = patchstore::kDefaultPrefetchBatches;
  BindSamplerOptions(m);
  m.def(
      "parse_byte_size",
      [](const std::string& text) {
        auto r = patchstore::ParseByteSize(text);
        if (!r.ok()) throw py::value_error(r.status().message());
        return *r;
      },
      py::arg("text"), "'8GB', '512MiB', '1.5G', '1000000': bytes (reader/order.h ParseByteSize).");
  py::class_<PySampler>(
      m, "Sampler",
      "patchstore::PatchSampler: exact mask-aware uniform windows, deterministic in (seed, epoch, position),\n"
      "sharded by rank, gathered into caller buffers with the GIL released. Use patchstore.PatchSampler.")
      .def(py::init(&Create), py::arg("reader"), py::arg("options"),
           "PatchSampler::Create. KeyError for an unknown field, ValueError for bad options.")
      .def_property_readonly("fields", [](const PySampler& ps) { return ps.s->options().fields; })
      .def_property_readonly("channels", [](const PySampler& ps) { return ps.s->channels(); })
      .def_property_readonly("patch_size", [](const PySampler& ps) { return ps.s->options().patch_size; })
      .def_property_readonly("patch_shape",
                             [](const PySampler& ps) { return py::make_tuple(ps.s->height(), ps.s->width()); })
      .def_property_readonly("policy",
                             [](const PySampler& ps) {
                               return std::string(patchstore::SamplingPolicyName(ps.s->options().ResolvedPolicy()));
                             })
      .def_property_readonly("skipped_report", [](const PySampler& ps) { return ps.s->SkippedReport(); })
      .def_property_readonly("considered_samples", [](const PySampler& ps) { return ps.s->considered_samples(); })
      .def(
          "eligible_list",
          [](const PySampler& ps) {
            const auto& e = ps.s->eligible_list();
            py::bytes b(reinterpret_cast<const char*>(e.data()), e.size() * sizeof(uint64_t));
            return b;
          },
          "The eligible samples (store indices, ascending) as uint64 bytes: PatchDataset's item i is sample i of it.")
      .def(
          "served_windows",
          [](const PySampler& ps, const std::string& loader, uint64_t epoch, uint64_t first, int64_t n) {
            auto kind = patchstore::ParseLoaderKind(loader);
            if (!kind.ok()) throw py::value_error(kind.status().message());
            patchstore::Result<std::vector<Window>> r = Status::Internal("no windows");
            {
              py::gil_scoped_release nogil;
              r = ps.s->ServedWindows(*kind, epoch, first, n);
            }
            py::list out;
            for (const Window& w : Unwrap(std::move(r))) out.append(WindowTuple(w));
            return out;
          },
          py::arg("loader"), py::arg("epoch"), py::arg("first"), py::arg("n"),
          "PatchSampler::ServedWindows: windows [first, first+n) a loader ('sampler', 'batchloader',\n"
          "'patchdataset') serves from `epoch` on, as (sample, y, x, flip, rot, positive) tuples.")
      .def_property_readonly("patches_per_sample",
                             [](const PySampler& ps) { return ps.s->options().patches_per_sample; })
      .def_property_readonly("eligible_samples", [](const PySampler& ps) { return ps.s->eligible_samples(); })
      .def_property_readonly("skipped_samples", [](const PySampler& ps) { return ps.s->skipped_samples(); })
      .def_property_readonly(
          "candidate_stats",
          [](const PySampler& ps) {
            const auto st = ps.s->candidate_stats();
            py::dict d;
            d["by_lists"] = st.by_lists;
            d["by_blocks"] = st.by_blocks;
            d["by_counting"] = st.by_counting;
            return d;
          },
          "How this process decided the candidate windows of mask-aware draws so far: {'by_lists',\n"
          "'by_blocks', 'by_counting'} (only counting reads the mask). The windows do not depend on it.")
      .def_property_readonly("skipped_ids",
                             [](const PySampler& ps) {
                               py::list out;
                               for (const std::string& id : ps.s->skipped_ids()) out.append(py::bytes(id));
                               return out;
                             })
      .def_property_readonly("visits_per_epoch", [](const PySampler& ps) { return ps.s->visits_per_epoch(); })
      .def_property_readonly("windows_per_epoch", [](const PySampler& ps) { return ps.s->windows_per_epoch(); })
      .def(
          "eligibility",
          [](const PySampler& ps) {
            std::string out(static_cast<size_t>(ps.reader->size()), '\0');
            for (uint64_t i = 0; i < ps.reader->size(); ++i) out[i] = ps.s->eligible(i) ? 1 : 0;
            return py::bytes(out);
          },
          "One byte per sample: 1 when it has an admissible window.")
      .def_property_readonly("position",
                             [](PySampler& ps) {
                               std::lock_guard<std::mutex> lock(ps.mu);
                               return py::make_tuple(ps.epoch, ps.cursor);
                             })
      .def(
          "set_position",
          [](PySampler& ps, uint64_t epoch, uint64_t cursor) {
            const uint64_t per = ps.s->windows_per_epoch();
            if (cursor != 0 && cursor >= per)
              throw py::value_error(ps.Context("set_position") + ": cursor " + std::to_string(cursor) +
                                    " outside the epoch's " + std::to_string(per) + " windows");
            py::gil_scoped_release nogil;  // next() may hold the mutex without the GIL
            std::lock_guard<std::mutex> lock(ps.mu);
            ps.epoch = epoch;
            ps.cursor = cursor;
          },
          py::arg("epoch"), py::arg("cursor") = 0, "Where next() continues: window `cursor` of `epoch`.")
      .def(
          "next",
          [](PySampler& ps, int64_t n, const py::sequence& outs, const py::object& windows) {
            const std::string context = ps.Context("batch");
            if (n < 0) throw py::value_error(context + ": negative batch size " + std::to_string(n));
            Targets t = TakeTargets(ps, outs, windows, n, context);
            Status st;
            uint64_t new_epoch = 0, new_cursor = 0;
            {
              py::gil_scoped_release nogil;
              std::lock_guard<std::mutex> lock(ps.mu);
              const uint64_t per = ps.s->windows_per_epoch();
              uint64_t epoch = ps.epoch, cursor = ps.cursor;
              int64_t done = 0;
              if (n > 0 && per == 0) st = Status::OutOfRange(context + ": no sample has an admissible window");
              while (st.ok() && done < n) {
                const int64_t take = static_cast<int64_t>(
                    std::min<uint64_t>(static_cast<uint64_t>(n - done), per - cursor));
                st = GatherRange(ps, epoch, cursor, take, t, done);
                done += take;
                cursor += static_cast<uint64_t>(take);
                if (cursor == per) {
                  ++epoch;
                  cursor = 0;
                }
              }
              if (st.ok()) {  // the cursor moves only when the whole batch is there
                ps.epoch = epoch;
                ps.cursor = cursor;
                // Batch prefetch: the next n windows' bytes, requested while the caller uses these.
                if (ps.s->options().prefetch_next) ps.s->PrefetchAhead(epoch, cursor, n);
              }
              new_epoch = ps.epoch;
              new_cursor = ps.cursor;
            }
            Check(st);
            return py::make_tuple(new_epoch, new_cursor);
          },
          py::arg("n"), py::arg("outs"), py::arg("windows") = py::none(),
          "The next n windows (continuing into the next epoch) into outs (one (n,C,P,P) buffer per field:\n"
          "float32, or of the field's stored dtype for the elements as stored); windows: None or an int64 (n, 6) "
          "buffer for (sample, y, x, flip, rot, positive).")
      .def(
          "gather",
          [](const PySampler& ps, uint64_t epoch, uint64_t first, int64_t n, const py::sequence& outs,
             const py::object& windows) {
            const std::string context = ps.Context("gather");
            const uint64_t per = ps.s->windows_per_epoch();
            if (n < 0 || first > per || static_cast<uint64_t>(n) > per - first)
              throw py::index_error(context + ": windows [" + std::to_string(first) + ", " +
                                    std::to_string(static_cast<int64_t>(first) + n) + ") outside the epoch's " +
                                    std::to_string(per) + " windows");
            Targets t = TakeTargets(ps, outs, windows, n, context);
            Status st;
            {
              py::gil_scoped_release nogil;
              st = GatherRange(ps, epoch, first, n, t, 0);
            }
            Check(st);
          },
          py::arg("epoch"), py::arg("first"), py::arg("n"), py::arg("outs"), py::arg("windows") = py::none(),
          "Windows [first, first+n) of `epoch` on this rank (stateless).")
      .def(
          "prefetch_ahead",
          [](const PySampler& ps, uint64_t epoch, uint64_t first, int64_t n, uint64_t stride) {
            py::gil_scoped_release nogil;
            ps.s->PrefetchAhead(epoch, first, n, stride);
          },
          py::arg("epoch"), py::arg("first"), py::arg("n"), py::arg("stride") = 0,
          "PatchSampler::PrefetchAhead: keep `prefetch` batches of n windows requested, the first at window `first`\n"
          "of `epoch`, each `stride` windows after the one before (0: n); returns at once, never fails.")
      .def_property_readonly("prefetch",
                             [](const PySampler& ps) {
                               return ps.s->options().prefetch_next ? ps.s->options().prefetch_batches : 0;
                             })
      .def(
          "sample_bytes",
          [](const PySampler& ps) {
            const auto& e = ps.s->eligible_list();
            std::vector<uint64_t> out(e.size());
            for (size_t i = 0; i < e.size(); ++i) out[i] = ps.s->SampleBytes(e[i]);
            return py::bytes(reinterpret_cast<const char*>(out.data()), out.size() * sizeof(uint64_t));
          },
          "SampleBytes of each eligible sample (eligible_list order) as uint64 bytes.")
      .def(
          "gather_windows",
          [](const PySampler& ps, const py::object& windows, const py::sequence& outs) {
            const std::string context = ps.Context("gather_windows");
            std::vector<Window> wins = LoadWindows(ps, windows, context);
            Targets t = TakeTargets(ps, outs, py::none(), static_cast<int64_t>(wins.size()), context);
            Status st;
            {
              py::gil_scoped_release nogil;
              st = ps.s->GatherWindowsTo(wins, t.outs);
            }
            Check(st);
          },
          py::arg("windows"), py::arg("outs"), "Copies the given windows (an int64 (n, 6) array) into outs.")
      .def(
          "sample_at",
          [](const PySampler& ps, uint64_t epoch, uint64_t p) {
            if (p >= ps.s->visits_per_epoch())
              throw py::index_error(ps.Context("sample_at") + ": position " + std::to_string(p) +
                                    " outside the epoch's " + std::to_string(ps.s->visits_per_epoch()) + " visits");
            return ps.s->SampleAt(epoch, p);
          },
          py::arg("epoch"), py::arg("position"))
      .def(
          "window_at",
          [](const PySampler& ps, uint64_t epoch, uint64_t p, int j) {
            const std::string context = ps.Context("window");
            if (p >= ps.s->visits_per_epoch())
              throw py::index_error(context + ": position " + std::to_string(p) + " outside the epoch's " +
                                    std::to_string(ps.s->visits_per_epoch()) + " visits");
            if (j < 0 || j >= ps.s->options().patches_per_sample)
              throw py::index_error(context + ": window " + std::to_string(j) + " outside [0, " +
                                    std::to_string(ps.s->options().patches_per_sample) + ")");
            patchstore::Result<Window> w = Status::Internal("no window");
            {
              py::gil_scoped_release nogil;
              w = ps.s->WindowAt(epoch, p, j);
            }
            return WindowTuple(Unwrap(std::move(w)));
          },
          py::arg("epoch"), py::arg("position"), py::arg("j"),
          "(sample, y, x, flip, rot, positive) of window j of the visit at rank-local `position`.")
      .def(
          "windows_of_samples",
          [](const PySampler& ps, uint64_t epoch, const py::object& samples_obj, const py::object& windows,
             const py::object& first_j_obj) {
            const std::string context = ps.Context("windows_of_samples");
            BufferHold b;
            if (!b.Get(samples_obj.ptr(), PyBUF_ND | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) || b.view().itemsize != 8 ||
                !FormatIs(b.view().format, "qlQL") || b.view().ndim != 1)
              throw py::value_error(context + ": samples must be a contiguous 1-D int64 buffer");
            const int64_t B = static_cast<int64_t>(b.view().shape[0]);
            const int k = ps.s->options().patches_per_sample;
            std::vector<int64_t> samples(static_cast<const int64_t*>(b.view().buf),
                                         static_cast<const int64_t*>(b.view().buf) + B);
            for (int64_t s : samples)
              if (s < 0 || static_cast<uint64_t>(s) >= ps.reader->size())
                throw py::index_error(context + ": sample " + std::to_string(s) + " outside [0, " +
                                      std::to_string(ps.reader->size()) + ")");
            std::vector<int64_t> first_j(static_cast<size_t>(B), 0);
            if (!first_j_obj.is_none()) {
              BufferHold jb;
              if (!jb.Get(first_j_obj.ptr(), PyBUF_ND | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) || jb.view().itemsize != 8 ||
                  !FormatIs(jb.view().format, "qlQL") || jb.view().ndim != 1 || jb.view().shape[0] != B)
                throw py::value_error(context + ": first_j must be a contiguous 1-D int64 buffer like samples");
              std::memcpy(first_j.data(), jb.view().buf, static_cast<size_t>(B) * 8);
              for (int64_t j : first_j)
                if (j < 0 || j > (int64_t{1} << 30))
                  throw py::value_error(context + ": first_j values must be in [0, 2^30]");
            }
            auto hold = WritableBuffer(windows, {B * k, kWindowColumns}, "qlQL", 8, "int64", "the window buffer",
                                       context);
            int64_t* dst = static_cast<int64_t*>(hold->view().buf);
            Status st;
            {
              py::gil_scoped_release nogil;  // the first draw from a sample finds its windows
              // Read every new sample's mask at once, not one after the other in the draws.
              ps.s->PrefetchMasks(std::vector<uint64_t>(samples.begin(), samples.end()));
              std::vector<Window> wins(static_cast<size_t>(B * k));
              for (int64_t i = 0; i < B && st.ok(); ++i)
                for (int j = 0; j < k && st.ok(); ++j) {
                  auto w = ps.s->WindowOfSample(epoch, static_cast<uint64_t>(samples[i]),
                                                static_cast<int>(first_j[i] + j));
                  if (w.ok()) wins[i * k + j] = *w;
                  else st = w.status();
                }
              if (st.ok()) StoreWindows(wins, dst);
            }
            Check(st);
          },
          py::arg("epoch"), py::arg("samples"), py::arg("windows"), py::arg("first_j") = py::none(),
          "Windows j0..j0+k-1 of each sample (PatchSampler::WindowOfSample: a function of (seed, epoch,\n"
          "sample, j)) into an int64 (B*k, 6) buffer; first_j: None (j0 = 0) or an int64 buffer of one j0\n"
          "per sample. IndexError for a sample without an admissible window.");
}

}  // namespace patchstore_py
