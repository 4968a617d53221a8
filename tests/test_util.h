// Helpers shared by the GoogleTest suites: scratch directories, commands, and
// stores built from a few lines (StoreSpec, WriteStore) for tests that need
// "a store with these fields and these values" rather than the writer itself.
#pragma once

#include <string>

namespace patchstore::testing {

// A fresh, empty directory under $TMPDIR (or /tmp), removed with the object.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs a shell command, returns its exit status (or -1) and, if `output` is
// given, what it printed on stdout and stderr.
int RunCommand(const std::string& command, std::string* output = nullptr);

// The absolute path of this build's `patchstore` program; tests write it
// PATCHSTORE_CLI. Only test_util.cc is compiled with the path
// (PATCHSTORE_CLI_PATH), so the suites' other objects are the same in every
// build folder and ccache serves a second build (reader-only, sanitizers).
const char* CliPath();

}  // namespace patchstore::testing

#define PATCHSTORE_CLI (::patchstore::testing::CliPath())

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "patchstore/store/format.h"
#include "patchstore/store/status.h"
#include "patchstore/store/store.h"

namespace patchstore::testing {

// The value that WriteSyntheticStore puts at (sample s, field f, channel c,
// row y, column x): exact in float32 for the small sizes tests use.
inline float SyntheticValue(uint64_t s, int f, int64_t c, int64_t y, int64_t x) {
  return static_cast<float>(s * 1000000 + f * 200000 + c * 10000 + y * 100 + x);
}

// One field of a store written by WriteStore.
struct StoreField {
  StoreField() = default;
  StoreField(std::string name_, int channels_ = 1, bool mask_ = false)  // NOLINT(google-explicit-constructor)
      : name(std::move(name_)), channels(channels_), mask(mask_) {}
  std::string name;
  int channels = 1;   // C of an image field; volume fields have 1
  bool mask = false;  // is_mask (the writer gives 1-channel masks block counts)
  DType dtype = DType::kFloat32;
  uint16_t tile = 0;   // 0: rows; else the tile edge of every record
  Normalization norm;  // of the field and its records (readers apply it to raw dtypes)
  SourceType source_type = SourceType::kFloat32;
  uint16_t mask_blocks = 0;  // a mask's block edge (0: the writer's default)
  // Summed-area tables stored beside each record (has_sat, as format-1
  // masks had; such a field has no block counts).
  bool sat = false;
};

// The value of element (sample s, field f, plane p, row y, column x), where a
// plane is a channel of an image record or a slice of a volume record. It is
// stored as is in float32 records and cast to the element type of integer
// (raw source) records; float16 records take it as the binary16 bit pattern
// (0..65535).
using StoreValueFn = std::function<double(uint64_t s, int f, int64_t p, int64_t y, int64_t x)>;

// A store written by WriteStore: every sample has one record per field, of
// shape (planes, height, width) — planes = the field's channels for frames,
// `depth` slices for volumes — unless `shape` says otherwise per record.
//
//   StoreSpec spec;
//   spec.fields = {StoreField{"img", 2}, StoreField{"mask", 1, /*mask=*/true}};
//   spec.ids = NumberedIds(7);  // "s/0" .. "s/6"
//   spec.height = 20;
//   spec.width = 24;
//   spec.value = [](uint64_t s, int f, int64_t c, int64_t y, int64_t x) {
//     return f == 1 ? double((x + y + s) % 5 == 0) : SyntheticValue(s, f, c, y, x);
//   };
//   ASSERT_TRUE(WriteStore(dir / "s.ps", spec).ok());
struct StoreSpec {
  std::string kind = "frames";  // or "volumes": fields of layout SHW, records (S, H, W)
  std::vector<StoreField> fields;
  std::vector<std::string> ids;  // one sample each, in this order
  int64_t height = 0, width = 0;
  int64_t depth = 0;  // volumes: slices per record
  // (planes, H, W) of the record of sample s, field f; null: the above.
  std::function<std::array<int64_t, 3>(uint64_t s, int f)> shape;
  StoreValueFn value = [](uint64_t s, int f, int64_t p, int64_t y, int64_t x) { return SyntheticValue(s, f, p, y, x); };
  std::map<std::string, std::string> attributes;  // set in the metadata (StoreMeta::attributes)
  bool seal = true;                               // mark finished; false: commit the metadata and leave it open
  Writer::OrdinalOf ordinal;                      // given to Seal (a shard's input order)
  uint64_t batch = 4;                             // samples per write transaction
  uint64_t initial_map_size = uint64_t{1} << 30;
};

// "<prefix>0" .. "<prefix><n-1>".
std::vector<std::string> NumberedIds(uint64_t n, const std::string& prefix = "s/");

// Writes `spec` at `path` through the store Writer (not durable). A store
// already there keeps its samples: the ids it holds are skipped, the others
// appended (value() still sees their index in `ids`).
Status WriteStore(const std::string& path, const StoreSpec& spec);

struct SyntheticField {
  const char* name;
  int channels;
};

// Writes `samples` samples with ids "s/<index>" and the given fields, all
// H x W, with SyntheticValue() contents (WriteStore with the defaults).
// `batch` samples per commit; `seal` marks the store finished.
Status WriteSyntheticStore(const std::string& path, uint64_t samples, const std::vector<SyntheticField>& fields,
                           int64_t H, int64_t W, bool seal = true, uint64_t batch = 4,
                           uint64_t initial_map_size = uint64_t{1} << 30);

}  // namespace patchstore::testing
