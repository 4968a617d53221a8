// NIfTI, MetaImage, NRRD and DICOM volumes through ITK (ingest/volume_decode.h).
// Runs inside a DecodePool child: every ITK exception, and any allocation
// that fails under the child's memory limit, becomes the reply's status.
// The only file of patchstore that includes ITK headers, with its export
// writer.
#include <itkExtractImageFilter.h>
#include <itkGDCMImageIO.h>
#include <itkGDCMSeriesFileNames.h>
#include <itkImage.h>
#include <itkImageFileReader.h>
#include <itkImageFileWriter.h>
#include <itkImageSeriesReader.h>
#include <itkLinearInterpolateImageFunction.h>
#include <itkMetaDataObject.h>
#include <itkMetaImageIO.h>
#include <itkMultiThreaderBase.h>
#include <itkNearestNeighborInterpolateImageFunction.h>
#include <itkNiftiImageIO.h>
#include <itkNrrdImageIO.h>
#include <itkOrientImageFilter.h>
#include <itkResampleImageFilter.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <sstream>
#include <vector>

#include "ingest/volume_decode.h"

namespace patchstore {
namespace {

namespace fs = std::filesystem;

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

constexpr const char* kAccepted =
    "NIfTI (.nii, .nii.gz, .hdr/.img), MetaImage (.mha, .mhd), NRRD (.nrrd, .nhdr) or a folder holding one DICOM "
    "series";

// The format of `path` by its name (a folder: DICOM), and the ITK reader for it.
Result<std::pair<std::string, itk::ImageIOBase::Pointer>> IoFor(const std::string& path) {
  struct stat sb;
  if (::stat(path.c_str(), &sb) != 0) {
    if (errno == ENOENT) return Status::NotFound("reading '" + path + "': no such file or folder");
    return Status::FromErrno("reading '" + path + "'", errno);
  }
  if (S_ISDIR(sb.st_mode))
    return std::make_pair(std::string("dicom"), itk::ImageIOBase::Pointer(itk::GDCMImageIO::New()));
  if (!S_ISREG(sb.st_mode))
    return Status::InvalidArgument("reading '" + path + "': not a regular file (a FIFO, socket or device)");
  const std::string name = Lower(fs::path(path).filename().string());
  if (EndsWith(name, ".nii") || EndsWith(name, ".nii.gz") || EndsWith(name, ".hdr") || EndsWith(name, ".img") ||
      EndsWith(name, ".img.gz"))
    return std::make_pair(std::string("nifti"), itk::ImageIOBase::Pointer(itk::NiftiImageIO::New()));
  if (EndsWith(name, ".mha") || EndsWith(name, ".mhd"))
    return std::make_pair(std::string("metaimage"), itk::ImageIOBase::Pointer(itk::MetaImageIO::New()));
  if (EndsWith(name, ".nrrd") || EndsWith(name, ".nhdr"))
    return std::make_pair(std::string("nrrd"), itk::ImageIOBase::Pointer(itk::NrrdImageIO::New()));
  return Status::Unsupported("reading '" + path + "': unknown volume format (by its name); accepted: " + kAccepted);
}

// The first bytes of a NIfTI header (or of the .hdr of a pair), for the
// checks below: sizeof_hdr 348 (NIfTI-1) or 540 (NIfTI-2), in either byte
// order. `size` is 0 when the file cannot be read here or is neither (ITK
// has read it already, or will say what is wrong).
struct NiftiHeaderBytes {
  uint8_t h[540] = {0};
  int32_t size = 0;
  bool swapped = false;
  bool pair = false;  // .hdr/.img
  bool gz = false;
  // `n` bytes at `offset` in the machine's byte order.
  void Get(int offset, int n, void* out) const {
    std::memcpy(out, h + offset, n);
    if (swapped) std::reverse(static_cast<uint8_t*>(out), static_cast<uint8_t*>(out) + n);
  }
};

Result<NiftiHeaderBytes> ReadNiftiHeader(const std::string& path) {
  NiftiHeaderBytes hb;
  const std::string name = Lower(fs::path(path).filename().string());
  hb.pair = EndsWith(name, ".hdr") || EndsWith(name, ".img") || EndsWith(name, ".img.gz");
  hb.gz = EndsWith(name, ".gz");
  gzFile f = gzopen((hb.pair ? fs::path(path).replace_extension(".hdr").string() : path).c_str(), "rb");
  if (!f) return hb;
  const int n = gzread(f, hb.h, sizeof hb.h);
  gzclose(f);
  if (n < 348) return Status::Corruption("reading '" + path + "': truncated NIfTI header");
  int32_t size = 0;
  std::memcpy(&size, hb.h, 4);
  if (size == 348 || size == 540) {
    hb.size = size;
  } else {
    std::reverse(reinterpret_cast<uint8_t*>(&size), reinterpret_cast<uint8_t*>(&size) + 4);
    if (size == 348 || size == 540) {
      hb.size = size;
      hb.swapped = true;
    }
  }
  return hb;
}

// Voxel sizes (pixdim[1..3]): ITK 5.2 takes a NaN, infinite or zero one as 1
// without a word, and with an sform (and no qform) it refuses a NaN, zero or
// negative one as "only supports orthonormal direction cosines", which does
// not name the field at fault. So they are checked before ITK reads the
// header, and refused with the file's own numbers whatever the xform codes.
// (A negative one is refused later anyway, as a negative spacing.)
Status CheckNiftiPixdim(const std::string& path, const NiftiHeaderBytes& hb) {
  if (hb.size == 0) return Status::OK();
  double pixdim[3] = {0, 0, 0};
  int ndim = 3;
  for (int i = 0; i < 3; ++i) {
    if (hb.size == 348) {
      float v = 0;
      hb.Get(76 + 4 * (i + 1), 4, &v);
      pixdim[i] = v;
    } else {
      hb.Get(104 + 8 * (i + 1), 8, &pixdim[i]);
    }
  }
  if (hb.size == 348) {
    int16_t d0 = 0;
    hb.Get(40, 2, &d0);
    ndim = d0;
  } else {
    int64_t d0 = 0;
    hb.Get(16, 8, &d0);
    ndim = static_cast<int>(std::min<int64_t>(d0, 7));
  }
  for (int i = 0; i < 3 && i < ndim; ++i)
    if (!std::isfinite(pixdim[i]) || !(pixdim[i] > 0)) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "pixdim (%g, %g, %g)", pixdim[0], pixdim[1], pixdim[2]);
      return Status::InvalidArgument("reading '" + path + "': its header gives voxel size " + buf +
                                     ": every spacing must be a positive number");
    }
  return Status::OK();
}

// The bytes of one voxel on disk, by the header's datatype as ITK exposes it
// ("datatype" in its metadata); 0 when it is not a scalar type. ITK reports
// the pixel type it delivers, which is float32 for an integer file with
// scl_slope / scl_inter (it rescales while reading), so the voxels on disk
// cannot be counted from GetImageSizeInBytes().
uint64_t NiftiVoxelBytes(const itk::MetaDataDictionary& dict) {
  std::string v;
  if (!itk::ExposeMetaData<std::string>(dict, "datatype", v)) return 0;
  // NIfTI-1/2 datatype codes (nifti1.h, which ITK does not export to its users).
  switch (std::atoi(v.c_str())) {
    case 2:    // DT_UINT8
    case 256:  // DT_INT8
      return 1;
    case 4:    // DT_INT16
    case 512:  // DT_UINT16
      return 2;
    case 8:    // DT_INT32
    case 768:  // DT_UINT32
    case 16:   // DT_FLOAT32
      return 4;
    case 1024:  // DT_INT64
    case 1280:  // DT_UINT64
    case 64:    // DT_FLOAT64
      return 8;
    default: return 0;
  }
}

// ITK 5.2 reads a NIfTI file whose voxels stop short (a truncated .nii or
// .nii.gz) without an error: the missing voxels come back as zeros. So the
// bytes are checked first: an uncompressed file must hold vox_offset + the
// data bytes (`data_bytes`: the voxels as stored, before any scl_slope); a
// gzip stream's trailer (ISIZE: its length mod 2^32) must say as much, and
// when it does not (a truncated stream, or several gzip members), the stream
// is inflated to count what it holds.
Status CheckNiftiComplete(const std::string& path, const NiftiHeaderBytes& hb, uint64_t data_bytes) {
  const std::string name = Lower(fs::path(path).filename().string());
  const bool pair = hb.pair, gz = hb.gz;
  uint64_t offset = 0;
  if (hb.size == 348) {
    float v = 0;
    hb.Get(108, 4, &v);
    offset = v > 0 && std::isfinite(v) ? static_cast<uint64_t>(v) : pair ? 0 : 352;
  } else if (hb.size == 540) {
    int64_t v = 0;
    hb.Get(168, 8, &v);
    offset = v > 0 ? static_cast<uint64_t>(v) : pair ? 0 : 544;
  } else {
    return Status::OK();
  }
  const std::string data_file =
      pair ? fs::path(path).replace_extension(EndsWith(name, ".img.gz") ? ".img.gz" : ".img").string() : path;
  const uint64_t need = offset + data_bytes;
  if (!gz) {
    std::error_code ec;
    const uint64_t have = fs::file_size(data_file, ec);
    if (!ec && have < need)
      return Status::Corruption("reading '" + path + "': truncated: the file holds " + std::to_string(have) +
                                " bytes, its header declares " + std::to_string(need));
    return Status::OK();
  }
  FILE* raw = std::fopen(data_file.c_str(), "rb");
  if (!raw) return Status::OK();
  uint8_t trailer[4] = {0};
  const bool have_trailer = std::fseek(raw, -4, SEEK_END) == 0 && std::fread(trailer, 1, 4, raw) == 4;
  std::fclose(raw);
  const uint32_t isize = static_cast<uint32_t>(trailer[0]) | (static_cast<uint32_t>(trailer[1]) << 8) |
                         (static_cast<uint32_t>(trailer[2]) << 16) | (static_cast<uint32_t>(trailer[3]) << 24);
  if (have_trailer && isize == static_cast<uint32_t>(need)) return Status::OK();
  gzFile f = gzopen(data_file.c_str(), "rb");
  if (!f) return Status::OK();
  std::vector<uint8_t> buf(1 << 20);
  uint64_t total = 0;
  int n = 0;
  while ((n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0) total += static_cast<uint64_t>(n);
  int err = Z_OK;
  const std::string why = n < 0 ? gzerror(f, &err) : "";
  gzclose(f);
  if (total < need || n < 0)
    return Status::Corruption("reading '" + path + "': truncated or damaged gzip stream: it holds " +
                              std::to_string(total) + " bytes of the " + std::to_string(need) + " its header declares" +
                              (why.empty() ? "" : " (" + why + ")"));
  return Status::OK();
}

// MetaImage likewise: ITK 5.2 reads a short .mha / .raw (plain or zlib)
// without an error. The header's ElementDataFile says where the voxels are:
// uncompressed they must all be there; compressed, the file must hold the
// CompressedDataSize the header declares (ITK writes it), or, without one,
// the stream must inflate to every voxel.
Status CheckMetaImageComplete(const std::string& path, uint64_t data_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::OK();
  std::map<std::string, std::string> kv;
  std::string line;
  uint64_t data_start = 0;
  for (int n = 0; n < 200 && std::getline(in, line); ++n) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    auto trim = [](std::string t) {
      while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
      while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.erase(0, 1);
      return t;
    };
    const std::string key = trim(line.substr(0, eq));
    kv[key] = trim(line.substr(eq + 1));
    if (key == "ElementDataFile") {
      data_start = static_cast<uint64_t>(in.tellg());
      break;
    }
  }
  auto it = kv.find("ElementDataFile");
  if (it == kv.end() || it->second == "LIST" || it->second.find_first_of("% ") != std::string::npos)
    return Status::OK();  // several data files: ITK's reader checks each
  std::string data_path = path;
  if (it->second != "LOCAL") {
    data_path = (fs::path(path).parent_path() / it->second).string();
    const auto hs = kv.find("HeaderSize");
    if (hs != kv.end() && std::strtoll(hs->second.c_str(), nullptr, 10) < 0) return Status::OK();
    data_start = hs != kv.end() ? std::strtoull(hs->second.c_str(), nullptr, 10) : 0;
  }
  std::error_code ec;
  const uint64_t size = fs::file_size(data_path, ec);
  if (ec) return Status::OK();
  const uint64_t have = size > data_start ? size - data_start : 0;
  const std::string compressed = Lower(kv.count("CompressedData") ? kv["CompressedData"] : "false");
  if (compressed != "true") {
    if (have < data_bytes)
      return Status::Corruption("reading '" + path + "': truncated: '" + data_path + "' holds " + std::to_string(have) +
                                " bytes of voxels, the header declares " + std::to_string(data_bytes));
    return Status::OK();
  }
  if (kv.count("CompressedDataSize")) {
    const uint64_t need = std::strtoull(kv["CompressedDataSize"].c_str(), nullptr, 10);
    if (have < need)
      return Status::Corruption("reading '" + path + "': truncated: '" + data_path + "' holds " + std::to_string(have) +
                                " compressed bytes, the header declares " + std::to_string(need));
    return Status::OK();
  }
  // No declared size: inflate the stream to count what it holds.
  std::ifstream raw(data_path, std::ios::binary);
  raw.seekg(static_cast<std::streamoff>(data_start));
  z_stream z{};
  if (inflateInit(&z) != Z_OK) return Status::OK();
  std::vector<uint8_t> src(1 << 16), dst(1 << 20);
  uint64_t total = 0;
  int rc = Z_OK;
  while (rc != Z_STREAM_END && total < data_bytes) {
    if (z.avail_in == 0) {
      raw.read(reinterpret_cast<char*>(src.data()), static_cast<std::streamsize>(src.size()));
      z.avail_in = static_cast<uInt>(raw.gcount());
      z.next_in = src.data();
      if (z.avail_in == 0) break;
    }
    z.avail_out = static_cast<uInt>(dst.size());
    z.next_out = dst.data();
    rc = inflate(&z, Z_NO_FLUSH);
    total += dst.size() - z.avail_out;
    if (rc != Z_OK && rc != Z_STREAM_END) break;
  }
  inflateEnd(&z);
  if (total < data_bytes)
    return Status::Corruption("reading '" + path + "': truncated or damaged zlib stream: it inflates to " +
                              std::to_string(total) + " bytes of the " + std::to_string(data_bytes) +
                              " the header declares");
  return Status::OK();
}

template <unsigned D>
VolumeGrid GridOf(const itk::ImageBase<D>* img) {
  VolumeGrid g;
  const auto size = img->GetLargestPossibleRegion().GetSize();
  for (unsigned i = 0; i < 3; ++i) {
    g.size[i] = size[i];
    g.spacing[i] = img->GetSpacing()[i];
    g.origin[i] = img->GetOrigin()[i];
    for (unsigned r = 0; r < 3; ++r) g.direction[r * 3 + i] = img->GetDirection()[r][i];
  }
  return g;
}

Status CheckGrid(const VolumeGrid& g, const std::string& what) {
  VolumeGeometry geo;
  geo.spacing = g.spacing;
  geo.origin = g.origin;
  geo.direction = g.direction;
  Status st = CheckVolumeGeometry(geo);
  if (!st.ok()) return Status::InvalidArgument("reading " + what + ": " + st.message());
  return Status::OK();
}

// The DICOM series of a folder: the one there is, or the one --series names.
Result<std::vector<std::string>> SeriesFiles(const std::string& dir, const std::string& series, std::string* chosen) {
  auto names = itk::GDCMSeriesFileNames::New();
  names->SetUseSeriesDetails(false);
  names->SetGlobalWarningDisplay(false);
  names->SetDirectory(dir);
  const std::vector<std::string> uids = names->GetSeriesUIDs();
  if (uids.empty()) return Status::NotFound("reading DICOM folder '" + dir + "': no DICOM series in it");
  auto describe = [&](const std::string& uid) {
    const auto files = names->GetFileNames(uid);
    std::string desc, number;
    auto io = itk::GDCMImageIO::New();
    io->SetFileName(files.front());
    try {
      io->ReadImageInformation();
      io->GetValueFromTag("0008|103e", desc);
      io->GetValueFromTag("0020|0011", number);
    } catch (const itk::ExceptionObject&) {
    }
    auto trim = [](std::string s) {
      while (!s.empty() && (s.back() == ' ' || s.back() == '\0')) s.pop_back();
      while (!s.empty() && s.front() == ' ') s.erase(0, 1);
      return s;
    };
    desc = trim(desc);
    number = trim(number);
    return "'" + uid + "' (" + (number.empty() ? "" : "series number " + number + ", ") +
           (desc.empty() ? "" : "\"" + desc + "\", ") + std::to_string(files.size()) + " files)";
  };
  std::string uid;
  if (series.empty()) {
    if (uids.size() > 1) {
      std::string list;
      for (const std::string& u : uids) list += (list.empty() ? "" : ", ") + describe(u);
      return Status::InvalidArgument("reading DICOM folder '" + dir + "': it holds " + std::to_string(uids.size()) +
                                     " series: " + list + "; pick one with --series UID (or its series number)");
    }
    uid = uids.front();
  } else {
    for (const std::string& u : uids) {
      std::string number;
      auto io = itk::GDCMImageIO::New();
      io->SetFileName(names->GetFileNames(u).front());
      try {
        io->ReadImageInformation();
        io->GetValueFromTag("0020|0011", number);
      } catch (const itk::ExceptionObject&) {
      }
      while (!number.empty() && (number.back() == ' ' || number.back() == '\0')) number.pop_back();
      while (!number.empty() && number.front() == ' ') number.erase(0, 1);
      if (u == series || (!number.empty() && number == series)) uid = u;
    }
    if (uid.empty()) {
      std::string list;
      for (const std::string& u : uids) list += (list.empty() ? "" : ", ") + describe(u);
      return Status::NotFound("reading DICOM folder '" + dir + "': no series '" + series + "' in it; it holds " + list);
    }
  }
  *chosen = uid;
  return names->GetFileNames(uid);
}

// A series with a slice missing (or two at one position) reads as a volume
// with the wrong geometry; ITK only warns. Checks that the slice positions
// along the slice normal are evenly spaced.
Status CheckSlicePositions(const std::vector<std::string>& files, const VolumeGrid& grid, const std::string& dir) {
  if (files.size() < 3) return Status::OK();
  std::vector<double> along;
  for (const std::string& f : files) {
    auto io = itk::GDCMImageIO::New();
    io->SetFileName(f);
    io->ReadImageInformation();
    std::string ipp;
    if (!io->GetValueFromTag("0020|0032", ipp)) return Status::OK();  // no positions: nothing to check
    double x = 0, y = 0, z = 0;
    std::replace(ipp.begin(), ipp.end(), '\\', ' ');
    std::istringstream in(ipp);
    if (!(in >> x >> y >> z)) return Status::OK();
    // DICOM positions are LPS, like ITK's; the normal is the grid's third axis.
    along.push_back(x * grid.direction[2] + y * grid.direction[5] + z * grid.direction[8]);
  }
  std::vector<double> steps;
  for (size_t i = 1; i < along.size(); ++i) steps.push_back(along[i] - along[i - 1]);
  std::vector<double> sorted = steps;
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  const double step = sorted[sorted.size() / 2];
  for (size_t i = 0; i < steps.size(); ++i) {
    if (std::fabs(steps[i] - step) > 0.1 * std::fabs(step) + 1e-6) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "slice positions jump by %g mm between '%s' (%g mm) and '%s' (%g mm), "
                    "the other slices are %g mm apart",
                    steps[i], fs::path(files[i]).filename().c_str(), along[i],
                    fs::path(files[i + 1]).filename().c_str(), along[i + 1], step);
      return Status::InvalidArgument("reading DICOM series in '" + dir + "': " + buf +
                                     (std::fabs(steps[i]) > std::fabs(step)
                                          ? " (a missing slice?)"
                                          : " (two slices at one position, or a second series?)"));
    }
  }
  return Status::OK();
}

// Reorientation (exact: permutes and flips axes) to the axes the three
// letters point to (RAS: i towards the patient's Right, j Anterior, k
// Superior; nibabel's and DICOM's letters).
template <typename Img>
typename Img::Pointer Orient(typename Img::Pointer img, const std::string& code) {
  typename Img::DirectionType want;
  want.Fill(0);
  for (unsigned c = 0; c < 3; ++c) {
    switch (code[c]) {
      case 'L': want[0][c] = 1; break;
      case 'R': want[0][c] = -1; break;
      case 'P': want[1][c] = 1; break;
      case 'A': want[1][c] = -1; break;
      case 'S': want[2][c] = 1; break;
      case 'I': want[2][c] = -1; break;
    }
  }
  auto f = itk::OrientImageFilter<Img, Img>::New();
  f->SetUseImageDirection(true);
  f->SetDesiredCoordinateDirection(want);
  f->SetInput(img);
  f->Update();
  typename Img::Pointer out = f->GetOutput();
  out->DisconnectPipeline();
  return out;
}

template <typename In, typename Out>
typename Out::Pointer Resample(typename In::Pointer img, const VolumeGrid& grid, bool nearest) {
  auto f = itk::ResampleImageFilter<In, Out, double>::New();
  f->SetInput(img);
  if (nearest) f->SetInterpolator(itk::NearestNeighborInterpolateImageFunction<In, double>::New());
  else f->SetInterpolator(itk::LinearInterpolateImageFunction<In, double>::New());
  typename Out::SizeType size;
  typename Out::SpacingType spacing;
  typename Out::PointType origin;
  typename Out::DirectionType direction;
  for (unsigned i = 0; i < 3; ++i) {
    size[i] = grid.size[i];
    spacing[i] = grid.spacing[i];
    origin[i] = grid.origin[i];
    for (unsigned r = 0; r < 3; ++r) direction[r][i] = grid.direction[r * 3 + i];
  }
  f->SetSize(size);
  f->SetOutputSpacing(spacing);
  f->SetOutputOrigin(origin);
  f->SetOutputDirection(direction);
  f->SetDefaultPixelValue(0);
  f->Update();
  typename Out::Pointer out = f->GetOutput();
  out->DisconnectPipeline();
  return out;
}

template <typename T>
constexpr VoxelType VoxelOf() {
  if constexpr (std::is_same_v<T, uint8_t>) return VoxelType::kUInt8;
  else if constexpr (std::is_same_v<T, int8_t>) return VoxelType::kInt8;
  else if constexpr (std::is_same_v<T, uint16_t>) return VoxelType::kUInt16;
  else if constexpr (std::is_same_v<T, int16_t>) return VoxelType::kInt16;
  else if constexpr (std::is_same_v<T, uint32_t>) return VoxelType::kUInt32;
  else if constexpr (std::is_same_v<T, int32_t>) return VoxelType::kInt32;
  else if constexpr (std::is_same_v<T, int64_t>) return VoxelType::kInt64;
  else if constexpr (std::is_same_v<T, uint64_t>) return VoxelType::kUInt64;
  else if constexpr (std::is_same_v<T, float>) return VoxelType::kFloat32;
  else return VoxelType::kFloat64;
}

template <typename Img>
Status Deliver(const Img* img, uint8_t* shared, size_t shared_size, VolumeReply* reply) {
  using T = typename Img::PixelType;
  reply->grid = GridOf<3>(img);
  reply->type = VoxelOf<T>();
  const uint64_t n = reply->grid.size[0] * reply->grid.size[1] * reply->grid.size[2];
  reply->bytes = n * sizeof(T);
  if (reply->bytes > shared_size)
    return Status::InvalidArgument("the volume (" + std::to_string(n) + " voxels of " + std::to_string(sizeof(T)) +
                                   " bytes) is larger than the decoder's buffer");
  std::memcpy(shared, img->GetBufferPointer(), reply->bytes);
  return Status::OK();
}

template <typename T>
Status ReadTyped(const VolumeRequest& req, const std::string& format, itk::ImageIOBase* io,
                 const std::vector<std::string>& dicom_files, unsigned dims, uint8_t* shared, size_t shared_size,
                 VolumeReply* reply) {
  using Img = itk::Image<T, 3>;
  typename Img::Pointer img;
  if (format == "dicom") {
    auto r = itk::ImageSeriesReader<Img>::New();
    r->SetImageIO(io);
    r->SetFileNames(dicom_files);
    r->Update();
    img = r->GetOutput();
  } else if (dims == 4) {
    using Img4 = itk::Image<T, 4>;
    auto r = itk::ImageFileReader<Img4>::New();
    r->SetImageIO(io);
    r->SetFileName(req.path);
    r->UpdateOutputInformation();
    auto region = r->GetOutput()->GetLargestPossibleRegion();
    auto size = region.GetSize();
    auto index = region.GetIndex();
    size[3] = 0;
    index[3] += req.volume_index;
    auto x = itk::ExtractImageFilter<Img4, Img>::New();
    x->SetInput(r->GetOutput());
    x->SetExtractionRegion(typename Img4::RegionType(index, size));
    x->SetDirectionCollapseToSubmatrix();
    x->Update();
    img = x->GetOutput();
  } else {
    auto r = itk::ImageFileReader<Img>::New();
    r->SetImageIO(io);
    r->SetFileName(req.path);
    r->Update();
    img = r->GetOutput();
  }
  img->DisconnectPipeline();
  reply->source = GridOf<3>(img.GetPointer());
  PS_RETURN_IF_ERROR(CheckGrid(reply->source, "'" + req.path + "'"));
  if (format == "dicom") PS_RETURN_IF_ERROR(CheckSlicePositions(dicom_files, reply->source, req.path));
  if (!req.orient.empty()) {
    img = Orient<Img>(img, req.orient);
    reply->flags |= kGeometryReoriented;
  }
  if (req.resample || req.to_reference) {
    VolumeGrid target = req.reference;
    if (!req.to_reference) {
      target = GridOf<3>(img.GetPointer());
      for (int i = 0; i < 3; ++i) {
        const double extent = static_cast<double>(target.size[i]) * target.spacing[i];
        target.size[i] = std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(extent / req.spacing[i])));
        target.spacing[i] = req.spacing[i];
      }
      uint64_t n = 1;
      for (uint64_t s : target.size) n *= s;
      if (n > req.max_voxels)
        return Status::InvalidArgument("resampling '" + req.path + "' to spacing " + FormatTriple(req.spacing) +
                                       " gives " + std::to_string(n) + " voxels, more than the limit of " +
                                       std::to_string(req.max_voxels));
    }
    reply->flags |= kGeometryResampled;
    if (req.nearest) {
      img = Resample<Img, Img>(img, target, true);
    } else {
      using F = itk::Image<float, 3>;
      F::Pointer f = Resample<Img, F>(img, target, false);
      return Deliver(f.GetPointer(), shared, shared_size, reply);
    }
  }
  return Deliver(img.GetPointer(), shared, shared_size, reply);
}

int CodeOf(const itk::MetaDataDictionary& dict, const char* key) {
  std::string v;
  if (!itk::ExposeMetaData<std::string>(dict, key, v)) return -1;
  static const char* kNames[] = {"NIFTI_XFORM_UNKNOWN",   "NIFTI_XFORM_SCANNER_ANAT", "NIFTI_XFORM_ALIGNED_ANAT",
                                 "NIFTI_XFORM_TALAIRACH", "NIFTI_XFORM_MNI_152",      "NIFTI_XFORM_TEMPLATE_OTHER"};
  for (int i = 0; i < 6; ++i)
    if (v == kNames[i]) return i;
  return -1;
}

VolumeReply Decode(const VolumeRequest& req, uint8_t* shared, size_t shared_size) {
  VolumeReply reply;
  auto fail = [&](Status st) {
    reply.status = std::move(st);
    return reply;
  };
  auto io_r = IoFor(req.path);
  if (!io_r.ok()) return fail(io_r.status());
  auto [format, io] = std::move(io_r).value();
  reply.format = format;
  std::vector<std::string> dicom_files;
  NiftiHeaderBytes nifti_header;
  try {
    if (format == "dicom") {
      std::string uid;
      auto files = SeriesFiles(req.path, req.series, &uid);
      if (!files.ok()) return fail(files.status());
      dicom_files = std::move(files).value();
      io->SetFileName(dicom_files.front());
    } else {
      if (!io->CanReadFile(req.path.c_str()))
        return fail(Status::Corruption("reading '" + req.path + "': not a readable " +
                                       (format == "nifti"       ? std::string("NIfTI")
                                        : format == "metaimage" ? std::string("MetaImage")
                                                                : std::string("NRRD")) +
                                       " file (damaged or another format)"));
      io->SetFileName(req.path);
      if (format == "nifti") {
        auto hb = ReadNiftiHeader(req.path);
        if (!hb.ok()) return fail(hb.status());
        nifti_header = *hb;
        Status pst = CheckNiftiPixdim(req.path, nifti_header);
        if (!pst.ok()) return fail(pst);
      }
    }
    // The header alone, before any voxel memory is allocated.
    io->ReadImageInformation();
    const unsigned dims = io->GetNumberOfDimensions();
    std::string shape;
    uint64_t voxels = 1;
    bool overflow = false;
    for (unsigned i = 0; i < dims; ++i) {
      const uint64_t d = io->GetDimensions(i);
      shape += (i ? "x" : "") + std::to_string(d);
      overflow |= __builtin_mul_overflow(voxels, d, &voxels);
    }
    if (format == "dicom") {
      // One file's header: the series has as many slices as files.
      overflow |= __builtin_mul_overflow(voxels, static_cast<uint64_t>(dicom_files.size()), &voxels);
      shape += "x" + std::to_string(dicom_files.size());
    }
    if (io->GetNumberOfComponents() != 1)
      return fail(Status::Unsupported(
          "reading '" + req.path + "': " + std::to_string(io->GetNumberOfComponents()) + " components per voxel (" +
          itk::ImageIOBase::GetPixelTypeAsString(io->GetPixelType()) + "); only scalar volumes are ingested"));
    if (overflow || voxels > req.max_voxels)
      return fail(Status::InvalidArgument("reading '" + req.path + "': the header declares " + shape + " = " +
                                          (overflow ? std::string("more than 2^64") : std::to_string(voxels)) +
                                          " voxels, more than the limit of " + std::to_string(req.max_voxels) +
                                          " (--max-voxels); refused before reading"));
    unsigned use_dims = dims;
    if (format != "dicom") {
      if (dims == 4 && io->GetDimensions(3) == 1) use_dims = 3;  // a 3-D volume stored as 4-D
      if (dims < 3)
        return fail(Status::InvalidArgument("reading '" + req.path + "': a " + std::to_string(dims) + "-D image (" +
                                            shape + "), not a volume (use `patchstore ingest images`)"));
      if (use_dims > 4 || (use_dims == 4 && req.volume_index < 0))
        return fail(Status::InvalidArgument("reading '" + req.path + "': a " + std::to_string(dims) + "-D image (" +
                                            shape + "); pick one volume with --volume-index N"));
      if (use_dims == 4 && static_cast<uint64_t>(req.volume_index) >= io->GetDimensions(3))
        return fail(Status::InvalidArgument("reading '" + req.path + "': --volume-index " +
                                            std::to_string(req.volume_index) + " is beyond its " +
                                            std::to_string(io->GetDimensions(3)) + " volumes (" + shape + ")"));
      // A 3-D image is read as it is whatever --volume-index says (only the
      // 4-D branch of ReadTyped reads it): a cohort may mix the two.
    } else {
      use_dims = 3;
    }
    // The header's geometry, before reading: NaN or zero spacing and sheared
    // directions are refused with the file's own numbers.
    if (format != "dicom") {
      VolumeGrid declared;
      for (unsigned i = 0; i < 3; ++i) {
        declared.spacing[i] = io->GetSpacing(i);
        declared.origin[i] = io->GetOrigin(i);
        const std::vector<double> axis = io->GetDirection(i);
        for (unsigned r = 0; r < 3 && r < axis.size(); ++r) declared.direction[r * 3 + i] = axis[r];
      }
      Status gst = CheckGrid(declared, "'" + req.path + "'");
      if (!gst.ok()) return fail(gst);
    }
    if (format == "nifti" || format == "metaimage") {
      // NIfTI: the voxels as stored (an integer file with scl_slope arrives
      // as float32, rescaled); a type without a size here is not scalar.
      const uint64_t voxel_bytes = format == "nifti" ? NiftiVoxelBytes(io->GetMetaDataDictionary()) : 0;
      Status cst = format == "nifti" ? CheckNiftiComplete(req.path, nifti_header,
                                                          voxel_bytes ? io->GetImageSizeInPixels() * voxel_bytes
                                                                      : io->GetImageSizeInBytes())
                                     : CheckMetaImageComplete(req.path, io->GetImageSizeInBytes());
      if (!cst.ok()) return fail(cst);
    }
    using C = itk::IOComponentEnum;
    Status st;
    switch (io->GetComponentType()) {
      case C::UCHAR:
        st = ReadTyped<uint8_t>(req, format, io, dicom_files, use_dims, shared, shared_size, &reply);
        break;
      case C::CHAR: st = ReadTyped<int8_t>(req, format, io, dicom_files, use_dims, shared, shared_size, &reply); break;
      case C::USHORT:
        st = ReadTyped<uint16_t>(req, format, io, dicom_files, use_dims, shared, shared_size, &reply);
        break;
      case C::SHORT:
        st = ReadTyped<int16_t>(req, format, io, dicom_files, use_dims, shared, shared_size, &reply);
        break;
      case C::UINT:
        st = ReadTyped<uint32_t>(req, format, io, dicom_files, use_dims, shared, shared_size, &reply);
        break;
      case C::INT: st = ReadTyped<int32_t>(req, format, io, dicom_files, use_dims, shared, shared_size, &reply); break;
      case C::FLOAT: st = ReadTyped<float>(req, format, io, dicom_files, use_dims, shared, shared_size, &reply); break;
      case C::DOUBLE:
        st = ReadTyped<double>(req, format, io, dicom_files, use_dims, shared, shared_size, &reply);
        break;
      // 64-bit integers as such (not through float64, which rounds above
      // 2^53), so that the source type is recorded and float32's rounding
      // above 2^24 is noted as for HDF5 (ValueCheck).
      case C::LONG:
      case C::LONGLONG:
        if (io->GetComponentSize() == 8)
          st = ReadTyped<int64_t>(req, format, io, dicom_files, use_dims, shared, shared_size, &reply);
        else st = ReadTyped<int32_t>(req, format, io, dicom_files, use_dims, shared, shared_size, &reply);
        break;
      case C::ULONG:
      case C::ULONGLONG:
        if (io->GetComponentSize() == 8)
          st = ReadTyped<uint64_t>(req, format, io, dicom_files, use_dims, shared, shared_size, &reply);
        else st = ReadTyped<uint32_t>(req, format, io, dicom_files, use_dims, shared, shared_size, &reply);
        break;
      default:
        return fail(Status::Unsupported("reading '" + req.path + "': voxel type " +
                                        itk::ImageIOBase::GetComponentTypeAsString(io->GetComponentType()) +
                                        " is not supported"));
    }
    if (!st.ok())
      return fail(st.message().rfind("reading", 0) == 0 ? st : st.WithContext("reading '" + req.path + "'"));
    if (format == "nifti") {
      reply.qform_code = CodeOf(io->GetMetaDataDictionary(), "qform_code_name");
      reply.sform_code = CodeOf(io->GetMetaDataDictionary(), "sform_code_name");
    }
  } catch (const itk::ExceptionObject& e) {
    std::string what = e.GetDescription();
    while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
    return fail(Status::Corruption("reading '" + req.path + "': " + what));
  } catch (const std::bad_alloc&) {
    return fail(Status::InvalidArgument("reading '" + req.path + "': out of memory (the decoder's memory limit)"));
  } catch (const std::exception& e) {
    return fail(Status::Corruption("reading '" + req.path + "': " + e.what()));
  }
  return reply;
}

std::string Job(const std::string& request, uint8_t* shared, size_t shared_size) {
  // One thread per child: the pool runs one child per core.
  static bool once = [] {
    itk::MultiThreaderBase::SetGlobalDefaultNumberOfThreads(1);
    itk::Object::GlobalWarningDisplayOff();
    return true;
  }();
  (void)once;
  auto req = DecodeVolumeRequest(request);
  VolumeReply reply;
  if (!req.ok()) reply.status = req.status();
  else reply = Decode(*req, shared, shared_size);
  return EncodeVolumeReply(reply);
}

}  // namespace

VolumeDecodeFn ItkVolumeDecoder() { return &Job; }

Status WriteVolumeFile(const std::string& path, const float* data, const std::array<uint64_t, 3>& shw,
                       const VolumeGeometry& g) {
  using Img = itk::Image<float, 3>;
  const std::string name = Lower(fs::path(path).filename().string());
  itk::ImageIOBase::Pointer io;
  if (EndsWith(name, ".nii") || EndsWith(name, ".nii.gz")) io = itk::NiftiImageIO::New();
  else if (EndsWith(name, ".mha") || EndsWith(name, ".mhd")) io = itk::MetaImageIO::New();
  else return Status::InvalidArgument("writing '" + path + "': the name must end in .nii, .nii.gz, .mha or .mhd");
  try {
    auto img = Img::New();
    Img::SizeType size;
    size[0] = shw[2];
    size[1] = shw[1];
    size[2] = shw[0];
    img->SetRegions(Img::RegionType(size));
    Img::SpacingType spacing;
    Img::PointType origin;
    Img::DirectionType direction;
    for (unsigned i = 0; i < 3; ++i) {
      spacing[i] = g.spacing[i];
      origin[i] = g.origin[i];
      for (unsigned r = 0; r < 3; ++r) direction[r][i] = g.direction[r * 3 + i];
    }
    img->SetSpacing(spacing);
    img->SetOrigin(origin);
    img->SetDirection(direction);
    // Borrow the caller's voxels: no copy.
    img->GetPixelContainer()->SetImportPointer(const_cast<float*>(data), shw[0] * shw[1] * shw[2], false);
    auto w = itk::ImageFileWriter<Img>::New();
    w->SetImageIO(io);
    w->SetFileName(path);
    w->SetInput(img);
    w->SetUseCompression(EndsWith(name, ".gz") || EndsWith(name, ".mha"));
    w->Update();
  } catch (const itk::ExceptionObject& e) {
    return Status::IOError("writing '" + path + "': " + std::string(e.GetDescription()));
  }
  return Status::OK();
}

}  // namespace patchstore
