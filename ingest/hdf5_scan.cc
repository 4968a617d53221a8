// Listing the HDF5 files of an ingest (ingest/hdf5_source.h): metadata
// only. Every check that HDF5 would otherwise answer with silent fill values
// or a crash (virtual sources, external raw files and links, filters) is
// made here, before anything is written.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "ingest/checks.h"
#include "ingest/hdf5_source.h"

namespace patchstore {
namespace hdf5_ingest {

herr_t ElinkCallback(const char* /*parent_file*/, const char* /*parent_group*/, const char* child_file,
                     const char* child_object, unsigned* /*acc_flags*/, hid_t /*fapl*/, void* op_data) {
  auto* g = static_cast<ElinkGuard*>(op_data);
  g->target = std::string(child_file ? child_file : "?") + ":" + (child_object ? child_object : "?");
  return g->allow ? 0 : -1;
}

namespace {

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

}  // namespace

Result<Hid> Hdf5Source::OpenFile(size_t file) {
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

Result<Hid> Hdf5Source::OpenGroup(hid_t file_id, size_t file, size_t group) {
  PS_ASSIGN_OR_RETURN(Hid obj, OpenObject(file_id, file, group));
  if (H5Iget_type(obj.get()) != H5I_GROUP)
    return Status::InvalidArgument("opening group '" + groups_[group].path + "' in '" + o_.files[file] +
                                   "': not a group");
  return obj;
}

Result<Hid> Hdf5Source::OpenObject(hid_t file_id, size_t file, size_t group) {
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

std::string Hdf5Source::DescribeRoot(hid_t file_id) const {
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

namespace {

// External raw storage (H5Pset_external): every segment's file must exist
// and hold the bytes the dataset reads from it, or HDF5 would read the
// missing part as zeros. Relative names resolve as HDF5 resolves them when
// reading (the dataset access list sets the prefix ${ORIGIN}): from
// HDF5_EXTFILE_PREFIX when that is set, else from the HDF5 file's folder.
Status CheckExternalSegments(hid_t ds, hid_t dcpl, int count, uint64_t needed, const std::string& what) {
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

}  // namespace

DatasetInfo Hdf5Source::Inspect(hid_t ds, const std::string& what) {
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
void Hdf5Source::ScanFile(size_t file, std::vector<Item>* items) {
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
void Hdf5Source::ScanPatientFile(size_t file, const std::vector<Hid>& datasets, std::vector<Item>* items) {
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

void Hdf5Source::SizeItem(Item* it) const {
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

Status Hdf5Source::ResolveNorms(Item* item) {
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

}  // namespace hdf5_ingest
}  // namespace patchstore
