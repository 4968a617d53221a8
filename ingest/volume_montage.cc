#include "patchstore/ingest/volume_montage.h"

#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "patchstore/reader/reader.h"

namespace patchstore {
namespace {

void DrawLabel(cv::Mat* img, const std::string& text) {
  const double scale = 0.35;
  int base = 0;
  cv::Size sz = cv::getTextSize(text, cv::FONT_HERSHEY_SIMPLEX, scale, 1, &base);
  cv::rectangle(*img, cv::Rect(0, 0, std::min(sz.width + 4, img->cols), std::min(sz.height + base + 4, img->rows)),
                cv::Scalar(0, 0, 0), cv::FILLED);
  cv::putText(*img, text, cv::Point(2, sz.height + 2), cv::FONT_HERSHEY_SIMPLEX, scale, cv::Scalar(255, 255, 255), 1,
              cv::LINE_AA);
}

// The q-quantile (0..1) of the finite values, by nth_element (NumPy's
// "lower" interpolation); 0 when there are none.
double Quantile(std::vector<float>* v, double q) {
  if (v->empty()) return 0;
  const size_t k = static_cast<size_t>(std::floor(q * static_cast<double>(v->size() - 1)));
  std::nth_element(v->begin(), v->begin() + static_cast<std::ptrdiff_t>(k), v->end());
  return (*v)[k];
}

}  // namespace

Result<VolumeMontage> RenderVolumeMontage(const VolumeMontageOptions& o) {
  if (o.count <= 0 || o.count > 4096) return Status::InvalidArgument("montage: --count must be 1..4096");
  PS_ASSIGN_OR_RETURN(std::shared_ptr<Reader> reader, Reader::Open(o.store));
  if (reader->meta().kind != "volumes")
    return Status::InvalidArgument("volume montage of '" + o.store + "': the store holds " + reader->meta().kind +
                                   ", not volumes");
  if (reader->field_count() == 0) return Status::InvalidArgument("montage of '" + o.store + "': store is empty");
  const std::string fname = o.field.empty() ? reader->field(0).name : o.field;
  PS_ASSIGN_OR_RETURN(int field, reader->FieldIndex(fname));
  int overlay = -1;
  if (!o.overlay.empty()) {
    PS_ASSIGN_OR_RETURN(overlay, reader->FieldIndex(o.overlay));
  }
  SliceOptions so = o.slices;
  if (so.fields.empty())
    for (int f = 0; f < reader->field_count(); ++f) so.fields.push_back(reader->field(f).name);
  PS_ASSIGN_OR_RETURN(std::unique_ptr<SliceSampler> sampler, SliceSampler::Create(reader, so));
  VolumeMontage out;
  // Volumes SliceDataset leaves out (no item with these options).
  if (!sampler->skipped().empty())
    out.warning = std::to_string(sampler->skipped().size()) + " of " + std::to_string(sampler->considered_volumes()) +
                  " volumes give no item and are skipped" +
                  (so.crop.none() ? std::string()
                                  : " (crop " + std::to_string(so.crop.h) + "x" + std::to_string(so.crop.w) + ")") +
                  ", as SliceDataset skips them: " + sampler->skipped_text();
  const uint64_t N = sampler->size();
  const int64_t context = so.context.Of(fname);
  const uint64_t n = std::min<uint64_t>(static_cast<uint64_t>(o.count), N);
  struct Tile {
    std::vector<float> plane, mask;
    int64_t h = 0, w = 0;
    SliceRef ref;
    SliceTransform t;
  };
  std::vector<Tile> tiles(n);
  std::vector<float> values;
  for (uint64_t j = 0; j < n; ++j) {
    const uint64_t item = static_cast<uint64_t>((static_cast<__uint128_t>(j) * N) / n);
    out.items.push_back(item);
    Tile& tl = tiles[j];
    PS_ASSIGN_OR_RETURN(SliceItem it, sampler->Item(o.epoch, item));
    tl.ref = it.ref;
    tl.t = it.transform;
    tl.h = it.out_h;
    tl.w = it.out_w;
    tl.plane.resize(static_cast<size_t>(tl.h * tl.w));
    PS_RETURN_IF_ERROR(CopySliceStack(*reader, tl.ref.sample, field, tl.ref.slice, 0, tl.t, tl.plane.data()));
    if (overlay >= 0) {
      tl.mask.resize(tl.plane.size());
      PS_RETURN_IF_ERROR(CopySliceStack(*reader, tl.ref.sample, overlay, tl.ref.slice, 0, tl.t, tl.mask.data()));
    }
    if (!o.has_window)
      for (float x : tl.plane)
        if (std::isfinite(x)) values.push_back(x);
  }
  double lo = o.window_lo, hi = o.window_hi;
  if (!o.has_window) {
    lo = Quantile(&values, 0.01);
    hi = Quantile(&values, 0.99);
  }
  out.window_lo = lo;
  out.window_hi = hi;
  int tile = o.tile;
  if (tile <= 0) {
    const int64_t side = std::max(tiles[0].h, tiles[0].w);
    tile = static_cast<int>(std::min<int64_t>(std::max<int64_t>(side, 8), 256));
  }
  const int cols = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(n))));
  const int rows = static_cast<int>((n + cols - 1) / cols);
  const int gap = 2;
  cv::Mat sheet(rows * (tile + gap) + gap, cols * (tile + gap) + gap, CV_8UC3, cv::Scalar(32, 32, 32));
  for (uint64_t j = 0; j < n; ++j) {
    const Tile& tl = tiles[j];
    cv::Mat t(static_cast<int>(tl.h), static_cast<int>(tl.w), CV_8UC3);
    for (int64_t y = 0; y < tl.h; ++y)
      for (int64_t x = 0; x < tl.w; ++x) {
        const size_t k = static_cast<size_t>(y * tl.w + x);
        double u = hi > lo ? (static_cast<double>(tl.plane[k]) - lo) / (hi - lo)
                           : (static_cast<double>(tl.plane[k]) > lo ? 1.0 : 0.0);
        if (!std::isfinite(u)) u = 0;
        const uint8_t g = static_cast<uint8_t>(std::nearbyint(std::min(std::max(u, 0.0), 1.0) * 255.0));
        cv::Vec3b px(g, g, g);
        if (!tl.mask.empty() && tl.mask[k] != 0 && !std::isnan(tl.mask[k])) {
          px[0] = static_cast<uint8_t>((g + 255) / 2);  // translucent red (RGB order)
          px[1] = px[2] = static_cast<uint8_t>(g / 2);
        }
        t.at<cv::Vec3b>(static_cast<int>(y), static_cast<int>(x)) = px;
      }
    if (t.rows != tile || t.cols != tile) cv::resize(t, t, cv::Size(tile, tile), 0, 0, cv::INTER_AREA);
    if (o.labels) {
      std::string label = std::string(reader->id(tl.ref.sample)) + " s" + std::to_string(tl.ref.slice);
      if (context > 0) label += "+-" + std::to_string(context);
      if (tl.t.flip_v || tl.t.flip_h || tl.t.rot90)
        label += std::string(" ") + (tl.t.flip_v ? "v" : "") + (tl.t.flip_h ? "h" : "") +
                 (tl.t.rot90 ? "r" + std::to_string(tl.t.rot90) : "");
      DrawLabel(&t, label);
    }
    const int r = static_cast<int>(j / cols), c = static_cast<int>(j % cols);
    t.copyTo(sheet(cv::Rect(gap + c * (tile + gap), gap + r * (tile + gap), tile, tile)));
  }
  out.image.height = sheet.rows;
  out.image.width = sheet.cols;
  out.image.rgb.assign(sheet.data, sheet.data + sheet.total() * 3);
  return out;
}

}  // namespace patchstore
