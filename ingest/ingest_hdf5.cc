// HDF5 volume ingest: list every file first (cheap metadata only), then
// stream each volume straight into the record LMDB reserves for it. All HDF5
// calls run on the calling thread under hdf5::Hdf5Lock.
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "ingest/checks.h"
#include "ingest/encoding.h"
#include "ingest/hdf5_internal.h"
#include "ingest/projection.h"
#include "ingest/volume_convert.h"
#include "patchstore/ingest/ingest_hdf5.h"
#include "patchstore/reader/reader.h"
#include "patchstore/store/store.h"

namespace patchstore {
namespace {

using hdf5::Hid;
using hdf5::NumericType;
using hdf5::TakeErrorStack;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

std::string ShapeString(const std::array<hsize_t, 3>& d, int rank = 3) {
  std::string s;
  for (int i = 0; i < rank; ++i) s += (i ? "x" : "") + std::to_string(d[i]);
  return s;
}

struct GroupSpec {
  std::string path;   // as given, e.g. "MR" or "/data/MR"
  std::string field;  // field name in the store
};

// Refuses (or allows) traversal of external links; remembers the target so
// the error can name it.
struct ElinkGuard {
  bool allow = false;
  std::string target;
};

herr_t ElinkCallback(const char* /*parent_file*/, const char* /*parent_group*/, const char* child_file,
                     const char* child_object, unsigned* /*acc_flags*/, hid_t /*fapl*/, void* op_data) {
  auto* g = static_cast<ElinkGuard*>(op_data);
  g->target = std::string(child_file ? child_file : "?") + ":" + (child_object ? child_object : "?");
  return g->allow ? 0 : -1;
}

// Virtual datasets: HDF5 resolves a virtual dataset's sources only when it
// reads, fills what it cannot find with the fill value (silently), and
// recurses without bound through a source that maps back to itself (a
// crash). So before reading, walk the source mappings ourselves: every
// source file and dataset must exist, and no chain of sources may reach a
// dataset already on it. Objects are identified by (file number, address).
using ObjectKey = std::pair<unsigned long, haddr_t>;
constexpr int kMaxVirtualDepth = 16;

std::string StringFrom(const std::function<ssize_t(char*, size_t)>& get) {
  const ssize_t n = get(nullptr, 0);
  if (n <= 0) return "";
  std::string s(static_cast<size_t>(n) + 1, '\0');
  get(&s[0], s.size());
  s.resize(static_cast<size_t>(n));
  return s;
}

// Where HDF5 1.10 looks for a virtual source file: HDF5_VDS_PREFIX, the
// folder of the file holding the virtual dataset, then the name as given.
std::vector<std::string> VirtualSourceCandidates(const std::string& vds_file, const std::string& name) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  const fs::path p(name);
  const std::string rel = p.is_absolute() ? p.filename().string() : name;
  if (p.is_absolute()) out.push_back(name);
  if (const char* prefix = std::getenv("HDF5_VDS_PREFIX"); prefix && *prefix)
    out.push_back((fs::path(prefix) / rel).string());
  out.push_back((fs::path(vds_file).parent_path() / rel).string());
  if (!p.is_absolute()) out.push_back(name);
  return out;
}

// True when every link on `path` exists (so H5Dopen2 would find it).
bool LinkPathExists(hid_t file, const std::string& path) {
  std::string prefix;  // paths are taken from the root group, as HDF5 does for virtual sources
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t slash = path.find('/', pos);
    if (slash == std::string::npos) slash = path.size();
    const std::string part = path.substr(pos, slash - pos);
    if (!part.empty() && part != ".") {
      prefix += "/" + part;
      if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    }
    pos = slash + 1;
  }
  return true;
}

Status CheckVirtualSources(hid_t ds, const std::string& what, std::set<ObjectKey>* chain, int depth) {
  H5O_info_t oi;
  if (H5Oget_info2(ds, &oi, H5O_INFO_BASIC) < 0) return Status::Corruption("reading " + what + ": " + TakeErrorStack());
  const ObjectKey key{oi.fileno, oi.addr};
  const std::string here = StringFrom([&](char* b, size_t n) { return H5Fget_name(ds, b, n); });
  const std::string self = StringFrom([&](char* b, size_t n) { return H5Iget_name(ds, b, n); });
  if (!chain->insert(key).second)
    return Status::InvalidArgument("reading " + what + ": its virtual dataset sources lead back to '" + self +
                                   "' in '" + here + "' (a cycle); refused");
  if (depth > kMaxVirtualDepth)
    return Status::InvalidArgument("reading " + what + ": virtual datasets nested more than " +
                                   std::to_string(kMaxVirtualDepth) + " deep; refused");
  Hid dcpl(H5Dget_create_plist(ds), H5Pclose);
  if (!dcpl.valid()) return Status::Corruption("reading " + what + ": " + TakeErrorStack());
  if (H5Pget_layout(dcpl.get()) == H5D_VIRTUAL) {
    size_t count = 0;
    if (H5Pget_virtual_count(dcpl.get(), &count) < 0)
      return Status::Corruption("reading " + what + ": " + TakeErrorStack());
    for (size_t i = 0; i < count; ++i) {
      const std::string file = StringFrom(
          [&](char* b, size_t n) { return H5Pget_virtual_filename(dcpl.get(), i, b, n); });
      const std::string dset = StringFrom(
          [&](char* b, size_t n) { return H5Pget_virtual_dsetname(dcpl.get(), i, b, n); });
      const std::string mapping = "virtual source " + std::to_string(i) + " ('" + file + "':'" + dset + "')";
      if (file.find('%') != std::string::npos || dset.find('%') != std::string::npos)
        return Status::Unsupported("reading " + what + ": " + mapping +
                                   " uses a printf-style name (unlimited mapping), which is not supported");
      Hid src_file;
      if (file == ".") {
        src_file = Hid(H5Iget_file_id(ds), H5Fclose);
      } else {
        std::string found;
        for (const std::string& c : VirtualSourceCandidates(here, file)) {
          struct stat sb;
          if (::stat(c.c_str(), &sb) == 0) {
            if (!S_ISREG(sb.st_mode))
              return Status::InvalidArgument("reading " + what + ": " + mapping + ": '" + c +
                                             "' is not a regular file");
            found = c;
            break;
          }
        }
        if (found.empty())
          return Status::NotFound("reading " + what + ": " + mapping +
                                  ": the source file is missing (HDF5 would "
                                  "read fill values in its place); refused");
        src_file = Hid(H5Fopen(found.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
        if (!src_file.valid())
          return Status::Corruption("reading " + what + ": " + mapping + ": opening '" + found +
                                    "': " + TakeErrorStack());
      }
      if (!src_file.valid()) return Status::Corruption("reading " + what + ": " + TakeErrorStack());
      if (!LinkPathExists(src_file.get(), dset))
        return Status::NotFound("reading " + what + ": " + mapping +
                                ": the source dataset is missing (HDF5 would "
                                "read fill values in its place); refused");
      Hid src(H5Dopen2(src_file.get(), dset.c_str(), H5P_DEFAULT), H5Dclose);
      if (!src.valid()) return Status::Corruption("reading " + what + ": " + mapping + ": " + TakeErrorStack());
      PS_RETURN_IF_ERROR(CheckVirtualSources(src.get(), what, chain, depth + 1));
    }
  }
  chain->erase(key);
  return Status::OK();
}

struct LinkEntry {
  std::string name;
  H5L_type_t type;
  size_t val_size;
};

herr_t ListLink(hid_t /*group*/, const char* name, const H5L_info_t* info, void* data) {
  static_cast<std::vector<LinkEntry>*>(data)->push_back(
      LinkEntry{name, info->type, info->type == H5L_TYPE_HARD ? 0 : info->u.val_size});
  return 0;
}

// What one dataset of one group looks like (metadata only).
struct DatasetInfo {
  Status status;  // why it cannot be ingested
  std::array<hsize_t, 3> dims{};
  std::array<hsize_t, 3> chunk{};  // all 0 when not chunked
  SourceType source = SourceType::kUnknown;
  std::string type_name;
};

// One volume to ingest (or the failure found while listing it).
struct Item {
  size_t file = 0;
  std::string name;           // dataset name (file stem for a per-patient file); empty for a file-level failure
  bool patient_file = false;  // the --group paths name this file's datasets (one file, one volume)
  std::string id;
  Status status;
  std::array<uint64_t, 3> shw{};
  std::vector<DatasetInfo> fields;  // one per group
  std::vector<Normalization> norms;
  std::vector<std::string> norm_specs;  // the user's text of each norm (messages)
  std::vector<DType> dtypes;            // record dtype per field (RecordDType)
  uint64_t bytes = 0;                   // record payload of all fields
};

class Hdf5Ingest {
 public:
  explicit Hdf5Ingest(const Hdf5IngestOptions& o) : o_(o) {}
  Result<IngestSummary> Run();

 private:
  Status ParseOptions();
  std::string DescribeDataset(size_t file, size_t group, const std::string& name) const {
    return "dataset '" + name + "' in group '" + groups_[group].path + "' of '" + o_.files[file] + "'";
  }
  // A per-patient file's dataset is the --group path itself.
  std::string DescribeRootDataset(size_t file, size_t group) const {
    return "dataset '" + groups_[group].path + "' of '" + o_.files[file] + "'";
  }
  std::string Describe(const Item& item, size_t group) const {
    return item.patient_file ? DescribeRootDataset(item.file, group) : DescribeDataset(item.file, group, item.name);
  }
  Result<Hid> OpenFile(size_t file);
  // The object at --group path `group` (a group or, in a per-patient file, a
  // dataset); OpenGroup also requires a group.
  Result<Hid> OpenObject(hid_t file_id, size_t file, size_t group);
  Result<Hid> OpenGroup(hid_t file_id, size_t file, size_t group);
  // What the root of a file holds ("group 'MR' (2 members), dataset 'x'
  // (int16 4x5x6)") and the two layouts accepted, for errors.
  std::string DescribeRoot(hid_t file_id) const;
  void ScanPatientFile(size_t file, const std::vector<Hid>& datasets, std::vector<Item>* items);
  void SizeItem(Item* item) const;  // shw, record dtypes and bytes of a listed volume
  DatasetInfo Inspect(hid_t ds, const std::string& what);
  void ScanFile(size_t file, std::vector<Item>* items);
  Status ResolveNorms(Item* item);

  // Streaming.
  struct VolumeSource {
    std::shared_ptr<Hid> file;
    Hid group, dataset;
    NumericType type;
    std::array<hsize_t, 3> dims{}, chunk{};
    int axis = 2;
    Normalization norm;
    std::string norm_spec;          // as the user wrote it (messages)
    DType dtype = DType::kFloat32;  // of the record
    std::string describe;
  };
  struct PendingState {
    Status fill_error;
    bool counted = false;
  };
  struct Pending {
    size_t item = 0;
    SampleInput input;
    std::shared_ptr<PendingState> state;
  };
  Result<std::vector<std::shared_ptr<VolumeSource>>> OpenVolume(const Item& item);
  Status ReadVolume(const VolumeSource& v, void* dst);
  // The values of one slab as read (`n` elements of v.type.mem), before
  // they are converted into the record: 32/64-bit integers raise `*largest`
  // to their largest magnitude (float32 rounds those above 2^24: noted once
  // per dataset, as for images); float values must stay finite under a
  // normalisation, which runs in float32 (refused as for each float image's
  // own range; the type's extremes say nothing for float sources), and
  // float64 values beyond float32 with no normalisation are noted once
  // (`*beyond`): they are stored as +-inf.
  Status CheckSlabValues(const VolumeSource& v, const void* slab, uint64_t n, uint64_t* largest, bool* beyond);
  Status Flush();
  void RecordFailure(const Item& item, const Status& st);
  // Issue-17 checks on the listed volumes, before anything is written.
  Status CheckIdsAcrossFiles();
  void CheckSliceAxis();
  void Warn(std::string message) {
    if (summary_.warnings.size() < 100) summary_.warnings.push_back(std::move(message));
  }
  void ReportProgress();

  const Hdf5IngestOptions& o_;
  EncodingPlan encoding_;
  std::vector<GroupSpec> groups_;
  int axis_ = 2;
  bool prefix_ids_ = false;
  Hid lapl_;      // link access: external-link guard
  Hid dapl_;      // dataset access: guard + chunk cache
  Hid ext_dapl_;  // the same, for datasets with external raw files: their names resolve from the file's folder
  ElinkGuard guard_;

  std::unique_ptr<Writer> writer_;
  // Shard ingests: every id's position in the whole input (checks.h InputOrdinals).
  std::shared_ptr<std::unordered_map<std::string, uint64_t>> input_ordinals_;
  std::vector<Item> items_;
  std::vector<size_t> todo_;
  IngestSummary summary_;
  Clock::time_point start_;
  uint64_t done_ = 0;
  std::vector<Pending> batch_;
  uint64_t batch_bytes_ = 0;
  std::shared_ptr<Hid> open_file_;
  size_t open_file_index_ = SIZE_MAX;
  std::vector<uint64_t> slab_;             // source slab buffer (uint64 for alignment)
  std::unique_ptr<FailureReport> report_;  // --on-error skip (checks.h)
};

Status Hdf5Ingest::ParseOptions() {
  if (o_.store.empty()) return Status::InvalidArgument("ingest: no store path given");
  if (o_.shard_count > 0 || o_.shard_index > 0) {
    StoreMeta probe;  // validates I/N before anything is read
    PS_RETURN_IF_ERROR(CheckShard(&probe, o_.store, o_.shard_index, o_.shard_count));
  }
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

Result<Hid> Hdf5Ingest::OpenFile(size_t file) {
  const std::string& path = o_.files[file];
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::NotFound("opening HDF5 file '" + path + "': no such file");
    return Status::FromErrno("opening HDF5 file '" + path + "'", errno);
  }
  if (S_ISDIR(st.st_mode)) return Status::InvalidArgument("opening HDF5 file '" + path + "': is a directory");
  if (!S_ISREG(st.st_mode))  // a FIFO would block H5Fopen forever
    return Status::InvalidArgument("opening HDF5 file '" + path + "': it is " +
                                   (S_ISFIFO(st.st_mode)   ? "a FIFO"
                                    : S_ISSOCK(st.st_mode) ? "a socket"
                                                           : "a device") +
                                   ", not a regular file");
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
#if H5_VERSION_GE(1, 10, 7)
  // Keep HDF5's file locking, but do not fail on file systems without locks.
  H5Pset_file_locking(fapl.get(), true, true);
#endif
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
  if (id < 0) return Status::Corruption("opening HDF5 file '" + path + "': " + TakeErrorStack());
  return Hid(id, H5Fclose);
}

Result<Hid> Hdf5Ingest::OpenGroup(hid_t file_id, size_t file, size_t group) {
  PS_ASSIGN_OR_RETURN(Hid obj, OpenObject(file_id, file, group));
  if (H5Iget_type(obj.get()) != H5I_GROUP)
    return Status::InvalidArgument("opening group '" + groups_[group].path + "' in '" + o_.files[file] +
                                   "': not a group");
  return obj;
}

Result<Hid> Hdf5Ingest::OpenObject(hid_t file_id, size_t file, size_t group) {
  const std::string& path = groups_[group].path;
  const std::string what = "opening group '" + path + "' in '" + o_.files[file] + "'";
  guard_.target.clear();
  hid_t id = H5Oopen(file_id, path.c_str(), lapl_.get());
  if (id < 0) {
    std::string cause = TakeErrorStack();
    if (!guard_.target.empty())
      return Status::Unsupported(what + ": it is reached through an external link to '" + guard_.target +
                                 "'; refused (pass --allow-external to follow external links)");
    // Walk the path to tell a missing group from a damaged one.
    std::string prefix;
    size_t pos = 0;
    bool missing = false;
    while (pos <= path.size()) {
      size_t slash = path.find('/', pos);
      if (slash == std::string::npos) slash = path.size();
      std::string part = path.substr(pos, slash - pos);
      if (!part.empty()) {
        prefix += "/" + part;
        htri_t e = H5Lexists(file_id, prefix.c_str(), lapl_.get());
        if (e == 0) {
          missing = true;
          break;
        }
        if (e < 0) break;
      }
      pos = slash + 1;
    }
    H5Eclear2(H5E_DEFAULT);
    if (missing) return Status::NotFound(what + ": no such group or dataset");
    return Status::Corruption(what + ": " + cause);
  }
  return Hid(id, H5Oclose);
}

constexpr const char* kLayouts =
    "Accepted layouts: (1) every --group names a group holding one 3D dataset per patient (/MR/patient001, "
    "/CT/patient001, ...; ids are the dataset names), or (2) one file per patient, every --group naming a 3D "
    "dataset (/MR, /CT, /MASK at the root; the volume's id is the file stem)";

std::string Hdf5Ingest::DescribeRoot(hid_t file_id) const {
  constexpr size_t kMaxShown = 20;
  Hid root(H5Gopen2(file_id, "/", H5P_DEFAULT), H5Gclose);
  std::vector<LinkEntry> links;
  hsize_t idx = 0;
  if (!root.valid() || H5Literate(root.get(), H5_INDEX_NAME, H5_ITER_INC, &idx, ListLink, &links) < 0) {
    H5Eclear2(H5E_DEFAULT);
    return "Its root group cannot be listed. " + std::string(kLayouts);
  }
  std::string out;
  for (size_t i = 0; i < links.size() && i < kMaxShown; ++i) {
    const LinkEntry& l = links[i];
    std::string d;
    if (l.type == H5L_TYPE_EXTERNAL) {
      d = "external link '" + l.name + "'";
    } else {
      hid_t id = H5Oopen(root.get(), l.name.c_str(), lapl_.get());
      if (id < 0) {
        d = (l.type == H5L_TYPE_SOFT ? "soft link '" : "unreadable object '") + l.name + "'";
      } else {
        Hid obj(id, H5Oclose);
        const H5I_type_t t = H5Iget_type(obj.get());
        if (t == H5I_GROUP) {
          H5G_info_t gi;
          d = "group '" + l.name + "'";
          if (H5Gget_info(obj.get(), &gi) >= 0) d += " (" + std::to_string(gi.nlinks) + " members)";
        } else if (t == H5I_DATASET) {
          d = "dataset '" + l.name + "' (";
          Hid type(H5Dget_type(obj.get()), H5Tclose);
          auto nt = type.valid() ? hdf5::MapNumericType(type.get()) : Result<NumericType>(Status::Corruption(""));
          d += nt.ok() ? nt->describe : "non-numeric";
          Hid space(H5Dget_space(obj.get()), H5Sclose);
          const int rank = space.valid() ? H5Sget_simple_extent_ndims(space.get()) : -1;
          if (rank == 0) d += " scalar";
          else if (rank > 0 && rank <= 32) {
            std::vector<hsize_t> dims(static_cast<size_t>(rank));
            H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
            std::string shape;
            for (hsize_t x : dims) shape += (shape.empty() ? "" : "x") + std::to_string(x);
            d += " " + shape;
          }
          d += ")";
        } else {
          d = "named datatype '" + l.name + "'";
        }
      }
    }
    out += (out.empty() ? "" : ", ") + d;
  }
  H5Eclear2(H5E_DEFAULT);
  if (links.size() > kMaxShown) out += " and " + std::to_string(links.size() - kMaxShown) + " more";
  return "The file holds at its root: " + (out.empty() ? std::string("nothing") : out) + ". " + kLayouts;
}

// External raw storage (H5Pset_external): every segment's file must exist
// and hold the bytes the dataset reads from it, or HDF5 would read the
// missing part as zeros. Relative names resolve as HDF5 resolves them when
// reading (the dataset access list sets the prefix ${ORIGIN}): from
// HDF5_EXTFILE_PREFIX when that is set, else from the HDF5 file's folder.
static Status CheckExternalSegments(hid_t ds, hid_t dcpl, int count, uint64_t needed, const std::string& what) {
  namespace fs = std::filesystem;
  const std::string h5 = StringFrom([&](char* b, size_t n) { return H5Fget_name(ds, b, n); });
  const char* env = std::getenv("HDF5_EXTFILE_PREFIX");
  const std::string origin = fs::path(h5).parent_path().string();
  const std::string prefix = env && *env && std::string(env) != "${ORIGIN}" ? std::string(env) : origin;
  uint64_t remaining = needed;
  for (int i = 0; i < count && remaining > 0; ++i) {
    char name[4096] = {0};
    off_t offset = 0;
    hsize_t size = 0;
    if (H5Pget_external(dcpl, static_cast<unsigned>(i), sizeof name - 1, name, &offset, &size) < 0)
      return Status::Corruption("reading " + what + ": external raw file segment " + std::to_string(i) + ": " +
                                TakeErrorStack());
    const uint64_t take = std::min<uint64_t>(remaining, size);  // H5F_UNLIMITED: the rest
    remaining -= take;
    const fs::path raw = fs::path(name).is_absolute() || prefix.empty() ? fs::path(name) : fs::path(prefix) / name;
    const std::string where = "its external raw file '" + std::string(name) + "' (segment " + std::to_string(i) +
                              ", looked for at '" + raw.string() + "'" +
                              (fs::path(name).is_absolute() ? "" : ", relative to the folder of '" + h5 + "'") + ")";
    std::error_code ec;
    const uint64_t have = fs::file_size(raw, ec);
    if (ec) return Status::NotFound("reading " + what + ": " + where + " cannot be read: " + ec.message());
    const uint64_t end = static_cast<uint64_t>(offset) + take;
    if (have < end)
      return Status::Corruption("reading " + what + ": " + where + " holds " + std::to_string(have) +
                                " bytes; the dataset reads bytes " + std::to_string(offset) + ".." +
                                std::to_string(end) + " of it (the file is shorter than the dataset declares)");
  }
  if (remaining > 0)
    return Status::Corruption("reading " + what + ": its external raw file segments hold " +
                              std::to_string(needed - remaining) + " of the " + std::to_string(needed) +
                              " bytes the dataset declares");
  return Status::OK();
}

DatasetInfo Hdf5Ingest::Inspect(hid_t ds, const std::string& what) {
  DatasetInfo info;
  auto fail = [&](Status st) {
    info.status = std::move(st);
    return info;
  };
  Hid space(H5Dget_space(ds), H5Sclose);
  if (!space.valid()) return fail(Status::Corruption("reading " + what + ": " + TakeErrorStack()));
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) return fail(Status::Corruption("reading " + what + ": " + TakeErrorStack()));
  if (rank != 3) {
    std::string shape;
    if (rank > 0 && rank <= 32) {
      std::vector<hsize_t> d(rank);
      H5Sget_simple_extent_dims(space.get(), d.data(), nullptr);
      for (int i = 0; i < rank; ++i) shape += (i ? "x" : "") + std::to_string(d[i]);
    } else {
      shape = "scalar";
    }
    return fail(Status::InvalidArgument("reading " + what + ": rank " + std::to_string(rank) + " (shape " + shape +
                                        "), expected 3 (a volume)"));
  }
  H5Sget_simple_extent_dims(space.get(), info.dims.data(), nullptr);
  for (hsize_t d : info.dims)
    if (d == 0)
      return fail(Status::InvalidArgument("reading " + what + ": empty (shape " + ShapeString(info.dims) + ")"));
  Hid type(H5Dget_type(ds), H5Tclose);
  if (!type.valid()) return fail(Status::Corruption("reading " + what + ": " + TakeErrorStack()));
  auto nt = hdf5::MapNumericType(type.get());
  if (!nt.ok()) return fail(nt.status().WithContext("reading " + what));
  info.source = nt->source;
  info.type_name = nt->describe;
  Hid dcpl(H5Dget_create_plist(ds), H5Pclose);
  if (!dcpl.valid()) return fail(Status::Corruption("reading " + what + ": " + TakeErrorStack()));
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_VIRTUAL && !o_.allow_external)
    return fail(Status::Unsupported("reading " + what +
                                    ": a virtual dataset (its data lives in other files); refused (pass "
                                    "--allow-external to read it)"));
  if (layout == H5D_VIRTUAL) {
    std::set<ObjectKey> chain;
    Status vst = CheckVirtualSources(ds, what, &chain, 0);
    H5Eclear2(H5E_DEFAULT);
    if (!vst.ok()) return fail(vst);
  }
  const int external = H5Pget_external_count(dcpl.get());
  if (external > 0 && !o_.allow_external) {
    char name[512] = {0};
    off_t offset = 0;
    hsize_t size = 0;
    H5Pget_external(dcpl.get(), 0, sizeof name - 1, name, &offset, &size);
    return fail(Status::Unsupported("reading " + what + ": its data is stored in external raw file(s) ('" +
                                    std::string(name) + "'); refused (pass --allow-external to read it)"));
  }
  if (external > 0) {
    uint64_t needed = H5Tget_size(type.get());
    for (hsize_t d : info.dims) needed *= d;
    Status est = CheckExternalSegments(ds, dcpl.get(), external, needed, what);
    H5Eclear2(H5E_DEFAULT);
    if (!est.ok()) return fail(est);
  }
  if (layout == H5D_CHUNKED) {
    if (H5Pget_chunk(dcpl.get(), 3, info.chunk.data()) != 3)
      return fail(Status::Corruption("reading " + what + ": bad chunk layout: " + TakeErrorStack()));
  }
  const int nfilters = H5Pget_nfilters(dcpl.get());
  for (int i = 0; i < nfilters; ++i) {
    unsigned flags = 0, config = 0;
    size_t nelem = 0;
    char name[128] = {0};
    H5Z_filter_t id = H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &nelem, nullptr, sizeof name - 1,
                                     name, &config);
    if (id < 0) return fail(Status::Corruption("reading " + what + ": " + TakeErrorStack()));
    if (H5Zfilter_avail(id) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      std::string n = name[0] ? name : "unnamed";
      if (id == 32000) n = "lzf";
      return fail(Status::Unsupported("reading " + what + ": compressed with filter '" + n + "' (id " +
                                      std::to_string(id) +
                                      "), which this HDF5 library cannot decode (install its plugin and set "
                                      "HDF5_PLUGIN_PATH, or rewrite the file with gzip)"));
    }
  }
  // Size: S*H*W float32 values must fit one record.
  uint64_t n = 1;
  for (hsize_t d : info.dims) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n) || n > kMaxPayloadBytes / 4)
      return fail(Status::InvalidArgument("reading " + what + ": shape " + ShapeString(info.dims) +
                                          " is too large for one record"));
  }
  return info;
}

// Lists the datasets of every group of one file and turns them into items.
void Hdf5Ingest::ScanFile(size_t file, std::vector<Item>* items) {
  auto file_failure = [&](Status st) {
    Item it;
    it.file = file;
    it.status = std::move(st);
    items->push_back(std::move(it));
  };
  auto fh = OpenFile(file);
  if (!fh.ok()) return file_failure(fh.status());
  // Each file is judged on its own: every --group path a group (one dataset
  // per patient in each) or every one a dataset (the file is one patient).
  std::vector<Hid> objects;
  std::string group_paths, dataset_paths;
  for (size_t g = 0; g < groups_.size(); ++g) {
    auto oh = OpenObject(fh->get(), file, g);
    if (!oh.ok()) {
      if (oh.status().code() == Code::kNotFound)
        return file_failure(Status::NotFound(oh.status().message() + ". " + DescribeRoot(fh->get())));
      return file_failure(oh.status());
    }
    const H5I_type_t t = H5Iget_type(oh->get());
    if (t == H5I_GROUP) group_paths += (group_paths.empty() ? "'" : ", '") + groups_[g].path + "'";
    else if (t == H5I_DATASET) dataset_paths += (dataset_paths.empty() ? "'" : ", '") + groups_[g].path + "'";
    else
      return file_failure(Status::InvalidArgument("opening group '" + groups_[g].path + "' in '" + o_.files[file] +
                                                  "': neither a group nor a dataset. " + DescribeRoot(fh->get())));
    objects.push_back(std::move(oh).value());
  }
  if (group_paths.empty()) return ScanPatientFile(file, objects, items);
  if (!dataset_paths.empty())
    return file_failure(Status::InvalidArgument(
        "reading '" + o_.files[file] + "': --group " + group_paths + " name groups but " + dataset_paths +
        " name datasets; a file is either layout, not both. " + DescribeRoot(fh->get())));
  std::vector<std::map<std::string, DatasetInfo>> found(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    const Hid* gh = &objects[g];
    std::vector<LinkEntry> links;
    hsize_t idx = 0;
    if (H5Literate(gh->get(), H5_INDEX_NAME, H5_ITER_INC, &idx, ListLink, &links) < 0)
      return file_failure(Status::Corruption("listing group '" + groups_[g].path + "' in '" + o_.files[file] +
                                             "': " + TakeErrorStack()));
    for (const LinkEntry& l : links) {
      const std::string what = DescribeDataset(file, g, l.name);
      if (l.type == H5L_TYPE_EXTERNAL && !o_.allow_external) {
        std::string target = "?";
        std::vector<char> buf(l.val_size + 1, 0);
        const char* efile = nullptr;
        const char* eobj = nullptr;
        unsigned flags = 0;
        if (H5Lget_val(gh->get(), l.name.c_str(), buf.data(), buf.size(), H5P_DEFAULT) >= 0 &&
            H5Lunpack_elink_val(buf.data(), l.val_size, &flags, &efile, &eobj) >= 0 && efile && eobj)
          target = std::string(efile) + ":" + eobj;
        H5Eclear2(H5E_DEFAULT);
        DatasetInfo info;
        info.status = Status::Unsupported("reading " + what + ": an external link to '" + target +
                                          "'; refused (pass --allow-external to follow external links)");
        found[g][l.name] = info;
        continue;
      }
      guard_.target.clear();
      hid_t id = H5Oopen(gh->get(), l.name.c_str(), lapl_.get());
      if (id < 0) {
        std::string cause = TakeErrorStack();
        DatasetInfo info;
        if (!guard_.target.empty())
          info.status = Status::Unsupported("reading " + what + ": reached through an external link to '" +
                                            guard_.target +
                                            "'; refused (pass --allow-external to follow external links)");
        else if (l.type == H5L_TYPE_SOFT)
          info.status = Status::NotFound("reading " + what + ": a soft link to nothing (" + cause + ")");
        else info.status = Status::Corruption("reading " + what + ": " + cause);
        found[g][l.name] = info;
        continue;
      }
      Hid obj(id, H5Oclose);
      if (H5Iget_type(obj.get()) != H5I_DATASET) continue;  // subgroups, named types: not volumes
      found[g][l.name] = Inspect(obj.get(), what);
    }
  }
  std::set<std::string> names;
  for (const auto& m : found)
    for (const auto& [n, info] : m) names.insert(n);
  const std::string prefix = prefix_ids_ ? std::filesystem::path(o_.files[file]).stem().string() + "/" : "";
  for (const std::string& name : names) {
    Item it;
    it.file = file;
    it.name = name;
    it.id = prefix + name;
    for (size_t g = 0; g < groups_.size() && it.status.ok(); ++g) {
      auto f = found[g].find(name);
      if (f == found[g].end()) {
        // Name a group that has it, so the message says where it was seen.
        std::string seen;
        for (size_t h = 0; h < groups_.size(); ++h)
          if (found[h].count(name)) seen += (seen.empty() ? "'" : ", '") + groups_[h].path + "'";
        it.status = Status::NotFound("reading " + DescribeDataset(file, g, name) + ": missing (present in group " +
                                     seen + ")");
        break;
      }
      if (!f->second.status.ok()) {
        it.status = f->second.status;
        break;
      }
      if (!it.fields.empty() && f->second.dims != it.fields[0].dims) {
        it.status = Status::InvalidArgument("reading " + DescribeDataset(file, g, name) + ": shape " +
                                            ShapeString(f->second.dims) + " differs from " +
                                            ShapeString(it.fields[0].dims) + " in group '" + groups_[0].path + "'");
        break;
      }
      it.fields.push_back(f->second);
    }
    if (it.status.ok()) it.status = ResolveNorms(&it);
    if (it.status.ok()) SizeItem(&it);
    items->push_back(std::move(it));
  }
}

// A per-patient file: the datasets at the --group paths are one volume,
// whose id is the file stem (under every --ids scheme: there is no dataset
// name to prefix).
void Hdf5Ingest::ScanPatientFile(size_t file, const std::vector<Hid>& datasets, std::vector<Item>* items) {
  Item it;
  it.file = file;
  it.patient_file = true;
  it.name = std::filesystem::path(o_.files[file]).stem().string();
  it.id = it.name;
  for (size_t g = 0; g < groups_.size() && it.status.ok(); ++g) {
    DatasetInfo info = Inspect(datasets[g].get(), DescribeRootDataset(file, g));
    if (!info.status.ok()) {
      it.status = info.status;
      break;
    }
    if (!it.fields.empty() && info.dims != it.fields[0].dims) {
      it.status = Status::InvalidArgument("reading " + DescribeRootDataset(file, g) + ": shape " +
                                          ShapeString(info.dims) + " differs from " + ShapeString(it.fields[0].dims) +
                                          " of dataset '" + groups_[0].path + "'");
      break;
    }
    it.fields.push_back(info);
  }
  if (it.status.ok()) it.status = ResolveNorms(&it);
  if (it.status.ok()) SizeItem(&it);
  items->push_back(std::move(it));
}

void Hdf5Ingest::SizeItem(Item* it) const {
  const auto& d = it->fields[0].dims;
  int other[2], k = 0;
  for (int i = 0; i < 3; ++i)
    if (i != axis_) other[k++] = i;
  it->shw = {d[axis_], d[other[0]], d[other[1]]};
  it->bytes = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    it->dtypes.push_back(RecordDType(encoding_.For(groups_[g].field), it->fields[g].source, it->norms[g]));
    it->bytes += it->shw[0] * it->shw[1] * it->shw[2] * DTypeSize(it->dtypes[g]);
  }
}

Status Hdf5Ingest::ResolveNorms(Item* item) {
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string& field = groups_[g].field;
    const bool mask = std::find(o_.mask_fields.begin(), o_.mask_fields.end(), field) != o_.mask_fields.end();
    auto it = o_.norm.find(field);
    const std::string spec = it != o_.norm.end() ? it->second : mask ? "binary" : "none";
    PS_ASSIGN_OR_RETURN(Normalization n,
                        ResolveVolumeNorm(spec, mask, item->fields[g].source, item->fields[g].type_name, field,
                                          "reading " + Describe(*item, g)));
    item->norms.push_back(n);
    item->norm_specs.push_back(spec);
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------
// Streaming one dataset into its (S, H, W) float32 record.

namespace {

// Largest magnitude of n integers.
template <typename T>
uint64_t LargestMagnitude(const T* x, uint64_t n) {
  uint64_t m = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t a = x[i] < 0 ? uint64_t{0} - static_cast<uint64_t>(x[i]) : static_cast<uint64_t>(x[i]);
    m = std::max(m, a);
  }
  return m;
}

// The range of the finite values among n floats; false when there is none.
template <typename T>
bool FiniteRangeOf(const T* x, uint64_t n, double* lo, double* hi) {
  double a = INFINITY, b = -INFINITY;
  for (uint64_t i = 0; i < n; ++i)
    if (std::isfinite(x[i])) {
      a = std::min(a, static_cast<double>(x[i]));
      b = std::max(b, static_cast<double>(x[i]));
    }
  *lo = a;
  *hi = b;
  return a <= b;
}

std::string ShowDouble(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

}  // namespace

Status Hdf5Ingest::CheckSlabValues(const VolumeSource& v, const void* slab, uint64_t n, uint64_t* largest,
                                   bool* beyond) {
  using M = NumericType::Mem;
  switch (v.type.mem) {
    case M::kInt32: *largest = std::max(*largest, LargestMagnitude(static_cast<const int32_t*>(slab), n)); break;
    case M::kUInt32: *largest = std::max(*largest, LargestMagnitude(static_cast<const uint32_t*>(slab), n)); break;
    case M::kInt64: *largest = std::max(*largest, LargestMagnitude(static_cast<const int64_t*>(slab), n)); break;
    case M::kUInt64: *largest = std::max(*largest, LargestMagnitude(static_cast<const uint64_t*>(slab), n)); break;
    case M::kFloat:
    case M::kDouble: {
      double lo = 0, hi = 0;
      const bool any = v.type.mem == M::kFloat ? FiniteRangeOf(static_cast<const float*>(slab), n, &lo, &hi)
                                               : FiniteRangeOf(static_cast<const double*>(slab), n, &lo, &hi);
      if (!any) break;
      const std::string values = std::string(SourceTypeName(v.type.source)) + " value of this dataset";
      if (v.norm.kind == NormKind::kNone && !v.norm.clamp) {
        // No normalisation: float64 values beyond float32 become +-inf, as
        // NumPy's astype(float32) makes them; said, not refused (the user
        // asked for no transform, and NaN/inf are data elsewhere too).
        for (double x : {lo, hi})
          if (!std::isfinite(v.norm.Apply(x)) && !*beyond) {
            *beyond = true;
            Warn(v.describe + ": its " + SourceTypeName(v.type.source) + " value " + ShowDouble(x) +
                 " is beyond float32 (largest 3.40282347e+38), which records hold, and is stored as " +
                 (x < 0 ? "-inf" : "inf") +
                 " (as NumPy's astype(float32)); map the field into float32 with --norm FIELD=range:LO,HI "
                 "(computed in float64; the other normalisations take the value as float32 first)");
          }
        break;
      }
      Status st = CheckNormalizationOn(v.norm, lo, hi, false, v.norm_spec, values);
      if (!st.ok()) return st.WithContext("reading " + v.describe);
      break;
    }
    default: break;
  }
  return Status::OK();
}

Status Hdf5Ingest::ReadVolume(const VolumeSource& v, void* dst) {
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
  uint64_t largest = 0;  // of 32/64-bit integer values (float32 rounds above 2^24)
  bool beyond = false;   // a float64 value beyond float32 was reported
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
    PS_RETURN_IF_ERROR(CheckSlabValues(v, slab_.data(), ns * H * W, &largest, &beyond));
    // Element strides of the slab (C order over `count`).
    std::array<int64_t, 3> stride{static_cast<int64_t>(count[1] * count[2]), static_cast<int64_t>(count[2]), 1};
    const int64_t sk = stride[a], sh = stride[o1], sw = stride[o2];
    void* out = static_cast<uint8_t*>(dst) + s0 * H * W * DTypeSize(v.dtype);
    const int64_t nsi = static_cast<int64_t>(ns), Hi = static_cast<int64_t>(H), Wi = static_cast<int64_t>(W);
    using M = NumericType::Mem;
    switch (v.type.mem) {
      case M::kInt8: ConvertSlab<int8_t>(slab_.data(), nsi, Hi, Wi, sk, sh, sw, v.norm, v.dtype, out); break;
      case M::kUInt8: ConvertSlab<uint8_t>(slab_.data(), nsi, Hi, Wi, sk, sh, sw, v.norm, v.dtype, out); break;
      case M::kInt16: ConvertSlab<int16_t>(slab_.data(), nsi, Hi, Wi, sk, sh, sw, v.norm, v.dtype, out); break;
      case M::kUInt16: ConvertSlab<uint16_t>(slab_.data(), nsi, Hi, Wi, sk, sh, sw, v.norm, v.dtype, out); break;
      case M::kInt32: ConvertSlab<int32_t>(slab_.data(), nsi, Hi, Wi, sk, sh, sw, v.norm, v.dtype, out); break;
      case M::kUInt32: ConvertSlab<uint32_t>(slab_.data(), nsi, Hi, Wi, sk, sh, sw, v.norm, v.dtype, out); break;
      case M::kInt64: ConvertSlab<int64_t>(slab_.data(), nsi, Hi, Wi, sk, sh, sw, v.norm, v.dtype, out); break;
      case M::kUInt64: ConvertSlab<uint64_t>(slab_.data(), nsi, Hi, Wi, sk, sh, sw, v.norm, v.dtype, out); break;
      case M::kFloat: ConvertSlab<float>(slab_.data(), nsi, Hi, Wi, sk, sh, sw, v.norm, v.dtype, out); break;
      case M::kDouble: ConvertSlab<double>(slab_.data(), nsi, Hi, Wi, sk, sh, sw, v.norm, v.dtype, out); break;
    }
  }
  if (largest > (uint64_t{1} << 24))
    Warn(v.describe + ": " + SourceTypeName(v.type.source) + " values up to " + std::to_string(largest) +
         " exceed 2^24 = 16777216 and are rounded to the nearest float32 (e.g. 16777217 is stored as 16777216)");
  return Status::OK();
}

Result<std::vector<std::shared_ptr<Hdf5Ingest::VolumeSource>>> Hdf5Ingest::OpenVolume(const Item& item) {
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

void Hdf5Ingest::ReportProgress() {
  if (!o_.progress) return;
  Progress p;
  p.total = todo_.size();
  p.done = done_;
  p.failed = summary_.samples_failed;
  p.skipped = summary_.samples_present;
  p.bytes = summary_.bytes_decoded;
  p.seconds = Seconds(start_);
  o_.progress(p);
}

void Hdf5Ingest::RecordFailure(const Item& item, const Status& st) {
  ++done_;
  report_->Add(&summary_, item.id, o_.files[item.file], st);
  ReportProgress();
}

// Commits the batch. A volume whose data cannot be read is only found while
// LMDB calls its fill function; then the batch is written again without it
// (skip mode) or with the volumes before it only (stop mode: returns its
// error after committing them).
Status Hdf5Ingest::Flush() {
  Status stop;
  while (!batch_.empty()) {
    std::vector<SampleInput> inputs;
    inputs.reserve(batch_.size());
    for (const Pending& p : batch_) inputs.push_back(p.input);
    Status st = writer_->WriteBatch(inputs);
    if (st.ok()) {
      summary_.samples_written += batch_.size();
      for (const Pending& p : batch_) summary_.bytes_written += items_[p.item].bytes;
      batch_.clear();
      break;
    }
    size_t k = 0;
    while (k < batch_.size() && batch_[k].state->fill_error.ok()) ++k;
    if (k == batch_.size()) {  // not a source problem: the store failed
      batch_.clear();
      return st;
    }
    const Status bad = batch_[k].state->fill_error;
    const Item& item = items_[batch_[k].item];
    if (!o_.skip_errors) {
      batch_.resize(k);
      stop = bad;
      continue;
    }
    batch_.erase(batch_.begin() + static_cast<long>(k));
    RecordFailure(item, bad);
  }
  batch_bytes_ = 0;
  return stop;
}

Result<IngestSummary> Hdf5Ingest::Run() {
  start_ = Clock::now();
  PS_RETURN_IF_ERROR(ParseOptions());
  hdf5::Hdf5Lock lock;
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

  // 1. List every file (metadata only).
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
  // This shard's volumes (ids were assigned and checked over all files);
  // unreadable files (no name) stay: every shard must report them.
  input_ordinals_ = InputOrdinals(items_, o_.shard_count, [](const Item& it) -> std::string_view { return it.id; });
  if (o_.shard_count > 0) {
    std::vector<Item> kept;
    for (Item& it : items_)
      if (it.name.empty() || ShardOfId(it.id, o_.shard_count) == o_.shard_index) kept.push_back(std::move(it));
    items_.swap(kept);
  }

  // 2. Open the store with a map large enough for everything listed, so
  // that LMDB rarely has to grow it (each growth re-reads a batch).
  uint64_t estimate = 0;
  for (const Item& it : items_) estimate += it.bytes + groups_.size() * 8192;
  std::error_code ec;
  const uint64_t existing = std::filesystem::file_size(std::filesystem::path(o_.store) / "data.mdb", ec);
  WriterOptions wo;
  wo.kind = "volumes";
  wo.durable = o_.durable;
  wo.initial_map_size = std::max<uint64_t>(uint64_t{1} << 30,
                                           (ec ? 0 : existing) + estimate + estimate / 8 + (uint64_t{64} << 20));
  PS_ASSIGN_OR_RETURN(writer_, Writer::Open(o_.store, wo));
  StoreMeta& meta = writer_->mutable_meta();
  PS_RETURN_IF_ERROR(CheckShard(&meta, o_.store, o_.shard_index, o_.shard_count));
  auto axis_attr = meta.attributes.find("slice_axis");
  if (axis_attr != meta.attributes.end() && axis_attr->second != std::to_string(axis_))
    return Status::InvalidArgument("ingest into '" + o_.store + "': the store holds volumes sliced along source axis " +
                                   axis_attr->second + ", not " + std::to_string(axis_) +
                                   " (use the same --slice-axis or a new store)");
  if (!meta.fields.empty()) {
    std::string have, want;
    for (const FieldMeta& f : meta.fields) have += (have.empty() ? "" : ",") + f.name;
    for (const GroupSpec& g : groups_) want += (want.empty() ? "" : ",") + g.field;
    if (have != want)
      return Status::InvalidArgument("ingest into '" + o_.store + "': the store has fields " + have +
                                     " but this ingest gives " + want + " (same --group options in the same order)");
  }
  // A resumed ingest must normalise each field as the first one did.
  for (const GroupSpec& g : groups_) {
    auto n = o_.norm.find(g.field);
    const bool mask = std::find(o_.mask_fields.begin(), o_.mask_fields.end(), g.field) != o_.mask_fields.end();
    PS_RETURN_IF_ERROR(CheckResumeSetting(&meta, o_.store, "norm." + g.field,
                                          n != o_.norm.end() ? n->second
                                          : mask             ? "default (mask: binary)"
                                                             : "default",
                                          "--norm of field '" + g.field + "'"));
  }
  // ... and store each field in the same dtype.
  PS_RETURN_IF_ERROR(CheckResumeEncoding(meta, o_.store, encoding_, 0));
  report_ = std::make_unique<FailureReport>(o_.report_path.empty() ? o_.store + "/ingest-errors.tsv" : o_.report_path);
  if (o_.skip_errors) PS_RETURN_IF_ERROR(CheckReportPath(report_->path()));
  meta.attributes["slice_axis"] = std::to_string(axis_);
  meta.attributes["source_format"] = "hdf5";
  for (const GroupSpec& g : groups_) meta.attributes["hdf5_group." + g.field] = g.path;
  if (!o_.command_line.empty()) meta.attributes["ingest_command"] = o_.command_line;

  summary_.samples_total = items_.size();
  for (size_t i = 0; i < items_.size(); ++i) {
    if (!items_[i].name.empty() && writer_->Contains(items_[i].id)) ++summary_.samples_present;
    else todo_.push_back(i);
  }

  // The store's size from the datasets' headers, before the first write
  // (ingest/projection.h).
  {
    StoreProjector projector("ingest", /*frames=*/false);
    for (const Item& it : items_) {
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
      projector.Add(records, 1, it.id.size());
    }
    const StoreProjection proj = projector.Finish();
    summary_.projected_bytes = proj.bytes;
    summary_.ram_bytes = proj.ram_bytes;
    summary_.advice = proj.advice;
    if (o_.progress && proj.samples > 0) {
      Progress p;
      p.total = todo_.size();
      p.skipped = summary_.samples_present;
      p.seconds = Seconds(start_);
      p.message = proj.message;
      o_.progress(p);
    }
  }

  // 3. Stream.
  Status failure;
  for (size_t pos = 0; pos < todo_.size() && failure.ok(); ++pos) {
    if (o_.cancelled && o_.cancelled()) {
      // Nothing of the pending batch has been read yet: drop it, stop now.
      batch_.clear();
      failure = Status::Aborted("cancelled");
      break;
    }
    const size_t index = todo_[pos];
    const Item& item = items_[index];
    Status st = item.status;
    std::vector<std::shared_ptr<VolumeSource>> sources;
    if (st.ok()) {
      auto opened = OpenVolume(item);
      if (opened.ok()) sources = std::move(opened).value();
      else st = opened.status();
    }
    std::vector<uint16_t> field_index;
    for (size_t g = 0; g < groups_.size() && st.ok(); ++g) {
      FieldMeta fm;
      fm.name = groups_[g].field;
      fm.channels = 1;
      fm.layout = Layout::kSHW;
      fm.source_type = item.fields[g].source;
      fm.norm = item.norms[g];
      fm.dtype = item.dtypes[g];
      fm.is_mask = std::find(o_.mask_fields.begin(), o_.mask_fields.end(), fm.name) != o_.mask_fields.end();
      fm.source_format = "hdf5";
      auto fi = writer_->EnsureField(fm);
      if (!fi.ok()) st = fi.status().WithContext("ingesting " + Describe(item, g));
      else field_index.push_back(*fi);
    }
    if (!st.ok()) {
      if (!o_.skip_errors) {
        failure = st;
        break;
      }
      RecordFailure(item, st);
      continue;
    }
    Pending p;
    p.item = index;
    p.state = std::make_shared<PendingState>();
    p.input.id = item.id;
    for (size_t g = 0; g < groups_.size(); ++g) {
      RecordInput r;
      r.field = field_index[g];
      r.header.layout = Layout::kSHW;
      r.header.rank = 3;
      r.header.shape = {item.shw[0], item.shw[1], item.shw[2], 0};
      r.header.norm = item.norms[g];
      r.header.source_type = item.fields[g].source;
      r.header.dtype = item.dtypes[g];
      const bool last = g + 1 == groups_.size();
      std::shared_ptr<VolumeSource> src = sources[g];
      std::shared_ptr<PendingState> state = p.state;
      const uint64_t bytes = item.bytes;
      std::string lower = groups_[g].field;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      const bool mask_like = lower.find("mask") != std::string::npos || lower == "seg" || lower == "label" ||
                             std::find(o_.mask_fields.begin(), o_.mask_fields.end(), groups_[g].field) !=
                                 o_.mask_fields.end();
      const uint64_t elements = item.shw[0] * item.shw[1] * item.shw[2];
      const std::string what = "volume '" + item.id + "': field '" + groups_[g].field + "' (" + Describe(item, g) + ")";
      RecordHeader hdr = r.header;  // for the all-zero check: the payload as readers see it
      hdr.payload_bytes = elements * DTypeSize(hdr.dtype);
      r.fill = [this, src, state, last, bytes, mask_like, hdr, what](void* dst) -> Status {
        Status s = ReadVolume(*src, dst);
        if (!s.ok()) {
          state->fill_error = s;
          return s;
        }
        if (mask_like) {
          if (AllZeroAfterNorm(hdr, dst))
            Warn(what + " is all zero: an empty mask (require= and --overlay find nothing in it)");
        }
        if (last && !state->counted) {
          state->counted = true;
          ++done_;
          summary_.bytes_decoded += bytes;
          ReportProgress();
        }
        return Status::OK();
      };
      p.input.records.push_back(std::move(r));
    }
    batch_.push_back(std::move(p));
    batch_bytes_ += item.bytes;
    if (batch_bytes_ >= o_.batch_bytes || batch_.size() >= 256) failure = Flush();
  }
  // Commit what was listed before a failure: those volumes are complete.
  Status st = Flush();
  if (failure.ok() && !st.ok()) failure = st;
  open_file_.reset();
  report_->Close(&summary_);
  ReportProgress();
  summary_.seconds = Seconds(start_);
  if (!failure.ok())
    return failure.WithContext("ingest into '" + o_.store + "' stopped after " +
                               std::to_string(summary_.samples_written) + " new volumes");
  if (summary_.samples_failed == 0 && !writer_->meta().sealed)
    PS_RETURN_IF_ERROR(writer_->Seal(OrdinalLookup(input_ordinals_)));
  return summary_;
}

Status Hdf5Ingest::CheckIdsAcrossFiles() {
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

void Hdf5Ingest::CheckSliceAxis() {
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

}  // namespace

Result<IngestSummary> IngestHdf5(const Hdf5IngestOptions& options) {
  Hdf5Ingest ingest(options);
  return ingest.Run();
}

}  // namespace patchstore
