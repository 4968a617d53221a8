// ingest/decode_pool.h — decoding in child processes
// (ingest-private).
//
// Image libraries were not written for hostile input: a damaged EXR can make
// a decoder allocate gigabytes, spin for minutes or crash. A DecodePool runs
// DecodeFile() in persistent child processes, one per decoder thread, each
// with a memory limit (RLIMIT_DATA) and a per-file watchdog. Pixels come back
// through a shared mapping (no copy through a pipe). A child that crashes,
// runs out of memory or times out is replaced, and the file gets an error
// that names it and the cause; the ingest goes on or stops as configured.
//
// Thread-safety: slot `i` must be used by one thread at a time.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ingest/decode.h"

namespace patchstore {

// A job other than image decoding, run in the child for each Call: it
// writes at most `shared_size` bytes of pixels to `shared` and returns the
// reply that Call hands back (its own encoding: the job and its caller
// agree on it). It must not throw; whatever it allocates counts against the
// child's memory limit.
using DecodeJob = std::function<std::string(const std::string& request, uint8_t* shared, size_t shared_size)>;

struct DecodePoolOptions {
  int slots = 1;  // child processes (one per decoder thread)
  uint64_t max_pixels = uint64_t{1} << 28;
  double timeout_s = 60;      // per file
  uint64_t memory_limit = 0;  // bytes of new data memory per child; 0 = 4 x max_pixels x 4 + 1 GiB
  // Set for a pool that runs `job` (Call) instead of DecodeFile (Decode).
  DecodeJob job;
  uint64_t shared_bytes = 0;  // pixel buffer per slot (reserved, not committed); 0: max_pixels x 4
};

class DecodePool {
 public:
  // Starts the children. Call before starting other threads when possible.
  static Result<std::unique_ptr<DecodePool>> Start(const DecodePoolOptions& options);
  ~DecodePool();

  // Decodes `path` in child `slot`. The returned image's pixels point into
  // the slot's shared mapping: valid until the next Decode on this slot.
  Result<DecodedImage> Decode(int slot, const std::string& path, const std::string& channel);

  // Runs options.job on `request` in child `slot` and returns its reply;
  // the pixels it wrote are at shared(slot) until the next call on this
  // slot. A crash, a timeout or the memory limit comes back as Corruption
  // "decoding '<what>': the decoder crashed (...)" / "gave up after N s".
  Result<std::string> Call(int slot, const std::string& request, const std::string& what);
  const uint8_t* shared(int slot) const { return slots_[static_cast<size_t>(slot)].shared; }
  size_t shared_size(int slot) const { return slots_[static_cast<size_t>(slot)].shared_size; }

 private:
  struct Slot {
    pid_t pid = -1;
    int to_child = -1, from_child = -1;
    uint8_t* shared = nullptr;  // pixel buffer, max_pixels * 4 bytes (reserved, not committed)
    size_t shared_size = 0;
  };
  DecodePool() = default;
  Status Spawn(Slot* slot);
  void Kill(Slot* slot);
  // Sends `request` to the child of `s` and waits for the reply.
  Result<std::string> Exchange(Slot* s, const std::string& request, const std::string& what);
  DecodePoolOptions options_;
  std::vector<Slot> slots_;
};

}  // namespace patchstore
