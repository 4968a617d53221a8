#include "patchstore/reader/order.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "patchstore/reader/transform.h"
#include "store/numbers.h"

namespace patchstore {
namespace {

// Salts of the locality order's draws (4-char tags, as 'PERM').
constexpr uint64_t kShiftSalt = 0x4c4f4353ULL;  // 'LOCS': first block's share
constexpr uint64_t kBlockSalt = 0x4c4f4342ULL;  // 'LOCB': block order
constexpr uint64_t kItemSalt = 0x4c4f4349ULL;   // 'LOCI': order inside block b (with b)

}  // namespace

const char* SampleOrderName(SampleOrder order) {
  switch (order) {
    case SampleOrder::kRandom: return "random";
    case SampleOrder::kLocality: return "locality";
  }
  return "unknown";
}

Result<SampleOrder> ParseSampleOrder(const std::string& name) {
  for (SampleOrder o : {SampleOrder::kRandom, SampleOrder::kLocality})
    if (name == SampleOrderName(o)) return o;
  return Status::InvalidArgument("unknown order '" + name + "' (orders: random, locality)");
}

std::vector<uint64_t> LocalityBlocks(const uint64_t* bytes, uint64_t n, uint64_t budget_bytes, uint64_t seed,
                                     uint64_t epoch) {
  const uint64_t cap = std::max<uint64_t>(budget_bytes / 2, 1);
  // The first block's cap: 1 + a uniform share of cap, a new one each epoch.
  uint64_t first_cap = 1 + splitmix::Below(splitmix::Key(seed, epoch, kShiftSalt, 0, 0), cap);
  std::vector<uint64_t> starts{0};
  uint64_t used = 0, limit = first_cap;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t b = bytes[i];
    if (i > starts.back() && (used + b > limit || used + b < used)) {  // full (or overflow): a new block
      starts.push_back(i);
      used = 0;
      limit = cap;
    }
    used += b;
  }
  if (n > 0) starts.push_back(n);
  return starts;
}

Status LocalityOrder(const uint64_t* bytes, uint64_t n, uint64_t budget_bytes, uint64_t seed, uint64_t epoch,
                     std::vector<uint64_t>* out) {
  if (budget_bytes == 0)
    return Status::InvalidArgument("the locality order needs a page-cache budget in bytes (cache_budget), got 0");
  out->clear();
  out->reserve(n);
  const std::vector<uint64_t> starts = LocalityBlocks(bytes, n, budget_bytes, seed, epoch);
  const uint64_t blocks = starts.empty() ? 0 : starts.size() - 1;
  std::vector<uint64_t> block_order(blocks);
  for (uint64_t b = 0; b < blocks; ++b) block_order[b] = b;
  splitmix::Shuffle(block_order.data(), blocks, seed, epoch, kBlockSalt);
  for (uint64_t b : block_order) {
    const size_t at = out->size();
    for (uint64_t i = starts[b]; i < starts[b + 1]; ++i) out->push_back(i);
    // Each block its own stream: salt 'LOCI' mixed with the block's index.
    splitmix::Shuffle(out->data() + at, starts[b + 1] - starts[b], seed, epoch, splitmix::Key(kItemSalt, b));
  }
  return Status::OK();
}

Result<uint64_t> ParseByteSize(const std::string& text) {
  auto bad = [&] {
    return Status::InvalidArgument("'" + text + "' is not a byte size (examples: 8GB, 512MiB, 1.5G, 1000000)");
  };
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const size_t num_begin = i;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == num_begin) return bad();
  const std::string number = text.substr(num_begin, i - num_begin);
  if (std::count(number.begin(), number.end(), '.') > 1) return bad();
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit;
  for (; i < text.size(); ++i)
    if (!std::isspace(static_cast<unsigned char>(text[i])))
      unit += static_cast<char>(std::toupper(static_cast<unsigned char>(text[i])));
  double scale = 1;
  const char* prefixes = "KMGT";
  if (!unit.empty() && unit != "B") {
    const char* p = std::strchr(prefixes, unit[0]);
    if (p == nullptr) return bad();
    const int power = static_cast<int>(p - prefixes) + 1;
    const std::string rest = unit.substr(1);
    double base = 0;
    if (rest.empty() || rest == "IB" || rest == "I") base = 1024;
    else if (rest == "B") base = 1000;
    else return bad();
    scale = std::pow(base, power);
  }
  double v = 0;
  if (!ParseDouble(number, &v)) return bad();
  v *= scale;
  if (!(v >= 1) || v >= 1.8e19) return bad();
  return static_cast<uint64_t>(v);
}

}  // namespace patchstore
