// ingest/decode_jpeg.cc — what OpenCV's JPEG decoding would not say: the
// colour space the file declares, read by libjpeg (the header only).
#include "ingest/decode.h"

// jpeglib.h uses size_t and FILE without including their headers.
#include <csetjmp>
#include <cstddef>
#include <cstdio>

#include <jpeglib.h>

namespace patchstore {
namespace {

struct JpegErrors {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void OnJpegError(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

void IgnoreJpegMessage(j_common_ptr /*cinfo*/) {}

// The colour space of the JPEG in `bytes` (JCS_UNKNOWN when libjpeg cannot
// read its header: decoding then fails with OpenCV's error). Only POD objects
// live in this frame, so the longjmp of an error skips no destructor.
J_COLOR_SPACE HeaderColorSpace(const std::vector<uint8_t>& bytes) {
  jpeg_decompress_struct cinfo;
  JpegErrors errors;
  cinfo.err = jpeg_std_error(&errors.mgr);
  errors.mgr.error_exit = OnJpegError;
  errors.mgr.output_message = IgnoreJpegMessage;
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return JCS_UNKNOWN;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  const J_COLOR_SPACE space = cinfo.jpeg_color_space;
  jpeg_destroy_decompress(&cinfo);
  return space;
}

}  // namespace

Status CheckJpegColorSpace(const std::string& path, const std::vector<uint8_t>& bytes) {
  const J_COLOR_SPACE space = HeaderColorSpace(bytes);
  if (space == JCS_CMYK || space == JCS_YCCK)
    return Status::InvalidArgument(
        "decoding '" + path + "': a " + (space == JCS_CMYK ? "CMYK" : "YCCK (CMYK)") +
        " JPEG holds ink separations, which have no exact RGB (OpenCV would convert them with a rule of its own); "
        "convert the file to RGB with the conversion you want (e.g. an ICC profile) and ingest that");
  return Status::OK();
}

}  // namespace patchstore
