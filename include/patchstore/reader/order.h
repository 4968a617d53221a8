// patchstore/reader/order.h — the epoch orders of the samplers: uniformly
// random, or locality-aware for stores larger than the page cache.
//
// kRandom: one Fisher-Yates permutation of the epoch's items
// (splitmix::Shuffle), every item equally likely anywhere. Best when the
// store fits in RAM (the default everywhere).
//
// kLocality (opt-in): items are taken in storage order (a store's index
// order is its record order: ingest writes records in commit order) and cut
// into consecutive blocks whose record bytes fit half the page-cache budget
// (a block larger than that is only a single item that alone exceeds it).
// Each epoch the block boundaries are shifted by a random amount (the first
// block gets a random share of the cap), the blocks are visited in a random
// order and the items of each block in a random order. So at any time the
// readers work inside one block of at most budget/2 bytes, which stays in
// the page cache while it is read (and while the next block starts),
// instead of every item of the store being equally likely next. The price:
// items of one block are near each other in the epoch (less mixing than a
// full shuffle); with budget >= 2 x the store's bytes it is one block, a
// full random permutation of its own (a different one from kRandom's).
// Prior art: FFCV's QUASI_RANDOM order, MosaicML Streaming's py1s/py1b
// shuffles (blocks of shards with shifted boundaries).
//
// Ranks: the order is one global sequence per (seed, epoch), split over
// ranks exactly as the random order is (DistributedSampler style: rank r
// takes positions r, r + world_size, ...; padded by repeating its start).
// So every item is visited once per epoch across ranks (plus that padding),
// and the ranks of one machine read the same block at the same time.
//
// Deterministic: a function of (item bytes, budget, seed, epoch) only;
// every rank and process computes the same sequence.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "patchstore/store/status.h"

namespace patchstore {

enum class SampleOrder : uint8_t {
  kRandom = 0,    // a uniformly random permutation per epoch
  kLocality = 1,  // blocks of storage order that fit a page-cache budget, shuffled across and within
};

// "random", "locality".
const char* SampleOrderName(SampleOrder order);
// The order of a name above; InvalidArgument listing the names otherwise.
Result<SampleOrder> ParseSampleOrder(const std::string& name);

// The blocks of kLocality for one epoch: block b holds positions
// [starts[b], starts[b+1]) of the storage-ordered items (starts[0] = 0,
// starts.back() = n). Greedy: a block takes items while their bytes fit
// budget_bytes / 2; the first block's cap is a random share of that
// (shifting every boundary from epoch to epoch). REQUIRES: budget_bytes > 0.
std::vector<uint64_t> LocalityBlocks(const uint64_t* bytes, uint64_t n, uint64_t budget_bytes, uint64_t seed,
                                     uint64_t epoch);

// The kLocality order of one epoch: a permutation of [0, n) (positions in
// the storage-ordered item list) into `out`. bytes[i]: the record bytes
// item i reads. InvalidArgument when budget_bytes is 0.
Status LocalityOrder(const uint64_t* bytes, uint64_t n, uint64_t budget_bytes, uint64_t seed, uint64_t epoch,
                     std::vector<uint64_t>* out);

// "8GB", "512MiB", "1.5G", "1000000" (bytes): a byte count as users write
// it (K/M/G/T powers of 1024 with or without "B"/"iB"; KB/MB/GB/TB powers of
// 1000). InvalidArgument naming the text otherwise.
Result<uint64_t> ParseByteSize(const std::string& text);

}  // namespace patchstore
