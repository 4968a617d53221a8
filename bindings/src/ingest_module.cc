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
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "patchstore/ingest/convert.h"
#include "patchstore/ingest/ingest.h"
#include "patchstore/ingest/ingest_hdf5.h"
#include "patchstore/ingest/ingest_volumes.h"
#include "patchstore/ingest/montage.h"
#include "patchstore/ingest/volume_montage.h"
#include "sampler_options_py.h"
#include "slice_options_py.h"
#include "status_py.h"

namespace py = pybind11;
using patchstore::ExportOptions;
using patchstore::ExportSummary;
using patchstore::Hdf5IngestOptions;
using patchstore::ImageIngestOptions;
using patchstore::IngestSummary;
using patchstore::Progress;
using patchstore::ProgressCallback;
using patchstore::VolumeIngestOptions;
using patchstore_py::RaiseStatus;
using patchstore_py::SamplerOptionsFrom;
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
  d["projected_bytes"] = s.projected_bytes;
  d["ram_bytes"] = s.ram_bytes;
  d["advice"] = s.advice;
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

// The option structs are bound as classes (ImageIngestOptions,
// Hdf5IngestOptions: every field but the callbacks, defaults from the C++
// struct), so an option added to the struct (and the CLI) is one
// def_readwrite here and one keyword in patchstore/_ingest_api.py; the
// calls take a copy and set its progress and cancel callbacks.
py::dict IngestImages(ImageIngestOptions o, py::object progress, std::shared_ptr<CancelFlag> cancel) {
  return RunIngest(o, patchstore::IngestImages, std::move(progress), std::move(cancel), Where::kFiles);
}

py::dict IngestHdf5(Hdf5IngestOptions o, py::object progress, std::shared_ptr<CancelFlag> cancel) {
  return RunIngest(o, patchstore::IngestHdf5, std::move(progress), std::move(cancel), Where::kLookup);
}

py::dict IngestVolumes(VolumeIngestOptions o, py::object progress, std::shared_ptr<CancelFlag> cancel) {
  return RunIngest(o, patchstore::IngestVolumes, std::move(progress), std::move(cancel), Where::kFiles);
}

// patchstore::CopyStore with the GIL released: progress (the conversion's
// samples and notices) and verify_progress (records checked) reach the
// Python callables as Progress reports; the cancel flag stops a conversion
// between samples. A copy that fails verification raises
// CorruptRecordError whose message lists the problems found.
py::dict Copy(const std::string& src, const std::string& dst, const std::string& layout, uint32_t tile_size,
              const std::vector<std::string>& encoding, int threads, bool durable, const std::string& command_line,
              py::object progress, py::object verify_progress, std::shared_ptr<CancelFlag> cancel) {
  patchstore::CopyOptions o;
  o.src = src;
  o.dst = dst;
  o.layout = layout;
  o.tile_size = tile_size;
  o.encoding = encoding;
  o.threads = threads;
  o.durable = durable;
  o.command_line = command_line;
  ProgressBridge bridge(std::move(progress));
  ProgressBridge verify_bridge(std::move(verify_progress));
  o.progress = bridge.callback();
  if (ProgressCallback v = verify_bridge.callback()) {
    const auto start = std::chrono::steady_clock::now();
    o.verify_progress = [v, start](uint64_t done, uint64_t total) {
      Progress p;
      p.done = done;
      p.total = total;
      p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      v(p);
    };
  }
  if (cancel) o.cancelled = [cancel] { return cancel->set.load(std::memory_order_relaxed); };
  std::vector<patchstore::VerifyProblem> problems;
  patchstore::Result<patchstore::CopySummary> r = patchstore::Status::Internal("copy did not run");
  {
    py::gil_scoped_release nogil;
    r = patchstore::CopyStore(o, &problems);
  }
  bridge.RethrowIfFailed();
  verify_bridge.RethrowIfFailed();
  if (!r.ok()) {
    patchstore::Status st = r.status();
    if (!problems.empty()) {
      std::string list;
      for (size_t i = 0; i < problems.size() && i < 20; ++i)
        list += "\n  '" + problems[i].id + "' field '" + problems[i].field + "': " + problems[i].message;
      st = patchstore::Status(st.code(), st.message() + list);
    }
    RaiseStatus(st, Where::kFiles);
  }
  py::dict d;
  d["converted"] = r->converted;
  d["samples"] = r->samples;
  d["records"] = r->records;
  d["src_bytes"] = r->src_bytes;
  d["dst_bytes"] = r->dst_bytes;
  d["seconds"] = r->seconds;
  return d;
}

// Binds one field of an option struct and records its name in `names`
// (the class's _fields, which __repr__ and the Python layer read).
template <typename C, typename T>
void BindField(py::class_<C>& cls, py::list& names, const char* name, T C::*member, const char* doc) {
  cls.def_readwrite(name, member, doc);
  names.append(name);
}

// "ClassName(field=value, ...)" for the bound option structs: the fields are
// read back through Python, so the repr lists exactly what is bound.
std::string OptionsRepr(py::handle self, const char* name) {
  py::list parts;
  for (py::handle f : self.attr("_fields")) {
    parts.append(py::str("{}={!r}").format(f, self.attr(f)));
  }
  return std::string(name) + "(" + py::str(", ").attr("join")(parts).cast<std::string>() + ")";
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

// RenderMontage: (height, width, bytearray of height*width*3 RGB bytes,
// windows as (sample, y, x, flip, rot, positive) tuples, warnings).
py::tuple Montage(const std::string& store, int count, const py::object& sampler, const std::string& field,
                  const std::string& overlay, bool require_overlay, uint64_t epoch, bool has_window, double lo,
                  double hi, int tile, const std::string& loader, bool with_windows) {
  patchstore::MontageOptions o;
  o.store = store;
  o.count = count;
  o.sampler = SamplerOptionsFrom(sampler);
  auto kind = patchstore::ParseLoaderKind(loader);
  if (!kind.ok()) throw py::value_error("montage: " + kind.status().message());
  o.loader = *kind;
  o.field = field;
  o.overlay = overlay;
  o.require_overlay = require_overlay;
  o.epoch = epoch;
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
  if (!with_windows) return py::make_tuple(img.height, img.width, pixels);
  py::list wins;
  for (const patchstore::Window& w : img.windows)
    wins.append(py::make_tuple(w.sample, w.y, w.x, static_cast<int>(w.flip), static_cast<int>(w.rot), w.positive));
  return py::make_tuple(img.height, img.width, pixels, wins, img.warnings);
  return py::make_tuple(img.height, img.width, pixels);
}

// RenderVolumeMontage: (height, width, bytearray of RGB bytes, (lo, hi) window used, items shown, warning).
py::tuple VolumeMontage(const std::string& store, int count, const std::string& field, const std::string& overlay,
                        const py::object& slices, uint64_t epoch, bool has_window, double lo, double hi, int tile,
                        bool labels) {
  patchstore::VolumeMontageOptions o;
  o.store = store;
  o.count = count;
  o.field = field;
  o.overlay = overlay;
  o.slices = patchstore_py::SliceOptionsFrom(slices);
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
  return py::make_tuple(m.image.height, m.image.width, pixels, py::make_tuple(m.window_lo, m.window_hi), m.items,
                        m.warning);
}

}  // namespace

PYBIND11_MODULE(_ingest, m) {
  m.doc() = "patchstore._ingest: compiled image and HDF5 volume ingest and export. Use patchstore.ingest_images /\n"
            "patchstore.ingest_hdf5 / patchstore.export.";

  py::class_<Progress>(m, "Progress", "Progress of an ingest or export: done of total items, plus bytes.")
      .def_readonly("done", &Progress::done)
      .def_readonly("total", &Progress::total)
      .def_readonly("failed", &Progress::failed)
      .def_readonly("skipped", &Progress::skipped)
      .def_readonly("bytes", &Progress::bytes)
      .def_readonly("seconds", &Progress::seconds)
      .def_readonly("message", &Progress::message,
                    "a notice to show as it is (e.g. the projected store size, before an ingest writes); \"\" for "
                    "a progress step")
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

  using IO = ImageIngestOptions;
  py::class_<IO> io(m, "ImageIngestOptions",
                    "patchstore::ImageIngestOptions (ingest/ingest.h): what `patchstore ingest images` takes.\n"
                    "Defaults are the C++ ones; patchstore.ingest_images fills one from its keywords.");
  io.def(py::init<>());
  py::list io_fields;
  BindField(io, io_fields, "store", &IO::store, "destination directory (created if missing)");
  BindField(io, io_fields, "manifest", &IO::manifest, "CSV manifest (or root + field_templates)");
  BindField(io, io_fields, "root", &IO::root, "root folder searched with field_templates");
  BindField(io, io_fields, "field_templates", &IO::field_templates, "[(field, path template), ...]");
  BindField(io, io_fields, "mask_fields", &IO::mask_fields, "fields stored as {0,1}");
  BindField(io, io_fields, "norm", &IO::norm, "{field: normalisation spec}");
  BindField(io, io_fields, "layout", &IO::layout, "\"rows\" | \"tiles\" (--layout)");
  BindField(io, io_fields, "tile_size", &IO::tile_size,
            "tile edge for layout tiles (--tile-size); 0: the default (a resumed store's own)");
  BindField(io, io_fields, "encoding", &IO::encoding, "--encoding specs: [\"compact\", \"depth=float16\", ...]");
  BindField(io, io_fields, "threads", &IO::threads, "decoder threads; 0 = all cores");
  BindField(io, io_fields, "skip_errors", &IO::skip_errors, "--on-error skip");
  BindField(io, io_fields, "report_path", &IO::report_path, "failures as TSV (--report)");
  BindField(io, io_fields, "batch_bytes", &IO::batch_bytes, "commit after this many bytes");
  BindField(io, io_fields, "batch_samples", &IO::batch_samples, "... or this many samples (--commit-every)");
  BindField(io, io_fields, "durable", &IO::durable, "fsync each commit (--no-sync: False)");
  BindField(io, io_fields, "max_pixels", &IO::max_pixels, "refuse larger declared images");
  BindField(io, io_fields, "isolate_decoders", &IO::isolate_decoders, "decode in child processes (not --in-process)");
  BindField(io, io_fields, "decode_timeout_s", &IO::decode_timeout_s, "seconds a file may decode (--decode-timeout)");
  BindField(io, io_fields, "shard_index", &IO::shard_index, "--shard I/N: this shard (I)");
  BindField(io, io_fields, "shard_count", &IO::shard_count, "--shard I/N: number of shards (N); 0 = no sharding");
  BindField(io, io_fields, "command_line", &IO::command_line, "recorded in the metadata");
  io.attr("_fields") = py::tuple(io_fields);
  io.def("__repr__", [](py::handle self) { return OptionsRepr(self, "ImageIngestOptions"); });

  using HO = Hdf5IngestOptions;
  py::class_<HO> ho(m, "Hdf5IngestOptions",
                    "patchstore::Hdf5IngestOptions (ingest/ingest_hdf5.h): what `patchstore ingest hdf5` takes.\n"
                    "Defaults are the C++ ones; patchstore.ingest_hdf5 fills one from its keywords.");
  ho.def(py::init<>());
  py::list ho_fields;
  BindField(ho, ho_fields, "files", &HO::files, "input .h5 files, ingested in this order");
  BindField(ho, ho_fields, "store", &HO::store, "destination directory (created if missing)");
  BindField(ho, ho_fields, "groups", &HO::groups, "\"PATH\" or \"PATH=FIELD\" per field (--group)");
  BindField(ho, ho_fields, "slice_axis", &HO::slice_axis, "source axis that indexes slices");
  BindField(ho, ho_fields, "ids", &HO::ids, "\"auto\" | \"stem\" | \"name\"");
  BindField(ho, ho_fields, "strict_ids", &HO::strict_ids, "refuse a patient under two file prefixes");
  BindField(ho, ho_fields, "mask_fields", &HO::mask_fields, "fields stored as masks (--mask)");
  BindField(ho, ho_fields, "norm", &HO::norm, "{field: normalisation spec}");
  BindField(ho, ho_fields, "allow_external", &HO::allow_external, "follow external links and storage");
  BindField(ho, ho_fields, "encoding", &HO::encoding, "--encoding specs: [\"compact\", \"MR=float16\", ...]");
  BindField(ho, ho_fields, "layout", &HO::layout, "\"rows\" only (\"tiles\" is refused for volumes)");
  BindField(ho, ho_fields, "tile_size", &HO::tile_size, "unused (volumes are stored in rows)");
  BindField(ho, ho_fields, "skip_errors", &HO::skip_errors, "--on-error skip");
  BindField(ho, ho_fields, "report_path", &HO::report_path, "failures as TSV (--report)");
  BindField(ho, ho_fields, "batch_bytes", &HO::batch_bytes, "commit after this many record bytes");
  BindField(ho, ho_fields, "slab_bytes", &HO::slab_bytes, "source bytes read per hyperslab");
  BindField(ho, ho_fields, "chunk_cache_bytes", &HO::chunk_cache_bytes, "HDF5 chunk cache per dataset");
  BindField(ho, ho_fields, "shard_index", &HO::shard_index, "--shard I/N: this shard (I)");
  BindField(ho, ho_fields, "shard_count", &HO::shard_count, "--shard I/N: number of shards (N); 0 = no sharding");
  BindField(ho, ho_fields, "durable", &HO::durable, "fsync each commit (--no-sync: False)");
  BindField(ho, ho_fields, "command_line", &HO::command_line, "recorded in the metadata");
  ho.attr("_fields") = py::tuple(ho_fields);
  ho.def("__repr__", [](py::handle self) { return OptionsRepr(self, "Hdf5IngestOptions"); });

  using VO = VolumeIngestOptions;
  py::class_<VO> vo(m, "VolumeIngestOptions",
                    "patchstore::VolumeIngestOptions (ingest/ingest_volumes.h): what `patchstore ingest volumes`\n"
                    "takes. Defaults are the C++ ones; patchstore.ingest_volumes fills one from its keywords.");
  vo.def(py::init<>());
  py::list vo_fields;
  BindField(vo, vo_fields, "store", &VO::store, "destination directory (created if missing)");
  BindField(vo, vo_fields, "manifest", &VO::manifest, "CSV manifest id,<field>,...");
  BindField(vo, vo_fields, "root", &VO::root, "root folder for the field templates");
  BindField(vo, vo_fields, "field_templates", &VO::field_templates, "[(field, template), ...]");
  BindField(vo, vo_fields, "slice_axis", &VO::slice_axis, "\"axial\" | \"coronal\" | \"sagittal\"");
  BindField(vo, vo_fields, "orient", &VO::orient, "\"\" or three letters (\"RAS\", \"LPS\", ...)");
  BindField(vo, vo_fields, "spacing", &VO::spacing, "[] or [X, Y, Z] mm: resample");
  BindField(vo, vo_fields, "interpolation", &VO::interpolation, "{field: \"nearest\" | \"linear\"}");
  BindField(vo, vo_fields, "series", &VO::series, "DICOM series to read (UID or number)");
  BindField(vo, vo_fields, "volume_index", &VO::volume_index, "4-D images: the volume to take (-1: refuse)");
  BindField(vo, vo_fields, "mask_fields", &VO::mask_fields, "fields stored as masks (--mask)");
  BindField(vo, vo_fields, "norm", &VO::norm, "{field: normalisation spec}");
  BindField(vo, vo_fields, "encoding", &VO::encoding, "--encoding specs");
  BindField(vo, vo_fields, "threads", &VO::threads, "decoder processes (0: all cores)");
  BindField(vo, vo_fields, "skip_errors", &VO::skip_errors, "--on-error skip");
  BindField(vo, vo_fields, "report_path", &VO::report_path, "failures as TSV (--report)");
  BindField(vo, vo_fields, "batch_bytes", &VO::batch_bytes, "commit after this many record bytes");
  BindField(vo, vo_fields, "durable", &VO::durable, "fsync each commit (--no-sync: False)");
  BindField(vo, vo_fields, "max_voxels", &VO::max_voxels, "refuse larger volumes (--max-voxels)");
  BindField(vo, vo_fields, "decode_timeout_s", &VO::decode_timeout_s, "seconds per volume and field");
  BindField(vo, vo_fields, "decode_memory_bytes", &VO::decode_memory_bytes, "per decoder process (0: 8 GiB)");
  BindField(vo, vo_fields, "shard_index", &VO::shard_index, "--shard I/N: this shard (I)");
  BindField(vo, vo_fields, "shard_count", &VO::shard_count, "--shard I/N: number of shards (N); 0 = no sharding");
  BindField(vo, vo_fields, "command_line", &VO::command_line, "recorded in the metadata");
  vo.attr("_fields") = py::tuple(vo_fields);
  vo.def("__repr__", [](py::handle self) { return OptionsRepr(self, "VolumeIngestOptions"); });
  m.def("ingest_volumes", &IngestVolumes, py::arg("options"), py::arg("progress") = py::none(),
        py::arg("cancel") = nullptr,
        "patchstore::IngestVolumes with the GIL released. Returns the IngestSummary as a dict.");
  m.def("volume_ingest_available", &patchstore::VolumeIngestAvailable,
        "Whether this build reads NIfTI, MetaImage, NRRD and DICOM through ITK.");

  m.def("ingest_images", &IngestImages, py::arg("options"), py::arg("progress") = py::none(),
        py::arg("cancel") = nullptr,
        "patchstore::IngestImages with the GIL released. Returns the IngestSummary as a dict.\n"
        "cancel: a CancelFlag polled between samples (RuntimeError once set: committed samples stay).");
  m.def("ingest_hdf5", &IngestHdf5, py::arg("options"), py::arg("progress") = py::none(), py::arg("cancel") = nullptr,
        "patchstore::IngestHdf5 with the GIL released. Returns the IngestSummary as a dict.\n"
        "cancel: a CancelFlag polled between volumes (RuntimeError once set: committed volumes stay).\n"
        "NotFound (a missing group or dataset) raises KeyError.");
  m.def("copy", &Copy, py::arg("src"), py::arg("dst"), py::arg("layout"), py::arg("tile_size"), py::arg("encoding"),
        py::arg("threads"), py::arg("durable"), py::arg("command_line"), py::arg("progress"),
        py::arg("verify_progress"), py::arg("cancel") = nullptr,
        "patchstore::CopyStore with the GIL released. Returns the CopySummary as a dict.\n"
        "cancel: a CancelFlag polled between samples of a conversion (RuntimeError once set: nothing at dst).");
  m.def("render_volume_montage", &VolumeMontage, py::arg("store"), py::arg("count"), py::arg("field"),
        py::arg("overlay"), py::arg("slices"), py::arg("epoch"), py::arg("has_window"), py::arg("lo"), py::arg("hi"),
        py::arg("tile"), py::arg("labels"),
        "patchstore::RenderVolumeMontage with the GIL released: (height, width, RGB bytearray, (lo, hi), items, "
        "warning). slices: a patchstore._patchstore.SliceOptions (fields [] = every field of the store).");
  m.def("render_montage", &Montage, py::arg("store"), py::arg("count"), py::arg("sampler"), py::arg("field"),
        py::arg("overlay"), py::arg("require_overlay"), py::arg("epoch"), py::arg("has_window"), py::arg("window_lo"),
        py::arg("window_hi"), py::arg("tile"), py::arg("loader") = "sampler", py::arg("with_windows") = false,
        "patchstore::RenderMontage with the GIL released: (height, width, bytearray of RGB bytes), and with\n"
        "with_windows also the windows shown as (sample, y, x, flip, rot, positive) tuples and the warnings.");
  m.def("export", &Export, py::arg("store"), py::arg("outdir"), py::arg("ids"), py::arg("fields"), py::arg("format"),
        py::arg("has_window"), py::arg("window_lo"), py::arg("window_hi"), py::arg("progress"),
        py::arg("axis_order") = "", py::arg("window_auto") = false,
        "patchstore::Export with the GIL released. Returns the ExportSummary as a dict.");
  m.def(
      "safe_relative_path", [](const py::bytes& id) { return py::bytes(patchstore::SafeRelativePath(id)); },
      py::arg("id"), "The relative path export writes sample `id` (bytes) under.");
}
