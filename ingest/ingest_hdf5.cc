// HDF5 volume ingest: the HDF5 source of the ingest driver
// (ingest/driver.h). It lists every file first (cheap metadata only: groups,
// datasets, virtual and external storage checked), then streams each volume
// straight into the record LMDB reserves for it (the records' fill reads the
// slabs at commit). All HDF5 calls run on the calling thread under
// hdf5::Hdf5Lock, so the driver decodes inline.
#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "ingest/checks.h"
#include "ingest/driver.h"
#include "ingest/encoding.h"
#include "ingest/hdf5_source.h"
#include "ingest/projection.h"
#include "ingest/volume_convert.h"
#include "patchstore/ingest/ingest_hdf5.h"
#include "patchstore/reader/reader.h"
#include "patchstore/store/store.h"

namespace patchstore {
namespace hdf5_ingest {

Status Hdf5Source::ParseOptions() {
  if (o_.store.empty()) return Status::InvalidArgument("ingest: no store path given");
  if (o_.files.empty()) return Status::InvalidArgument("ingest: no HDF5 file given");
  if (o_.groups.empty()) return Status::InvalidArgument("ingest: no --group given (e.g. --group MR --group CT)");
  for (const std::string& spec : o_.groups) {
    GroupSpec g;
    const size_t eq = spec.rfind('=');
    g.path = eq == std::string::npos ? spec : spec.substr(0, eq);
    if (eq != std::string::npos) {
      g.field = spec.substr(eq + 1);
    } else {
      g.field = g.path;
      while (!g.field.empty() && g.field.front() == '/') g.field.erase(0, 1);
      while (!g.field.empty() && g.field.back() == '/') g.field.pop_back();
    }
    if (!g.path.empty() && g.field.empty() && eq == std::string::npos)  // "/" or "//": nothing to name a field by
      return Status::InvalidArgument("ingest: --group '" + spec +
                                     "' is the root group, which gives no field name; "
                                     "name the field: --group " +
                                     spec + "=FIELD");
    if (g.path.empty() || g.field.empty())
      return Status::InvalidArgument("ingest: --group takes PATH or PATH=FIELD, got '" + spec + "'");
    for (const GroupSpec& h : groups_)
      if (h.field == g.field)
        return Status::InvalidArgument("ingest: two --group options give field '" + g.field + "'");
    groups_.push_back(g);
  }
  if (o_.slice_axis < -3 || o_.slice_axis > 2)
    return Status::InvalidArgument("ingest: --slice-axis " + std::to_string(o_.slice_axis) +
                                   " is not an axis of a 3D dataset (0, 1, 2 or -1, -2, -3)");
  axis_ = o_.slice_axis < 0 ? o_.slice_axis + 3 : o_.slice_axis;
  if (o_.ids == "auto") prefix_ids_ = o_.files.size() > 1;
  else if (o_.ids == "stem") prefix_ids_ = true;
  else if (o_.ids == "name") prefix_ids_ = false;
  else return Status::InvalidArgument("ingest: --ids must be auto, stem or name, got '" + o_.ids + "'");
  if (prefix_ids_) {
    std::map<std::string, std::string> stems;
    for (const std::string& f : o_.files) {
      const std::string stem = std::filesystem::path(f).stem().string();
      auto [it, fresh] = stems.emplace(stem, f);
      if (!fresh)
        return Status::InvalidArgument("ingest: files '" + it->second + "' and '" + f + "' have the same stem '" +
                                       stem + "', so their sample ids would collide");
    }
  }
  auto has_field = [&](const std::string& f) {
    return std::any_of(groups_.begin(), groups_.end(), [&](const GroupSpec& g) { return g.field == f; });
  };
  for (const std::string& m : o_.mask_fields)
    if (!has_field(m)) return Status::InvalidArgument("ingest: --mask names field '" + m + "', which no --group gives");
  for (const auto& [f, spec] : o_.norm) {
    if (!has_field(f)) return Status::InvalidArgument("ingest: --norm names field '" + f + "', which no --group gives");
    auto check = ParseNormalization(spec, 255.0);
    if (!check.ok()) return check.status().WithContext("ingest: --norm for field '" + f + "'");
  }
  {
    std::vector<std::string> fields;
    for (const GroupSpec& g : groups_) fields.push_back(g.field);
    PS_ASSIGN_OR_RETURN(encoding_, ParseEncodings(o_.encoding));
    Status st = CheckEncodingFields(encoding_, fields);
    if (!st.ok()) return Status::InvalidArgument(st.message() + " (fields come from --group)");
    if (o_.layout == "tiles")
      return Status::InvalidArgument("ingest hdf5: --layout tiles is for image frames; a volume slice is read whole, "
                                     "as one contiguous range of its (S,H,W) record, so tiles would not help "
                                     "(use the default --layout rows)");
    PS_RETURN_IF_ERROR(ParseLayout(o_.layout, o_.tile_size).status());
  }
  if (o_.slab_bytes == 0 || o_.batch_bytes == 0)
    return Status::InvalidArgument("ingest: slab_bytes and batch_bytes must be positive");
  return Status::OK();
}

// ---------------------------------------------------------------------------
// Streaming one dataset into its (S, H, W) float32 record.

Status Hdf5Source::ReadVolume(const VolumeSource& v, void* dst) {
  const int a = v.axis;
  int o1 = -1, o2 = -1;
  for (int i = 0; i < 3; ++i)
    if (i != a) (o1 < 0 ? o1 : o2) = i;
  const uint64_t S = v.dims[a], H = v.dims[o1], W = v.dims[o2];
  const uint64_t per_slice = H * W * v.type.mem_size;
  // Slabs of whole chunks along the slice axis: each chunk is decompressed
  // by exactly one H5Dread.
  const uint64_t unit = v.chunk[a] > 0 ? v.chunk[a] : 1;
  uint64_t n = std::max<uint64_t>(1, o_.slab_bytes / std::max<uint64_t>(1, unit * per_slice)) * unit;
  n = std::min(n, S);
  Hid filespace(H5Dget_space(v.dataset.get()), H5Sclose);
  if (!filespace.valid()) return Status::Corruption("reading " + v.describe + ": " + TakeErrorStack());
  ValueCheck check(v.describe, "dataset", v.type.source, v.norm, v.norm_spec);
  for (uint64_t s0 = 0; s0 < S; s0 += n) {
    const uint64_t ns = std::min(n, S - s0);
    std::array<hsize_t, 3> start{0, 0, 0}, count = v.dims;
    start[a] = s0;
    count[a] = ns;
    if (H5Sselect_hyperslab(filespace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) < 0)
      return Status::Internal("selecting slices of " + v.describe + ": " + TakeErrorStack());
    Hid memspace(H5Screate_simple(3, count.data(), nullptr), H5Sclose);
    const uint64_t bytes = ns * per_slice;
    if (slab_.size() * sizeof(uint64_t) < bytes) {
      slab_.clear();
      slab_.shrink_to_fit();
      slab_.resize((bytes + 7) / 8);
    }
    if (H5Dread(v.dataset.get(), v.type.memtype.get(), memspace.get(), filespace.get(), H5P_DEFAULT, slab_.data()) < 0)
      return Status::Corruption("reading slices [" + std::to_string(s0) + ", " + std::to_string(s0 + ns) + ") of " +
                                v.describe + ": " + TakeErrorStack());
    // Element strides of the slab (C order over `count`).
    std::array<int64_t, 3> stride{static_cast<int64_t>(count[1] * count[2]), static_cast<int64_t>(count[2]), 1};
    const int64_t sk = stride[a], sh = stride[o1], sw = stride[o2];
    void* out = static_cast<uint8_t*>(dst) + s0 * H * W * DTypeSize(v.dtype);
    const int64_t nsi = static_cast<int64_t>(ns), Hi = static_cast<int64_t>(H), Wi = static_cast<int64_t>(W);
    using M = NumericType::Mem;
    auto convert = [&](auto type) {
      return CheckAndConvertSlab<decltype(type)>(&check, slab_.data(), nsi, Hi, Wi, sk, sh, sw, v.norm, v.dtype, out);
    };
    Status st;
    switch (v.type.mem) {
      case M::kInt8: st = convert(int8_t{}); break;
      case M::kUInt8: st = convert(uint8_t{}); break;
      case M::kInt16: st = convert(int16_t{}); break;
      case M::kUInt16: st = convert(uint16_t{}); break;
      case M::kInt32: st = convert(int32_t{}); break;
      case M::kUInt32: st = convert(uint32_t{}); break;
      case M::kInt64: st = convert(int64_t{}); break;
      case M::kUInt64: st = convert(uint64_t{}); break;
      case M::kFloat: st = convert(float{}); break;
      case M::kDouble: st = convert(double{}); break;
    }
    if (!st.ok()) return st.WithContext("reading " + v.describe);
  }
  for (std::string& w : check.Finish()) Warn(std::move(w));
  return Status::OK();
}

Result<std::vector<std::shared_ptr<Hdf5Source::VolumeSource>>> Hdf5Source::OpenVolume(const Item& item) {
  if (open_file_index_ != item.file) {
    open_file_.reset();
    open_file_index_ = SIZE_MAX;
    PS_ASSIGN_OR_RETURN(Hid f, OpenFile(item.file));
    open_file_ = std::make_shared<Hid>(std::move(f));
    open_file_index_ = item.file;
  }
  std::vector<std::shared_ptr<VolumeSource>> out;
  for (size_t g = 0; g < groups_.size(); ++g) {
    auto v = std::make_shared<VolumeSource>();
    v->file = open_file_;
    v->describe = Describe(item, g);
    guard_.target.clear();
    hid_t id = -1;
    if (item.patient_file) {
      id = H5Dopen2(open_file_->get(), groups_[g].path.c_str(), dapl_.get());
    } else {
      PS_ASSIGN_OR_RETURN(v->group, OpenGroup(open_file_->get(), item.file, g));
      guard_.target.clear();
      id = H5Dopen2(v->group.get(), item.name.c_str(), dapl_.get());
    }
    if (id < 0) return Status::Corruption("opening " + v->describe + ": " + TakeErrorStack());
    v->dataset = Hid(id, H5Dclose);
    if (o_.allow_external) {
      // A dataset whose data lives in external raw files is reopened with the
      // prefix ${ORIGIN}, so relative names resolve from the HDF5 file's
      // folder (as CheckExternalSegments checks them), not the working
      // directory. Only those: HDF5 refuses to open one dataset with two
      // prefixes, and a virtual dataset opens its sources with the default.
      Hid dcpl(H5Dget_create_plist(v->dataset.get()), H5Pclose);
      if (dcpl.valid() && H5Pget_external_count(dcpl.get()) > 0) {
        v->dataset = Hid(-1, H5Dclose);
        id = item.patient_file ? H5Dopen2(open_file_->get(), groups_[g].path.c_str(), ext_dapl_.get())
                               : H5Dopen2(v->group.get(), item.name.c_str(), ext_dapl_.get());
        if (id < 0) return Status::Corruption("opening " + v->describe + ": " + TakeErrorStack());
        v->dataset = Hid(id, H5Dclose);
      }
    }
    // The file may have changed since it was listed: check again.
    DatasetInfo now = Inspect(v->dataset.get(), v->describe);
    if (!now.status.ok()) return now.status;
    if (now.dims != item.fields[g].dims || now.source != item.fields[g].source)
      return Status::IOError("reading " + v->describe + ": the file changed during the ingest");
    Hid type(H5Dget_type(v->dataset.get()), H5Tclose);
    PS_ASSIGN_OR_RETURN(v->type, hdf5::MapNumericType(type.get()));
    v->dims = now.dims;
    v->chunk = now.chunk;
    v->axis = axis_;
    v->norm = item.norms[g];
    v->norm_spec = item.norm_specs[g];
    v->dtype = item.dtypes[g];
    out.push_back(std::move(v));
  }
  return out;
}

Status Hdf5Source::Plan(std::vector<IngestUnit>* units) {
  guard_.allow = o_.allow_external;
  lapl_ = Hid(H5Pcreate(H5P_LINK_ACCESS), H5Pclose);
  dapl_ = Hid(H5Pcreate(H5P_DATASET_ACCESS), H5Pclose);
  if (!lapl_.valid() || !dapl_.valid()) return Status::Internal("creating HDF5 property lists: " + TakeErrorStack());
  H5Pset_elink_cb(lapl_.get(), ElinkCallback, &guard_);
  H5Pset_elink_cb(dapl_.get(), ElinkCallback, &guard_);
  // External raw files named relatively are read from the HDF5 file's folder,
  // not the working directory (CheckExternalSegments checks them there).
  ext_dapl_ = Hid(H5Pcopy(dapl_.get()), H5Pclose);
  if (!ext_dapl_.valid() || H5Pset_efile_prefix(ext_dapl_.get(), "${ORIGIN}") < 0)
    return Status::Internal("creating HDF5 property lists: " + TakeErrorStack());
  // The slab reads cover whole chunks, so the cache only has to hold the
  // chunks of one read; w0 = 1 evicts fully read chunks first.
  H5Pset_chunk_cache(dapl_.get(), 12421, o_.chunk_cache_bytes, 1.0);

  // List every file (metadata only).
  for (size_t f = 0; f < o_.files.size(); ++f) ScanFile(f, &items_);
  if (items_.empty()) return Status::NotFound("ingest: no dataset found in the given groups of the given files");
  {
    std::map<std::string, size_t> seen;
    std::vector<std::string> clashes;  // ids two files give (--ids name, or per-patient stems)
    for (Item& it : items_) {
      if (it.name.empty()) continue;
      auto [pos, fresh] = seen.emplace(it.id, it.file);
      if (!fresh && it.status.ok() && pos->second != it.file)
        clashes.push_back("'" + it.id + "' in '" + o_.files[pos->second] + "' and '" + o_.files[it.file] + "'");
      if (!fresh && it.status.ok())
        it.status = Status::AlreadyExists(
            (it.patient_file ? "reading per-patient file '" + o_.files[it.file] + "'"
                             : "reading dataset '" + it.name + "' of '" + o_.files[it.file] + "'") +
            ": id '" + it.id + "' is already used by '" + o_.files[pos->second] +
            (it.patient_file ? "' (a per-patient file's id is its file stem: rename one of the files)"
                             : "' (use --ids stem to prefix ids with the file name)"));
    }
    // --strict-ids: found before anything is written, as the prefix checks are.
    if (o_.strict_ids && !clashes.empty()) {
      std::string shown;
      for (size_t i = 0; i < clashes.size() && i < 3; ++i) shown += (i ? "; " : "") + clashes[i];
      return Status::InvalidArgument("ingest: --strict-ids: " + std::to_string(clashes.size()) +
                                     " id(s) given by two files (" + shown + (clashes.size() > 3 ? "; ..." : "") +
                                     "): the same patient twice, or two patients under one id; nothing was "
                                     "written (use --ids stem to prefix ids with the file name)");
    }
  }

  // A first file that cannot be read stops the ingest before the store is
  // created or touched.
  if (!o_.skip_errors && items_.front().name.empty())
    return items_.front().status.WithContext("ingest into '" + o_.store + "' stopped after 0 new volumes");
  if (o_.skip_errors && !o_.report_path.empty()) PS_RETURN_IF_ERROR(CheckReportPath(o_.report_path));
  PS_RETURN_IF_ERROR(CheckIdsAcrossFiles());
  CheckSliceAxis();
  // Ids were assigned and checked over all files; unreadable files (no
  // name) are kept by every shard: every shard must report them.
  for (const Item& it : items_) {
    IngestUnit u;
    u.id = it.id;
    u.file = o_.files[it.file];
    u.status = it.status;
    u.every_shard = it.name.empty();
    units->push_back(std::move(u));
  }
  return Status::OK();
}

// Opens the store with a map large enough for everything listed, so that
// LMDB rarely has to grow it (each growth re-reads a batch).
uint64_t Hdf5Source::MapBytes(const std::vector<size_t>& units) const {
  uint64_t estimate = 0;
  for (size_t i : units) estimate += items_[i].bytes + groups_.size() * 8192;
  std::error_code ec;
  const uint64_t existing = std::filesystem::file_size(std::filesystem::path(o_.store) / "data.mdb", ec);
  return std::max<uint64_t>(uint64_t{1} << 30, (ec ? 0 : existing) + estimate + estimate / 8 + (uint64_t{64} << 20));
}

Status Hdf5Source::Prepare(StoreMeta* meta) {
  auto axis_attr = meta->attributes.find("slice_axis");
  if (axis_attr != meta->attributes.end() && axis_attr->second != std::to_string(axis_))
    return Status::InvalidArgument("ingest into '" + o_.store + "': the store holds volumes sliced along source axis " +
                                   axis_attr->second + ", not " + std::to_string(axis_) +
                                   " (use the same --slice-axis or a new store)");
  if (!meta->fields.empty()) {
    std::string have, want;
    for (const FieldMeta& f : meta->fields) have += (have.empty() ? "" : ",") + f.name;
    for (const GroupSpec& g : groups_) want += (want.empty() ? "" : ",") + g.field;
    if (have != want)
      return Status::InvalidArgument("ingest into '" + o_.store + "': the store has fields " + have +
                                     " but this ingest gives " + want + " (same --group options in the same order)");
  }
  // A resumed ingest must normalise each field as the first one did.
  for (const GroupSpec& g : groups_) {
    auto n = o_.norm.find(g.field);
    const bool mask = std::find(o_.mask_fields.begin(), o_.mask_fields.end(), g.field) != o_.mask_fields.end();
    PS_RETURN_IF_ERROR(CheckResumeSetting(meta, o_.store, "norm." + g.field,
                                          n != o_.norm.end() ? n->second
                                          : mask             ? "default (mask: binary)"
                                                             : "default",
                                          "--norm of field '" + g.field + "'"));
  }
  // ... and store each field in the same dtype.
  PS_RETURN_IF_ERROR(CheckResumeEncoding(*meta, o_.store, encoding_, 0));
  meta->attributes["slice_axis"] = std::to_string(axis_);
  meta->attributes["source_format"] = "hdf5";
  for (const GroupSpec& g : groups_) meta->attributes["hdf5_group." + g.field] = g.path;
  return Status::OK();
}

// The store's size from the datasets' headers, before the first write
// (ingest/projection.h).
bool Hdf5Source::Project(const std::vector<size_t>& units, StoreProjector* projector) const {
  for (size_t i : units) {
    const Item& it = items_[i];
    if (it.name.empty() || !it.status.ok()) continue;
    std::vector<ProjectedRecord> records;
    for (size_t g = 0; g < groups_.size(); ++g) {
      ProjectedRecord r;
      r.field = groups_[g].field;
      r.header.layout = Layout::kSHW;
      r.header.rank = 3;
      r.header.shape = {it.shw[0], it.shw[1], it.shw[2], 0};
      r.header.dtype = it.dtypes[g];
      r.header.source_type = it.fields[g].source;
      r.header.norm = it.norms[g];
      records.push_back(std::move(r));
    }
    projector->Add(records, 1, it.id.size());
  }
  return true;
}

// Opens the volume's datasets; their slabs are read by the records' fill,
// straight into the records LMDB reserves, when the driver commits.
DecodedUnit Hdf5Source::Decode(size_t index, int /*slot*/, BufferPool* /*buffers*/) {
  const Item& item = items_[index];
  DecodedUnit out;
  out.bytes = item.bytes;
  auto opened = OpenVolume(item);
  if (!opened.ok()) {
    out.status = opened.status();
    out.failed_file = o_.files[item.file];
    return out;
  }
  const std::vector<std::shared_ptr<VolumeSource>> sources = std::move(opened).value();
  for (size_t g = 0; g < groups_.size(); ++g) {
    UnitField u;
    u.path = o_.files[item.file];
    u.describe = Describe(item, g);
    FieldMeta& fm = u.meta;
    fm.name = groups_[g].field;
    fm.channels = 1;
    fm.layout = Layout::kSHW;
    fm.source_type = item.fields[g].source;
    fm.norm = item.norms[g];
    fm.dtype = item.dtypes[g];
    fm.is_mask = std::find(o_.mask_fields.begin(), o_.mask_fields.end(), fm.name) != o_.mask_fields.end();
    fm.source_format = "hdf5";
    u.header.layout = Layout::kSHW;
    u.header.rank = 3;
    u.header.shape = {item.shw[0], item.shw[1], item.shw[2], 0};
    u.header.norm = item.norms[g];
    u.header.source_type = item.fields[g].source;
    u.header.dtype = item.dtypes[g];
    std::string lower = groups_[g].field;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const bool mask_like = lower.find("mask") != std::string::npos || lower == "seg" || lower == "label" || fm.is_mask;
    const uint64_t elements = item.shw[0] * item.shw[1] * item.shw[2];
    const std::string what = "volume '" + item.id + "': field '" + groups_[g].field + "' (" + u.describe + ")";
    RecordHeader hdr = u.header;  // for the all-zero check: the payload as readers see it
    hdr.payload_bytes = elements * DTypeSize(hdr.dtype);
    std::shared_ptr<VolumeSource> src = sources[g];
    u.fill = [this, src, mask_like, hdr, what](void* dst) -> Status {
      PS_RETURN_IF_ERROR(ReadVolume(*src, dst));
      if (mask_like && AllZeroAfterNorm(hdr, dst))
        Warn(what + " is all zero: an empty mask (require= and --overlay find nothing in it)");
      return Status::OK();
    };
    out.fields.push_back(std::move(u));
  }
  return out;
}

Status Hdf5Source::CheckIdsAcrossFiles() {
  if (!prefix_ids_) return Status::OK();
  // name -> the prefixed ids it has, in the store and in this ingest.
  std::map<std::string, std::set<std::string>> by_name;
  std::set<std::string> stored, fresh;  // ids in the store; new ids of this ingest
  auto name_of = [](const std::string& id) {
    const size_t slash = id.find('/');
    return slash == std::string::npos ? id : id.substr(slash + 1);
  };
  if (std::filesystem::exists(std::filesystem::path(o_.store) / "data.mdb")) {
    auto reader = Reader::Open(o_.store);
    if (reader.ok())
      for (uint64_t i = 0; i < (*reader)->size(); ++i) {
        const std::string id((*reader)->id(i));
        by_name[name_of(id)].insert(id);
        stored.insert(id);
      }
  }
  for (const Item& it : items_)
    if (!it.name.empty() && it.status.ok()) {
      by_name[it.name].insert(it.id);
      if (!stored.count(it.id)) fresh.insert(it.id);
    }
  std::vector<std::string> dups;  // names that this ingest would store under a second prefix
  for (const auto& [name, ids] : by_name)
    if (ids.size() > 1 && std::any_of(ids.begin(), ids.end(), [&](const std::string& id) { return fresh.count(id); })) {
      std::string list;
      for (const std::string& id : ids) list += (list.empty() ? "'" : ", '") + id + "'";
      dups.push_back("dataset '" + name + "' would be stored " + std::to_string(ids.size()) + " times, as " + list);
    }
  if (dups.empty()) return Status::OK();
  std::string shown;
  for (size_t i = 0; i < dups.size() && i < 3; ++i) shown += (i ? "; " : "") + dups[i];
  std::string msg = std::to_string(dups.size()) + " patient name(s) would be stored under several file prefixes (" +
                    shown + (dups.size() > 3 ? "; ..." : "") +
                    "): the same patient twice, or on both sides of a train/validation split by id. To add new "
                    "patients to a store, list only the new file, or use --ids name (ids without the file prefix; "
                    "present ones are skipped)";
  if (o_.strict_ids) return Status::InvalidArgument("ingest: --strict-ids: " + msg);
  Warn(msg);
  return Status::OK();
}

void Hdf5Source::CheckSliceAxis() {
  // The plane of slices along axis a of dims d, as (rows, columns).
  auto plane = [](const std::array<hsize_t, 3>& d, int a) {
    int o[2], k = 0;
    for (int i = 0; i < 3; ++i)
      if (i != a) o[k++] = i;
    return std::pair<uint64_t, uint64_t>(d[o[0]], d[o[1]]);
  };
  auto aspect = [](std::pair<uint64_t, uint64_t> p) {
    return static_cast<double>(std::max(p.first, p.second)) /
           static_cast<double>(std::max<uint64_t>(1, std::min(p.first, p.second)));
  };
  size_t count = 0;
  std::string example;
  for (const Item& it : items_) {
    if (it.name.empty() || !it.status.ok() || it.fields.empty()) continue;
    const auto& d = it.fields[0].dims;
    const auto now = plane(d, axis_);
    if (aspect(now) < 2) continue;
    int best = axis_;
    for (int a = 0; a < 3; ++a)
      if (aspect(plane(d, a)) < aspect(plane(d, best))) best = a;
    if (best == axis_ || aspect(plane(d, best)) > 1.5) continue;
    if (count++ == 0) {
      const auto alt = plane(d, best);
      example = "'" + it.id + "' " + ShapeString(d) + " gives " + std::to_string(d[axis_]) + " slices of " +
                std::to_string(now.first) + "x" + std::to_string(now.second) + " along --slice-axis " +
                std::to_string(axis_) + "; --slice-axis " + std::to_string(best) + " would give " +
                std::to_string(d[best]) + " slices of " + std::to_string(alt.first) + "x" + std::to_string(alt.second);
    }
  }
  if (count)
    Warn(std::to_string(count) +
         " volume(s) have slices much thinner in one direction than another slice axis "
         "would give (" +
         example + "): check the layout of the data ((S,H,W) datasets need --slice-axis 0)");
}

}  // namespace hdf5_ingest

Result<IngestSummary> IngestHdf5(const Hdf5IngestOptions& o) {
  DriverOptions d;
  if (o.store.empty()) return Status::InvalidArgument("ingest: no store path given");
  d.store = o.store;
  d.shard_index = o.shard_index;
  d.shard_count = o.shard_count;
  PS_RETURN_IF_ERROR(CheckShardOption(d));  // before anything is read
  hdf5::Hdf5Lock lock;                      // held until the source (declared after it) is gone
  hdf5_ingest::Hdf5Source source(o);
  PS_RETURN_IF_ERROR(source.ParseOptions());
  std::vector<IngestUnit> units;
  PS_RETURN_IF_ERROR(source.Plan(&units));
  d.writer.kind = "volumes";
  d.writer.durable = o.durable;
  d.command_line = o.command_line;
  d.inline_decode = true;
  d.batch_bytes = o.batch_bytes;
  d.batch_samples = 256;
  d.skip_errors = o.skip_errors;
  d.report_path = o.report_path;
  d.frames = false;
  d.noun = "volumes";
  d.progress = o.progress;
  d.cancelled = o.cancelled;
  return RunIngest(d, std::move(units), &source);
}

}  // namespace patchstore
