// `patchstore info STORE [--json] [--all]` — what a store (or a directory of
// shards) holds, read from the sample index: no record is read.
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/json.h"
#include "cli/progress.h"
#include "cli/shapes.h"
#include "patchstore/reader/reader.h"

namespace patchstore::cli {
namespace {

struct InfoArgs {
  std::string store;
  bool json = false;
  bool all = false;
};

// " (mask)" and whether its block counts exist (FORMAT.md "Mask block
// counts"), for `info`; "" for other fields.
std::string MaskNote(const FieldMeta& f) {
  if (!f.is_mask) return "";
  if (f.mask_blocks) {
    const std::string n = std::to_string(f.mask_blocks);
    return " (mask; block counts " + n + "x" + n + ")";
  }
  if (f.channels == 1 && f.layout == Layout::kCHW && !f.has_sat)
    return " (mask; no block counts: `patchstore upgrade` adds them)";
  return " (mask)";
}

// "3x1080x1920" -> [3, 1080, 1920]; "varies" or "-" -> null.
std::string JsonShape(const std::string& shape) {
  if (shape.empty() || shape.find_first_not_of("0123456789x") != std::string::npos) return "null";
  std::string out = "[";
  for (char c : shape) out += c == 'x' ? std::string(", ") : std::string(1, c);
  return out + "]";
}

// "R,G,B" -> ["R", "G", "B"].
std::string JsonList(const std::string& csv) {
  std::string out = "[";
  size_t start = 0;
  while (!csv.empty()) {
    size_t comma = csv.find(',', start);
    const size_t len = comma == std::string::npos ? std::string::npos : comma - start;
    out += (start ? ", " : "") + JsonString(csv.substr(start, len));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out + "]";
}

int RunInfo(const InfoArgs& a) {
  auto r = OpenStoreOrSet(a.store);
  if (!r.ok()) return Fail(r.status());
  const auto& reader = *r;
  const StoreMeta& m = reader->meta();
  // Shapes: per field, the shape shared by all samples or "varies".
  std::vector<std::string> shapes(m.fields.size());
  // Per mask field: samples whose mask has no valid pixel (no sampler can
  // draw a masked window from them; loaders skip and report them).
  std::vector<uint64_t> empty_masks(m.fields.size(), 0);
  std::vector<std::string> first_empty(m.fields.size());
  uint64_t payload = 0;
  for (int f = 0; f < reader->field_count(); ++f) {
    std::string shape;
    bool varies = false;
    for (uint64_t s = 0; s < reader->size(); ++s) {
      auto h = reader->Summary(s, f);  // the sample index: no record is read
      if (!h.ok()) continue;
      payload += h->payload_bytes();
      if (h->has_valid_count && h->valid_count == 0 && ++empty_masks[f] == 1)
        first_empty[f] = std::string(reader->id(s));
      std::string sh;
      for (int d = 0; d < h->rank; ++d) sh += (d ? "x" : "") + std::to_string(h->shape[d]);
      if (shape.empty()) shape = sh;
      else if (sh != shape) varies = true;
    }
    shapes[f] = varies ? "varies" : shape.empty() ? "-" : shape;
  }
  if (a.json) {
    std::ostringstream os;
    os << "{\"path\": " << JsonString(a.store) << ", \"format_version\": " << m.format_version
       << ", \"tool_version\": " << JsonString(m.tool_version) << ", \"kind\": " << JsonString(m.kind)
       << ", \"sealed\": " << (m.sealed ? "true" : "false") << ", \"samples\": " << reader->size()
       << ", \"payload_bytes\": " << payload << ", \"fields\": [";
    for (size_t f = 0; f < m.fields.size(); ++f) {
      const auto& fm = m.fields[f];
      os << (f ? ", " : "") << "{\"name\": " << JsonString(fm.name) << ", \"channels\": " << fm.channels
         << ", \"shape\": " << JsonShape(shapes[f])
         << ", \"source_type\": " << JsonString(SourceTypeName(fm.source_type))
         << ", \"source_format\": " << JsonString(fm.source_format)
         << ", \"normalisation\": " << JsonString(fm.norm.ToString())
         << ", \"channel_names\": " << JsonList(fm.channel_names) << ", \"mask\": " << (fm.is_mask ? "true" : "false")
         << ", \"dtype\": " << JsonString(DTypeName(fm.dtype))
         << ", \"layout\": " << JsonString(fm.tile ? "tiles" : "rows") << ", \"tile_size\": " << fm.tile;
      if (fm.is_mask) os << ", \"empty_masks\": " << empty_masks[f] << ", \"mask_blocks\": " << fm.mask_blocks;
      os << ", \"shape_range\": " << ShapeRangeJson(FieldShapeRange(*reader, static_cast<int>(f))) << "}";
    }
    os << "]";
    if (a.all) {
      os << ", \"sample_shapes\": [";
      for (uint64_t i = 0; i < reader->size(); ++i)
        os << (i ? ", " : "") << "{\"id\": " << JsonString(reader->id(i))
           << ", \"shapes\": " << SampleShapesJson(*reader, i, JsonString)
           << (m.kind == "volumes" ? ", \"geometry\": " + SampleGeometryJson(*reader, i) : std::string()) << "}";
      os << "]";
    }
    os << "}";
    std::cout << os.str() << "\n";
    return 0;
  }
  std::printf("store:          %s\n", a.store.c_str());
  std::printf("format version: %u (written by patchstore %s)\n", m.format_version, m.tool_version.c_str());
  std::printf("kind:           %s\n", m.kind.c_str());
  std::printf("sealed:         %s\n", m.sealed ? "yes" : "no (ingest unfinished or failed)");
  std::printf("samples:        %llu\n", static_cast<unsigned long long>(reader->size()));
  if (reader->store_count() > 1) {
    std::printf("stores:         %zu, read as one (samples in this order):\n", reader->store_count());
    for (size_t i = 0; i < reader->store_count(); ++i) {
      auto samples = reader->store_begin(i + 1) - reader->store_begin(i);
      std::printf("  %s: %llu samples\n", reader->store_path(i).c_str(), static_cast<unsigned long long>(samples));
    }
  }
  std::printf("record bytes:   %s\n", HumanBytes(static_cast<double>(payload)).c_str());
  std::printf("fields:\n");
  for (size_t f = 0; f < m.fields.size(); ++f) {
    const auto& fm = m.fields[f];
    const std::string layout = fm.tile ? "tiles " + std::to_string(fm.tile) : std::string("rows");
    const std::string channels = fm.channel_names.empty() ? "" : " channels=" + fm.channel_names;
    std::printf("  %-10s C=%u shape=%s dtype=%s layout=%s source=%s %s norm=%s%s%s\n", fm.name.c_str(), fm.channels,
                shapes[f].c_str(), DTypeName(fm.dtype), layout.c_str(), fm.source_format.c_str(),
                SourceTypeName(fm.source_type), fm.norm.ToString().c_str(), channels.c_str(), MaskNote(fm).c_str());
    if (shapes[f] == "varies")
      std::printf("  %-10s shapes: %s%s\n", "",
                  ShapeRangeText(FieldShapeRange(*reader, static_cast<int>(f)), m.kind == "volumes").c_str(),
                  a.all ? "" : "; --all lists each sample");
    if (empty_masks[f] > 0)
      std::printf("  %-10s %llu sample(s) with no valid pixel (first: '%s'): samplers with require=%s skip them\n", "",
                  static_cast<unsigned long long>(empty_masks[f]), Printable(first_empty[f]).c_str(), fm.name.c_str());
  }
  if (a.all) {
    std::printf("samples (%s):\n", m.kind == "volumes" ? "S x H x W per field" : "C x H x W per field");
    for (uint64_t i = 0; i < reader->size(); ++i) {
      const std::string geometry = SampleGeometryText(*reader, i);
      std::printf("  %s: %s%s%s\n", Printable(reader->id(i)).c_str(), SampleShapesText(*reader, i).c_str(),
                  geometry.empty() ? "" : "; ", geometry.c_str());
    }
  }
  return 0;
}

}  // namespace

Runner RegisterInfo(CLI::App* app, const bool* /*quiet*/) {
  auto* cmd = app->add_subcommand("info", "Describe a store: fields, shapes, samples, bytes, sealed");
  auto args = std::make_shared<InfoArgs>();
  cmd->add_option("STORE", args->store, kStoreOrSetHelp)->required();
  cmd->add_flag("--json", args->json, "Machine-readable output");
  cmd->add_flag("--all", args->all,
                "Also list every sample's shapes, e.g. each volume's (S,H,W), and each volume's geometry (spacing, "
                "origin, axes) when it has one");
  AddExitCodes(cmd, "0 described, 1 the store could not be read (the message says why), 2 bad usage.");
  return [cmd, args]() -> int { return cmd->parsed() ? RunInfo(*args) : -1; };
}

}  // namespace patchstore::cli
