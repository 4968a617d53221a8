// ingest/sources.h — which files make which samples (ingest-private).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "patchstore/store/status.h"

namespace patchstore {

struct FileRef {
  std::string path;     // absolute or relative to the working directory
  std::string channel;  // EXR channel to select, "" = all
};

struct SampleSource {
  std::string id;
  std::vector<FileRef> files;  // one per field, in field order
};

struct SourceList {
  std::vector<std::string> fields;
  std::vector<SampleSource> samples;
  // Found while listing (FindByTemplates: files of a later field whose
  // sample has no file of the first field, so it is not ingested).
  std::vector<std::string> warnings;
};

// Reads a CSV manifest (RFC 4180 quoting) whose header is `id,<field>,...`.
// Cells are paths relative to the manifest's folder; `path.exr:CHANNEL`
// selects an EXR channel. Errors name the manifest and the line.
Result<SourceList> ReadManifest(const std::string& manifest_path);

// Finds samples under `root` by path templates with named placeholders, e.g.
// {"rgb", "{video}/render/rgb/{frame}.png"}. The first template is matched
// against every file below root; the others are filled in with the same
// placeholder values (a missing file is reported when it is decoded). Ids
// join the placeholder values of the first template with '/', in order of
// appearance. Samples are sorted by id. A template may end in ":CHANNEL".
// With `match_folders`, the first template also matches folders (a DICOM
// series is a folder); a folder that matches is not searched further.
Result<SourceList> FindByTemplates(const std::string& root,
                                   const std::vector<std::pair<std::string, std::string>>& templates,
                                   bool match_folders = false);

}  // namespace patchstore
