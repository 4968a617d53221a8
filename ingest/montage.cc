#include "patchstore/ingest/montage.h"

#include "ingest/decode.h"

#include <unistd.h>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "patchstore/reader/sampler.h"

namespace patchstore {
namespace {

// Maps a (C,h,w) float tile to 8-bit RGB.
cv::Mat ToDisplay(const float* data, int64_t C, int64_t h, int64_t w, const RecordHeader& hdr,
                  const MontageOptions& o) {
  const double maxval = SourceMaxValue(hdr.source_type);
  const bool integer = maxval > 0;
  double lo = o.window_lo, hi = o.window_hi;
  const int64_t n = C * h * w;
  if (!o.has_window && !integer) {
    FiniteRange(data, n, &lo, &hi);
  }
  auto to8 = [&](float v) -> uint8_t {
    double x;
    if (integer && !o.has_window) {
      x = hdr.norm.Invert(v, maxval) / maxval;  // the source value, as a fraction of its range
    } else {
      x = (v - lo) / (hi - lo);
    }
    if (!std::isfinite(x)) x = 0;
    return static_cast<uint8_t>(std::nearbyint(std::min(std::max(x, 0.0), 1.0) * 255.0));
  };
  cv::Mat out(static_cast<int>(h), static_cast<int>(w), CV_8UC3);
  const int64_t plane = h * w;
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      cv::Vec3b& px = out.at<cv::Vec3b>(static_cast<int>(y), static_cast<int>(x));
      bool finite = true;
      for (int c = 0; c < 3; ++c) {
        const float v = data[(C >= 3 ? c : 0) * plane + y * w + x];
        finite = finite && std::isfinite(v);
        px[c] = to8(v);
      }
      if (!finite) px = cv::Vec3b(kNonFiniteRgb[0], kNonFiniteRgb[1], kNonFiniteRgb[2]);
    }
  return out;
}

void Overlay(cv::Mat* rgb, const float* mask, int64_t h, int64_t w) {
  auto in = [&](int64_t y, int64_t x) {
    if (y < 0 || x < 0 || y >= h || x >= w) return false;
    const float m = mask[y * w + x];
    return m != 0 && !std::isnan(m);
  };
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      const bool inside = in(y, x);
      // The edge: pixels with a 4-neighbour on the other side (the image border does not count).
      bool edge = false;
      const int64_t ny[4] = {y - 1, y + 1, y, y}, nx[4] = {x, x, x - 1, x + 1};
      for (int k = 0; k < 4 && !edge; ++k)
        edge = ny[k] >= 0 && nx[k] >= 0 && ny[k] < h && nx[k] < w && in(ny[k], nx[k]) != inside;
      cv::Vec3b& px = rgb->at<cv::Vec3b>(static_cast<int>(y), static_cast<int>(x));
      if (edge) {
        px = inside ? cv::Vec3b(255, 255, 255) : cv::Vec3b(0, 0, 0);  // white inside, black outside
      } else if (inside) {
        px[0] = static_cast<uint8_t>((px[0] + 255) / 2);  // translucent red (RGB order)
        px[1] = static_cast<uint8_t>(px[1] / 2);
        px[2] = static_cast<uint8_t>(px[2] / 2);
      }
    }
}

void Label(cv::Mat* img, const std::string& text, int x, int y) {
  const double scale = 0.4;
  int base = 0;
  cv::Size sz = cv::getTextSize(text, cv::FONT_HERSHEY_SIMPLEX, scale, 1, &base);
  cv::rectangle(*img, cv::Rect(x, y, std::min(sz.width + 4, img->cols - x), sz.height + base + 4), cv::Scalar(0, 0, 0),
                cv::FILLED);
  cv::putText(*img, text, cv::Point(x + 2, y + sz.height + 2), cv::FONT_HERSHEY_SIMPLEX, scale,
              cv::Scalar(255, 255, 255), 1, cv::LINE_AA);
}

struct Setup {
  std::shared_ptr<Reader> reader;
  std::unique_ptr<PatchSampler> sampler;
  int field = 0, overlay = -1;
};

Result<Setup> MakeSampler(const MontageOptions& o) {
  Setup s;
  PS_ASSIGN_OR_RETURN(s.reader, Reader::Open(o.store));
  if (s.reader->field_count() == 0) return Status::InvalidArgument("montage of '" + o.store + "': store is empty");
  SamplerOptions so = o.sampler;
  const std::string field = o.field.empty() ? s.reader->field(0).name : o.field;
  so.fields = {field};
  if (!o.overlay.empty()) {
    const int f = s.reader->meta().FieldIndex(o.overlay);
    if (f >= 0 && !s.reader->field(f).is_mask) {
      std::string masks;
      for (int i = 0; i < s.reader->field_count(); ++i)
        if (s.reader->field(i).is_mask) masks += (masks.empty() ? "'" : ", '") + s.reader->field(i).name + "'";
      return Status::InvalidArgument("montage of '" + o.store + "': --overlay field '" + o.overlay +
                                     "' is not a mask (" +
                                     (masks.empty() ? "the store has no mask field" : "mask fields: " + masks) +
                                     "); ingest it with --mask " + o.overlay);
    }
    so.fields.push_back(o.overlay);
  }
  if (so.require.empty() && o.require_overlay && so.policy != SamplingPolicy::kUniform) so.require = o.overlay;
  PS_ASSIGN_OR_RETURN(s.sampler, PatchSampler::Create(s.reader, so));
  return s;
}

Result<Image8> DrawMontage(const MontageOptions& o, Setup& s);
Result<Image8> DrawBoxes(const MontageOptions& o, const std::string& id);

Image8 FromMat(const cv::Mat& m) {
  Image8 img;
  img.height = m.rows;
  img.width = m.cols;
  img.rgb.assign(m.data, m.data + m.total() * 3);
  return img;
}

}  // namespace

Status CheckMontageSize(const MontageOptions& o, int64_t values_per_window) {
  if (o.count <= 0 || o.count > 4096)
    return Status::InvalidArgument("montage: --count must be 1..4096, got " + std::to_string(o.count));
  const int64_t ph = o.sampler.height(), pw = o.sampler.width();
  if (ph <= 0 || ph > (int64_t{1} << 16) || pw <= 0 || pw > (int64_t{1} << 16))
    return Status::InvalidArgument("montage: --patch must be 1..65536, got " + std::to_string(ph) + "x" +
                                   std::to_string(pw));
  if (o.tile < 0 || o.tile > 4096)
    return Status::InvalidArgument("montage: --tile must be 8..4096 (or 0: automatic), got " + std::to_string(o.tile));
  if (o.sampler.patches_per_sample <= 0 || o.sampler.patches_per_sample > 4096)
    return Status::InvalidArgument("montage: --patches-per-sample must be 1..4096, got " +
                                   std::to_string(o.sampler.patches_per_sample));
  if (o.has_window && (!std::isfinite(o.window_lo) || !std::isfinite(o.window_hi) || !(o.window_lo < o.window_hi)))
    return Status::InvalidArgument("montage: --window LO,HI needs finite LO < HI");
  const int64_t n = o.count;
  const int64_t tile = o.tile > 0 ? o.tile : std::min<int64_t>(std::max(ph, pw), 256);
  const int64_t cols = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(n))));
  const int64_t rows = (n + cols - 1) / cols;
  const int64_t gap = 2;
  const int64_t width = cols * (tile + gap) + gap, height = rows * (tile + gap) + gap;
  if (width * height > kMaxMontagePixels)
    return Status::InvalidArgument("montage: a sheet of " + std::to_string(n) + " tiles of " + std::to_string(tile) +
                                   " px is " + std::to_string(width) + "x" + std::to_string(height) +
                                   " pixels, more "
                                   "than the limit of " +
                                   std::to_string(kMaxMontagePixels) + " (2^29); use a smaller --count or --tile");
  // The gathered windows, float32, before they are drawn.
  const double bytes = static_cast<double>(n) * static_cast<double>(values_per_window) * static_cast<double>(ph) *
                       static_cast<double>(pw) * 4.0;
  if (bytes > static_cast<double>(kMaxMontageWindowBytes))
    return Status::InvalidArgument(
        "montage: " + std::to_string(n) + " windows of " + std::to_string(ph) + "x" + std::to_string(pw) + " (" +
        std::to_string(values_per_window) + " channels) need " +
        std::to_string(static_cast<uint64_t>(bytes / (1 << 20))) + " MiB of float32, more than the limit of " +
        std::to_string(kMaxMontageWindowBytes >> 20) + " MiB; use a smaller --count or --patch");
  return Status::OK();
}

Result<Image8> RenderMontage(const MontageOptions& o) {
  // Everything that does not need the store is checked before opening it;
  // the window memory once the field's channels are known.
  PS_RETURN_IF_ERROR(CheckMontageSize(o, 1));
  PS_ASSIGN_OR_RETURN(Setup s, MakeSampler(o));
  {
    int64_t values = 0;
    for (int64_t c : s.sampler->channels()) values += c;
    PS_RETURN_IF_ERROR(CheckMontageSize(o, values));
  }
  try {
    return DrawMontage(o, s);
  } catch (const cv::Exception& e) {  // e.g. an allocation OpenCV cannot make
    return Status::IOError("montage of '" + o.store + "': OpenCV: " + e.what());
  } catch (const std::bad_alloc&) {
    return Status::IOError("montage of '" + o.store + "': out of memory");
  }
}

namespace {
Result<Image8> DrawMontage(const MontageOptions& o, Setup& s) {
  const int64_t ph = s.sampler->height(), pw = s.sampler->width();
  if (s.sampler->eligible_samples() == 0) {
    std::string example;
    if (!s.sampler->skipped_ids().empty()) {
      const std::string& id = s.sampler->skipped_ids()[0];
      auto idx = s.reader->Find(id);
      auto h = idx.ok() ? s.reader->Summary(*idx, s.sampler->field_indices()[0]) : Result<RecordSummary>(idx.status());
      if (h.ok())
        example = "; the first, '" + id + "', is " + std::to_string(h->shape[2]) + "x" + std::to_string(h->shape[1]) +
                  (s.sampler->options().require.empty() ? "" : " (or its mask has no qualifying window)");
    }
    return Status::OutOfRange("montage of '" + o.store + "': no sample has an admissible " + std::to_string(ph) + "x" +
                              std::to_string(pw) + " window (" + std::to_string(s.sampler->skipped_samples()) +
                              " skipped" + example + ")");
  }
  const int64_t n = o.count;  // continues into later epochs when one holds fewer windows
  const auto& ch = s.sampler->channels();
  std::vector<std::vector<float>> bufs;
  std::vector<float*> outs;
  for (int64_t c : ch) {
    bufs.emplace_back(static_cast<size_t>(n * c * ph * pw));
    outs.push_back(bufs.back().data());
  }
  // The windows the loader serves from the start of `epoch` (continuing
  // into later epochs when one holds fewer), copied as the loaders copy.
  PS_ASSIGN_OR_RETURN(std::vector<Window> wins, s.sampler->ServedWindows(o.loader, o.epoch, 0, n));
  PS_RETURN_IF_ERROR(s.sampler->GatherWindows(wins, outs));
  // A tile is the window scaled to fit `tile` x `tile`, keeping its aspect.
  const int tile = o.tile > 0 ? o.tile : static_cast<int>(std::min<int64_t>(std::max(ph, pw), 256));
  const double scale = static_cast<double>(tile) / static_cast<double>(std::max(ph, pw));
  const int th = std::max(1, static_cast<int>(std::lround(static_cast<double>(ph) * scale)));
  const int tw = std::max(1, static_cast<int>(std::lround(static_cast<double>(pw) * scale)));
  const int cols = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(n))));
  const int rows = static_cast<int>((n + cols - 1) / cols);
  const int gap = 2;
  cv::Mat sheet(rows * (tile + gap) + gap, cols * (tile + gap) + gap, CV_8UC3, cv::Scalar(32, 32, 32));
  const int field = s.sampler->field_indices()[0];
  for (int64_t i = 0; i < n; ++i) {
    PS_ASSIGN_OR_RETURN(RecordHeader hdr, s.reader->Header(wins[i].sample, field));
    cv::Mat t = ToDisplay(bufs[0].data() + i * ch[0] * ph * pw, ch[0], ph, pw, hdr, o);
    if (outs.size() > 1) Overlay(&t, bufs[1].data() + i * ph * pw, ph, pw);
    if (t.rows != th || t.cols != tw) cv::resize(t, t, cv::Size(tw, th), 0, 0, cv::INTER_AREA);
    std::string label = std::string(s.reader->id(wins[i].sample)) + " y" + std::to_string(wins[i].y) + " x" +
                        std::to_string(wins[i].x);
    if (wins[i].flip || wins[i].rot) label += " f" + std::to_string(wins[i].flip) + "r" + std::to_string(wins[i].rot);
    Label(&t, label, 0, 0);
    const int r = static_cast<int>(i / cols), c = static_cast<int>(i % cols);
    t.copyTo(sheet(cv::Rect(gap + c * (tile + gap), gap + r * (tile + gap), tw, th)));
  }
  Image8 img = FromMat(sheet);
  img.windows = wins;
  if (std::string report = s.sampler->SkippedReport(); !report.empty()) img.warnings.push_back(report);
  return img;
}

}  // namespace

Result<Image8> RenderBoxes(const MontageOptions& o, const std::string& id) {
  // A picture's limit (as CheckMontageSize's for the sheet): every window of a frame is drawn.
  if (o.sampler.patches_per_sample <= 0 || o.sampler.patches_per_sample > 4096)
    return Status::InvalidArgument("drawing windows of '" + o.store + "': --patches-per-sample must be 1..4096, got " +
                                   std::to_string(o.sampler.patches_per_sample));
  try {
    return DrawBoxes(o, id);
  } catch (const cv::Exception& e) {
    return Status::IOError("drawing windows on '" + id + "' of '" + o.store + "': OpenCV: " + e.what());
  } catch (const std::bad_alloc&) {
    return Status::IOError("drawing windows on '" + id + "' of '" + o.store + "': out of memory");
  }
}

namespace {
Result<Image8> DrawBoxes(const MontageOptions& o, const std::string& id) {
  PS_ASSIGN_OR_RETURN(Setup s, MakeSampler(o));
  PS_ASSIGN_OR_RETURN(uint64_t sample, s.reader->Find(id));
  const int field = s.sampler->field_indices()[0];
  PS_ASSIGN_OR_RETURN(TensorView v, s.reader->Get(sample, field));
  v = AsFloat32(v);
  PS_ASSIGN_OR_RETURN(RecordHeader hdr, s.reader->Header(sample, field));
  cv::Mat frame = ToDisplay(v.data_as<float>(), v.shape[0], v.shape[1], v.shape[2], hdr, o);
  if (s.sampler->field_indices().size() > 1) {
    PS_ASSIGN_OR_RETURN(TensorView m, s.reader->Get(sample, s.sampler->field_indices()[1]));
    m = AsFloat32(m);
    Overlay(&frame, m.data_as<float>(), m.shape[1], m.shape[2]);
  }
  // The windows the loader takes from this sample in the epoch.
  PS_ASSIGN_OR_RETURN(std::vector<Window> wins, s.sampler->ServedWindowsOfSample(o.loader, o.epoch, sample));
  if (wins.size() > static_cast<size_t>(std::max(o.count, 0))) wins.resize(static_cast<size_t>(std::max(o.count, 0)));
  for (const Window& w : wins) {
    cv::rectangle(frame,
                  cv::Rect(static_cast<int>(w.x), static_cast<int>(w.y), static_cast<int>(s.sampler->width()),
                           static_cast<int>(s.sampler->height())),
                  cv::Scalar(255, 255, 0), 2);
    Label(&frame, "y" + std::to_string(w.y) + " x" + std::to_string(w.x), static_cast<int>(w.x), static_cast<int>(w.y));
  }
  Image8 img = FromMat(frame);
  img.windows = wins;
  if (!s.sampler->eligible(sample)) {
    img.warnings.push_back(s.sampler->considered(sample) ? s.sampler->SkippedReport()
                                                         : "'" + id + "' is not in the ids subset: the " +
                                                               LoaderKindName(o.loader) + " never serves it");
  }
  return img;
}

}  // namespace

Status WritePng(const Image8& image, const std::string& path) {
  cv::Mat rgb(image.height, image.width, CV_8UC3, const_cast<uint8_t*>(image.rgb.data())), bgr;
  cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
  std::vector<uint8_t> buf;
  try {
    if (!cv::imencode(".png", bgr, buf)) return Status::IOError("encoding '" + path + "' as PNG failed");
  } catch (const cv::Exception& e) {
    return Status::IOError("encoding '" + path + "' as PNG: " + e.what());
  }
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) return Status::FromErrno("writing '" + path + "'", errno);
    f.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    if (!f) return Status::IOError("writing '" + tmp + "': write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return Status::FromErrno("renaming to '" + path + "'", errno);
  return Status::OK();
}

}  // namespace patchstore
