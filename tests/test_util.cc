#include "test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

namespace patchstore::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/patchstore-test-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  // Make read-only test folders writable again so they can be removed.
  for (auto it = std::filesystem::recursive_directory_iterator(path_, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
    std::filesystem::permissions(it->path(), std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
  std::filesystem::permissions(path_, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
  std::filesystem::remove_all(path_, ec);
}

int RunCommand(const std::string& command, std::string* output) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return -1;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = pclose(p);
  if (output) *output = out;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

const char* CliPath() { return PATCHSTORE_CLI_PATH; }

}  // namespace patchstore::testing

#include <algorithm>
#include <cstring>

#include "patchstore/store/store.h"

namespace patchstore::testing {

std::vector<std::string> NumberedIds(uint64_t n, const std::string& prefix) {
  std::vector<std::string> ids;
  for (uint64_t i = 0; i < n; ++i) ids.push_back(prefix + std::to_string(i));
  return ids;
}

namespace {

// The payload of record (s, f): row-major (or tiled) elements of the field's dtype.
Result<std::vector<uint8_t>> Payload(const StoreSpec& spec, uint64_t s, int f, const std::array<int64_t, 3>& shape) {
  const StoreField& field = spec.fields[static_cast<size_t>(f)];
  const int64_t P = shape[0], H = shape[1], W = shape[2];
  const size_t es = DTypeSize(field.dtype);
  std::vector<uint8_t> rows(static_cast<size_t>(P * H * W) * es);
  for (int64_t p = 0; p < P; ++p)
    for (int64_t y = 0; y < H; ++y)
      for (int64_t x = 0; x < W; ++x) {
        const double v = spec.value(s, f, p, y, x);
        uint8_t* dst = &rows[static_cast<size_t>((p * H + y) * W + x) * es];
        switch (field.dtype) {
          case DType::kFloat32: {
            const float fv = static_cast<float>(v);
            std::memcpy(dst, &fv, 4);
            break;
          }
          case DType::kUInt8: *dst = static_cast<uint8_t>(v); break;
          case DType::kUInt16: {
            const uint16_t u = static_cast<uint16_t>(v);
            std::memcpy(dst, &u, 2);
            break;
          }
          case DType::kInt16: {
            const int16_t i = static_cast<int16_t>(v);
            std::memcpy(dst, &i, 2);
            break;
          }
          case DType::kFloat16: {
            const uint16_t bits = static_cast<uint16_t>(v);
            std::memcpy(dst, &bits, 2);
            break;
          }
          default:
            return Status::InvalidArgument("WriteStore: field '" + field.name + "' has dtype " +
                                           DTypeName(field.dtype) + ", which it cannot write");
        }
      }
  if (field.tile == 0) return rows;
  const TileGrid grid{P, H, W, field.tile};
  std::vector<uint8_t> tiled(static_cast<size_t>(grid.elements()) * es);
  TileCHW(rows.data(), es, grid, tiled.data());
  return tiled;
}

// The summed-area tables of record (s, f): (P, H+1, W+1) counts of the
// valid (non-zero, not NaN) values above and left of each entry.
std::vector<uint32_t> SummedAreaTables(const StoreSpec& spec, uint64_t s, int f, const std::array<int64_t, 3>& shape) {
  const int64_t P = shape[0], H = shape[1], W = shape[2];
  std::vector<uint32_t> sat(static_cast<size_t>(P * (H + 1) * (W + 1)), 0);
  for (int64_t p = 0; p < P; ++p)
    for (int64_t y = 0; y < H; ++y)
      for (int64_t x = 0; x < W; ++x) {
        const float v = static_cast<float>(spec.value(s, f, p, y, x));
        const size_t at = static_cast<size_t>((p * (H + 1) + y + 1) * (W + 1) + x + 1);
        sat[at] = sat[at - 1] + sat[at - static_cast<size_t>(W + 1)] - sat[at - static_cast<size_t>(W + 2)] +
                  ((v != 0.0f && v == v) ? 1u : 0u);
      }
  return sat;
}

}  // namespace

Status WriteStore(const std::string& path, const StoreSpec& spec) {
  const bool volumes = spec.kind == "volumes";
  WriterOptions wo;
  wo.kind = spec.kind;
  wo.durable = false;
  wo.initial_map_size = spec.initial_map_size;
  PS_ASSIGN_OR_RETURN(auto writer, Writer::Open(path, wo));
  std::vector<uint16_t> idx;
  for (const StoreField& f : spec.fields) {
    FieldMeta m;
    m.name = f.name;
    m.channels = static_cast<uint32_t>(volumes ? 1 : f.channels);
    m.layout = volumes ? Layout::kSHW : Layout::kCHW;
    m.dtype = f.dtype;
    m.tile = f.tile;
    m.norm = f.norm;
    m.is_mask = f.mask;
    m.source_type = f.source_type;
    m.mask_blocks = f.mask_blocks;
    m.has_sat = f.sat;
    m.source_format = "synthetic";
    PS_ASSIGN_OR_RETURN(uint16_t i, writer->EnsureField(m));
    idx.push_back(i);
  }
  for (const auto& [key, value] : spec.attributes) writer->mutable_meta().attributes[key] = value;
  const uint64_t n = spec.ids.size();
  for (uint64_t s = 0; s < n;) {
    std::vector<SampleInput> in;
    std::vector<std::vector<uint8_t>> data;
    std::vector<std::vector<uint32_t>> sats;
    for (; s < n && in.size() < std::max<uint64_t>(spec.batch, 1); ++s) {
      if (writer->Contains(spec.ids[s])) continue;  // an existing store: append the rest
      SampleInput si;
      si.id = spec.ids[s];
      for (size_t f = 0; f < spec.fields.size(); ++f) {
        const StoreField& field = spec.fields[f];
        const std::array<int64_t, 3> shape = spec.shape ? spec.shape(s, static_cast<int>(f))
                                                        : std::array<int64_t, 3>{volumes ? spec.depth : field.channels,
                                                                                 spec.height, spec.width};
        PS_ASSIGN_OR_RETURN(std::vector<uint8_t> payload, Payload(spec, s, static_cast<int>(f), shape));
        data.push_back(std::move(payload));
        RecordInput r;
        r.field = idx[f];
        r.header.dtype = field.dtype;
        r.header.layout = volumes ? Layout::kSHW : Layout::kCHW;
        r.header.rank = 3;
        r.header.shape = {static_cast<uint64_t>(shape[0]), static_cast<uint64_t>(shape[1]),
                          static_cast<uint64_t>(shape[2]), 0};
        r.header.tile = field.tile;
        r.header.norm = field.norm;
        r.header.source_type = field.source_type;
        si.records.push_back(std::move(r));
        if (field.sat) {
          sats.push_back(SummedAreaTables(spec, s, static_cast<int>(f), shape));
          RecordInput t;
          t.field = static_cast<uint16_t>(kAuxFieldBase + idx[f]);
          t.header.dtype = DType::kUInt32;
          t.header.layout = Layout::kSAT;
          t.header.shape = {static_cast<uint64_t>(shape[0]), static_cast<uint64_t>(shape[1] + 1),
                            static_cast<uint64_t>(shape[2] + 1), 0};
          si.records.push_back(std::move(t));
        }
      }
      in.push_back(std::move(si));
    }
    // Point records at their data now that `data` no longer reallocates.
    size_t k = 0, t = 0;
    for (SampleInput& si : in)
      for (RecordInput& r : si.records)
        r.data = r.header.layout == Layout::kSAT ? static_cast<const void*>(sats[t++].data()) : data[k++].data();
    if (!in.empty()) PS_RETURN_IF_ERROR(writer->WriteBatch(in));
  }
  if (spec.seal) PS_RETURN_IF_ERROR(writer->Seal(spec.ordinal));
  else PS_RETURN_IF_ERROR(writer->CommitMeta());
  return Status::OK();
}

Status WriteSyntheticStore(const std::string& path, uint64_t samples, const std::vector<SyntheticField>& fields,
                           int64_t H, int64_t W, bool seal, uint64_t batch, uint64_t initial_map_size) {
  StoreSpec spec;
  for (const SyntheticField& f : fields) {
    StoreField field;
    field.name = f.name;
    field.channels = f.channels;
    spec.fields.push_back(field);
  }
  spec.height = H;
  spec.width = W;
  spec.seal = seal;
  spec.batch = batch;
  spec.initial_map_size = initial_map_size;
  spec.ids = NumberedIds(samples);
  return WriteStore(path, spec);
}

}  // namespace patchstore::testing
