// store/shard.h — which shard of a shard set a sample belongs to
// (internal; FORMAT.md "Shards").
//
// A shard set is N stores written by N independent ingests (`--shard I/N`):
// store I holds the samples whose id hashes to I. The hash is xxh3_64 of the
// id bytes (seed 0) mod N, so a sample's shard depends on its id and N only:
// adding inputs moves no existing sample. Each store records its place as
// the metadata attribute `shard` = "I/N".
#pragma once

#include <cstdint>
#include <string_view>

#include "patchstore/store/format.h"
#include "patchstore/store/status.h"

namespace patchstore {

// The metadata attribute (attr.shard) holding "I/N".
inline constexpr const char* kShardAttribute = "shard";
// Largest shard count accepted.
inline constexpr uint32_t kMaxShardCount = 1u << 20;

// xxh3_64(id bytes, seed 0) % count. REQUIRES: count > 0.
uint32_t ShardOfId(std::string_view id, uint32_t count);

// Parses "I/N" (decimal, 0 <= I < N <= kMaxShardCount). InvalidArgument
// naming the text and the rule otherwise.
Status ParseShardSpec(std::string_view text, uint32_t* index, uint32_t* count);

// The shard a store's metadata records: (I, N), or (0, 0) when the store is
// not a shard. Corruption when the attribute is malformed.
Status ShardOfStore(const StoreMeta& meta, uint32_t* index, uint32_t* count);

}  // namespace patchstore
