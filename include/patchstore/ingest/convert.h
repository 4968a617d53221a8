// patchstore/ingest/convert.h — copy a store: compacted as it is, or
// re-laid out and re-encoded from its records, without the sources.
//
// The layout (rows or tiles) and encoding (float32, compact, float16) of a
// store are chosen at ingest and fixed for its life (ingest/encoding.h).
// CopyStore writes a new store with other ones from the records of an
// existing store: every record is read through the Reader (checksum
// checked), brought to the float32 values readers return, and encoded again
// by the ingest's one encoder (RecordDType, ToFloat16; integer dtypes hold
// the source values under the record's normalisation), so the copy reads
// exactly as an ingest of the same sources with those flags would:
//   * exact encodings (float32, compact): every value read from the copy is
//     bit-identical to the same value read from the source. A value the
//     target dtype cannot hold exactly (e.g. compact uint8 for a field whose
//     float32 values are not those of any 8-bit source under its
//     normalisation: it was stored float16, or written by hand) stops the
//     copy with an InvalidArgument naming the sample, the field, the value
//     and the option that keeps the field as it is.
//     The integer dtypes of compact hold source values: from float32 records
//     they are the values the normalisation's inverse gives (what export
//     writes back), so they equal the source file's unless the
//     normalisation merged some (a mask's binary {0,1}: 0 and the source
//     type's largest value; clamped values: the clamp bound's source value).
//   * FIELD=float16 rounds to nearest, as ingest does (lossy, on request).
// Everything else is carried: ids in index order, every field's metadata
// (source type, normalisation, channel names, masks), the store's
// attributes (ingest settings, shard I/N, slice axis) and its input order,
// mask block counts (written by the Writer from the copied masks, with the
// source's block edge) and the sample index, sealed when the source is.
// Volume stores convert their encoding; their layout stays rows (a slice is
// one contiguous range of its record already), so --layout tiles is refused
// for them, as `ingest hdf5` refuses it.
//
// Crash safety: the copy is written into a temporary folder next to DST
// (DST.copy-XXXXXX), verified there (every checksum, as `patchstore
// verify`), and renamed to DST only when complete and verified: an
// interrupted, killed or failed copy never leaves a DST (a killed one may
// leave its temporary folder).
//
// Thread-safety: reentrant; the source may be read (or appended to: the copy
// holds what was committed when it began) by other processes meanwhile.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "patchstore/ingest/ingest.h"
#include "patchstore/reader/verify.h"
#include "patchstore/store/status.h"

namespace patchstore {

struct CopyOptions {
  std::string src;  // an existing store
  std::string dst;  // the new store's directory: must not exist, its parent must

  // Empty `layout` and `encoding` (and tile_size 0): a compacted copy of the
  // bytes as they are (LMDB's compacting copy: CopyStoreCompact). Otherwise
  // a conversion from the records:
  //   layout: "" (each field keeps its own), "rows" or "tiles" (every
  //   (C,H,W) field in tile_size x tile_size tiles). tile_size: a multiple
  //   of 8 in 8..4096 with layout "tiles"; 0: the source's tile edge when it
  //   is tiled, else kDefaultTileSize (ingest/encoding.h).
  //   encoding: --encoding specs as ingest takes them ("float32" |
  //   "compact" for every field, "FIELD=float32|compact|float16" for one);
  //   a field that no spec names (all of them when only per-field specs or
  //   none are given) keeps its dtype.
  std::string layout;
  uint32_t tile_size = 0;
  std::vector<std::string> encoding;

  int threads = 0;           // converter threads; 0 = all cores
  bool durable = true;       // fsync each commit of the conversion
  std::string command_line;  // recorded as the copy's "copy_command" attribute (conversions)
  // The conversion's progress (done/total samples, bytes written) and its
  // notices (Progress::message: what is being written), from the calling
  // thread.
  ProgressCallback progress;
  // What the user must be told even when progress is not shown: each
  // staging folder of an earlier, interrupted copy to DST that was removed or
  // kept ("copy: removed '<path>': <why>"). Unset: sent to `progress` as a
  // notice.
  std::function<void(const std::string& line)> notice;
  // The verification's progress: records checked of all.
  std::function<void(uint64_t done, uint64_t total)> verify_progress;
  // Polled between samples; true stops the copy (Aborted), leaving no DST.
  std::function<bool()> cancelled;
};

struct CopySummary {
  bool converted = false;  // re-laid out / re-encoded (else a compacted copy)
  uint64_t samples = 0;    // verified in the copy
  uint64_t records = 0;
  uint64_t src_bytes = 0;  // data.mdb of the source and of the copy
  uint64_t dst_bytes = 0;
  double seconds = 0;
};

// Copies `o.src` to `o.dst` as described above. Errors (nothing is left at
// DST): AlreadyExists when DST exists; InvalidArgument for bad options (the
// message names the option), a missing parent folder, a lossy conversion
// (naming sample, field and value) or --layout tiles on a volume store;
// NotFound / Corruption / IOError from reading the source (a record whose
// checksum fails names its sample and field); Aborted when cancelled;
// Corruption when the copy fails verification, its problems then listed in
// `*problems` (when given).
Result<CopySummary> CopyStore(const CopyOptions& o, std::vector<VerifyProblem>* problems = nullptr);

// The conversion alone: writes the converted copy of `o.src` into
// `dst_dir`, an existing empty directory (CopyStore's temporary folder), not
// verified, with `o.layout`, `o.tile_size` and `o.encoding`.
Status ConvertStore(const CopyOptions& o, const std::string& dst_dir);

}  // namespace patchstore
