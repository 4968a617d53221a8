// patchstore/ingest/ingest.h — decode files once into a store; export back.
//
// This room is the only one that links OpenCV, OpenEXR and HDF5. Readers
// never need it.
//
// Image ingest: every sample is a set of named fields (rgb, mask, depth),
// each decoded from one file into a (C,H,W) record (float32 normalised by
// default; rows or tiles, compact or float16 dtypes on request: encoding.h):
//   * PNG, JPEG, BMP through OpenCV: 8- and 16-bit; gray, RGB (stored in RGB
//     order), RGBA.
//   * TIFF through libtiff: the samples as stored (strips or tiles, planar or
//     interleaved, extra samples, any compression); CMYK, YCbCr, MinIsWhite
//     and odd bit depths are refused naming the tag (decode.h DecodeTiff).
//   * OpenEXR through the OpenEXR library: half/float/uint channels,
//     scanline or tiled, any compression. `file.exr:Z` picks channel Z; by
//     default all channels (R,G,B,A first in that order, others by name).
//     Luminance/chroma files (Y, RY, BY) become R,G,B[,A] as OpenEXR's RGBA
//     interface reconstructs them (the field's source_format says "exr-yc"
//     when its first file was one).
// Decoders' notes (32-bit integers above 2^24, which float32 rounds) are in
// IngestSummary::warnings.
// Normalisation per field (recorded in each record's header so export can
// invert it): 8/16-bit images default to [-1,1] (x/maxval*2-1, as image
// training code commonly does), masks (field named "mask" or listed in mask_fields) to {0,1},
// float data unchanged.
//
// Guarantees: decoding runs on a thread pool; one writer commits batches, so
// a sample is either entirely in the store or absent. On the first bad file
// ingest stops (default) with everything committed before it intact, or
// with skip_errors records the failure and goes on. Running the same ingest
// again resumes: samples already present are skipped. A finished ingest
// seals the store.
//
// Thread-safety: each function may be called from any thread; do not run two
// ingests into one store at once (the second fails with IOError).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "patchstore/store/format.h"
#include "patchstore/store/status.h"

namespace patchstore {

// Progress reported by long operations: `done` of `total` items, plus bytes.
// A report with a non-empty `message` is a notice to show as it is (e.g. the
// projected store size an ingest reports before it writes:
// ingest/projection.h), not a step: its counts are those of the last step.
struct Progress {
  uint64_t done = 0, total = 0, failed = 0, skipped = 0;
  uint64_t bytes = 0;  // record payload bytes written so far
  double seconds = 0;
  std::string message;
};
using ProgressCallback = std::function<void(const Progress&)>;

struct ImageIngestOptions {
  std::string store;  // destination directory (created if missing)

  // Form 1: a CSV manifest with header `id,<field>,<field>,...`; cells are
  // paths relative to the manifest's folder, optionally `path:CHANNEL` for EXR.
  std::string manifest;

  // Form 2: a root folder and one path template per field, with named
  // placeholders: {"rgb", "{video}/render/rgb/{frame}.png"}. Files matching
  // the first field's template define the samples; the id joins the
  // placeholder values with '/' in order of appearance ("video03/0042").
  std::string root;
  std::vector<std::pair<std::string, std::string>> field_templates;

  // Fields treated as masks (stored as {0,1}); a field named "mask" always is.
  std::vector<std::string> mask_fields;
  // Per-field normalisation spec (see ParseNormalization), overriding defaults.
  std::map<std::string, std::string> norm;

  // Record layout of every (C,H,W) field: "rows" (row-major, zero-copy
  // views of whole records) or "tiles" (tile_size x tile_size tiles: a
  // window of a store larger than RAM reads a few contiguous ranges; see
  // store/FORMAT.md "Tiled records"). tile_size: a multiple of 8 in 8..4096,
  // or 0: kDefaultTileSize (ingest/encoding.h) for a new store, the store's
  // own tile edge when resuming one.
  std::string layout = "rows";
  uint32_t tile_size = 0;
  // Record dtype per field, as --encoding: "float32" (default) or "compact"
  // for every field, "FIELD=float32|compact|float16" for one (later specs
  // win). See ingest/encoding.h and store/FORMAT.md "Encodings".
  std::vector<std::string> encoding;

  int threads = 0;                             // decoder threads; 0 = all cores
  bool skip_errors = false;                    // --on-error skip
  std::string report_path;                     // failures as TSV; default <store>/ingest-errors.tsv
  uint64_t batch_bytes = uint64_t{256} << 20;  // commit after this many bytes
  uint64_t batch_samples = 256;                // ... or this many samples
  bool durable = true;                         // fsync each commit
  uint64_t max_pixels = uint64_t{1} << 28;     // refuse larger declared images
  // Decode in child processes with a memory limit and a per-file watchdog,
  // so a hostile file can neither crash nor stall the ingest.
  bool isolate_decoders = true;
  double decode_timeout_s = 60;
  std::string command_line;  // recorded in the metadata
  // Shard I of N (shard_count 0: the whole input): only the samples whose
  // id has ShardOfId(id, N) == I (store/format.h) are ingested, into a store
  // that records I/N; samples_total counts this shard's samples.
  uint32_t shard_index = 0, shard_count = 0;
  ProgressCallback progress;  // called from the writer thread
  // Polled between samples; returning true stops the ingest after committing
  // what was decoded so far (Status code kAborted). E.g. a Ctrl-C flag.
  std::function<bool()> cancelled;
};

struct IngestSummary {
  uint64_t samples_total = 0;    // samples found in the input
  uint64_t samples_written = 0;  // newly committed
  uint64_t samples_present = 0;  // already in the store (resume)
  uint64_t samples_failed = 0;   // skipped because of errors
  uint64_t bytes_written = 0;    // record payload bytes committed (in the records' dtypes)
  uint64_t bytes_decoded = 0;    // same, counted at decode time
  double seconds = 0;
  std::string report_path;          // where failures were written, if any
  std::string report_error;         // why the failure report could not be written ("" if it was)
  std::vector<std::string> errors;  // one message per failed sample (first 100)
  // Things that went through but look wrong (HDF5: a patient already stored
  // under another file prefix, slices much thinner one way than another axis
  // would give, an all-zero mask volume): one line each, first 100.
  std::vector<std::string> warnings;
  // The projection reported before the first write (ingest/projection.h):
  // the store's projected data.mdb bytes, this machine's RAM (or
  // PATCHSTORE_ASSUME_RAM_BYTES), and the flags that serve a store larger
  // than the page cache when it is one and they are not chosen ("" else).
  // 0 / "" when nothing was to be written.
  uint64_t projected_bytes = 0;
  uint64_t ram_bytes = 0;
  std::string advice;
};

// Runs an image ingest. Errors name the file, the sample and the cause.
Result<IngestSummary> IngestImages(const ImageIngestOptions& options);

struct ExportOptions {
  std::string store;
  std::string outdir;
  std::vector<std::string> ids;     // empty: all samples
  std::vector<std::string> fields;  // empty: all fields
  // "" (by source: png for integer, exr for float), "png", "exr", "h5";
  // volume stores also "nifti" and "mha" (ingest_volumes.h: one file per
  // (volume, field), float32 with the stored geometry; needs ITK).
  std::string format;
  bool has_window = false;              // --window LO,HI for float data written as PNG, in STORED units
  double window_lo = 0, window_hi = 1;  //   (after the ingest normalisation)
  // --window auto: each record's (volume's) 1st..99th percentile of its finite values.
  bool window_auto = false;
  // Volumes written as h5: "source" or "" (the slice axis back where it was
  // in the HDF5 input) or "shw" (slices first, as stored).
  std::string axis_order;
  ProgressCallback progress;
};

struct ExportSummary {
  uint64_t files_written = 0;
  uint64_t bytes_written = 0;
  std::vector<std::string> paths;  // first 1000 files written
  // E.g. a window far wider than the stored values of a normalised field
  // (the window is in stored units): one line per field.
  std::vector<std::string> warnings;
};

// Writes OUTDIR/<safe id>/<field>.<ext> for each selected record. PNG output
// inverts the stored normalisation and keeps the source bit depth and
// channels; EXR output is float32, bit-exact.
Result<ExportSummary> Export(const ExportOptions& options);

// Maps a sample id to a relative path that stays inside the output folder:
// each '/'-separated part becomes a folder; bytes outside [A-Za-z0-9._-] and
// the parts "." and ".." are percent-encoded, an empty part becomes "%",
// parts longer than 200 bytes are cut and suffixed with a hash.
std::string SafeRelativePath(const std::string& id);

}  // namespace patchstore
