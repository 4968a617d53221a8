// `patchstore ingest volumes` — NIfTI, MetaImage, NRRD and DICOM volumes
// through ITK, with their geometry (see patchstore/ingest/ingest_volumes.h).

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/ingest_run.h"
#include "cli/validators.h"
#include "patchstore/ingest/ingest_volumes.h"

namespace patchstore::cli {
namespace {

struct VolumesArgs {
  VolumeIngestOptions options;
  std::vector<std::string> field_specs, norm_specs, interpolation_specs;
  std::string spacing;
  std::string on_error = "stop";
  bool no_sync = false;
  std::string shard;
  CLI::Option* shard_opt = nullptr;
  std::string command_line;
};

int RunVolumes(VolumesArgs& a, bool quiet) {
  VolumeIngestOptions& o = a.options;
  if (!VolumeIngestAvailable())
    return Fail("ingest volumes is not built in: this patchstore was built without ITK (install "
                "libinsighttoolkit5-dev and build again)");
  auto add_template = [&](std::string name, std::string value) {
    o.field_templates.emplace_back(std::move(name), std::move(value));
  };
  auto add_norm = [&](std::string name, std::string value) { o.norm[name] = std::move(value); };
  auto add_interpolation = [&](std::string name, std::string value) { o.interpolation[name] = std::move(value); };
  if (!ParseAssignments(a.field_specs, "field", "NAME=TEMPLATE", add_template) ||
      !ParseAssignments(a.norm_specs, "norm", "FIELD=SPEC", add_norm) ||
      !ParseAssignments(a.interpolation_specs, "interpolation", "FIELD=nearest|linear", add_interpolation))
    return 2;
  if (!a.spacing.empty()) {
    std::string s = a.spacing;
    for (char& c : s)
      if (c == ',') c = ' ';
    const char* p = s.c_str();
    for (int i = 0; i < 3; ++i) {
      char* end = nullptr;
      const double v = std::strtod(p, &end);
      if (end == p) break;
      o.spacing.push_back(v);
      p = end;
    }
    while (*p == ' ') ++p;
    if (o.spacing.size() != 3 || *p != '\0') {
      std::cerr << "patchstore: error: --spacing takes X,Y,Z (three numbers, mm), got '" << a.spacing << "'\n";
      return 2;
    }
  }
  if (!CheckSourceFlags(o.manifest, o.root, o.field_templates.size())) return 2;
  if (!ParseShardFlag(a.shard_opt, a.shard, &o.shard_index, &o.shard_count)) return 2;
  o.skip_errors = a.on_error == "skip";
  o.durable = !a.no_sync;
  o.command_line = a.command_line;
  return RunIngestCommand("volumes", o.store, quiet, [&](const ProgressCallback& progress, const auto& cancelled) {
    o.progress = progress;
    o.cancelled = cancelled;
    return IngestVolumes(o);
  });
}

}  // namespace

Runner RegisterIngestVolumes(CLI::App* ingest, const bool* quiet, std::string command_line) {
  auto* cmd = ingest
                  ->add_subcommand("volumes",
                                   "Ingest NIfTI, MetaImage, NRRD and DICOM volumes through ITK, with their geometry")
                  ->fallthrough();
  auto args = std::make_shared<VolumesArgs>();
  args->command_line = std::move(command_line);
  VolumeIngestOptions& o = args->options;
  cmd->add_option("STORE", o.store, "Store directory (created if missing)")->required();
  cmd->add_option("--manifest", o.manifest,
                  "CSV manifest: header id,<field>,...; cells are files (or DICOM folders) relative to the manifest");
  cmd->add_option("--root", o.root, "Root folder searched with --field templates");
  cmd->add_option("--field", args->field_specs,
                  "NAME=TEMPLATE (repeat), e.g. MR='{patient}/mr.nii.gz'; a template may name a folder holding a "
                  "DICOM series. The first field's matches define the volumes, ids join the placeholder values "
                  "with '/'");
  cmd->add_option("--slice-axis", o.slice_axis,
                  "Anatomical axis the stored slices are taken along, from each volume's direction matrix: axial "
                  "(default), coronal or sagittal")
      ->check(CLI::IsMember({"axial", "coronal", "sagittal"}));
  cmd->add_option("--orient", o.orient,
                  "Reorient every volume first (exact: axes permuted and flipped) so that its axes i, j, k point to "
                  "these three letters, e.g. RAS or LPS (LPS with axial slices: rows anterior to posterior, columns "
                  "the patient's right to left)");
  cmd->add_option("--spacing", args->spacing,
                  "X,Y,Z: resample every volume to this voxel size (mm along i, j, k, after --orient); linear for "
                  "images (values become float32), nearest for --mask fields; a patient's other fields are "
                  "resampled onto its first field's grid");
  cmd->add_option("--interpolation", args->interpolation_specs,
                  "FIELD=nearest|linear: how --spacing resamples FIELD (default nearest for --mask fields, linear "
                  "for the others; nearest keeps labels)");
  cmd->add_option("--series", o.series,
                  "For DICOM folders holding several series: the SeriesInstanceUID (or series number) to read");
  cmd->add_option("--volume-index", o.volume_index,
                  "For 4-D images: the volume (0-based) to take (default: 4-D images are refused); 3-D images "
                  "are read as they are")
      ->check(NonNegative());
  cmd->add_option("--mask", o.mask_fields,
                  "Treat FIELD as a mask: marked as such, stored as {0,1} unless --norm says otherwise, resampled "
                  "with nearest neighbour");
  cmd->add_option("--norm", args->norm_specs,
                  "FIELD=SPEC: none (default: values unchanged, a CT keeps its HU) | unit | symmetric (uint8/16 "
                  "sources) | binary | affine:SCALE,OFFSET, optionally +clamp:LO,HI | range:LO,HI");
  cmd->add_option("--encoding", o.encoding,
                  "Record dtype (repeat): float32 (default) | compact (uint8/uint16 volumes kept as they are, "
                  "int8/int16 as int16, others float32; readers return the same float32) | "
                  "FIELD=float32|compact|float16");
  cmd->add_option("-j,--threads", o.threads, "Decoder processes (default: all cores)")->check(NonNegative());
  cmd->add_option("--max-voxels", o.max_voxels,
                  "Refuse volumes whose header declares (or whose resampled grid has) more voxels (default 2^29)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--decode-timeout", o.decode_timeout_s, "Seconds allowed to decode one volume (default 600)")
      ->check(CLI::PositiveNumber & FiniteNumber());
  cmd->add_option("--decode-memory", o.decode_memory_bytes,
                  "Bytes of memory each decoder process may allocate (default 0: 8 GiB); a volume that needs more "
                  "fails alone");
  cmd->add_option("--on-error", args->on_error,
                  "stop (default): stop at the first bad volume, keeping what was committed; skip: record failures "
                  "in the report and go on")
      ->check(CLI::IsMember({"stop", "skip"}));
  cmd->add_option("--report", o.report_path,
                  "Where --on-error skip writes the failures of this run (default STORE/ingest-errors.tsv; a run "
                  "without failures removes it)");
  cmd->add_flag("--no-sync", args->no_sync, "Do not fsync commits (faster; a crash may lose recent batches)");
  args->shard_opt = cmd->add_option(
      "--shard", args->shard,
      "I/N: ingest only shard I (0..N-1) of N: the volumes whose id hashes to I, into a store of their own");
  cmd->footer(
      "Formats, by the name: NIfTI (.nii, .nii.gz, .hdr/.img), MetaImage (.mha, .mhd), NRRD (.nrrd, .nhdr);\n"
      "a folder is a DICOM series (several series in it: refused, naming them, unless --series picks one;\n"
      "a missing slice is refused). 4-D images are refused unless --volume-index picks a volume.\n"
      "\n"
      "Each (volume, field) becomes one (S,H,W) record, S along --slice-axis as the volume's geometry says,\n"
      "and each volume keeps its geometry (spacing, origin, direction; NIfTI qform/sform codes): shown by\n"
      "`patchstore info --all` and `ls --json`, written back by `export --format nifti|mha`.\n"
      "The fields of a patient must share one grid (a difference is refused, naming it) unless --spacing\n"
      "resamples them onto one. Decoding runs in isolated, memory-limited processes.\n"
      "\n"
      "Examples:\n"
      "  patchstore ingest volumes synthrad.ps --root data --field MR='{patient}/mr.nii.gz' \\\n"
      "      --field CT='{patient}/ct.nii.gz' --field MASK='{patient}/mask.nii.gz' --mask MASK\n"
      "  patchstore ingest volumes brain.ps --root data --field T1='{subject}/t1.mha' --orient LPS --spacing 1,1,1\n"
      "  patchstore ingest volumes ct.ps --root dicom --field CT='{patient}/ct'   # a DICOM series per folder\n"
      "Running the same command again resumes: complete volumes are skipped.");
  AddIngestExitCodes(cmd, "volumes");
  return [cmd, args, quiet]() -> int {
    if (!cmd->parsed()) return -1;
    return RunVolumes(*args, *quiet);
  };
}

}  // namespace patchstore::cli
