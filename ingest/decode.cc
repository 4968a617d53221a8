#include "ingest/decode.h"

#include <ImfChannelList.h>
#include <ImfFrameBuffer.h>
#include <ImfHeader.h>
#include <ImfIO.h>
#include <ImfInputFile.h>
#include <ImfRgbaFile.h>
#include <ImfStdIO.h>
#include <ImfTestFile.h>
#include <openexr.h>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <vector>

#include "ingest/checks.h"
#include "ingest/encoding.h"

namespace patchstore {
namespace {

Status ReadWholeFile(const std::string& path, std::vector<uint8_t>* out) {
  // Refuse a directory, device or socket before opening it (no meaningful
  // size). A FIFO is read: in an isolated decoder its time limit applies;
  // in-process decoding refuses FIFOs before calling this (ingest_images.cc).
  PS_RETURN_IF_ERROR(CheckRegularInput(path, "image", /*allow_fifo=*/true));
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status(errno == ENOENT ? Code::kNotFound : Code::kIOError,
                  "reading '" + path + "': " + std::strerror(errno));
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  if (size < 0) return Status::IOError("reading '" + path + "': cannot determine size");
  if (static_cast<uint64_t>(size) > (uint64_t{1} << 34))
    return Status::InvalidArgument("reading '" + path + "': file larger than 16 GiB");
  in.seekg(0);
  out->resize(static_cast<size_t>(size));
  if (size > 0 && !in.read(reinterpret_cast<char*>(out->data()), size))
    return Status::IOError("reading '" + path + "': short read");
  return Status::OK();
}

bool IsExr(const std::vector<uint8_t>& b) {
  return b.size() >= 4 && b[0] == 0x76 && b[1] == 0x2f && b[2] == 0x31 && b[3] == 0x01;
}

std::string SniffFormat(const std::vector<uint8_t>& b) {
  if (b.size() >= 8 && std::memcmp(b.data(), "\x89PNG\r\n\x1a\n", 8) == 0) return "png";
  if (b.size() >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff) return "jpeg";
  if (b.size() >= 4 && (std::memcmp(b.data(), "II*\0", 4) == 0 || std::memcmp(b.data(), "MM\0*", 4) == 0))
    return "tiff";
  if (b.size() >= 2 && b[0] == 'B' && b[1] == 'M') return "bmp";
  if (IsExr(b)) return "exr";
  return "";
}

// An Imf::IStream over a memory buffer, so EXR decoding never re-reads the
// file and errors come from one place.
class MemoryIStream : public Imf::IStream {
 public:
  MemoryIStream(const std::string& name, const std::vector<uint8_t>& data) : Imf::IStream(name.c_str()), data_(data) {}
  bool isMemoryMapped() const override { return false; }
  bool read(char c[], int n) override {
    if (n < 0 || pos_ + static_cast<uint64_t>(n) > data_.size()) throw std::runtime_error("unexpected end of file");
    std::memcpy(c, data_.data() + pos_, static_cast<size_t>(n));
    pos_ += static_cast<uint64_t>(n);
    return pos_ < data_.size();
  }
  uint64_t tellg() override { return pos_; }
  void seekg(uint64_t pos) override { pos_ = pos; }
  void clear() override {}

 private:
  const std::vector<uint8_t>& data_;
  uint64_t pos_ = 0;
};

// Reads only the header through OpenEXR's core C API (no pixel or offset
// table allocation) and checks the declared size against the limit before
// the C++ library, whose constructor allocates in proportion to the data
// window, is allowed near the file.
Status PrecheckExr(const std::string& path, const std::vector<uint8_t>& bytes, uint64_t max_pixels) {
  exr_context_initializer_t init = EXR_DEFAULT_CONTEXT_INITIALIZER;
  init.user_data = const_cast<std::vector<uint8_t>*>(&bytes);
  init.read_fn = [](exr_const_context_t, void* ud, void* buf, uint64_t sz, uint64_t off,
                    exr_stream_error_func_ptr_t) -> int64_t {
    const auto* d = static_cast<const std::vector<uint8_t>*>(ud);
    if (off >= d->size()) return 0;
    const uint64_t n = std::min<uint64_t>(sz, d->size() - off);
    std::memcpy(buf, d->data() + off, n);
    return static_cast<int64_t>(n);
  };
  init.size_fn = [](exr_const_context_t, void* ud) -> int64_t {
    return static_cast<int64_t>(static_cast<const std::vector<uint8_t>*>(ud)->size());
  };
  init.error_handler_fn = [](exr_const_context_t, exr_result_t, const char*) {};  // errors come back as codes
  exr_context_t ctx = nullptr;
  exr_result_t rc = exr_start_read(&ctx, path.c_str(), &init);
  if (rc != EXR_ERR_SUCCESS) {
    if (ctx) exr_finish(&ctx);
    return Status::Corruption("decoding '" + path + "' as OpenEXR: bad header (" + exr_get_default_error_message(rc) +
                              ")");
  }
  Status st;
  int parts = 0;
  exr_attr_box2i_t box{};
  const exr_attr_chlist_t* chans = nullptr;
  if (exr_get_count(ctx, &parts) != EXR_ERR_SUCCESS || parts < 1 ||
      exr_get_data_window(ctx, 0, &box) != EXR_ERR_SUCCESS || exr_get_channels(ctx, 0, &chans) != EXR_ERR_SUCCESS ||
      chans == nullptr) {
    st = Status::Corruption("decoding '" + path + "' as OpenEXR: unreadable header");
  } else {
    const int64_t w = static_cast<int64_t>(box.max.x) - box.min.x + 1;
    const int64_t h = static_cast<int64_t>(box.max.y) - box.min.y + 1;
    const int64_t c = chans->num_channels;
    if (w <= 0 || h <= 0 || c <= 0) {
      st = Status::Corruption("decoding '" + path + "' as OpenEXR: empty data window or no channels");
    } else if (static_cast<uint64_t>(w) * static_cast<uint64_t>(h) > max_pixels ||
               static_cast<uint64_t>(w) * static_cast<uint64_t>(h) * static_cast<uint64_t>(c) > 4 * max_pixels) {
      st = Status::InvalidArgument("decoding '" + path + "': declared size " + std::to_string(w) + "x" +
                                   std::to_string(h) + "x" + std::to_string(c) + " exceeds the limit of " +
                                   std::to_string(max_pixels) + " values");
    }
  }
  exr_finish(&ctx);
  return st;
}

// A luminance/chroma image (Y, RY, BY with chroma subsampled, optionally A)
// read through OpenEXR's RGBA interface, which reconstructs R, G, B (half)
// from Y and the interpolated chroma: the values are exactly what
// Imf::RgbaInputFile returns. Format "exr-yc" records where they came from.
Result<DecodedImage> DecodeExrYc(const std::string& path, const std::vector<uint8_t>& bytes, uint64_t max_pixels) {
  MemoryIStream stream(path, bytes);
  Imf::RgbaInputFile file(stream, 1);
  const Imath::Box2i dw = file.dataWindow();
  const int64_t width = static_cast<int64_t>(dw.max.x) - dw.min.x + 1;
  const int64_t height = static_cast<int64_t>(dw.max.y) - dw.min.y + 1;
  if (width <= 0 || height <= 0 || width > (1 << 20) || height > (1 << 20))
    return Status::Corruption("decoding '" + path + "': bad data window");
  const bool alpha = (file.channels() & Imf::WRITE_A) != 0;
  if (static_cast<uint64_t>(width) * static_cast<uint64_t>(height) * (alpha ? 4 : 3) > max_pixels)
    return Status::InvalidArgument("decoding '" + path + "': declared size " + std::to_string(width) + "x" +
                                   std::to_string(height) + "x" + (alpha ? "4" : "3") + " exceeds the limit of " +
                                   std::to_string(max_pixels) + " values");
  std::vector<Imf::Rgba> rgba(static_cast<size_t>(width) * static_cast<size_t>(height));
  // Absolute (x, y) addressing: shift the base by the data window origin.
  const intptr_t origin = -static_cast<intptr_t>(dw.min.x) - static_cast<intptr_t>(dw.min.y) * width;
  file.setFrameBuffer(rgba.data() + origin, 1, static_cast<size_t>(width));
  file.readPixels(dw.min.y, dw.max.y);
  const int C = alpha ? 4 : 3;
  DecodedImage img;
  img.pixels.create(static_cast<int>(height), static_cast<int>(width), CV_32FC(C));
  float* out = img.pixels.ptr<float>(0);
  for (size_t i = 0; i < rgba.size(); ++i) {
    out[i * C] = rgba[i].r;
    out[i * C + 1] = rgba[i].g;
    out[i * C + 2] = rgba[i].b;
    if (alpha) out[i * C + 3] = rgba[i].a;
  }
  img.source_type = SourceType::kFloat16;
  img.format = "exr-yc";
  img.channel_names = alpha ? "R,G,B,A" : "R,G,B";
  return img;
}

Result<DecodedImage> DecodeExr(const std::string& path, const std::vector<uint8_t>& bytes, const std::string& channel,
                               uint64_t max_pixels) {
  PS_RETURN_IF_ERROR(PrecheckExr(path, bytes, max_pixels));
  try {
    MemoryIStream stream(path, bytes);
    Imf::InputFile file(stream, 1);
    const Imf::Header& header = file.header();
    const Imath::Box2i dw = header.dataWindow();
    const int64_t width = static_cast<int64_t>(dw.max.x) - dw.min.x + 1;
    const int64_t height = static_cast<int64_t>(dw.max.y) - dw.min.y + 1;
    if (width <= 0 || height <= 0) return Status::Corruption("decoding '" + path + "': empty data window");
    std::vector<std::string> names;
    std::vector<Imf::PixelType> types;
    const Imf::ChannelList& chl = header.channels();
    if (channel.empty() && chl.findChannel("Y") && (chl.findChannel("RY") || chl.findChannel("BY"))) {
      // Luminance/chroma: R, G, B through the RGBA interface. Channels it
      // does not read would be lost: refused, naming them.
      std::string others;
      for (auto it = chl.begin(); it != chl.end(); ++it) {
        const std::string n = it.name();
        if (n != "Y" && n != "RY" && n != "BY" && n != "A") others += (others.empty() ? "" : ",") + n;
      }
      if (!others.empty())
        return Status::Unsupported("decoding '" + path +
                                   "': a luminance/chroma image (Y,RY,BY) with further "
                                   "channels (" +
                                   others + "): pick one with '" + path + ":NAME'");
      // The RGBA interface reads chroma subsampled 2x2 (as OpenEXR writes
      // it); other samplings are not that layout, and it would throw.
      for (const char* c : {"RY", "BY"})
        if (const Imf::Channel* ch = chl.findChannel(c); ch && (ch->xSampling != 2 || ch->ySampling != 2))
          return Status::Unsupported("decoding '" + path + "': channel " + c + " is sampled " +
                                     std::to_string(ch->xSampling) + "x" + std::to_string(ch->ySampling) +
                                     ", but a luminance/chroma image (Y,RY,BY) that OpenEXR reconstructs as RGB has "
                                     "its chroma subsampled 2x2; read a channel as stored with '" +
                                     path + ":NAME' (e.g. " + path + ":Y)");
      return DecodeExrYc(path, bytes, max_pixels);
    }
    for (auto it = header.channels().begin(); it != header.channels().end(); ++it) {
      if (it.channel().xSampling != 1 || it.channel().ySampling != 1) {
        if (!channel.empty() && channel != it.name()) continue;
        return Status::Unsupported("decoding '" + path + "': subsampled channel '" + it.name() + "'");
      }
      names.push_back(it.name());
      types.push_back(it.channel().type);
    }
    if (!channel.empty()) {
      auto f = std::find(names.begin(), names.end(), channel);
      if (f == names.end()) {
        std::string have;
        for (auto& n : names) have += (have.empty() ? "" : ",") + n;
        return Status::NotFound("decoding '" + path + "': no channel '" + channel + "' (has " + have + ")");
      }
      Imf::PixelType t = types[f - names.begin()];
      names = {channel};
      types = {t};
    } else {
      // R, G, B, A first in that order, then the rest by name (OpenEXR's order).
      static const char* kOrder[] = {"R", "G", "B", "A"};
      std::vector<std::pair<std::string, Imf::PixelType>> ordered, rest;
      for (const char* o : kOrder)
        for (size_t i = 0; i < names.size(); ++i)
          if (names[i] == o) ordered.emplace_back(names[i], types[i]);
      for (size_t i = 0; i < names.size(); ++i)
        if (names[i] != "R" && names[i] != "G" && names[i] != "B" && names[i] != "A")
          rest.emplace_back(names[i], types[i]);
      ordered.insert(ordered.end(), rest.begin(), rest.end());
      names.clear();
      types.clear();
      for (auto& [n, t] : ordered) {
        names.push_back(n);
        types.push_back(t);
      }
    }
    if (names.empty()) return Status::Corruption("decoding '" + path + "': no channels");
    if (names.size() > 512) return Status::Unsupported("decoding '" + path + "': too many channels");
    const uint64_t total = static_cast<uint64_t>(width) * static_cast<uint64_t>(height) * names.size();
    if (total > max_pixels)
      return Status::InvalidArgument("decoding '" + path + "': declared size " + std::to_string(width) + "x" +
                                     std::to_string(height) + "x" + std::to_string(names.size()) +
                                     " exceeds the limit of " + std::to_string(max_pixels) + " values");
    if (width > (1 << 20) || height > (1 << 20))
      return Status::InvalidArgument("decoding '" + path + "': declared size too large");
    DecodedImage img;
    img.pixels.create(static_cast<int>(height), static_cast<int>(width), CV_32FC(static_cast<int>(names.size())));
    const size_t C = names.size();
    Imf::FrameBuffer fb;
    char* base = reinterpret_cast<char*>(img.pixels.ptr<float>(0));
    const size_t xs = sizeof(float) * C, ys = xs * static_cast<size_t>(width);
    // OpenEXR addresses pixels by absolute (x, y): shift the base pointer by
    // the data window origin (arithmetic in integers, as the library does).
    const intptr_t origin = -static_cast<intptr_t>(dw.min.x) * static_cast<intptr_t>(xs) -
                            static_cast<intptr_t>(dw.min.y) * static_cast<intptr_t>(ys);
    // UINT channels are read as UINT (then converted), so that values
    // float32 rounds (above 2^24) are seen and reported.
    std::vector<std::vector<uint32_t>> uints(C);
    const intptr_t uorigin = -static_cast<intptr_t>(dw.min.x) * 4 - static_cast<intptr_t>(dw.min.y) * 4 * width;
    for (size_t c = 0; c < C; ++c) {
      if (types[c] == Imf::UINT) {
        uints[c].assign(static_cast<size_t>(width) * static_cast<size_t>(height), 0);
        fb.insert(names[c], Imf::Slice(Imf::UINT, reinterpret_cast<char*>(uints[c].data()) + uorigin, 4,
                                       4 * static_cast<size_t>(width), 1, 1, 0.0));
      } else {
        fb.insert(names[c], Imf::Slice(Imf::FLOAT, base + origin + c * sizeof(float), xs, ys, 1, 1, 0.0));
      }
    }
    file.setFrameBuffer(fb);
    file.readPixels(dw.min.y, dw.max.y);
    uint32_t largest = 0;
    for (size_t c = 0; c < C; ++c) {
      if (uints[c].empty()) continue;
      float* out = img.pixels.ptr<float>(0);
      for (size_t i = 0; i < uints[c].size(); ++i) {
        out[i * C + c] = static_cast<float>(uints[c][i]);
        largest = std::max(largest, uints[c][i]);
      }
    }
    if (largest > (uint32_t{1} << 24)) img.warnings.push_back(Float32RoundingNote(path, SourceType::kUInt32, largest));
    bool all_half = true, any_uint = false;
    for (auto t : types) {
      all_half = all_half && t == Imf::HALF;
      any_uint = any_uint || t == Imf::UINT;
    }
    img.source_type = all_half ? SourceType::kFloat16 : any_uint ? SourceType::kUInt32 : SourceType::kFloat32;
    img.format = "exr";
    for (size_t c = 0; c < C; ++c) img.channel_names += (c ? "," : "") + names[c];
    return img;
  } catch (const std::exception& e) {
    return Status::Corruption("decoding '" + path + "' as OpenEXR: " + e.what());
  } catch (...) {
    return Status::Corruption("decoding '" + path + "' as OpenEXR: unknown error");
  }
}

Result<DecodedImage> DecodeWithOpenCV(const std::string& path, const std::vector<uint8_t>& bytes,
                                      const std::string& format, uint64_t max_pixels) {
  DecodedImage img;
  try {
    cv::Mat raw = cv::imdecode(cv::_InputArray(bytes.data(), static_cast<int>(bytes.size())), cv::IMREAD_UNCHANGED);
    if (raw.empty())
      return Status::Corruption("decoding '" + path + "': not a readable image (corrupt, truncated or unsupported" +
                                (format.empty() ? std::string(" format)") : " " + format + ")"));
    const uint64_t total = static_cast<uint64_t>(raw.rows) * raw.cols * raw.channels();
    if (total > max_pixels)
      return Status::InvalidArgument("decoding '" + path + "': image of " + std::to_string(total) +
                                     " values exceeds the limit of " + std::to_string(max_pixels));
    switch (raw.depth()) {
      case CV_8U: img.source_type = SourceType::kUInt8; break;
      case CV_16U: img.source_type = SourceType::kUInt16; break;
      case CV_32F: img.source_type = SourceType::kFloat32; break;
      case CV_8S:
        img.source_type = SourceType::kInt8;
        raw.convertTo(raw, CV_32F);
        break;
      case CV_16S:
        img.source_type = SourceType::kInt16;
        raw.convertTo(raw, CV_32F);
        break;
      case CV_32S:
        img.source_type = SourceType::kInt32;
        raw.convertTo(raw, CV_32F);
        break;
      case CV_64F:
        img.source_type = SourceType::kFloat64;
        raw.convertTo(raw, CV_32F);
        break;
      default: return Status::Unsupported("decoding '" + path + "': unsupported pixel depth");
    }
    switch (raw.channels()) {
      case 1:
        img.pixels = raw;
        img.channel_names = "Y";
        break;
      case 3:
        cv::cvtColor(raw, img.pixels, cv::COLOR_BGR2RGB);
        img.channel_names = "R,G,B";
        break;
      case 4:
        cv::cvtColor(raw, img.pixels, cv::COLOR_BGRA2RGBA);
        img.channel_names = "R,G,B,A";
        break;
      default:
        return Status::Unsupported("decoding '" + path + "': " + std::to_string(raw.channels()) +
                                   " channels (supported: 1, 3, 4)");
    }
    if (!img.pixels.isContinuous()) img.pixels = img.pixels.clone();
  } catch (const cv::Exception& e) {
    if (std::string(e.what()).find("validateInputImageSize") != std::string::npos)
      return Status::InvalidArgument("decoding '" + path + "': declared image size exceeds the limit of " +
                                     std::to_string(max_pixels) + " pixels");
    return Status::Corruption("decoding '" + path + "': " + e.err);
  }
  img.format = format.empty() ? "image" : format;
  return img;
}

template <typename T>
void Deinterleave(const DecodedImage& image, const Normalization& norm, float* dst) {
  const int H = image.height(), W = image.width(), C = image.channels();
  const size_t plane = static_cast<size_t>(H) * W;
  if constexpr (std::is_integral_v<T>) {
    // Integer sources: a lookup table holds Apply() for every possible value,
    // so each pixel costs one load (bit-identical to applying it directly).
    std::vector<float> lut(size_t{1} << (8 * sizeof(T)));
    for (size_t v = 0; v < lut.size(); ++v) lut[v] = norm.Apply(static_cast<double>(v));
    for (int y = 0; y < H; ++y) {
      const T* row = image.pixels.ptr<T>(y);
      for (int c = 0; c < C; ++c) {
        float* out = dst + c * plane + static_cast<size_t>(y) * W;
        for (int x = 0; x < W; ++x) out[x] = lut[row[x * C + c]];
      }
    }
  } else {
    const bool identity = norm.kind == NormKind::kNone && !norm.clamp;
    for (int y = 0; y < H; ++y) {
      const T* row = image.pixels.ptr<T>(y);
      for (int c = 0; c < C; ++c) {
        float* out = dst + c * plane + static_cast<size_t>(y) * W;
        if (identity) {
          for (int x = 0; x < W; ++x) out[x] = row[x * C + c];
        } else {
          for (int x = 0; x < W; ++x) out[x] = norm.Apply(row[x * C + c]);
        }
      }
    }
  }
}

// The raw source values of an image, de-interleaved into (C,H,W) of Out
// (compact encodings: Out holds every value of T exactly).
template <typename T, typename Out>
void DeinterleaveRaw(const DecodedImage& image, Out* dst) {
  const int H = image.height(), W = image.width(), C = image.channels();
  const size_t plane = static_cast<size_t>(H) * W;
  for (int y = 0; y < H; ++y) {
    const T* row = image.pixels.ptr<T>(y);
    for (int c = 0; c < C; ++c) {
      Out* out = dst + c * plane + static_cast<size_t>(y) * W;
      for (int x = 0; x < W; ++x) out[x] = static_cast<Out>(row[x * C + c]);
    }
  }
}

}  // namespace

Result<DecodedImage> DecodeFile(const std::string& path, const std::string& channel, uint64_t max_pixels) {
  std::vector<uint8_t> bytes;
  PS_RETURN_IF_ERROR(ReadWholeFile(path, &bytes));
  if (bytes.empty()) return Status::Corruption("decoding '" + path + "': file is empty");
  const std::string format = SniffFormat(bytes);
  if (format == "exr") return DecodeExr(path, bytes, channel, max_pixels);
  if (!channel.empty())
    return Status::InvalidArgument("decoding '" + path + "': a channel (':" + channel +
                                   "') can only be chosen for OpenEXR files");
  if (format == "tiff") return DecodeTiff(path, bytes, max_pixels);
  if (format == "jpeg") PS_RETURN_IF_ERROR(CheckJpegColorSpace(path, bytes));
  return DecodeWithOpenCV(path, bytes, format, max_pixels);
}

std::string Float32RoundingNote(const std::string& path, SourceType source, uint64_t largest) {
  return "'" + path + "': " + SourceTypeName(source) + " values up to " + std::to_string(largest) +
         " exceed 2^24 = 16777216 and are rounded to the nearest float32 (e.g. 16777217 is stored as 16777216)";
}

void FiniteRange(const float* data, int64_t n, double* lo, double* hi) {
  double a = INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    const float x = data[i];
    if (std::isfinite(x)) {
      a = std::min(a, static_cast<double>(x));
      b = std::max(b, static_cast<double>(x));
    }
  }
  if (!(a < b)) {
    a = std::isfinite(a) ? a : 0;
    b = a + 1;
  }
  *lo = a;
  *hi = b;
}

void ToCHWFloat(const DecodedImage& image, const Normalization& norm, float* dst) {
  switch (image.pixels.depth()) {
    case CV_8U: Deinterleave<uint8_t>(image, norm, dst); break;
    case CV_16U: Deinterleave<uint16_t>(image, norm, dst); break;
    case CV_64F: Deinterleave<double>(image, norm, dst); break;
    default: Deinterleave<float>(image, norm, dst); break;
  }
}

void ToCHW(const DecodedImage& image, const Normalization& norm, DType dtype, void* dst) {
  const int depth = image.pixels.depth();
  switch (dtype) {
    case DType::kUInt8: DeinterleaveRaw<uint8_t>(image, static_cast<uint8_t*>(dst)); return;
    case DType::kUInt16:
      if (depth == CV_8U) DeinterleaveRaw<uint8_t>(image, static_cast<uint16_t*>(dst));
      else DeinterleaveRaw<uint16_t>(image, static_cast<uint16_t*>(dst));
      return;
    case DType::kInt16:
      // int8/int16 sources reach here as CV_32F holding integers (decode
      // converts them), so the conversion back is exact.
      if (depth == CV_8U) DeinterleaveRaw<uint8_t>(image, static_cast<int16_t*>(dst));
      else DeinterleaveRaw<float>(image, static_cast<int16_t*>(dst));
      return;
    case DType::kFloat16: {
      const size_t n = image.pixels.total() * static_cast<size_t>(image.channels());
      std::vector<float> tmp(n);
      ToCHWFloat(image, norm, tmp.data());
      Float16* out = static_cast<Float16*>(dst);
      for (size_t i = 0; i < n; ++i) out[i] = ToFloat16(tmp[i]);
      return;
    }
    default: ToCHWFloat(image, norm, static_cast<float*>(dst)); return;
  }
}

}  // namespace patchstore
