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
    std::filesystem::permissions(it->path(), std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ec);
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

}  // namespace patchstore::testing

#include "patchstore/store/store.h"

namespace patchstore::testing {

Status WriteSyntheticStore(const std::string& path, uint64_t samples, const std::vector<SyntheticField>& fields,
                           int64_t H, int64_t W, bool seal, uint64_t batch, uint64_t initial_map_size) {
  WriterOptions wo;
  wo.durable = false;
  wo.initial_map_size = initial_map_size;
  PS_ASSIGN_OR_RETURN(auto writer, Writer::Open(path, wo));
  std::vector<uint16_t> idx;
  for (const SyntheticField& f : fields) {
    FieldMeta m;
    m.name = f.name;
    m.channels = static_cast<uint32_t>(f.channels);
    m.source_format = "synthetic";
    m.source_type = SourceType::kFloat32;
    PS_ASSIGN_OR_RETURN(uint16_t i, writer->EnsureField(m));
    idx.push_back(i);
  }
  uint64_t s = writer->sample_count();
  while (s < samples) {
    std::vector<SampleInput> in;
    std::vector<std::vector<float>> data;
    for (; s < samples && in.size() < batch; ++s) {
      SampleInput si;
      si.id = "s/" + std::to_string(s);
      for (size_t f = 0; f < fields.size(); ++f) {
        const int C = fields[f].channels;
        std::vector<float> v(static_cast<size_t>(C * H * W));
        for (int64_t c = 0; c < C; ++c)
          for (int64_t y = 0; y < H; ++y)
            for (int64_t x = 0; x < W; ++x)
              v[static_cast<size_t>((c * H + y) * W + x)] = SyntheticValue(s, static_cast<int>(f), c, y, x);
        data.push_back(std::move(v));
        RecordInput r;
        r.field = idx[f];
        r.header.rank = 3;
        r.header.shape = {static_cast<uint64_t>(C), static_cast<uint64_t>(H), static_cast<uint64_t>(W), 0};
        r.header.source_type = SourceType::kFloat32;
        si.records.push_back(std::move(r));
      }
      in.push_back(std::move(si));
    }
    // Point records at their data now that `data` no longer reallocates.
    size_t k = 0;
    for (SampleInput& si : in)
      for (RecordInput& r : si.records) r.data = data[k++].data();
    PS_RETURN_IF_ERROR(writer->WriteBatch(in));
  }
  if (seal) PS_RETURN_IF_ERROR(writer->Seal());
  else PS_RETURN_IF_ERROR(writer->CommitMeta());
  return Status::OK();
}

}  // namespace patchstore::testing
