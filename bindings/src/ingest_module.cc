// patchstore/bindings/src/ingest_module.cc — patchstore._ingest, the
// writing half of the Python binding: image and HDF5 volume ingest, export.
//
// A separate extension module so that reading processes (DataLoader
// workers) never load OpenCV, OpenEXR or HDF5: `import patchstore` loads
// only _patchstore; _ingest is imported on the first ingest/export call.
//
// All calls run with the GIL released. A Python progress callable, when
// given, is called from the ingest's writer thread with the GIL taken; if it
// raises, it is not called again and its exception is raised when the
// operation returns.
//
// Cancelling: ingest_images and ingest_hdf5 take a CancelFlag that the
// ingest polls between samples / volumes (ImageIngestOptions::cancelled,
// Hdf5IngestOptions::cancelled); setting it from any thread stops the ingest
// after committing what was done (RuntimeError, code Aborted).
// patchstore.ingest_images / ingest_hdf5 run the call on a helper thread and
// set the flag when the main thread sees Ctrl-C (patchstore/_ingest_api.py).
//
// Errors of ingest_hdf5: a missing input file is checked for by the Python
// layer (FileNotFoundError); here NotFound (a group or a patient's dataset
// missing from a file) becomes KeyError, as h5py raises for a missing key.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "patchstore/ingest/ingest.h"
#include "patchstore/ingest/ingest_hdf5.h"
#include "patchstore/ingest/montage.h"
#include "patchstore/ingest/volume_montage.h"
#include "status_py.h"

namespace py = pybind11;
using patchstore::ExportOptions;
using patchstore::ExportSummary;
using patchstore::Hdf5IngestOptions;
using patchstore::ImageIngestOptions;
using patchstore::IngestSummary;
using patchstore::Progress;
using patchstore::ProgressCallback;
using patchstore_py::RaiseStatus;
using patchstore_py::Where;

namespace {

// Set from Python (any thread), polled by the ingest between samples.
struct CancelFlag {
  std::atomic<bool> set{false};
};

// Adapts a Python callable (or None) to a ProgressCallback. Lives on the
// calling thread's stack for the whole operation.
class ProgressBridge {
 public:
  explicit ProgressBridge(py::object fn) : fn_(std::move(fn)) {}
  ~ProgressBridge() {
    py::gil_scoped_acquire gil;  // fn_ may be released only with the GIL
    fn_ = py::object();
  }

  ProgressCallback callback() {
    if (fn_.is_none()) return nullptr;
    return [this](const Progress& p) {
      py::gil_scoped_acquire gil;
      if (error_) return;
      try {
        fn_(p);
      } catch (py::error_already_set& e) {
        error_ = std::move(e);
      }
    };
  }

  // REQUIRES: the GIL is held. Raises the callback's exception, if any.
  void RethrowIfFailed() {
    if (error_) {
      py::error_already_set e = std::move(*error_);
      error_.reset();
      throw e;
    }
  }

 private:
  py::object fn_;
  std::optional<py::error_already_set> error_;
};

py::dict SummaryDict(const IngestSummary& s) {
  py::dict d;
  d["samples_total"] = s.samples_total;
  d["samples_written"] = s.samples_written;
  d["samples_present"] = s.samples_present;
  d["samples_failed"] = s.samples_failed;
  d["bytes_written"] = s.bytes_written;
  d["bytes_decoded"] = s.bytes_decoded;
  d["seconds"] = s.seconds;
  d["report_path"] = s.report_path;
  d["report_error"] = s.report_error;
  d["errors"] = s.errors;
  d["warnings"] = s.warnings;
  return d;
}

// Runs an ingest with the GIL released: progress reaches the Python
// callable, the cancel flag (set on KeyboardInterrupt) stops it between
// samples, a Status becomes the matching exception.
template <typename Options, typename Fn>
py::dict RunIngest(Options& o, Fn&& ingest, py::object progress, std::shared_ptr<CancelFlag> cancel, Where where) {
  ProgressBridge bridge(std::move(progress));
  o.progress = bridge.callback();
  if (cancel) o.cancelled = [cancel] { return cancel->set.load(std::memory_order_relaxed); };
  patchstore::Result<IngestSummary> r = patchstore::Status::Internal("ingest did not run");
  {
    py::gil_scoped_release nogil;
    r = ingest(o);
  }
  bridge.RethrowIfFailed();
  if (!r.ok()) RaiseStatus(r.status(), where);
  return SummaryDict(r.value());
}

py::dict IngestImages(const std::string& store, const std::string& manifest, const std::string& root,
                      const std::vector<std::pair<std::string, std::string>>& fields,
                      const std::vector<std::string>& masks, const std::map<std::string, std::string>& norm,
                      int threads, bool skip_errors, const std::string& report_path, uint64_t batch_bytes,
                      bool durable, uint64_t max_pixels, const std::string& command_line, py::object progress,
                      std::shared_ptr<CancelFlag> cancel, std::pair<uint32_t, uint32_t> shard) {
  ImageIngestOptions o;
  o.shard_index = shard.first;
  o.shard_count = shard.second;
  o.store = store;
  o.manifest = manifest;
  o.root = root;
  o.field_templates = fields;
  o.mask_fields = masks;
  o.norm = norm;
  o.threads = threads;
  o.skip_errors = skip_errors;
  o.report_path = report_path;
  o.batch_bytes = batch_bytes;
  o.durable = durable;
  o.max_pixels = max_pixels;
  o.command_line = command_line;
  return RunIngest(o, patchstore::IngestImages, std::move(progress), std::move(cancel), Where::kFiles);
}

py::dict IngestHdf5(const std::vector<std::string>& files, const std::string& store,
                    const std::vector<std::string>& groups, int slice_axis, const std::string& ids,
                    const std::vector<std::string>& masks, const std::map<std::string, std::string>& norm,
                    bool allow_external, bool skip_errors, const std::string& report_path, uint64_t batch_bytes,
                    bool durable, const std::string& command_line, py::object progress,
                    std::shared_ptr<CancelFlag> cancel, bool strict_ids, std::pair<uint32_t, uint32_t> shard) {
  Hdf5IngestOptions o;
  o.shard_index = shard.first;
  o.shard_count = shard.second;
  o.strict_ids = strict_ids;
  o.files = files;
  o.store = store;
  o.groups = groups;
  o.slice_axis = slice_axis;
  o.ids = ids;
  o.mask_fields = masks;
  o.norm = norm;
  o.allow_external = allow_external;
  o.skip_errors = skip_errors;
  o.report_path = report_path;
  o.batch_bytes = batch_bytes;
  o.durable = durable;
  o.command_line = command_line;
  return RunIngest(o, patchstore::IngestHdf5, std::move(progress), std::move(cancel), Where::kLookup);
}

py::dict Export(const std::string& store, const std::string& outdir, const std::vector<py::bytes>& ids,
                const std::vector<std::string>& fields, const std::string& format, bool has_window, double lo,
                double hi, py::object progress, const std::string& axis_order, bool window_auto) {
  ExportOptions o;
  o.window_auto = window_auto;
  o.store = store;
  o.outdir = outdir;
  for (const py::bytes& id : ids) o.ids.push_back(std::string(id));
  o.fields = fields;
  o.format = format;
  o.has_window = has_window;
  o.window_lo = lo;
  o.window_hi = hi;
  o.axis_order = axis_order;
  ProgressBridge bridge(std::move(progress));
  o.progress = bridge.callback();
  patchstore::Result<ExportSummary> r = patchstore::Status::Internal("export did not run");
  {
    py::gil_scoped_release nogil;
    r = patchstore::Export(o);
  }
  bridge.RethrowIfFailed();
  // Unknown ids or fields in an export are lookups, not missing files.
  if (!r.ok()) RaiseStatus(r.status(), Where::kLookup);
  const ExportSummary& s = r.value();
  py::dict d;
  d["files_written"] = s.files_written;
  d["bytes_written"] = s.bytes_written;
  d["paths"] = s.paths;
  d["warnings"] = s.warnings;
  return d;
}

// RenderMontage: (height, width, bytearray of height*width*3 RGB bytes).
py::tuple Montage(const std::string& store, int count, int64_t patch_size, const std::string& field,
                  const std::string& overlay, const std::string& require, bool require_overlay,
                  int patches_per_sample, uint64_t seed, uint64_t epoch, bool flip, bool rot90, bool has_window,
                  double lo, double hi, int tile) {
  patchstore::MontageOptions o;
  o.store = store;
  o.count = count;
  o.patch_size = patch_size;
  o.field = field;
  o.overlay = overlay;
  o.require = require;
  o.require_overlay = require_overlay;
  o.patches_per_sample = patches_per_sample;
  o.seed = seed;
  o.epoch = epoch;
  o.flip = flip;
  o.rot90 = rot90;
  o.has_window = has_window;
  o.window_lo = lo;
  o.window_hi = hi;
  o.tile = tile;
  patchstore::Result<patchstore::Image8> r = patchstore::Status::Internal("montage did not run");
  {
    py::gil_scoped_release nogil;
    r = patchstore::RenderMontage(o);
  }
  if (!r.ok()) RaiseStatus(r.status(), Where::kLookup);
  const patchstore::Image8& img = r.value();
  py::bytearray pixels(reinterpret_cast<const char*>(img.rgb.data()), img.rgb.size());
  return py::make_tuple(img.height, img.width, pixels);
}

// RenderVolumeMontage: (height, width, bytearray of RGB bytes, (lo, hi) window used, items shown).
py::tuple VolumeMontage(const std::string& store, int count, const std::string& field, const std::string& overlay,
                        const std::vector<std::string>& ids, int64_t crop_h, int64_t crop_w, int64_t context,
                        const std::string& flip, bool rot90, uint64_t seed, uint64_t epoch, bool has_window,
                        double lo, double hi, int tile, bool labels) {
  patchstore::VolumeMontageOptions o;
  o.store = store;
  o.count = count;
  o.field = field;
  o.overlay = overlay;
  o.ids = ids;
  o.crop_h = crop_h;
  o.crop_w = crop_w;
  o.context = context;
  o.flip = flip == "independent" ? patchstore::SliceFlip::kIndependent
           : flip == "both"      ? patchstore::SliceFlip::kBoth
                                 : patchstore::SliceFlip::kNone;
  o.rot90 = rot90;
  o.seed = seed;
  o.epoch = epoch;
  o.has_window = has_window;
  o.window_lo = lo;
  o.window_hi = hi;
  o.tile = tile;
  o.labels = labels;
  patchstore::Result<patchstore::VolumeMontage> r = patchstore::Status::Internal("montage did not run");
  {
    py::gil_scoped_release nogil;
    r = patchstore::RenderVolumeMontage(o);
  }
  if (!r.ok()) RaiseStatus(r.status(), Where::kLookup);
  const patchstore::VolumeMontage& m = r.value();
  py::bytearray pixels(reinterpret_cast<const char*>(m.image.rgb.data()), m.image.rgb.size());
  return py::make_tuple(m.image.height, m.image.width, pixels, py::make_tuple(m.window_lo, m.window_hi), m.items);
}

}  // namespace

PYBIND11_MODULE(_ingest, m) {
  m.doc() =
      "patchstore._ingest: compiled image and HDF5 volume ingest and export. Use patchstore.ingest_images /\n"
      "patchstore.ingest_hdf5 / patchstore.export.";

  py::class_<Progress>(m, "Progress", "Progress of an ingest or export: done of total items, plus bytes.")
      .def_readonly("done", &Progress::done)
      .def_readonly("total", &Progress::total)
      .def_readonly("failed", &Progress::failed)
      .def_readonly("skipped", &Progress::skipped)
      .def_readonly("bytes", &Progress::bytes)
      .def_readonly("seconds", &Progress::seconds)
      .def("__repr__", [](const Progress& p) {
        return "Progress(done=" + std::to_string(p.done) + ", total=" + std::to_string(p.total) +
               ", failed=" + std::to_string(p.failed) + ", skipped=" + std::to_string(p.skipped) +
               ", bytes=" + std::to_string(p.bytes) + ", seconds=" + std::to_string(p.seconds) + ")";
      });

  py::class_<CancelFlag, std::shared_ptr<CancelFlag>>(
      m, "CancelFlag", "A flag an ingest polls between samples; set() stops it after the last commit.")
      .def(py::init<>())
      .def("set", [](CancelFlag& c) { c.set.store(true); })
      .def("is_set", [](const CancelFlag& c) { return c.set.load(); });

  m.def("ingest_images", &IngestImages, py::arg("store"), py::arg("manifest"), py::arg("root"),
        py::arg("fields"), py::arg("masks"), py::arg("norm"), py::arg("threads"), py::arg("skip_errors"),
        py::arg("report_path"), py::arg("batch_bytes"), py::arg("durable"), py::arg("max_pixels"),
        py::arg("command_line"), py::arg("progress"), py::arg("cancel") = nullptr,
        py::arg("shard") = std::pair<uint32_t, uint32_t>(0, 0),
        "patchstore::IngestImages with the GIL released. Returns the IngestSummary as a dict.\n"
        "cancel: a CancelFlag polled between samples (RuntimeError once set: committed samples stay).");
  m.def("ingest_hdf5", &IngestHdf5, py::arg("files"), py::arg("store"), py::arg("groups"), py::arg("slice_axis"),
        py::arg("ids"), py::arg("masks"), py::arg("norm"), py::arg("allow_external"), py::arg("skip_errors"),
        py::arg("report_path"), py::arg("batch_bytes"), py::arg("durable"), py::arg("command_line"),
        py::arg("progress"), py::arg("cancel") = nullptr, py::arg("strict_ids") = false,
        py::arg("shard") = std::pair<uint32_t, uint32_t>(0, 0),
        "patchstore::IngestHdf5 with the GIL released. Returns the IngestSummary as a dict.\n"
        "cancel: a CancelFlag polled between volumes (RuntimeError once set: committed volumes stay).\n"
        "NotFound (a missing group or dataset) raises KeyError.");
  m.def("render_volume_montage", &VolumeMontage, py::arg("store"), py::arg("count"), py::arg("field"),
        py::arg("overlay"), py::arg("ids"), py::arg("crop_h"), py::arg("crop_w"), py::arg("context"), py::arg("flip"),
        py::arg("rot90"), py::arg("seed"), py::arg("epoch"), py::arg("has_window"), py::arg("lo"), py::arg("hi"),
        py::arg("tile"), py::arg("labels"),
        "patchstore::RenderVolumeMontage with the GIL released: (height, width, RGB bytearray, (lo, hi), items).");
  m.def("render_montage", &Montage, py::arg("store"), py::arg("count"), py::arg("patch_size"), py::arg("field"),
        py::arg("overlay"), py::arg("require"), py::arg("require_overlay"), py::arg("patches_per_sample"),
        py::arg("seed"), py::arg("epoch"), py::arg("flip"), py::arg("rot90"), py::arg("has_window"),
        py::arg("window_lo"), py::arg("window_hi"), py::arg("tile"),
        "patchstore::RenderMontage with the GIL released: (height, width, bytearray of RGB bytes).");
  m.def("export", &Export, py::arg("store"), py::arg("outdir"), py::arg("ids"), py::arg("fields"),
        py::arg("format"), py::arg("has_window"), py::arg("window_lo"), py::arg("window_hi"),
        py::arg("progress"), py::arg("axis_order") = "", py::arg("window_auto") = false,
        "patchstore::Export with the GIL released. Returns the ExportSummary as a dict.");
  m.def(
      "safe_relative_path", [](const py::bytes& id) { return py::bytes(patchstore::SafeRelativePath(id)); },
      py::arg("id"), "The relative path export writes sample `id` (bytes) under.");
}
