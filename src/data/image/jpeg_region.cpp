#include "data/image/jpeg_region.h"

// clang-format off: jpeglib.h needs stdio's declarations first.
#include <jpeglib.h>
#include <cstdio>
// clang-format on

#include <csetjmp>
#include <cstring>

namespace trainer::data {
namespace {

// libjpeg's errors long-jump back to decode_jpeg_rows; its warnings are kept, and a premature
// end of the data counts as an error (its missing rows would come out grey).
struct ErrorManager {
  jpeg_error_mgr base;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool truncated;
};

[[noreturn]] void on_error(j_common_ptr info) {
  auto* e = reinterpret_cast<ErrorManager*>(info->err);
  (*info->err->format_message)(info, e->message);
  std::longjmp(e->jump, 1);
}

void on_message(j_common_ptr info, int level) {
  if (level >= 0) return;  // trace messages
  auto* e = reinterpret_cast<ErrorManager*>(info->err);
  char text[JMSG_LENGTH_MAX];
  (*info->err->format_message)(info, text);
  if (std::strstr(text, "remature end") != nullptr) {
    e->truncated = true;
    std::strcpy(e->message, text);
  }
}

// The decoding itself: no C++ object lives in this frame, so that a long jump leaves nothing
// undestroyed.
bool decode_rows(jpeg_decompress_struct& info, ErrorManager& err, const uint8_t* data, size_t size,
                 int num, int denom, bool cmyk, JDIMENSION& x, JDIMENSION y, JDIMENSION& width,
                 JDIMENSION height, std::vector<uint8_t>& pixels) {
  if (setjmp(err.jump)) return false;
  jpeg_mem_src(&info, data, static_cast<unsigned long>(size));
  jpeg_read_header(&info, TRUE);
  info.scale_num = static_cast<unsigned>(num);
  info.scale_denom = static_cast<unsigned>(denom);
  info.dct_method = JDCT_IFAST;
  info.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  jpeg_start_decompress(&info);
  jpeg_crop_scanline(&info, &x, &width);
  if (y > 0) jpeg_skip_scanlines(&info, y);
  const size_t stride = static_cast<size_t>(width) * static_cast<size_t>(info.output_components);
  pixels.resize(stride * height);
  while (info.output_scanline < y + height) {
    JSAMPROW row = pixels.data() + (info.output_scanline - y) * stride;
    if (jpeg_read_scanlines(&info, &row, 1) != 1) break;
  }
  jpeg_abort_decompress(&info);
  return !err.truncated;
}

}  // namespace

std::string decode_jpeg_rows(const uint8_t* data, size_t size, int num, int denom, bool cmyk,
                             int64_t& x, int64_t y, int64_t& width, int64_t height,
                             std::vector<uint8_t>& pixels) {
  jpeg_decompress_struct info;
  ErrorManager err;
  info.err = jpeg_std_error(&err.base);
  err.base.error_exit = on_error;
  err.base.emit_message = on_message;
  err.message[0] = '\0';
  err.truncated = false;
  jpeg_create_decompress(&info);
  auto cx = static_cast<JDIMENSION>(x), cw = static_cast<JDIMENSION>(width);
  const bool ok =
      decode_rows(info, err, data, size, num, denom, cmyk, cx, static_cast<JDIMENSION>(y), cw,
                  static_cast<JDIMENSION>(height), pixels);
  jpeg_destroy_decompress(&info);
  x = cx;
  width = cw;
  return ok ? "" : (err.message[0] != '\0' ? err.message : "undecodable data");
}

}  // namespace trainer::data
