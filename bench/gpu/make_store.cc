// make_store — writes a synthetic frames store the way `ingest images
// --layout tiles --encoding compact` lays one out (rgb uint8 with the "unit"
// normalisation, a 0/255 uint8 mask stored binary with block counts, depth
// float32 or float16), through the store Writer alone, so that a reader-only
// build (no OpenCV, OpenEXR, HDF5) can make the store its GPU check reads.
//
// Usage: make_store DIR FRAMES HEIGHT WIDTH [float32|float16] [TILE]
// Values are a fixed function of (frame, channel, y, x): the same store on
// every machine.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "patchstore/store/format.h"
#include "test_util.h"

namespace ps = patchstore;

namespace {

uint32_t Hash(uint64_t s, int64_t c, int64_t y, int64_t x) {
  uint64_t h = s * 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(c) * 0xbf58476d1ce4e5b9ull ^
               static_cast<uint64_t>(y) * 0x94d049bb133111ebull ^ static_cast<uint64_t>(x);
  h ^= h >> 31;
  h *= 0xd6e8feb86659fd93ull;
  return static_cast<uint32_t>(h >> 32);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s DIR FRAMES HEIGHT WIDTH [float32|float16] [TILE]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const uint64_t frames = std::strtoull(argv[2], nullptr, 10);
  const int64_t H = std::atoll(argv[3]), W = std::atoll(argv[4]);
  const bool half = argc > 5 && std::string(argv[5]) == "float16";
  const uint16_t tile = static_cast<uint16_t>(argc > 6 ? std::atoi(argv[6]) : 64);
  if (frames == 0 || H <= 0 || W <= 0) {
    std::fprintf(stderr, "make_store: FRAMES, HEIGHT and WIDTH must be positive\n");
    return 2;
  }
  ps::testing::StoreSpec spec;
  ps::testing::StoreField rgb{"rgb", 3}, mask{"mask", 1, true}, depth{"depth", 1};
  rgb.dtype = mask.dtype = ps::DType::kUInt8;
  rgb.source_type = mask.source_type = ps::SourceType::kUInt8;
  rgb.norm = ps::ParseNormalization("unit", 255.0).value();
  mask.norm = ps::ParseNormalization("binary", 255.0).value();
  depth.dtype = half ? ps::DType::kFloat16 : ps::DType::kFloat32;
  depth.source_type = ps::SourceType::kFloat32;
  rgb.tile = mask.tile = depth.tile = tile;
  spec.fields = {rgb, mask, depth};
  spec.ids = ps::testing::NumberedIds(frames, "frame/");
  spec.height = H;
  spec.width = W;
  spec.batch = 2;
  spec.initial_map_size = uint64_t{1} << 32;
  spec.value = [half](uint64_t s, int f, int64_t c, int64_t y, int64_t x) -> double {
    const uint32_t h = Hash(s, f * 4 + c, y, x);
    if (f == 0) return h & 0xff;  // rgb: any uint8
    if (f == 1) {                 // mask: a disc per frame, 0/255
      const int64_t cy = 200 + static_cast<int64_t>(s * 97 % 500), cx = 300 + static_cast<int64_t>(s * 211 % 1200);
      return (y - cy) * (y - cy) + (x - cx) * (x - cx) < 250 * 250 ? 255 : 0;
    }
    // depth: a float32 value, or a finite float16 bit pattern (sign, exponent < 31)
    if (half) return static_cast<double>(h & 0x7bff);
    return static_cast<double>(static_cast<float>(h % 100000) / 997.0f);
  };
  const ps::Status st = ps::testing::WriteStore(dir, spec);
  if (!st.ok()) {
    std::fprintf(stderr, "make_store: %s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("make_store: %s: %llu frames %lldx%lld, tiles %u, depth %s\n", dir.c_str(),
              static_cast<unsigned long long>(frames), static_cast<long long>(H), static_cast<long long>(W), tile,
              half ? "float16" : "float32");
  return 0;
}
