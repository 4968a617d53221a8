// Export: records back to image files for inspection.
#include <ImfChannelList.h>
#include <ImfFrameBuffer.h>
#include <ImfHeader.h>
#include <ImfOutputFile.h>

#include <fcntl.h>
#include <unistd.h>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>

#include "ingest/decode.h"
#include "ingest/hdf5_internal.h"
#include "ingest/volume_decode.h"
#include "patchstore/ingest/ingest.h"
#include "patchstore/ingest/montage.h"
#include "patchstore/reader/reader.h"
#include "patchstore/reader/volume.h"

namespace patchstore {
namespace fs = std::filesystem;

std::string SafeRelativePath(const std::string& id) {
  std::string out;
  size_t start = 0;
  while (true) {
    size_t slash = id.find('/', start);
    std::string part = id.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    std::string enc;
    if (part.empty()) {
      enc = "%";
    } else if (part == "." || part == "..") {
      for (size_t i = 0; i < part.size(); ++i) enc += "%2E";
    } else {
      for (unsigned char c : part) {
        if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
          enc += static_cast<char>(c);
        } else {
          char buf[4];
          std::snprintf(buf, sizeof buf, "%%%02X", c);
          enc += buf;
        }
      }
    }
    if (enc.size() > 200) {
      char buf[20];
      std::snprintf(buf, sizeof buf, "~%016llx", static_cast<unsigned long long>(Checksum64(part.data(), part.size())));
      enc = enc.substr(0, 180) + buf;
    }
    out += (out.empty() ? "" : "/") + enc;
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return out;
}

namespace {

// Writes `data` to `path` through a temporary file and a rename, so a
// reader never sees a half-written file.
Status WriteFileAtomic(const std::string& path, const void* data, size_t size) {
  std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno("writing '" + tmp + "'", errno);
  const char* p = static_cast<const char*>(data);
  size_t left = size;
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return Status::FromErrno("writing '" + tmp + "'", err);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Status::FromErrno("writing '" + tmp + "'", err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Status::FromErrno("renaming to '" + path + "'", err);
  }
  return Status::OK();
}

std::string G(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// [lo, hi] = the 1st and 99th percentiles of the finite values (lower
// interpolation); FiniteRange's fallback when they coincide or none are finite.
void PercentileWindow(const float* data, int64_t n, double* lo, double* hi) {
  std::vector<float> v;
  v.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(data[i])) v.push_back(data[i]);
  if (v.empty()) return FiniteRange(data, n, lo, hi);
  auto at = [&](double q) {
    const size_t k = static_cast<size_t>(std::floor(q * static_cast<double>(v.size() - 1)));
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
    return static_cast<double>(v[k]);
  };
  *lo = at(0.01);
  *hi = at(0.99);
  if (!(*lo < *hi)) FiniteRange(data, n, lo, hi);
}

Status ExportPng(const TensorView& v, const RecordHeader& h, const ExportOptions& o, const std::string& path,
                 uint64_t* bytes) {
  const int C = static_cast<int>(v.shape[0]), H = static_cast<int>(v.shape[1]), W = static_cast<int>(v.shape[2]);
  if (C != 1 && C != 3 && C != 4)
    return Status::Unsupported("exporting to '" + path + "': " + std::to_string(C) +
                               " channels cannot be written as PNG (use --format exr)");
  const float* data = v.data_as<float>();
  const bool integer_source = SourceMaxValue(h.source_type) > 0;
  const bool sixteen = h.source_type == SourceType::kUInt16;
  // The PNG written: 16-bit for uint16 sources, else 8-bit (float sources go through a window).
  const double maxval = SourceMaxValue(sixteen ? SourceType::kUInt16 : SourceType::kUInt8);
  double lo = 0, hi = 1;
  bool windowed = !integer_source || o.has_window || o.window_auto;
  if (windowed) {
    if (o.has_window) {
      lo = o.window_lo;
      hi = o.window_hi;
    } else if (o.window_auto) {
      PercentileWindow(v.data_as<float>(), v.elements(), &lo, &hi);
    } else {  // the stored range
      FiniteRange(v.data_as<float>(), v.elements(), &lo, &hi);
    }
  }
  const int64_t plane = static_cast<int64_t>(H) * W;
  // Non-finite values (NaN, +inf, -inf) are drawn in kNonFiniteRgb, never as a value: a gray
  // image holding any is written as RGB (gray replicated) so that the colour can be told apart.
  bool nonfinite = false;
  for (int64_t i = 0, n = v.elements(); i < n && !nonfinite; ++i) nonfinite = !std::isfinite(data[i]);
  const int CO = nonfinite && C == 1 ? 3 : C;
  cv::Mat img(H, W, CV_MAKETYPE(sixteen ? CV_16U : CV_8U, CO));
  auto put = [&](int y, int x, int c, double raw) {
    if (sixteen) img.ptr<uint16_t>(y)[x * CO + c] = static_cast<uint16_t>(raw);
    else img.ptr<uint8_t>(y)[x * CO + c] = static_cast<uint8_t>(raw);
  };
  for (int y = 0; y < H; ++y) {
    for (int x = 0; x < W; ++x) {
      bool finite = true;
      for (int c = 0; c < C; ++c) {
        float s = data[c * plane + static_cast<int64_t>(y) * W + x];
        finite = finite && std::isfinite(s);
        double raw = windowed ? (static_cast<double>(s) - lo) / (hi - lo) * maxval : h.norm.Invert(s, maxval);
        if (!std::isfinite(raw)) raw = 0;
        raw = std::min(std::max(std::nearbyint(raw), 0.0), maxval);
        for (int o = c; o < (C == 1 ? CO : c + 1); ++o) put(y, x, o, raw);
      }
      if (!finite)
        for (int c = 0; c < 3; ++c) put(y, x, c, kNonFiniteRgb[c] ? maxval : 0.0);  // alpha, if any, stays
    }
  }
  if (CO == 3) cv::cvtColor(img, img, cv::COLOR_RGB2BGR);
  if (CO == 4) cv::cvtColor(img, img, cv::COLOR_RGBA2BGRA);
  std::vector<uint8_t> buf;
  try {
    if (!cv::imencode(".png", img, buf)) return Status::IOError("encoding '" + path + "' as PNG failed");
  } catch (const cv::Exception& e) {
    return Status::IOError("encoding '" + path + "' as PNG: " + e.what());
  }
  *bytes += buf.size();
  return WriteFileAtomic(path, buf.data(), buf.size());
}

Status ExportExr(const TensorView& v, const std::string& channel_names, const std::string& path, uint64_t* bytes) {
  const int C = static_cast<int>(v.shape[0]), H = static_cast<int>(v.shape[1]), W = static_cast<int>(v.shape[2]);
  std::vector<std::string> names;
  size_t start = 0;
  while (!channel_names.empty()) {
    size_t comma = channel_names.find(',', start);
    names.push_back(channel_names.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (static_cast<int>(names.size()) != C) {
    names.clear();
    if (C == 1) names = {"Y"};
    else if (C == 3) names = {"R", "G", "B"};
    else if (C == 4) names = {"R", "G", "B", "A"};
    else
      for (int c = 0; c < C; ++c) names.push_back("C" + std::to_string(c));
  }
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  try {
    Imf::Header header(W, H);
    header.compression() = Imf::ZIP_COMPRESSION;
    for (const std::string& n : names) header.channels().insert(n, Imf::Channel(Imf::FLOAT));
    Imf::OutputFile file(tmp.c_str(), header);
    Imf::FrameBuffer fb;
    const int64_t plane = static_cast<int64_t>(H) * W;
    for (int c = 0; c < C; ++c)
      fb.insert(names[c],
                Imf::Slice(Imf::FLOAT, reinterpret_cast<char*>(const_cast<float*>(v.data_as<float>() + c * plane)),
                           sizeof(float), sizeof(float) * W));
    file.setFrameBuffer(fb);
    file.writePixels(H);
  } catch (const std::exception& e) {
    ::unlink(tmp.c_str());
    return Status::IOError("writing '" + path + "' as OpenEXR: " + e.what());
  }
  std::error_code ec;
  *bytes += fs::file_size(tmp, ec);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Status::FromErrno("renaming to '" + path + "'", err);
  }
  return Status::OK();
}

// Writes every slice of one (S,H,W) volume as OUTDIR/<id>/<field>/<slice:04>.png,
// 8-bit gray, with the window [lo, hi] mapped to [0, 255].
Status ExportVolumePng(const TensorView& v, const ExportOptions& o, const fs::path& dir, ExportSummary* summary,
                       Progress* progress) {
  const int64_t S = v.shape[0], H = v.shape[1], W = v.shape[2];
  double lo = o.window_lo, hi = o.window_hi;
  if (o.window_auto) {
    PercentileWindow(v.data_as<float>(), v.elements(), &lo, &hi);
  } else if (!o.has_window) {  // the finite range of this volume
    FiniteRange(v.data_as<float>(), v.elements(), &lo, &hi);
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IOError("creating '" + dir.string() + "': " + ec.message());
  const double scale = 255.0 / (hi - lo);
  cv::Mat gray(static_cast<int>(H), static_cast<int>(W), CV_8UC1), img;
  std::vector<uint8_t> buf;
  for (int64_t s = 0; s < S; ++s) {
    const float* plane = v.data_as<float>() + s * H * W;
    bool nonfinite = false;
    for (int64_t y = 0; y < H; ++y) {
      uint8_t* row = gray.ptr<uint8_t>(static_cast<int>(y));
      for (int64_t x = 0; x < W; ++x) {
        const float f = plane[y * W + x];
        nonfinite = nonfinite || !std::isfinite(f);
        double r = (static_cast<double>(f) - lo) * scale;
        if (!(r > 0)) r = 0;  // also NaN
        row[x] = static_cast<uint8_t>(std::nearbyint(std::min(r, 255.0)));
      }
    }
    img = gray;
    if (nonfinite) {  // a slice holding NaN/inf: RGB, with those pixels in kNonFiniteRgb (BGR order here)
      cv::cvtColor(gray, img, cv::COLOR_GRAY2BGR);
      for (int64_t y = 0; y < H; ++y)
        for (int64_t x = 0; x < W; ++x)
          if (!std::isfinite(plane[y * W + x]))
            img.at<cv::Vec3b>(static_cast<int>(y), static_cast<int>(x)) = cv::Vec3b(kNonFiniteRgb[2], kNonFiniteRgb[1],
                                                                                    kNonFiniteRgb[0]);
    }
    char name[32];
    std::snprintf(name, sizeof name, "%04lld.png", static_cast<long long>(s));
    const std::string path = (dir / name).string();
    buf.clear();
    try {
      if (!cv::imencode(".png", img, buf)) return Status::IOError("encoding '" + path + "' as PNG failed");
    } catch (const cv::Exception& e) {
      return Status::IOError("encoding '" + path + "' as PNG: " + e.what());
    }
    PS_RETURN_IF_ERROR(WriteFileAtomic(path, buf.data(), buf.size()));
    summary->bytes_written += buf.size();
    ++summary->files_written;
    if (summary->paths.size() < 1000) summary->paths.push_back(path);
  }
  ++progress->done;
  if (o.progress) o.progress(*progress);
  return Status::OK();
}

}  // namespace

Result<ExportSummary> Export(const ExportOptions& o) {
  if (!o.format.empty() && o.format != "png" && o.format != "exr" && o.format != "h5" && o.format != "nifti" &&
      o.format != "mha")
    return Status::InvalidArgument("export: unknown format '" + o.format + "' (png, exr, h5, nifti or mha)");
  if (!o.axis_order.empty() && o.axis_order != "source" && o.axis_order != "shw")
    return Status::InvalidArgument("export: unknown axis order '" + o.axis_order + "' (source or shw)");
  if (o.has_window && (!std::isfinite(o.window_lo) || !std::isfinite(o.window_hi) || !(o.window_lo < o.window_hi)))
    return Status::InvalidArgument("export: --window needs finite LO < HI, got " + std::to_string(o.window_lo) + "," +
                                   std::to_string(o.window_hi));
  PS_ASSIGN_OR_RETURN(auto reader, Reader::Open(o.store));
  std::vector<uint64_t> samples;
  if (o.ids.empty()) {
    for (uint64_t i = 0; i < reader->size(); ++i) samples.push_back(i);
  } else {
    for (const std::string& id : o.ids) {
      PS_ASSIGN_OR_RETURN(uint64_t i, reader->Find(id));
      samples.push_back(i);
    }
  }
  std::vector<int> fields;
  if (o.fields.empty()) {
    for (int f = 0; f < reader->field_count(); ++f) fields.push_back(f);
  } else {
    for (const std::string& name : o.fields) {
      PS_ASSIGN_OR_RETURN(int f, reader->FieldIndex(name));
      fields.push_back(f);
    }
  }
  const bool volumes = reader->meta().kind == "volumes";
  if (volumes && o.format == "exr")
    return Status::Unsupported("export of '" + o.store + "': volumes are written as png slices or h5, not exr");
  if (!volumes && (o.format == "h5" || o.format == "nifti" || o.format == "mha"))
    return Status::Unsupported("export of '" + o.store + "': " + o.format +
                               " output is for volume stores; use png or exr");
  std::error_code ec;
  fs::create_directories(o.outdir, ec);
  if (ec) return Status::IOError("export: creating '" + o.outdir + "': " + ec.message());
  if (volumes && o.format == "h5") return ExportVolumesHdf5(o, *reader, samples, fields);
  ExportSummary summary;
  std::vector<bool> warned(static_cast<size_t>(reader->field_count()), false);
  Progress progress;
  progress.total = samples.size() * fields.size();
  for (uint64_t s : samples) {
    const std::string rel = SafeRelativePath(std::string(reader->id(s)));
    const fs::path dir = fs::path(o.outdir) / rel;
    fs::create_directories(dir, ec);
    if (ec) return Status::IOError("export: creating '" + dir.string() + "': " + ec.message());
    // Whole records are read: one read-ahead request per record (the map
    // has no kernel readahead).
    for (int f : fields) reader->Prefetch(s, f);
    for (int f : fields) {
      if (volumes && (o.format == "nifti" || o.format == "mha")) {
        // One file per (volume, field): the stored float32 values with the
        // stored geometry (identity with unit spacing for volumes without).
        PS_ASSIGN_OR_RETURN(TensorView v, Volume(*reader, s, f));
        v = AsFloat32(v);  // compact volumes: normalised float32 values
        PS_ASSIGN_OR_RETURN(std::optional<VolumeGeometry> g, reader->Geometry(s));
        if (!g && summary.warnings.empty())
          summary.warnings.push_back("'" + std::string(reader->id(s)) +
                                     "' has no geometry (ingested from HDF5, or before geometry was stored): "
                                     "written with unit spacing, zero origin and identity direction");
        const std::string path =
            (dir / (SafeRelativePath(reader->field(f).name) + (o.format == "nifti" ? ".nii.gz" : ".mha"))).string();
        Status st = WriteVolumeFile(path, v.data_as<float>(),
                                    {static_cast<uint64_t>(v.shape[0]), static_cast<uint64_t>(v.shape[1]),
                                     static_cast<uint64_t>(v.shape[2])},
                                    g ? *g : VolumeGeometry());
        if (!st.ok()) return st.WithContext("export of " + reader->Describe(s, f));
        std::error_code size_ec;
        summary.bytes_written += fs::file_size(path, size_ec);
        ++summary.files_written;
        if (summary.paths.size() < 1000) summary.paths.push_back(path);
        ++progress.done;
        if (o.progress) o.progress(progress);
        continue;
      }
      if (volumes) {
        PS_ASSIGN_OR_RETURN(TensorView v, Volume(*reader, s, f));
        v = AsFloat32(v);  // compact volumes: normalised float32 values
        if (o.has_window && !warned[f] && reader->field(f).norm.kind != NormKind::kNone) {
          double vlo = 0, vhi = 1;
          FiniteRange(v.data_as<float>(), v.elements(), &vlo, &vhi);
          if (o.window_hi - o.window_lo > 10 * (vhi - vlo) || o.window_hi < vlo || o.window_lo > vhi) {
            warned[f] = true;
            summary.warnings.push_back(
                "field '" + reader->field(f).name + "' is stored normalised (" + reader->field(f).norm.ToString() +
                "; '" + std::string(reader->id(s)) + "' holds " + G(vlo) + ".." + G(vhi) + ") but --window " +
                G(o.window_lo) + "," + G(o.window_hi) +
                " is in stored units, so the slices come out nearly flat: give the window in stored units or "
                "--window auto");
          }
        }
        Status st = ExportVolumePng(v, o, dir / SafeRelativePath(reader->field(f).name), &summary, &progress);
        if (!st.ok()) return st.WithContext("export of " + reader->Describe(s, f));
        continue;
      }
      PS_ASSIGN_OR_RETURN(RecordHeader h, reader->Header(s, f));
      PS_ASSIGN_OR_RETURN(TensorView v, reader->Get(s, f));
      v = AsFloat32(v);  // compact records: normalised float32 values
      if (h.layout != Layout::kCHW)
        return Status::Unsupported("export of " + reader->Describe(s, f) + ": only image records for now");
      const FieldMeta& fm = reader->field(f);
      std::string fmt = o.format;
      if (fmt.empty()) {
        const bool integer = h.source_type == SourceType::kUInt8 || h.source_type == SourceType::kUInt16;
        fmt = integer ? "png" : "exr";
      }
      const std::string name = SafeRelativePath(fm.name);
      const std::string path = (dir / (name + "." + fmt)).string();
      Status st = fmt == "png" ? ExportPng(v, h, o, path, &summary.bytes_written)
                               : ExportExr(v, fm.channel_names, path, &summary.bytes_written);
      if (!st.ok()) return st.WithContext("export of " + reader->Describe(s, f));
      ++summary.files_written;
      if (summary.paths.size() < 1000) summary.paths.push_back(path);
      ++progress.done;
      if (o.progress) o.progress(progress);
    }
  }
  return summary;
}

}  // namespace patchstore
