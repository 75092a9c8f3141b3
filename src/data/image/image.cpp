#include "data/image/image.h"

#include <spng.h>
#include <torch/torch.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>

#include "data/dataset.h"
#include "data/image/jpeg_region.h"

namespace trainer::data {
namespace {

// The longest side decoded: a header with a longer one (within data.max_image_pixels) is refused
// with its own message.
constexpr int64_t kMaxSide = 1 << 15;

bool is_jpeg(const std::vector<uint8_t>& b) {
  return b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF;
}

bool is_png(const std::vector<uint8_t>& b) {
  static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  return b.size() >= 8 && std::memcmp(b.data(), sig, 8) == 0;
}

[[noreturn]] void not_an_image(const std::string& path) {
  throw DataError(path + ": not a JPEG or PNG image");
}

// One decompressor per thread: libjpeg-turbo handles are not thread-safe, and making one per
// image costs an allocation of some kilobytes. A handle that has failed is never used again:
// libjpeg-turbo 2.1 leaves it in a state that misreads the next image (a header cut before its
// SOS marker makes the next valid one read as 0x0), so jpeg_failed() drops it and the next call
// makes a fresh one.
using TjHandle = std::unique_ptr<void, int (*)(tjhandle)>;

TjHandle& thread_decoder() {
  thread_local TjHandle handle(nullptr, &tjDestroy);
  return handle;
}

tjhandle jpeg_decoder() {
  TjHandle& handle = thread_decoder();
  if (!handle) handle.reset(tjInitDecompress());
  if (!handle) throw DataError(std::string("libjpeg-turbo: ") + tjGetErrorStr2(nullptr));
  return handle.get();
}

// Drops this thread's decompressor (see jpeg_decoder) and throws DataError(message).
[[noreturn]] void jpeg_failed(const std::string& message) {
  thread_decoder().reset();
  throw DataError(message);
}

// A header's size: more pixels than `max_pixels` is refused as Pillow's DecompressionBombError
// refuses it, then a side longer than kMaxSide, then an empty image.
void check_size(const std::string& path, const char* format, int64_t width, int64_t height,
                int64_t max_pixels) {
  const std::string size = std::to_string(width) + "x" + std::to_string(height);
  if (width * height > max_pixels) {
    throw DataError(path + ": " + size + " = " + std::to_string(width * height) +
                    " pixels is more than data.max_image_pixels (" + std::to_string(max_pixels) +
                    "): a decompression bomb or a corrupt header; raise data.max_image_pixels if "
                    "the image is genuine");
  }
  if (width > kMaxSide || height > kMaxSide) {
    throw DataError(path + ": " + size + ": a side longer than " + std::to_string(kMaxSide) +
                    " pixels, the most the image decoder takes; resize the image");
  }
  if (width <= 0 || height <= 0) {
    throw DataError(path + ": corrupt " + format + ": size " + size + " in the header");
  }
}

struct JpegHeader {
  int width = 0, height = 0, colorspace = 0;
};

JpegHeader jpeg_header(const std::vector<uint8_t>& bytes, const std::string& path,
                       int64_t max_pixels) {
  JpegHeader h;
  int subsamp = 0;
  tjhandle tj = jpeg_decoder();
  if (tjDecompressHeader3(tj, bytes.data(), static_cast<unsigned long>(bytes.size()), &h.width,
                          &h.height, &subsamp, &h.colorspace) != 0) {
    jpeg_failed(path + ": corrupt JPEG header: " + tjGetErrorStr2(tj));
  }
  try {
    check_size(path, "JPEG", h.width, h.height, max_pixels);
  } catch (const DataError& e) {
    jpeg_failed(e.what());
  }
  return h;
}

// The smallest DCT scale keeping `region` at least min_side on both sides.
tjscalingfactor pick_scale(const Rect& region, int64_t min_side) {
  int count = 0;
  const tjscalingfactor* factors = tjGetScalingFactors(&count);
  tjscalingfactor best{1, 1};
  double best_value = 1.0;
  for (int i = 0; i < count; ++i) {
    const double f = static_cast<double>(factors[i].num) / factors[i].denom;
    if (f > 1.0 || f >= best_value) continue;
    if (std::floor(static_cast<double>(region.width) * f) >= static_cast<double>(min_side) &&
        std::floor(static_cast<double>(region.height) * f) >= static_cast<double>(min_side)) {
      best = factors[i];
      best_value = f;
    }
  }
  return best;
}

// `pixels` ([height, width, 3], or 4 for `cmyk`) as an RGB image.
Image rgb_image(std::vector<uint8_t> pixels, int64_t width, int64_t height, bool cmyk) {
  Image img;
  img.width = width;
  img.height = height;
  if (!cmyk) {
    img.rgb = std::move(pixels);
    return img;
  }
  // Adobe's inverted CMYK, as JPEG files store it: channel = C * K / 255.
  img.rgb.resize(static_cast<size_t>(width * height * 3));
  for (size_t i = 0, n = static_cast<size_t>(width * height); i < n; ++i) {
    const unsigned k = pixels[4 * i + 3];
    for (size_t c = 0; c < 3; ++c)
      img.rgb[3 * i + c] = static_cast<uint8_t>(pixels[4 * i + c] * k / 255);
  }
  return img;
}

// The training path: only `region`'s rows and columns (whole iMCUs), at the smallest DCT scale
// keeping it at least `min_side` on both sides, with the fast DCT; `region` becomes its place in
// the returned image.
Image decode_jpeg_region(const std::vector<uint8_t>& bytes, const std::string& path,
                         const JpegHeader& h, Rect& region, int64_t min_side) {
  const tjscalingfactor sf = pick_scale(region, min_side);
  const bool cmyk = h.colorspace == TJCS_CMYK || h.colorspace == TJCS_YCCK;
  const double f = static_cast<double>(sf.num) / sf.denom;
  const int64_t width = TJSCALED(h.width, sf), height = TJSCALED(h.height, sf);
  Rect r;  // the region in scaled pixels, kept inside the image
  r.x = std::min<int64_t>(static_cast<int64_t>(std::floor(region.x * f)), width - 1);
  r.y = std::min<int64_t>(static_cast<int64_t>(std::floor(region.y * f)), height - 1);
  r.width = std::clamp<int64_t>(std::llround(region.width * f), 1, width - r.x);
  r.height = std::clamp<int64_t>(std::llround(region.height * f), 1, height - r.y);
  int64_t x = r.x, w = r.width;
  std::vector<uint8_t> pixels;
  const std::string error = decode_jpeg_rows(bytes.data(), bytes.size(), sf.num, sf.denom, cmyk, x,
                                             r.y, w, r.height, pixels);
  if (!error.empty()) throw DataError(path + ": corrupt JPEG: " + error);
  region = Rect{r.x - x, 0, r.width, r.height};
  return rgb_image(std::move(pixels), w, r.height, cmyk);
}

Image decode_jpeg(const std::vector<uint8_t>& bytes, const std::string& path, Rect& region,
                  int64_t min_side, int64_t max_pixels) {
  const JpegHeader h = jpeg_header(bytes, path, max_pixels);
  if (min_side > 0) return decode_jpeg_region(bytes, path, h, region, min_side);
  const bool cmyk = h.colorspace == TJCS_CMYK || h.colorspace == TJCS_YCCK;
  std::vector<uint8_t> pixels(static_cast<size_t>(h.width) * h.height * (cmyk ? 4 : 3));
  tjhandle tj = jpeg_decoder();
  const int rc = tjDecompress2(tj, bytes.data(), static_cast<unsigned long>(bytes.size()),
                               pixels.data(), h.width, /*pitch=*/0, h.height,
                               cmyk ? TJPF_CMYK : TJPF_RGB, TJFLAG_ACCURATEDCT);
  if (rc != 0) {
    const std::string why = tjGetErrorStr2(tj);
    // Warnings leave a usable image (e.g. extraneous bytes before a marker), except data that
    // ends before the header's size is filled ("Premature end of JPEG file", "... premature end
    // of data segment"), whose missing rows come out grey.
    const bool usable =
        tjGetErrorCode(tj) == TJERR_WARNING && why.find("remature end") == std::string::npos;
    thread_decoder().reset();  // after a warning too: no handle that has failed decodes again
    if (!usable) throw DataError(path + ": corrupt JPEG: " + why);
  }
  return rgb_image(std::move(pixels), h.width, h.height, cmyk);
}

struct SpngDeleter {
  void operator()(spng_ctx* ctx) const { spng_ctx_free(ctx); }
};
using SpngContext = std::unique_ptr<spng_ctx, SpngDeleter>;

SpngContext png_context(const std::vector<uint8_t>& bytes, const std::string& path, spng_ihdr& ihdr,
                        int64_t max_pixels) {
  SpngContext ctx(spng_ctx_new(0));
  if (!ctx) throw DataError(path + ": out of memory for the PNG decoder");
  int rc = spng_set_png_buffer(ctx.get(), bytes.data(), bytes.size());
  if (rc == 0) rc = spng_get_ihdr(ctx.get(), &ihdr);
  if (rc != 0) throw DataError(path + ": corrupt PNG: " + spng_strerror(rc));
  check_size(path, "PNG", ihdr.width, ihdr.height, max_pixels);
  return ctx;
}

Image decode_png(const std::vector<uint8_t>& bytes, const std::string& path, int64_t max_pixels) {
  spng_ihdr ihdr{};
  SpngContext ctx = png_context(bytes, path, ihdr, max_pixels);
  // RGBA8 is the output format libspng converts every PNG colour type and depth to.
  size_t size = 0;
  int rc = spng_decoded_image_size(ctx.get(), SPNG_FMT_RGBA8, &size);
  std::vector<uint8_t> rgba(size);
  if (rc == 0) rc = spng_decode_image(ctx.get(), rgba.data(), size, SPNG_FMT_RGBA8, 0);
  if (rc != 0) throw DataError(path + ": corrupt PNG: " + spng_strerror(rc));
  Image img;
  img.width = ihdr.width;
  img.height = ihdr.height;
  img.rgb.resize(static_cast<size_t>(img.width * img.height * 3));
  for (size_t i = 0, n = static_cast<size_t>(img.width * img.height); i < n; ++i) {
    std::memcpy(&img.rgb[3 * i], &rgba[4 * i], 3);
  }
  return img;
}

}  // namespace

void image_size(const std::vector<uint8_t>& bytes, const std::string& path, int64_t& width,
                int64_t& height, int64_t max_pixels) {
  if (is_jpeg(bytes)) {
    const JpegHeader h = jpeg_header(bytes, path, max_pixels);
    width = h.width;
    height = h.height;
  } else if (is_png(bytes)) {
    spng_ihdr ihdr{};
    png_context(bytes, path, ihdr, max_pixels);
    width = ihdr.width;
    height = ihdr.height;
  } else {
    not_an_image(path);
  }
}

Image decode_image(const std::vector<uint8_t>& bytes, const std::string& path, Rect& region,
                   int64_t min_side, int64_t max_pixels) {
  if (is_jpeg(bytes)) return decode_jpeg(bytes, path, region, min_side, max_pixels);
  if (is_png(bytes)) return decode_png(bytes, path, max_pixels);
  not_an_image(path);
}

Rect random_resized_crop(int64_t width, int64_t height, const std::vector<double>& scale,
                         const std::vector<double>& ratio, Rng& rng) {
  const double area = static_cast<double>(width * height);
  const double log_lo = std::log(ratio[0]), log_hi = std::log(ratio[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * rng.uniform(scale[0], scale[1]);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    const auto w = static_cast<int64_t>(std::llround(std::sqrt(target * aspect)));
    const auto h = static_cast<int64_t>(std::llround(std::sqrt(target / aspect)));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int64_t y = rng.below(height - h + 1);
      const int64_t x = rng.below(width - w + 1);
      return Rect{x, y, w, h};
    }
  }
  // Fallback: the whole image, narrowed to the ratio range.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < ratio[0]) {
    h = std::llround(static_cast<double>(w) / ratio[0]);
  } else if (in_ratio > ratio[1]) {
    w = std::llround(static_cast<double>(h) * ratio[1]);
  }
  return Rect{(width - w) / 2, (height - h) / 2, w, h};
}

namespace {

// torchvision's Resize(resize): the shorter side becomes `resize`, the longer one
// int(resize * long / short). {width, height}.
std::pair<int64_t, int64_t> resized_size(int64_t width, int64_t height, int64_t resize) {
  return width <= height ? std::make_pair(resize, resize * height / width)
                         : std::make_pair(resize * width / height, resize);
}

}  // namespace

Rect center_crop(int64_t width, int64_t height, int64_t resize, int64_t crop) {
  const auto [rw, rh] = resized_size(width, height, resize);
  // CenterCrop: offsets rounded half to even, as Python's round() in torchvision.
  Rect r;
  r.x = static_cast<int64_t>(std::nearbyint(static_cast<double>(rw - crop) / 2.0));
  r.y = static_cast<int64_t>(std::nearbyint(static_cast<double>(rh - crop) / 2.0));
  r.width = std::min(crop, rw);
  r.height = std::min(crop, rh);
  return r;
}

void resize_center_crop(const Image& image, int64_t resize, int64_t crop, torch::Tensor out) {
  const auto [rw, rh] = resized_size(image.width, image.height, resize);
  const Rect r = center_crop(image.width, image.height, resize, crop);
  auto full = torch::from_blob(const_cast<uint8_t*>(image.rgb.data()),
                               {1, image.height, image.width, 3}, torch::kUInt8)
                  .permute({0, 3, 1, 2});  // [1, 3, H, W], channels last in memory
  auto resized = (rw == image.width && rh == image.height)
                     ? full
                     : at::_upsample_bilinear2d_aa(full, {rh, rw}, /*align_corners=*/false);
  out.copy_(resized[0].slice(1, r.y, r.y + r.height).slice(2, r.x, r.x + r.width));
}

void crop_resize(const Image& image, const Rect& region, int64_t size, bool flip,
                 torch::Tensor out) {
  auto full = torch::from_blob(const_cast<uint8_t*>(image.rgb.data()),
                               {image.height, image.width, 3}, torch::kUInt8);  // [H, W, 3]
  // [1, 3, h, w] with channels last in memory, the layout of the vectorised uint8 kernels.
  auto crop = full.slice(0, region.y, region.y + region.height)
                  .slice(1, region.x, region.x + region.width)
                  .permute({2, 0, 1})
                  .unsqueeze(0)
                  .contiguous(at::MemoryFormat::ChannelsLast);
  auto resized = (region.width == size && region.height == size)
                     ? crop
                     : at::_upsample_bilinear2d_aa(crop, {size, size}, /*align_corners=*/false);
  if (flip) resized = resized.flip({3});
  out.copy_(resized[0]);
}

}  // namespace trainer::data
