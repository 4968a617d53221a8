// libFuzzer target: the parsers that read untrusted store bytes. Any input
// must give a Status, never a crash, a hang or an out-of-bounds read.
//   record header + body  (ParseRecordHeader, VerifyRecordBody)
//   sample id entries     (DecodeIdValue)
//   metadata text         (StoreMeta::Decode)
//   keys                  (DecodeRecordKey, DecodeIndexKey)
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "patchstore/store/format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace patchstore;
  auto h = ParseRecordHeader(data, size);
  if (h.ok()) {
    // A parsed header promises the body is inside `size`.
    (void)VerifyRecordBody(*h, data);
  }
  // Most random headers stop at the checksum; also parse a copy whose header
  // checksum is made valid, so the field checks behind it are exercised.
  if (size >= kRecordHeaderSize) {
    std::vector<uint8_t> copy(data, data + size);
    std::memcpy(copy.data(), "PSR1", 4);
    const uint64_t sum = Checksum64(copy.data(), kRecordHeaderSize - 8);
    for (int i = 0; i < 8; ++i) copy[kRecordHeaderSize - 8 + i] = static_cast<uint8_t>(sum >> (8 * i));
    auto h2 = ParseRecordHeader(copy.data(), copy.size());
    if (h2.ok()) (void)VerifyRecordBody(*h2, copy.data());
  }
  (void)DecodeIdValue(size, data, size);
  auto meta = StoreMeta::Decode(std::string_view(reinterpret_cast<const char*>(data), size));
  if (meta.ok()) (void)meta->Encode();
  uint64_t s;
  uint16_t f;
  (void)DecodeRecordKey(data, size, &s, &f);
  (void)DecodeIndexKey(data, size, &s);
  return 0;
}
