// `patchstore ingest`: the parent of the ingest subcommands, one per source
// format (ingest_images_cmd.cc, ingest_hdf5_cmd.cc, ingest_volumes_cmd.cc).
#include "cli/commands.h"

namespace patchstore::cli {

std::vector<Runner> RegisterIngest(CLI::App* app, const bool* quiet, const std::string& command_line) {
  auto* ingest = app->add_subcommand("ingest", "Decode files once into a store");
  ingest->require_subcommand(1);
  ingest->footer("Run 'patchstore ingest images --help' (PNG, JPEG, TIFF, OpenEXR frames),\n"
                 "'patchstore ingest hdf5 --help' (3D volumes in HDF5 groups) or\n"
                 "'patchstore ingest volumes --help' (NIfTI, MetaImage, NRRD, DICOM volumes).");
  return {RegisterIngestImages(ingest, quiet, command_line), RegisterIngestHdf5(ingest, quiet),
          RegisterIngestVolumes(ingest, quiet, command_line)};
}

}  // namespace patchstore::cli
