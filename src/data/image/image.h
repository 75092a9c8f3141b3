// Image decoding (JPEG through libjpeg-turbo, PNG through libspng) and the crops of the image
// transforms: torchvision's RandomResizedCrop for training, resize + center crop for evaluation.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "util/random.h"

namespace trainer::data {

// An 8-bit RGB image, rows of width * 3 bytes.
struct Image {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> rgb;  // [height, width, 3]
};

// A rectangle in pixels.
struct Rect {
  int64_t x = 0, y = 0, width = 0, height = 0;
};

// Pillow's Image.MAX_IMAGE_PIXELS: more pixels than this in a header is taken for a
// decompression bomb (data.max_image_pixels).
constexpr int64_t kMaxImagePixels = 89478485;

// Width and height from the header; throws DataError naming `path` for anything that is not a
// readable JPEG or PNG, or whose header claims more than `max_pixels` pixels.
void image_size(const std::vector<uint8_t>& bytes, const std::string& path, int64_t& width,
                int64_t& height, int64_t max_pixels = kMaxImagePixels);

// Decodes `bytes`. With `min_side` > 0 (a training crop) a JPEG is decoded at the smallest of
// libjpeg-turbo's DCT scales (1/8 .. 1) that keeps `region` (in full-size pixels) at least
// `min_side` pixels on both sides, so large photos that end up as small crops decode several
// times faster, and only the region's rows and (whole iMCUs of) its columns are decoded, with the
// fast DCT: the image returned holds those, and `region` becomes the crop's place in it. Throws
// DataError naming `path` for corrupt or truncated data and for a header claiming more than
// `max_pixels` pixels, before allocating anything for them. `min_side` 0 decodes the whole image at
// full size with the accurate integer DCT, as PIL and torchvision do.
Image decode_image(const std::vector<uint8_t>& bytes, const std::string& path, Rect& region,
                   int64_t min_side, int64_t max_pixels = kMaxImagePixels);

// torchvision's RandomResizedCrop.get_params: up to 10 tries at a random area in
// scale[0..1] x (width * height) and a log-uniform aspect ratio in ratio[0..1], else the largest
// central crop within the ratio range.
Rect random_resized_crop(int64_t width, int64_t height, const std::vector<double>& scale,
                         const std::vector<double>& ratio, Rng& rng);

// torchvision's CenterCrop(crop) after Resize(resize), in the resized image's pixels: the
// shorter side scaled to `resize` (the longer to int(resize * long / short)), then the central
// crop x crop, its offsets rounded half to even.
Rect center_crop(int64_t width, int64_t height, int64_t resize, int64_t crop);

// torchvision's Resize(resize) (antialiased bilinear) then CenterCrop(crop), on the whole image,
// written to `out` ([3, crop, crop] uint8, any strides); resize >= crop.
void resize_center_crop(const Image& image, int64_t resize, int64_t crop, torch::Tensor out);

// `region` of `image`, resized to size x size with antialiased bilinear filtering (as
// torchvision's tensor and PIL resizes), optionally mirrored, written to `out` ([3, size, size]
// uint8, any strides).
void crop_resize(const Image& image, const Rect& region, int64_t size, bool flip,
                 torch::Tensor out);

}  // namespace trainer::data
