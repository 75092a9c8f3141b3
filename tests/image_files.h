// Test data: JPEG (libjpeg-turbo) and PNG (libspng) files written from RGB pixels.
#pragma once

#include <spng.h>
#include <turbojpeg.h>

#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer::test_support {

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

// A width x height RGB image: a horizontal red ramp, a vertical green ramp, blue = `blue`.
inline std::vector<uint8_t> ramp_image(int width, int height, uint8_t blue = 64) {
  std::vector<uint8_t> rgb(static_cast<size_t>(width * height * 3));
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      uint8_t* p = &rgb[static_cast<size_t>((y * width + x) * 3)];
      p[0] = static_cast<uint8_t>(255 * x / (width > 1 ? width - 1 : 1));
      p[1] = static_cast<uint8_t>(255 * y / (height > 1 ? height - 1 : 1));
      p[2] = blue;
    }
  }
  return rgb;
}

inline std::vector<uint8_t> encode_jpeg(const std::vector<uint8_t>& rgb, int width, int height,
                                        int quality = 95, int subsampling = TJSAMP_444) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(tj, rgb.data(), width, /*pitch=*/0, height, TJPF_RGB, &buf, &size,
                             subsampling, quality, /*flags=*/0);
  std::vector<uint8_t> out(buf, buf + (rc == 0 ? size : 0));
  tjFree(buf);
  tjDestroy(tj);
  if (rc != 0) throw std::runtime_error("tjCompress2 failed");
  return out;
}

inline std::vector<uint8_t> encode_png(const std::vector<uint8_t>& rgb, int width, int height) {
  spng_ctx* ctx = spng_ctx_new(SPNG_CTX_ENCODER);
  spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = static_cast<uint32_t>(width);
  ihdr.height = static_cast<uint32_t>(height);
  ihdr.bit_depth = 8;
  ihdr.color_type = SPNG_COLOR_TYPE_TRUECOLOR;
  spng_set_ihdr(ctx, &ihdr);
  int rc = spng_encode_image(ctx, rgb.data(), rgb.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
  size_t size = 0;
  int err = 0;
  void* buf = rc == 0 ? spng_get_png_buffer(ctx, &size, &err) : nullptr;
  std::vector<uint8_t> out;
  if (buf) out.assign(static_cast<uint8_t*>(buf), static_cast<uint8_t*>(buf) + size);
  std::free(buf);
  spng_ctx_free(ctx);
  if (out.empty()) throw std::runtime_error("spng encode failed");
  return out;
}

}  // namespace trainer::test_support
