// Decoding only a rectangle of a JPEG (libjpeg-turbo's jpeg_crop_scanline and
// jpeg_skip_scanlines): the training crop's rows and columns, not the whole photo. Internal to
// data/image/image.cpp. Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace trainer::data {

// A JPEG's rows [y, y + height) and columns [x, x + width) (of the image scaled by num/denom, one
// of libjpeg-turbo's scaling factors), decoded with the fast integer DCT as RGB (or, `cmyk`, as the
// file's CMYK). The columns widen to whole iMCUs: `x` and `width` come back as decoded, and
// `pixels` holds [height, width, 3 or 4]. Returns "" or why the data is corrupt (a premature end
// included).
std::string decode_jpeg_rows(const uint8_t* data, size_t size, int num, int denom, bool cmyk,
                             int64_t& x, int64_t y, int64_t& width, int64_t height,
                             std::vector<uint8_t>& pixels);

}  // namespace trainer::data
