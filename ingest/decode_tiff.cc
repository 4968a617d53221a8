// TIFF decoding through libtiff (ingest-private; declared in decode.h).
//
// Samples are read as stored: strips or tiles, planar contiguous or
// separate, every compression and predictor libtiff decodes, any number of
// extra samples. What has no exact representation in a record is refused
// with the tag and value that make it so (CMYK, YCbCr, Lab, MinIsWhite,
// bit depths other than 8/16/32 (64 for floats), complex samples, several
// pages). A palette image is expanded through its colour map, exactly, to
// 16-bit R,G,B (the map's own type).
#include <tiffio.h>

#include <opencv2/core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ingest/decode.h"

namespace patchstore {
namespace {

struct MemFile {
  const std::vector<uint8_t>* data;
  uint64_t pos = 0;
};

tmsize_t ReadProc(thandle_t h, void* buf, tmsize_t n) {
  auto* f = static_cast<MemFile*>(h);
  if (n <= 0 || f->pos >= f->data->size()) return 0;
  const uint64_t k = std::min<uint64_t>(static_cast<uint64_t>(n), f->data->size() - f->pos);
  std::memcpy(buf, f->data->data() + f->pos, k);
  f->pos += k;
  return static_cast<tmsize_t>(k);
}
tmsize_t WriteProc(thandle_t, void*, tmsize_t) { return 0; }
toff_t SeekProc(thandle_t h, toff_t off, int whence) {
  auto* f = static_cast<MemFile*>(h);
  uint64_t base = whence == SEEK_CUR ? f->pos : whence == SEEK_END ? f->data->size() : 0;
  const uint64_t target = base + off;
  if (target < base && whence != SEEK_SET) return static_cast<toff_t>(-1);
  f->pos = target;
  return target;
}
int CloseProc(thandle_t) { return 0; }
toff_t SizeProc(thandle_t h) { return static_cast<MemFile*>(h)->data->size(); }
int MapProc(thandle_t, void**, toff_t*) { return 0; }
void UnmapProc(thandle_t, void*, toff_t) {}

struct Messages {
  std::string first_error;
};
int OnError(TIFF*, void* ud, const char* module, const char* fmt, va_list ap) {
  auto* m = static_cast<Messages*>(ud);
  if (m->first_error.empty()) {
    char buf[512];
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    m->first_error = (module && *module ? std::string(module) + ": " : std::string()) + buf;
  }
  return 1;  // handled: libtiff prints nothing
}
int OnWarning(TIFF*, void*, const char*, const char*, va_list) { return 1; }

const char* PhotometricName(uint16_t p) {
  switch (p) {
    case PHOTOMETRIC_MINISWHITE: return "MinIsWhite";
    case PHOTOMETRIC_MINISBLACK: return "MinIsBlack";
    case PHOTOMETRIC_RGB: return "RGB";
    case PHOTOMETRIC_PALETTE: return "Palette";
    case PHOTOMETRIC_MASK: return "TransparencyMask";
    case PHOTOMETRIC_SEPARATED: return "Separated (CMYK)";
    case PHOTOMETRIC_YCBCR: return "YCbCr";
    case PHOTOMETRIC_CIELAB: return "CIELab";
    case PHOTOMETRIC_ICCLAB: return "ICCLab";
    case PHOTOMETRIC_ITULAB: return "ITULab";
    case PHOTOMETRIC_CFA: return "CFA";
    case PHOTOMETRIC_LOGL: return "LogL";
    case PHOTOMETRIC_LOGLUV: return "LogLuv";
    default: return "unknown";
  }
}

// IEEE binary16 -> float32 (exact).
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: man * 2^-24
      const float v = std::ldexp(static_cast<float>(man), -24);
      std::memcpy(&bits, &v, 4);
      bits |= sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <typename T>
void ToFloatMat(const uint8_t* raw, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, raw + i * sizeof(T), sizeof(T));
    out[i] = static_cast<float>(v);
  }
}

// The largest |value| among n 32-bit integers (for the float32 rounding note).
template <typename T>
uint64_t MaxMagnitude(const uint8_t* raw, size_t n) {
  uint64_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, raw + i * sizeof(T), sizeof(T));
    const int64_t w = static_cast<int64_t>(v);
    m = std::max<uint64_t>(m, static_cast<uint64_t>(w < 0 ? -w : w));
  }
  return m;
}

}  // namespace

Result<DecodedImage> DecodeTiff(const std::string& path, const std::vector<uint8_t>& bytes, uint64_t max_pixels) {
  const std::string what = "decoding '" + path + "' as TIFF";
  MemFile mem{&bytes, 0};
  Messages messages;
  std::unique_ptr<TIFFOpenOptions, void (*)(TIFFOpenOptions*)> opts(TIFFOpenOptionsAlloc(), TIFFOpenOptionsFree);
  if (!opts) return Status::Internal(what + ": out of memory");
  TIFFOpenOptionsSetErrorHandlerExtR(opts.get(), OnError, &messages);
  TIFFOpenOptionsSetWarningHandlerExtR(opts.get(), OnWarning, nullptr);
  // No single allocation of libtiff may exceed what the image itself may take.
  TIFFOpenOptionsSetMaxSingleMemAlloc(opts.get(), static_cast<tmsize_t>(
                                                      std::min<uint64_t>(max_pixels * 8 + (1 << 20), 1ull << 40)));
  std::unique_ptr<TIFF, void (*)(TIFF*)> tif(TIFFClientOpenExt(path.c_str(), "rm", &mem, ReadProc, WriteProc, SeekProc,
                                                               CloseProc, SizeProc, MapProc, UnmapProc, opts.get()),
                                             TIFFClose);
  auto fail = [&](const std::string& why) {
    return Status::Corruption(what + ": " + why +
                              (messages.first_error.empty() ? "" : " (libtiff: " + messages.first_error + ")"));
  };
  if (!tif) return fail("not a readable TIFF (corrupt or truncated header)");
  auto refuse = [&](const std::string& tag, const std::string& value, const std::string& why) {
    return Status::Unsupported(what + ": " + tag + " = " + value + ": " + why);
  };

  // One image per file: further pages (not reduced-resolution copies) are
  // refused rather than silently dropped.
  const tdir_t dirs = TIFFNumberOfDirectories(tif.get());
  if (dirs > 1) {
    uint32_t pages = 1;
    for (tdir_t d = 1; d < dirs; ++d) {
      if (!TIFFSetDirectory(tif.get(), d)) break;
      uint32_t subfile = 0;
      TIFFGetFieldDefaulted(tif.get(), TIFFTAG_SUBFILETYPE, &subfile);
      if (!(subfile & FILETYPE_REDUCEDIMAGE) && ++pages > 1) break;  // one more is enough to refuse
    }
    if (pages > 1)
      return Status::Unsupported(what + ": the file holds more than one image (" + std::to_string(dirs) +
                                 " directories); only single-image TIFFs are read (split the pages into files)");
    if (!TIFFSetDirectory(tif.get(), 0)) return fail("cannot re-read the first directory");
  }

  uint32_t width = 0, height = 0, depth = 1;
  uint16_t spp = 1, bps = 1, format = SAMPLEFORMAT_UINT, photometric = 0, planar = PLANARCONFIG_CONTIG;
  if (!TIFFGetField(tif.get(), TIFFTAG_IMAGEWIDTH, &width) || !TIFFGetField(tif.get(), TIFFTAG_IMAGELENGTH, &height))
    return fail("no ImageWidth/ImageLength");
  if (width == 0 || height == 0)
    return fail("empty image (" + std::to_string(width) + "x" + std::to_string(height) + ")");
  TIFFGetFieldDefaulted(tif.get(), TIFFTAG_SAMPLESPERPIXEL, &spp);
  TIFFGetFieldDefaulted(tif.get(), TIFFTAG_BITSPERSAMPLE, &bps);
  TIFFGetFieldDefaulted(tif.get(), TIFFTAG_SAMPLEFORMAT, &format);
  TIFFGetFieldDefaulted(tif.get(), TIFFTAG_PLANARCONFIG, &planar);
  TIFFGetFieldDefaulted(tif.get(), TIFFTAG_IMAGEDEPTH, &depth);
  if (!TIFFGetField(tif.get(), TIFFTAG_PHOTOMETRIC, &photometric))
    return Status::Unsupported(what +
                               ": no PhotometricInterpretation (tag 262): the meaning of the samples is unknown");
  if (depth > 1) return refuse("ImageDepth (tag 32997)", std::to_string(depth), "volumetric TIFFs are not read");
  if (spp == 0) return fail("SamplesPerPixel (tag 277) is 0");
  if (planar != PLANARCONFIG_CONTIG && planar != PLANARCONFIG_SEPARATE)
    return refuse("PlanarConfiguration (tag 284)", std::to_string(planar), "not 1 (contiguous) or 2 (separate)");

  // Sample type: what the record's source type and the decoded matrix are.
  SourceType source = SourceType::kUnknown;
  if (format == SAMPLEFORMAT_UINT || format == SAMPLEFORMAT_VOID) {
    source = bps == 8    ? SourceType::kUInt8
             : bps == 16 ? SourceType::kUInt16
             : bps == 32 ? SourceType::kUInt32
                         : SourceType::kUnknown;
  } else if (format == SAMPLEFORMAT_INT) {
    source = bps == 8    ? SourceType::kInt8
             : bps == 16 ? SourceType::kInt16
             : bps == 32 ? SourceType::kInt32
                         : SourceType::kUnknown;
  } else if (format == SAMPLEFORMAT_IEEEFP) {
    source = bps == 16   ? SourceType::kFloat16
             : bps == 32 ? SourceType::kFloat32
             : bps == 64 ? SourceType::kFloat64
                         : SourceType::kUnknown;
  } else {
    return refuse("SampleFormat (tag 339)", std::to_string(format),
                  "only unsigned (1), signed (2) integer and IEEE float (3) samples are read (complex ones are not)");
  }
  if (source == SourceType::kUnknown)
    return refuse("BitsPerSample (tag 258)", std::to_string(bps),
                  std::string("with SampleFormat ") + std::to_string(format) +
                      ": only 8, 16 and 32-bit integer and 16, 32 and 64-bit float samples are held exactly");

  // Colour channels, then extra samples.
  std::vector<std::string> names;
  bool palette = false;
  switch (photometric) {
    case PHOTOMETRIC_MINISBLACK: names = {"Y"}; break;
    case PHOTOMETRIC_RGB: names = {"R", "G", "B"}; break;
    case PHOTOMETRIC_PALETTE:
      palette = true;
      names = {"R", "G", "B"};
      break;
    case PHOTOMETRIC_MINISWHITE:
      return refuse("PhotometricInterpretation (tag 262)", "0 (MinIsWhite)",
                    "the samples are inverted intensities (0 is white); convert the file to MinIsBlack");
    case PHOTOMETRIC_SEPARATED:
      return refuse("PhotometricInterpretation (tag 262)", "5 (Separated, e.g. CMYK)",
                    "ink separations have no exact RGB; convert the file to RGB with the colour profile it needs");
    case PHOTOMETRIC_YCBCR:
      return refuse("PhotometricInterpretation (tag 262)", "6 (YCbCr)",
                    "the conversion to RGB rounds (and chroma may be subsampled); convert the file to RGB");
    default:
      return refuse("PhotometricInterpretation (tag 262)",
                    std::to_string(photometric) + " (" + PhotometricName(photometric) + ")",
                    "only MinIsBlack (1), RGB (2) and Palette (3) images are read");
  }
  const size_t colour = palette ? 1 : names.size();
  if (spp < colour)
    return refuse("SamplesPerPixel (tag 277)", std::to_string(spp),
                  std::string("fewer samples than a ") + PhotometricName(photometric) + " pixel has (" +
                      std::to_string(colour) + ")");
  uint16_t nextra = 0;
  uint16_t* extra_types = nullptr;
  TIFFGetField(tif.get(), TIFFTAG_EXTRASAMPLES, &nextra, &extra_types);
  for (size_t s = colour; s < spp; ++s) {
    const size_t k = s - colour;
    const uint16_t type = k < nextra && extra_types ? extra_types[k] : EXTRASAMPLE_UNSPECIFIED;
    const bool alpha = type == EXTRASAMPLE_ASSOCALPHA || type == EXTRASAMPLE_UNASSALPHA;
    const bool have_a = std::find(names.begin(), names.end(), "A") != names.end();
    names.push_back(alpha && !have_a ? "A" : "S" + std::to_string(s));
  }
  if (palette) {
    if (spp != 1)
      return refuse("SamplesPerPixel (tag 277)", std::to_string(spp), "a palette image with extra samples is not read");
    if (format != SAMPLEFORMAT_UINT || (bps != 8 && bps != 16))
      return refuse("BitsPerSample (tag 258)", std::to_string(bps), "palette indices are read at 8 or 16 bits only");
  }

  const uint64_t out_channels = palette ? 3 : spp;
  const uint64_t total = uint64_t{width} * height * out_channels;
  if (uint64_t{width} * height > max_pixels || total > max_pixels || width > (1u << 30) || height > (1u << 30))
    return Status::InvalidArgument(what + ": declared size " + std::to_string(width) + "x" + std::to_string(height) +
                                   "x" + std::to_string(out_channels) + " exceeds the limit of " +
                                   std::to_string(max_pixels) + " values");

  // The samples as stored, interleaved (H, W, spp), in native byte order
  // (libtiff swaps them).
  const size_t es = bps / 8;
  const size_t W = width, H = height, S = spp;
  std::vector<uint8_t> raw(W * H * S * es);
  const bool separate = planar == PLANARCONFIG_SEPARATE && S > 1;
  const size_t planes = separate ? S : 1;
  const size_t chunk_spp = separate ? 1 : S;  // samples per pixel in one strip/tile
  // Copies `rows` x `cols` pixels of one chunk (row stride `src_stride`
  // bytes) of `plane` to (y0, x0).
  auto place = [&](const uint8_t* src, size_t src_stride, size_t y0, size_t x0, size_t rows, size_t cols,
                   size_t plane) {
    for (size_t r = 0; r < rows; ++r) {
      const uint8_t* s = src + r * src_stride;
      uint8_t* d = raw.data() + ((y0 + r) * W + x0) * S * es;
      if (!separate) {
        std::memcpy(d, s, cols * S * es);
      } else {
        for (size_t x = 0; x < cols; ++x) std::memcpy(d + (x * S + plane) * es, s + x * es, es);
      }
    }
  };
  if (TIFFIsTiled(tif.get())) {
    uint32_t tw = 0, th = 0;
    if (!TIFFGetField(tif.get(), TIFFTAG_TILEWIDTH, &tw) || !TIFFGetField(tif.get(), TIFFTAG_TILELENGTH, &th) ||
        tw == 0 || th == 0)
      return fail("tiled without a valid TileWidth/TileLength");
    const tmsize_t tile_bytes = TIFFTileSize(tif.get());
    const uint64_t need = uint64_t{tw} * th * chunk_spp * es;
    if (tile_bytes <= 0 || static_cast<uint64_t>(tile_bytes) < need) return fail("bad tile size");
    std::vector<uint8_t> buf(static_cast<size_t>(tile_bytes));
    for (size_t p = 0; p < planes; ++p)
      for (uint32_t y = 0; y < height; y += th)
        for (uint32_t x = 0; x < width; x += tw) {
          const uint32_t t = TIFFComputeTile(tif.get(), x, y, 0, static_cast<uint16_t>(p));
          const tmsize_t got = TIFFReadEncodedTile(tif.get(), t, buf.data(), tile_bytes);
          if (got < 0 || static_cast<uint64_t>(got) < need)
            return fail("tile " + std::to_string(t) + " is corrupt or truncated");
          place(buf.data(), size_t{tw} * chunk_spp * es, y, x, std::min<size_t>(th, H - y), std::min<size_t>(tw, W - x),
                p);
        }
  } else {
    uint32_t rps = 0;
    TIFFGetFieldDefaulted(tif.get(), TIFFTAG_ROWSPERSTRIP, &rps);
    if (rps == 0 || rps > height) rps = height;
    const size_t strips_per_plane = (H + rps - 1) / rps;
    if (TIFFNumberOfStrips(tif.get()) < strips_per_plane * planes) return fail("fewer strips than the image needs");
    const tmsize_t strip_bytes = TIFFStripSize(tif.get());
    const size_t row_bytes = W * chunk_spp * es;
    if (strip_bytes <= 0 || static_cast<uint64_t>(strip_bytes) < uint64_t{rps} * row_bytes)
      return fail("bad strip size");
    std::vector<uint8_t> buf(static_cast<size_t>(strip_bytes));
    for (size_t p = 0; p < planes; ++p)
      for (size_t s = 0; s < strips_per_plane; ++s) {
        const size_t y0 = s * rps, rows = std::min<size_t>(rps, H - y0);
        const uint32_t strip = static_cast<uint32_t>(p * strips_per_plane + s);
        const tmsize_t got = TIFFReadEncodedStrip(tif.get(), strip, buf.data(), strip_bytes);
        if (got < 0 || static_cast<uint64_t>(got) < rows * row_bytes)
          return fail("strip " + std::to_string(strip) + " is corrupt or truncated");
        place(buf.data(), row_bytes, y0, 0, rows, W, p);
      }
  }

  DecodedImage img;
  img.format = "tiff";
  img.source_type = source;
  const size_t n = W * H * S;
  const int h = static_cast<int>(H), w = static_cast<int>(W);
  if (palette) {
    uint16_t *red = nullptr, *green = nullptr, *blue = nullptr;
    if (!TIFFGetField(tif.get(), TIFFTAG_COLORMAP, &red, &green, &blue) || !red || !green || !blue)
      return fail("a palette image without a ColorMap (tag 320)");
    const size_t entries = size_t{1} << bps;
    img.pixels.create(h, w, CV_16UC3);
    uint16_t* out = img.pixels.ptr<uint16_t>(0);
    for (size_t i = 0; i < n; ++i) {
      size_t idx = raw[i * es];
      if (es == 2) {
        uint16_t v;
        std::memcpy(&v, raw.data() + i * 2, 2);
        idx = v;
      }
      if (idx >= entries) return fail("palette index out of range");
      out[i * 3] = red[idx];
      out[i * 3 + 1] = green[idx];
      out[i * 3 + 2] = blue[idx];
    }
    img.source_type = SourceType::kUInt16;
  } else if (source == SourceType::kUInt8 || source == SourceType::kUInt16) {
    img.pixels.create(h, w, CV_MAKETYPE(source == SourceType::kUInt8 ? CV_8U : CV_16U, static_cast<int>(S)));
    std::memcpy(img.pixels.data, raw.data(), raw.size());
  } else if (source == SourceType::kFloat64) {
    // Kept as float64 until the normalisation (which runs in float64 for
    // range:) and ValueCheck (values beyond float32) have seen it.
    img.pixels.create(h, w, CV_64FC(static_cast<int>(S)));
    std::memcpy(img.pixels.data, raw.data(), raw.size());
  } else {
    img.pixels.create(h, w, CV_32FC(static_cast<int>(S)));
    float* out = img.pixels.ptr<float>(0);
    uint64_t big = 0;
    switch (source) {
      case SourceType::kInt8: ToFloatMat<int8_t>(raw.data(), n, out); break;
      case SourceType::kInt16: ToFloatMat<int16_t>(raw.data(), n, out); break;
      case SourceType::kInt32:
        ToFloatMat<int32_t>(raw.data(), n, out);
        big = MaxMagnitude<int32_t>(raw.data(), n);
        break;
      case SourceType::kUInt32:
        ToFloatMat<uint32_t>(raw.data(), n, out);
        big = MaxMagnitude<uint32_t>(raw.data(), n);
        break;
      case SourceType::kFloat16:
        for (size_t i = 0; i < n; ++i) {
          uint16_t v;
          std::memcpy(&v, raw.data() + i * 2, 2);
          out[i] = HalfToFloat(v);
        }
        break;
      case SourceType::kFloat32: std::memcpy(out, raw.data(), raw.size()); break;
      default: return fail("internal: unexpected sample type");
    }
    if (big > (uint64_t{1} << 24)) img.warnings.push_back(Float32RoundingNote(path, source, big));
  }
  for (size_t c = 0; c < names.size() && !palette; ++c) img.channel_names += (c ? "," : "") + names[c];
  if (palette) img.channel_names = "R,G,B";
  return img;
}

}  // namespace patchstore
