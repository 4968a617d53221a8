// ingest/hdf5_source.h — the HDF5 source of the ingest driver
// (ingest-private; ingest/driver.h). Two files implement it: hdf5_scan.cc
// lists the files (groups, datasets, virtual and external storage checked,
// metadata only) and ingest_hdf5.cc plans the units and streams each
// volume's slabs into its records at commit. All HDF5 calls run under
// hdf5::Hdf5Lock on the calling thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ingest/driver.h"
#include "ingest/encoding.h"
#include "ingest/hdf5_internal.h"
#include "patchstore/ingest/ingest_hdf5.h"
#include "patchstore/store/format.h"

namespace patchstore {
namespace hdf5_ingest {

using hdf5::Hid;
using hdf5::NumericType;
using hdf5::TakeErrorStack;
inline std::string ShapeString(const std::array<hsize_t, 3>& d, int rank = 3) {
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

// The link-access callback that applies an ElinkGuard (op_data).
herr_t ElinkCallback(const char* parent_file, const char* parent_group, const char* child_file,
                     const char* child_object, unsigned* acc_flags, hid_t fapl, void* op_data);

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

class Hdf5Source : public IngestSource {
 public:
  explicit Hdf5Source(const Hdf5IngestOptions& o) : o_(o) {}
  Status ParseOptions();
  // Lists every file into units (one per item, in the same order).
  // REQUIRES: Hdf5Lock held from here until the source is destroyed.
  Status Plan(std::vector<IngestUnit>* units);

  Status Prepare(StoreMeta* meta) override;
  uint64_t MapBytes(const std::vector<size_t>& units) const override;
  bool Project(const std::vector<size_t>& units, StoreProjector* projector) const override;
  DecodedUnit Decode(size_t index, int slot, BufferPool* buffers) override;
  Status FieldRefused(const IngestUnit& /*unit*/, const UnitField& field, const Status& why,
                      const StoreMeta& /*meta*/) const override {
    return why.WithContext("ingesting " + field.describe);
  }
  std::vector<std::string> TakeWarnings() override {
    std::vector<std::string> out;
    out.swap(warnings_);
    return out;
  }

 private:
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
  Result<std::vector<std::shared_ptr<VolumeSource>>> OpenVolume(const Item& item);
  Status ReadVolume(const VolumeSource& v, void* dst);
  // Issue-17 checks on the listed volumes, before anything is written.
  Status CheckIdsAcrossFiles();
  void CheckSliceAxis();
  void Warn(std::string message) {
    if (warnings_.size() < 100) warnings_.push_back(std::move(message));
  }

  const Hdf5IngestOptions& o_;
  EncodingPlan encoding_;
  std::vector<GroupSpec> groups_;
  int axis_ = 2;
  bool prefix_ids_ = false;
  Hid lapl_;      // link access: external-link guard
  Hid dapl_;      // dataset access: guard + chunk cache
  Hid ext_dapl_;  // the same, for datasets with external raw files: their names resolve from the file's folder
  ElinkGuard guard_;

  std::vector<Item> items_;
  std::vector<std::string> warnings_;  // until the driver takes them
  std::shared_ptr<Hid> open_file_;
  size_t open_file_index_ = SIZE_MAX;
  std::vector<uint64_t> slab_;  // source slab buffer (uint64 for alignment)
};

}  // namespace hdf5_ingest
}  // namespace patchstore
