// Export of volume records to one HDF5 file, OUTDIR/volumes.h5, laid out like
// the ingest input: /<group>/<id> per field and volume (see ingest_hdf5.h).
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "ingest/hdf5_internal.h"
#include "patchstore/reader/reader.h"
#include "patchstore/reader/volume.h"

namespace patchstore {
namespace {

using hdf5::Hid;
using hdf5::TakeErrorStack;

Status WriteStringAttribute(hid_t obj, const char* name, const std::string& value, const std::string& what) {
  Hid type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), std::max<size_t>(1, value.size()));
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  Hid attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  std::string v = value.empty() ? std::string(1, '\0') : value;
  if (!attr.valid() || H5Awrite(attr.get(), type.get(), v.data()) < 0)
    return Status::IOError("writing attribute '" + std::string(name) + "' of " + what + ": " + TakeErrorStack());
  return Status::OK();
}

Status WriteIntAttribute(hid_t obj, const char* name, int64_t value, const std::string& what) {
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  Hid attr(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.valid() || H5Awrite(attr.get(), H5T_NATIVE_INT64, &value) < 0)
    return Status::IOError("writing attribute '" + std::string(name) + "' of " + what + ": " + TakeErrorStack());
  return Status::OK();
}

// Writes the (S,H,W) record `v` as dataset `name` under `group`, with the
// slice axis at position `axis` of the file dataset.
Status WriteVolume(hid_t group, const std::string& name, const TensorView& v, int axis, hid_t lcpl,
                   const std::string& what) {
  const hsize_t S = v.shape[0], H = v.shape[1], W = v.shape[2];
  std::array<hsize_t, 3> dims;
  if (axis == 0) dims = {S, H, W};
  else if (axis == 1) dims = {H, S, W};
  else dims = {H, W, S};
  Hid space(H5Screate_simple(3, dims.data(), nullptr), H5Sclose);
  Hid ds(H5Dcreate2(group, name.c_str(), H5T_IEEE_F32LE, space.get(), lcpl, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) return Status::IOError("creating " + what + ": " + TakeErrorStack());
  if (axis == 0) {
    if (H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data_as<float>()) < 0)
      return Status::IOError("writing " + what + ": " + TakeErrorStack());
    return Status::OK();
  }
  // Source order: transpose blocks of rows (the file's first axis is H).
  const hsize_t row_elems = S * W;  // one h of the output
  const hsize_t rows = std::max<hsize_t>(1, std::min<hsize_t>(H, (hsize_t{16} << 20) / row_elems));
  std::vector<float> buf(rows * row_elems);
  for (hsize_t h0 = 0; h0 < H; h0 += rows) {
    const hsize_t hn = std::min(rows, H - h0);
    for (hsize_t h = 0; h < hn; ++h) {
      float* out = buf.data() + h * row_elems;
      for (hsize_t s = 0; s < S; ++s) {
        const float* in = v.data_as<float>() + (s * H + h0 + h) * W;
        if (axis == 1) {
          std::memcpy(out + s * W, in, W * sizeof(float));  // (h, s, w)
        } else {
          for (hsize_t w = 0; w < W; ++w) out[w * S + s] = in[w];  // (h, w, s)
        }
      }
    }
    std::array<hsize_t, 3> start{h0, 0, 0}, count = dims;
    count[0] = hn;
    Hid fspace(H5Dget_space(ds.get()), H5Sclose);
    H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
    Hid mspace(H5Screate_simple(3, count.data(), nullptr), H5Sclose);
    if (H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), H5P_DEFAULT, buf.data()) < 0)
      return Status::IOError("writing " + what + ": " + TakeErrorStack());
  }
  return Status::OK();
}

// Opens or creates the group at absolute `path` (intermediate groups too).
Result<Hid> EnsureGroup(hid_t file, const std::string& path, const std::string& file_path) {
  std::string prefix;
  size_t pos = 1;
  Hid g(H5Gopen2(file, "/", H5P_DEFAULT), H5Gclose);
  while (pos <= path.size()) {
    size_t slash = path.find('/', pos);
    if (slash == std::string::npos) slash = path.size();
    const std::string part = path.substr(pos, slash - pos);
    pos = slash + 1;
    if (part.empty()) continue;
    prefix += "/" + part;
    htri_t exists = H5Lexists(file, prefix.c_str(), H5P_DEFAULT);
    hid_t id = exists > 0 ? H5Gopen2(file, prefix.c_str(), H5P_DEFAULT)
                          : H5Gcreate2(file, prefix.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (id < 0) return Status::IOError("creating group '" + prefix + "' in '" + file_path + "': " + TakeErrorStack());
    g = Hid(id, H5Gclose);
  }
  return g;
}

}  // namespace

Result<ExportSummary> ExportVolumesHdf5(const ExportOptions& o, const Reader& reader,
                                        const std::vector<uint64_t>& samples, const std::vector<int>& fields) {
  const auto& attrs = reader.meta().attributes;
  int source_axis = 0;
  if (auto it = attrs.find("slice_axis"); it != attrs.end()) {
    if (it->second == "0" || it->second == "1" || it->second == "2") source_axis = it->second[0] - '0';
    else return Status::Corruption("export of '" + o.store + "': bad slice_axis attribute '" + it->second + "'");
  }
  const std::string order = o.axis_order.empty() ? "source" : o.axis_order;
  const int axis = order == "shw" ? 0 : source_axis;
  const std::string path = (std::filesystem::path(o.outdir) / "volumes.h5").string();
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());

  hdf5::Hdf5Lock lock;
  ExportSummary summary;
  Status st;
  {
    Hid file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (!file.valid()) return Status::IOError("creating '" + tmp + "': " + TakeErrorStack());
    Hid lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
    H5Pset_create_intermediate_group(lcpl.get(), 1);
    st = WriteIntAttribute(file.get(), "slice_axis", source_axis, "'" + path + "'");
    if (st.ok()) st = WriteStringAttribute(file.get(), "axis_order", order, "'" + path + "'");
    if (st.ok()) st = WriteStringAttribute(file.get(), "patchstore_store", o.store, "'" + path + "'");
    Progress progress;
    progress.total = samples.size() * fields.size();
    for (int f : fields) {
      if (!st.ok()) break;
      const FieldMeta& fm = reader.field(f);
      std::string gpath = fm.name;
      if (auto it = attrs.find("hdf5_group." + fm.name); it != attrs.end() && !it->second.empty()) gpath = it->second;
      if (gpath.front() != '/') gpath = "/" + gpath;
      auto group = EnsureGroup(file.get(), gpath, path);
      if (!group.ok()) {
        st = group.status();
        break;
      }
      for (uint64_t s : samples) {
        reader.Prefetch(s, f);  // the whole volume is written out: one read-ahead request
        auto v = Volume(reader, s, f);
        if (!v.ok()) {
          st = v.status().WithContext("export");
          break;
        }
        auto h = reader.Header(s, f);
        const std::string id(reader.id(s));
        const std::string name = SafeRelativePath(id);
        const std::string what = "dataset '" + gpath + "/" + name + "' in '" + path + "'";
        st = WriteVolume(group->get(), name, AsFloat32(*v), axis, lcpl.get(), what);  // compact: normalised float32
        if (st.ok()) {
          Hid ds(H5Dopen2(group->get(), name.c_str(), H5P_DEFAULT), H5Dclose);
          st = WriteStringAttribute(ds.get(), "patchstore_id", id, what);
          if (st.ok() && h.ok()) st = WriteStringAttribute(ds.get(), "normalisation", h->norm.ToString(), what);
          if (st.ok() && h.ok())
            st = WriteStringAttribute(ds.get(), "source_type", SourceTypeName(h->source_type), what);
        }
        if (!st.ok()) {
          st = st.WithContext("export of " + reader.Describe(s, f));
          break;
        }
        ++progress.done;
        if (o.progress) o.progress(progress);
      }
    }
    if (st.ok() && H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0)
      st = Status::IOError("writing '" + tmp + "': " + TakeErrorStack());
    file.reset();
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Status::FromErrno("renaming to '" + path + "'", err);
  }
  std::error_code ec;
  summary.files_written = 1;
  summary.bytes_written = std::filesystem::file_size(path, ec);
  summary.paths.push_back(path);
  return summary;
}

}  // namespace patchstore
