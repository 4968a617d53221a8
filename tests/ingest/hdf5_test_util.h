// Writing small HDF5 inputs for the HDF5 ingest/export tests (C API).
#pragma once

#include <hdf5.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "patchstore/reader/reader.h"

namespace patchstore::testing {

class H5Out {
 public:
  explicit H5Out(const std::string& path) : id_(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)) {}
  ~H5Out() { Close(); }
  void Close() {
    if (id_ >= 0) H5Fclose(id_);
    id_ = -1;
  }
  hid_t id() const { return id_; }
  bool ok() const { return id_ >= 0; }

  // Writes `data` (C order over `dims`) as dataset `path` (intermediate
  // groups created). `chunk` empty: contiguous. gzip < 0: no deflate.
  bool Write(const std::string& path, hid_t file_type, hid_t mem_type, const std::vector<hsize_t>& dims,
             const void* data, const std::vector<hsize_t>& chunk = {}, int gzip = -1, bool shuffle = false) {
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (!chunk.empty()) H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
    if (shuffle) H5Pset_shuffle(dcpl);
    if (gzip >= 0) H5Pset_deflate(dcpl, static_cast<unsigned>(gzip));
    hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    hid_t ds = H5Dcreate2(id_, path.c_str(), file_type, space, lcpl, dcpl, H5P_DEFAULT);
    bool ok = ds >= 0 && H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0;
    if (ds >= 0) H5Dclose(ds);
    H5Sclose(space);
    H5Pclose(dcpl);
    H5Pclose(lcpl);
    return ok;
  }

  bool Group(const std::string& path) {
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t g = H5Gcreate2(id_, path.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT);
    H5Pclose(lcpl);
    if (g < 0) return false;
    H5Gclose(g);
    return true;
  }

 private:
  hid_t id_;
};

template <typename T>
std::vector<T> RandomValues(size_t n, uint32_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(u(rng));
  return v;
}

// The source index of record element (s, h, w) for a dataset of `dims`
// sliced along `axis`.
inline size_t SourceIndex(const std::array<hsize_t, 3>& dims, int axis, uint64_t s, uint64_t h, uint64_t w) {
  std::array<uint64_t, 3> c{};
  int k = 0;
  c[axis] = s;
  for (int i = 0; i < 3; ++i)
    if (i != axis) c[i] = k++ == 0 ? h : w;
  return (c[0] * dims[1] + c[1]) * dims[2] + c[2];
}

// Checks that the record of (id, field) is the source sliced along `axis`
// with every value mapped by `expect`. Returns a description of the first
// mismatch, or "".
template <typename T>
std::string CompareVolume(
    const Reader& r, const std::string& id, const std::string& field, const std::vector<T>& src,
    std::array<hsize_t, 3> dims, int axis,
    const std::function<float(T)>& expect = [](T x) { return static_cast<float>(x); }) {
  auto s = r.Find(id);
  if (!s.ok()) return s.status().ToString();
  auto f = r.FieldIndex(field);
  if (!f.ok()) return f.status().ToString();
  auto v = r.Get(*s, *f);
  if (!v.ok()) return v.status().ToString();
  int o1 = axis == 0 ? 1 : 0, o2 = axis == 2 ? 1 : 2;
  const uint64_t S = dims[axis], H = dims[o1], W = dims[o2];
  if (v->rank != 3 || static_cast<uint64_t>(v->shape[0]) != S || static_cast<uint64_t>(v->shape[1]) != H ||
      static_cast<uint64_t>(v->shape[2]) != W)
    return "shape " + std::to_string(v->shape[0]) + "x" + std::to_string(v->shape[1]) + "x" +
           std::to_string(v->shape[2]);
  for (uint64_t a = 0; a < S; ++a)
    for (uint64_t b = 0; b < H; ++b)
      for (uint64_t c = 0; c < W; ++c) {
        const float want = expect(src[SourceIndex(dims, axis, a, b, c)]);
        const float got = v->data_as<float>()[(a * H + b) * W + c];
        if (std::memcmp(&want, &got, 4) != 0)
          return "at (" + std::to_string(a) + "," + std::to_string(b) + "," + std::to_string(c) + "): got " +
                 std::to_string(got) + ", want " + std::to_string(want);
      }
  return "";
}

}  // namespace patchstore::testing
