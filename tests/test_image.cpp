// Image decoding and transforms (data/image/image.h) and the imagefolder dataset.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "config/config.h"
#include "data/dataset.h"
#include "data/image/image.h"
#include "image_files.h"
#include "temp_dir.h"

namespace trainer::data {
namespace {

namespace fs = std::filesystem;
using test_support::encode_jpeg;
using test_support::encode_png;
using test_support::ramp_image;
using test_support::write_file;

// Mean absolute difference of two RGB buffers of the same size.
double mean_abs_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += std::abs(int(a[i]) - int(b[i]));
  return sum / static_cast<double>(a.size());
}

std::string error_of(const std::vector<uint8_t>& bytes) {
  Rect region{0, 0, 1, 1};
  try {
    decode_image(bytes, "img/x.jpg", region, /*min_side=*/0);
  } catch (const DataError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no DataError";
  return "";
}

TEST(ImageDecodeTest, JpegRoundTrip) {
  const auto rgb = ramp_image(64, 48);
  Rect region{0, 0, 64, 48};
  const Image img = decode_image(encode_jpeg(rgb, 64, 48), "a.jpg", region, /*min_side=*/0);
  EXPECT_EQ(img.width, 64);
  EXPECT_EQ(img.height, 48);
  ASSERT_EQ(img.rgb.size(), rgb.size());
  EXPECT_LT(mean_abs_diff(img.rgb, rgb), 3.0);
  EXPECT_EQ(region.width, 64);  // decoded at full size: region unchanged
}

TEST(ImageDecodeTest, PngRoundTripIsExact) {
  const auto rgb = ramp_image(33, 17);
  Rect region{0, 0, 33, 17};
  const Image img = decode_image(encode_png(rgb, 33, 17), "a.png", region, /*min_side=*/0);
  EXPECT_EQ(img.width, 33);
  EXPECT_EQ(img.height, 17);
  EXPECT_EQ(img.rgb, rgb);
}

// `bytes` with the size in its header replaced: a PNG's IHDR (with its CRC recomputed, so that
// only the size is wrong) or a JPEG's SOF0 segment.
std::vector<uint8_t> with_header_size(std::vector<uint8_t> bytes, uint32_t width, uint32_t height) {
  auto put32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes[at + i] = static_cast<uint8_t>(v >> (24 - 8 * i));
  };
  if (bytes[0] == 0x89) {  // PNG: length(4) "IHDR" width(4) height(4) ... crc over type + data
    put32(16, width);
    put32(20, height);
    uint32_t crc = 0xFFFFFFFFu;  // CRC-32 as PNG computes it
    for (size_t i = 12; i < 29; ++i) {
      crc ^= bytes[i];
      for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    put32(29, crc ^ 0xFFFFFFFFu);
    return bytes;
  }
  for (size_t i = 2; i + 9 < bytes.size(); ++i) {  // FF C0: length(2) precision(1) h(2) w(2)
    if (bytes[i] == 0xFF && bytes[i + 1] == 0xC0) {
      bytes[i + 5] = static_cast<uint8_t>(height >> 8);
      bytes[i + 6] = static_cast<uint8_t>(height);
      bytes[i + 7] = static_cast<uint8_t>(width >> 8);
      bytes[i + 8] = static_cast<uint8_t>(width);
      return bytes;
    }
  }
  ADD_FAILURE() << "no SOF0 segment";
  return bytes;
}

// Headers that claim more pixels than the limit (Pillow's, by default) are rejected before any
// allocation; so is a JPEG whose data is far shorter than its header claims.
TEST(ImageDecodeTest, DecompressionBombsAndShortDataAreRejected) {
  const auto png = with_header_size(encode_png(ramp_image(16, 16), 16, 16), 30000, 30000);
  const auto jpeg = with_header_size(encode_jpeg(ramp_image(16, 16), 16, 16), 20000, 20000);
  for (const auto* bytes : {&png, &jpeg}) {
    const std::string e = error_of(*bytes);
    EXPECT_NE(e.find("is more than data.max_image_pixels (89478485)"), std::string::npos) << e;
    int64_t w = 0, h = 0;
    EXPECT_THROW(image_size(*bytes, "x", w, h), DataError);
  }
  // Below the limit the size is believed, but the missing data is an error, not grey pixels.
  const auto short_jpeg = with_header_size(encode_jpeg(ramp_image(16, 16), 16, 16), 4000, 4000);
  Rect region{0, 0, 4000, 4000};
  EXPECT_THROW(decode_image(short_jpeg, "x.jpg", region, /*min_side=*/0), DataError);
  const auto short_png = with_header_size(encode_png(ramp_image(16, 16), 16, 16), 4000, 4000);
  EXPECT_THROW(decode_image(short_png, "x.png", region, /*min_side=*/0), DataError);
  // A limit of its own: the genuine 16 x 16 image passes 256, not 255.
  const auto small = encode_png(ramp_image(16, 16), 16, 16);
  EXPECT_NO_THROW(decode_image(small, "x.png", region, /*min_side=*/0, /*max_pixels=*/256));
  EXPECT_THROW(decode_image(small, "x.png", region, /*min_side=*/0, /*max_pixels=*/255), DataError);
}

// A header's size is checked against data.max_image_pixels first, whatever its sides: a
// 60000 x 60000 JPEG or PNG gets the limit's message. A side longer than the decoder takes within
// the limit gets a message of its own.
TEST(ImageDecodeTest, HugeHeadersGetThePixelLimitsMessage) {
  const auto png = encode_png(ramp_image(16, 16), 16, 16);
  const auto jpeg = encode_jpeg(ramp_image(16, 16), 16, 16);
  for (const auto* bytes : {&png, &jpeg}) {
    const std::string e = error_of(with_header_size(*bytes, 60000, 60000));
    EXPECT_NE(e.find("img/x.jpg: 60000x60000 = 3600000000 pixels is more than "
                     "data.max_image_pixels (89478485)"),
              std::string::npos)
        << e;
    const std::string side = error_of(with_header_size(*bytes, 40000, 16));
    EXPECT_NE(side.find("img/x.jpg: 40000x16: a side longer than 32768 pixels"), std::string::npos)
        << side;
  }
  const std::string empty = error_of(with_header_size(jpeg, 0, 16));
  EXPECT_NE(empty.find("img/x.jpg: corrupt JPEG"), std::string::npos) << empty;
}

// JPEGs damaged in several ways, each decoded before a valid one on the same thread.
std::vector<std::pair<std::string, std::vector<uint8_t>>> damaged_jpegs(
    const std::vector<uint8_t>& valid) {
  size_t sos = 0;  // the SOS marker, FF DA
  for (size_t i = 2; i + 1 < valid.size() && !sos; ++i) {
    if (valid[i] == 0xFF && valid[i + 1] == 0xDA) sos = i;
  }
  EXPECT_GT(sos, 0u);
  auto cut = [&](size_t n) { return std::vector<uint8_t>(valid.begin(), valid.begin() + n); };
  auto flipped = valid;
  for (size_t i = sos + 20; i < flipped.size() - 2; i += 7) flipped[i] ^= 0x5A;
  return {{"the header cut before SOS", cut(sos)},
          {"the header cut inside a segment", cut(20)},
          {"the scan cut short", cut(sos + (valid.size() - sos) / 2)},
          {"garbage after SOI", {0xFF, 0xD8, 0xFF, 0x12, 0x34, 0x56, 0x78, 0x9A, 0xBC}},
          {"a size of 0 in the header", with_header_size(valid, 0, 0)},
          {"a size over the pixel limit", with_header_size(valid, 60000, 60000)},
          {"bytes flipped in the scan", flipped}};
}

// What decode_image gives for `bytes` (or its error), region included.
struct Decoded {
  std::vector<uint8_t> rgb;
  Rect region;
  std::string error;
};

Decoded decode(const std::vector<uint8_t>& bytes, int64_t min_side) {
  Decoded d;
  d.region = Rect{8, 4, 40, 36};
  try {
    d.rgb = decode_image(bytes, "x.jpg", d.region, min_side).rgb;
  } catch (const DataError& e) {
    d.error = e.what();
  }
  return d;
}

// A valid JPEG decodes to the same pixels after a damaged one on the same thread as on a thread
// that has decoded nothing else: the decoder keeps no state from a failure.
TEST(ImageDecodeTest, AValidJpegDecodesExactlyAfterADamagedOne) {
  const auto valid = encode_jpeg(ramp_image(64, 48), 64, 48, 90, TJSAMP_420);
  for (const int64_t min_side : {int64_t{0}, int64_t{16}}) {  // the whole image, a training crop
    Decoded fresh;
    std::thread([&] { fresh = decode(valid, min_side); }).join();
    ASSERT_EQ(fresh.error, "");
    for (const auto& [what, damaged] : damaged_jpegs(valid)) {
      Decoded bad, after, size_error;
      int64_t width = 0, height = 0;
      std::thread([&] {
        bad = decode(damaged, min_side);
        after = decode(valid, min_side);
        try {  // the header read alone, after another failure
          image_size(damaged, "x.jpg", width, height);
        } catch (const DataError&) {
        }
        try {
          image_size(valid, "x.jpg", width, height);
        } catch (const DataError& e) {
          size_error.error = e.what();
        }
      }).join();
      if (what != "bytes flipped in the scan") EXPECT_NE(bad.error, "") << what;
      EXPECT_EQ(after.error, "") << what << ", min_side " << min_side;
      EXPECT_TRUE(after.rgb == fresh.rgb) << what << ", min_side " << min_side;
      EXPECT_EQ(after.region.x, fresh.region.x) << what;
      EXPECT_EQ(after.region.width, fresh.region.width) << what;
      EXPECT_EQ(size_error.error, "") << what;
      EXPECT_EQ(width, 64) << what;
      EXPECT_EQ(height, 48) << what;
    }
  }
}

TEST(ImageDecodeTest, ImageSizeFromHeader) {
  int64_t w = 0, h = 0;
  image_size(encode_jpeg(ramp_image(40, 30), 40, 30), "a.jpg", w, h);
  EXPECT_EQ(w, 40);
  EXPECT_EQ(h, 30);
  image_size(encode_png(ramp_image(7, 9), 7, 9), "a.png", w, h);
  EXPECT_EQ(w, 7);
  EXPECT_EQ(h, 9);
}

TEST(ImageDecodeTest, JpegDecodesAtReducedScaleForSmallTargets) {
  const auto jpeg = encode_jpeg(ramp_image(400, 300), 400, 300);
  // 300 px tall to at least 50: 1/8 gives 37 (too small), 1/4 gives 75.
  Rect region{0, 0, 400, 300};
  const Image img = decode_image(jpeg, "a.jpg", region, /*min_side=*/50);
  EXPECT_EQ(img.width, 100);
  EXPECT_EQ(img.height, 75);
  EXPECT_EQ(region.width, 100);
  EXPECT_EQ(region.height, 75);
  // A region in full-size pixels is mapped to the decoded pixels: only its rows and (whole
  // iMCUs of) its columns are decoded.
  Rect part{200, 100, 200, 200};
  const Image half = decode_image(jpeg, "a.jpg", part, /*min_side=*/100);
  EXPECT_EQ(half.height, 100);
  EXPECT_GE(half.width, 100);
  EXPECT_LT(half.width, 200);
  EXPECT_EQ(part.y, 0);
  EXPECT_EQ(part.width, 100);
  EXPECT_EQ(part.height, 100);
  // The content survives: the red ramp at the region's left edge is about half way.
  EXPECT_NEAR(half.rgb[static_cast<size_t>((part.y * half.width + part.x) * 3)], 128, 8);
}

// The training path decodes only the crop's rows and columns: its pixels are those of the whole
// image decoded the same way (fast DCT, the same scale), cropped; with 4:2:0 chroma too.
TEST(ImageDecodeTest, CropDecodeEqualsTheWholeDecodesCrop) {
  std::vector<uint8_t> rgb = ramp_image(500, 375);
  uint32_t state = 7;
  for (auto& v : rgb) {  // texture, so that every block has detail
    state = state * 1664525u + 1013904223u;
    v = static_cast<uint8_t>((v + (state >> 27)) & 0xFF);
  }
  for (const int sampling : {TJSAMP_444, TJSAMP_420}) {
    const auto jpeg = encode_jpeg(rgb, 500, 375, /*quality=*/90, sampling);
    // min_side 376 keeps scale 1; 150 picks 1/2 for both regions.
    for (const auto& [min_side, crop] : std::vector<std::pair<int64_t, Rect>>{
             {376, Rect{101, 57, 300, 250}}, {150, Rect{100, 50, 320, 300}}}) {
      SCOPED_TRACE("sampling " + std::to_string(sampling) + ", min_side " +
                   std::to_string(min_side));
      Rect whole{0, 0, 500, 375}, part = crop;
      const Image all = decode_image(jpeg, "a.jpg", whole, min_side);
      const Image cut = decode_image(jpeg, "a.jpg", part, min_side);
      const double f = static_cast<double>(all.width) / 500.0;
      const auto x0 = static_cast<int64_t>(std::floor(crop.x * f));
      const auto y0 = static_cast<int64_t>(std::floor(crop.y * f));
      ASSERT_EQ(part.width, std::llround(crop.width * f));
      ASSERT_EQ(part.height, std::llround(crop.height * f));
      int worst = 0;
      for (int64_t y = 0; y < part.height; ++y) {
        for (int64_t x = 0; x < part.width * 3; ++x) {
          const int a = all.rgb[static_cast<size_t>((y0 + y) * all.width * 3 + x0 * 3 + x)];
          const int b = cut.rgb[static_cast<size_t>((part.y + y) * cut.width * 3 + part.x * 3 + x)];
          worst = std::max(worst, std::abs(a - b));
        }
      }
      EXPECT_EQ(worst, 0);
    }
    auto truncated = jpeg;
    truncated.resize(truncated.size() / 2);
    Rect part{100, 50, 320, 300};
    EXPECT_THROW(decode_image(truncated, "a.jpg", part, /*min_side=*/150), DataError);
  }
}

TEST(ImageDecodeTest, CorruptDataIsDataErrorNamingThePath) {
  EXPECT_NE(error_of({'h', 'e', 'l', 'l', 'o'}).find("img/x.jpg: not a JPEG or PNG"),
            std::string::npos);
  EXPECT_NE(error_of({}).find("img/x.jpg"), std::string::npos);
  auto jpeg = encode_jpeg(ramp_image(64, 64), 64, 64);
  jpeg.resize(jpeg.size() / 2);  // truncated mid-scan
  EXPECT_NE(error_of(jpeg).find("img/x.jpg: corrupt JPEG"), std::string::npos);
  auto header_only = encode_jpeg(ramp_image(64, 64), 64, 64);
  header_only.resize(20);
  EXPECT_NE(error_of(header_only).find("img/x.jpg: corrupt JPEG"), std::string::npos)
      << error_of(header_only);
  auto png = encode_png(ramp_image(16, 16), 16, 16);
  png[png.size() / 2] ^= 0xFF;  // a flipped byte in the image data fails its CRC
  EXPECT_NE(error_of(png).find("img/x.jpg: corrupt PNG"), std::string::npos);
}

TEST(ImageTransformTest, RandomResizedCropStaysInRangeAndIsReproducible) {
  const std::vector<double> scale = {0.08, 1.0}, ratio = {3.0 / 4.0, 4.0 / 3.0};
  Rng a(5), b(5);
  std::set<int64_t> widths;
  for (int i = 0; i < 200; ++i) {
    const Rect r = random_resized_crop(500, 375, scale, ratio, a);
    const Rect s = random_resized_crop(500, 375, scale, ratio, b);
    EXPECT_EQ(r.x, s.x);
    EXPECT_EQ(r.width, s.width);
    ASSERT_GE(r.x, 0);
    ASSERT_GE(r.y, 0);
    ASSERT_LE(r.x + r.width, 500);
    ASSERT_LE(r.y + r.height, 375);
    const double area = static_cast<double>(r.width * r.height) / (500.0 * 375.0);
    EXPECT_GE(area, 0.07);
    EXPECT_LE(area, 1.0);
    const double aspect = static_cast<double>(r.width) / static_cast<double>(r.height);
    EXPECT_GE(aspect, 0.74);
    EXPECT_LE(aspect, 1.35);
    widths.insert(r.width);
  }
  EXPECT_GT(widths.size(), 50u);
}

TEST(ImageTransformTest, RandomResizedCropFallsBackToCentralCrop) {
  // Scale range above what fits: every try fails, the fallback narrows a 10:1 image to 4:3.
  Rng rng(1);
  const Rect r = random_resized_crop(1000, 100, {0.99, 1.0}, {0.75, 4.0 / 3.0}, rng);
  EXPECT_EQ(r.height, 100);
  EXPECT_EQ(r.width, 133);
  EXPECT_EQ(r.x, (1000 - 133) / 2);
  EXPECT_EQ(r.y, 0);
}

TEST(ImageTransformTest, CenterCropMatchesResizeThenCrop) {
  // 500x375 -> Resize(256) = 341x256 -> CenterCrop(224) at left 58 (117 / 2 rounded half to
  // even), top 16.
  const Rect r = center_crop(500, 375, 256, 224);
  EXPECT_EQ(r.x, 58);
  EXPECT_EQ(r.y, 16);
  EXPECT_EQ(r.width, 224);
  EXPECT_EQ(r.height, 224);
  // Portrait: the width is the shorter side; 100x200 -> 50x100, top (100 - 50) / 2.
  const Rect p = center_crop(100, 200, 50, 50);
  EXPECT_EQ(p.x, 0);
  EXPECT_EQ(p.y, 25);
  EXPECT_EQ(p.width, 50);
  EXPECT_EQ(p.height, 50);
  // The resize and crop of a picture whose centre is marked: the mark stays in the centre.
  Image img;
  img.width = 90;
  img.height = 60;
  img.rgb.assign(90 * 60 * 3, 0);
  for (int y = 25; y < 35; ++y)
    for (int x = 40; x < 50; ++x) img.rgb[static_cast<size_t>((y * 90 + x) * 3)] = 255;
  auto out = torch::empty({3, 20, 20}, torch::kUInt8);
  resize_center_crop(img, /*resize=*/30, /*crop=*/20, out);
  // 90x60 -> 45x30 -> crop at (12, 5): the 10x10 mark becomes 5x5 at (20..25, 12..17) - (12, 5).
  EXPECT_GT(out[0][10][10].item<uint8_t>(), 200);
  EXPECT_EQ(out[0][0][0].item<uint8_t>(), 0);
  EXPECT_TRUE(torch::all(out[1] == 0).item<bool>());
}

TEST(ImageTransformTest, CropResizeAndFlip) {
  Image img;
  img.width = 40;
  img.height = 20;
  img.rgb = ramp_image(40, 20);
  auto out = torch::empty({3, 10, 10}, torch::kUInt8);
  crop_resize(img, Rect{0, 0, 40, 20}, 10, /*flip=*/false, out);
  auto red = out[0].to(torch::kFloat32);  // [10, 10]
  // Red rises left to right, green top to bottom, blue is constant.
  EXPECT_LT(red[0][0].item<float>(), red[0][9].item<float>());
  EXPECT_LT(out[1][0][0].item<uint8_t>(), out[1][9][0].item<uint8_t>());
  EXPECT_TRUE(torch::all(out[2] == 64).item<bool>());
  auto flipped = torch::empty({3, 10, 10}, torch::kUInt8);
  crop_resize(img, Rect{0, 0, 40, 20}, 10, /*flip=*/true, flipped);
  EXPECT_TRUE(torch::equal(flipped, out.flip({2})));
  // A crop of the right half only holds the upper half of the red ramp.
  crop_resize(img, Rect{20, 0, 20, 20}, 10, /*flip=*/false, out);
  EXPECT_GT(out[0].min().item<uint8_t>(), 120);
}

// --- imagefolder -----------------------------------------------------------------------------

class ImageFolderTest : public ::testing::Test {
 protected:
  // root/<split>/<cls>/<name>: a ramp JPEG whose blue channel is `blue`.
  void add(const std::string& split, const std::string& cls, const std::string& name,
           uint8_t blue = 64, int width = 60, int height = 45) {
    fs::create_directories((root() / split / cls / name).parent_path());
    const auto rgb = ramp_image(width, height, blue);
    const bool png = name.size() > 4 && name.substr(name.size() - 4) == ".png";
    write_file((root() / split / cls / name).string(),
               png ? encode_png(rgb, width, height) : encode_jpeg(rgb, width, height));
  }

  // Two classes in each split; "b_dog" sorts after "a_cat" whatever the creation order.
  void standard_tree() {
    add("train", "b_dog", "1.jpg", 200);
    add("train", "b_dog", "0.JPEG", 200);
    add("train", "a_cat", "x.png", 10);
    add("train", "a_cat", "sub/y.jpg", 10);
    add("train", "a_cat", "z.jpeg", 10);
    add("val", "a_cat", "v.jpg", 10);
    add("val", "b_dog", "w.jpg", 200);
    write_file((root() / "train" / "a_cat" / "notes.txt").string(), {'h', 'i'});
  }

  config::DataConfig config() const {
    config::DataConfig cfg = default_data_config();
    cfg.name = "imagefolder";
    cfg.root = root().string();
    cfg.options.set("image_size", int64_t{16});
    cfg.options.set("resize_size", int64_t{20});
    cfg.options.set("hflip", 0.5);
    return cfg;
  }

  Splits make(const config::DataConfig& cfg) const {
    return dataset_registry().get("imagefolder")(cfg, DataContext{/*seed=*/0});
  }

  const fs::path& root() const { return tmp_.path(); }
  test_support::TempDir tmp_{"imagefolder"};
};

std::vector<int64_t> range(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

TEST_F(ImageFolderTest, ClassesSortedFilesRecursiveLabels) {
  standard_tree();
  const Splits s = make(config());
  EXPECT_EQ(s.spec.num_classes, 2);
  EXPECT_EQ(s.spec.sample_shape, (std::vector<int64_t>{3, 16, 16}));
  EXPECT_EQ(s.train->size(), 5);  // notes.txt is not an image
  EXPECT_EQ(s.val->size(), 2);
  const Batch b = s.train->get(range(5));
  EXPECT_EQ(b.inputs.sizes(), (std::vector<int64_t>{5, 3, 16, 16}));
  EXPECT_EQ(b.inputs.dtype(), torch::kFloat32);
  EXPECT_EQ(b.targets.sizes(), (std::vector<int64_t>{5}));
  std::vector<int64_t> labels(b.targets.data_ptr<int64_t>(), b.targets.data_ptr<int64_t>() + 5);
  EXPECT_EQ(labels, (std::vector<int64_t>{0, 0, 0, 1, 1}));
  // Blue, normalised with ImageNet's statistics: 10 for cats, 200 for dogs.
  const double cat = (10 / 255.0 - 0.406) / 0.225, dog = (200 / 255.0 - 0.406) / 0.225;
  EXPECT_NEAR(b.inputs[0][2].mean().item<double>(), cat, 0.05);
  EXPECT_NEAR(b.inputs[4][2].mean().item<double>(), dog, 0.05);
  const Batch v = s.val->get({0, 1});
  EXPECT_EQ(v.targets[0].item<int64_t>(), 0);
  EXPECT_EQ(v.targets[1].item<int64_t>(), 1);
  EXPECT_EQ(b.bad_samples, 0);
}

TEST_F(ImageFolderTest, TrainAugmentationDependsOnSeedEpochAndIndexOnly) {
  standard_tree();
  const Splits s = make(config());
  const Epoch e0{7, 0}, e1{7, 1};
  const Batch all = s.train->get(range(5), e0);
  const Batch one = s.train->get({3}, e0);
  EXPECT_TRUE(torch::equal(all.inputs[3], one.inputs[0]));
  EXPECT_TRUE(torch::equal(all.inputs, s.train->get(range(5), e0).inputs));
  EXPECT_FALSE(torch::equal(all.inputs, s.train->get(range(5), e1).inputs));
  // Evaluation is deterministic: the epoch plays no part.
  EXPECT_TRUE(torch::equal(s.val->get({0, 1}, e0).inputs, s.val->get({0, 1}, e1).inputs));
}

TEST_F(ImageFolderTest, EvalIsResizeAndCenterCrop) {
  add("train", "a", "0.png", 0, 40, 20);
  add("val", "a", "0.png", 0, 40, 20);
  auto cfg = config();
  cfg.normalize = false;
  cfg.options.set("image_size", int64_t{10});
  cfg.options.set("resize_size",
                  int64_t{10});  // 40x20 -> 20x10 -> central 10x10: the middle of the red ramp
  const Batch b = make(cfg).val->get({0});
  const auto red = b.inputs[0][0];  // [10, 10] in [0, 1]
  EXPECT_NEAR(red.mean().item<double>(), 0.5, 0.05);
  EXPECT_GT(red.min().item<double>(), 0.2);
  EXPECT_LT(red.max().item<double>(), 0.8);
}

// data.val_fraction: a seeded share of each class of train/ validates, and trains no more.
TEST_F(ImageFolderTest, ValFractionHoldsOutASeededShareOfEachClass) {
  // Each image's blue value tells it apart: 10 + 10 * i for cats, 130 + 10 * i for dogs.
  for (int i = 0; i < 10; ++i) {
    add("train", "a_cat", std::to_string(i) + ".png", static_cast<uint8_t>(10 + 10 * i), 16, 16);
    add("train", "b_dog", std::to_string(i) + ".png", static_cast<uint8_t>(130 + 10 * i), 16, 16);
  }
  auto cfg = config();
  cfg.normalize = false;
  cfg.options.set("val_fraction", 0.2);
  auto blues = [](const Batch& b) {
    std::vector<int64_t> out;
    for (int64_t i = 0; i < b.inputs.size(0); ++i) {
      out.push_back(std::lround(b.inputs[i][2].mean().item<double>() * 255.0));
    }
    return out;
  };
  const Splits s = make(cfg);
  ASSERT_EQ(s.train->size(), 16);
  ASSERT_EQ(s.val->size(), 4);
  const Batch v = s.val->get(range(4));
  // Two of each class, labelled as their folder.
  EXPECT_EQ(v.targets.sum().item<int64_t>(), 2);
  const auto held = blues(v), kept = blues(s.train->get(range(16)));
  for (const auto b : held) {
    EXPECT_EQ(std::count(kept.begin(), kept.end(), b), 0) << "image " << b << " in both splits";
  }
  // The same seed draws the same split; another seed another one.
  EXPECT_EQ(blues(make(cfg).val->get(range(4))), held);
  const Splits other = dataset_registry().get("imagefolder")(cfg, DataContext{/*seed=*/5});
  EXPECT_NE(blues(other.val->get(range(4))), held);
}

TEST_F(ImageFolderTest, CorruptImageIsSkippedAndCounted) {
  standard_tree();
  write_file((root() / "train" / "a_cat" / "z.jpeg").string(), {0xFF, 0xD8, 0xFF, 0x00, 0x01});
  const Splits s = make(config());
  // Sample 2 (a_cat/z.jpeg) is replaced by the next one, b_dog/0.JPEG.
  const Batch b = s.train->get({2, 4});
  EXPECT_EQ(b.bad_samples, 1);
  EXPECT_EQ(b.targets[0].item<int64_t>(), 1);
  EXPECT_EQ(b.inputs.size(0), 2);
  // on_error: fail stops with the file's path.
  auto cfg = config();
  cfg.on_error = "fail";
  try {
    make(cfg).train->get({2});
    ADD_FAILURE() << "no DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("a_cat/z.jpeg: corrupt JPEG"), std::string::npos)
        << e.what();
  }
}

// With data.on_error: skip, exactly the damaged files are skipped and counted: a good image read
// after a damaged one on the same thread is read, and equals its reading in a folder without the
// damaged files.
TEST_F(ImageFolderTest, OnlyTheDamagedImagesAreSkipped) {
  const auto valid = encode_jpeg(ramp_image(60, 45), 60, 45, 90, TJSAMP_420);
  test_support::TempDir clean_dir{"imagefolder-clean"};
  for (const auto& dir : {root(), clean_dir.path()}) {
    fs::create_directories(dir / "train" / "a");
    fs::create_directories(dir / "val" / "a");
    write_file((dir / "train" / "a" / "0.jpg").string(), valid);
  }
  // val/a/00.jpg, 01.jpg, ...: good images (their blue channel tells them apart), each damaged
  // one between two of them.
  int64_t files = 0, bad_files = 0;
  std::vector<int64_t> next_good;  // each file's good file (itself, or the one after it)
  for (const auto& [what, bytes] : damaged_jpegs(valid)) {
    if (what == "bytes flipped in the scan") continue;  // decodes, with warnings
    for (const bool damaged : {false, true}) {
      const std::string name = (files < 10 ? "0" : "") + std::to_string(files) + ".jpg";
      if (damaged) {
        write_file((root() / "val" / "a" / name).string(), bytes);
        ++bad_files;
      } else {
        const auto blue = static_cast<uint8_t>(15 * (files - bad_files));
        const auto jpeg = encode_jpeg(ramp_image(60, 45, blue), 60, 45, 90, TJSAMP_420);
        write_file((root() / "val" / "a" / name).string(), jpeg);
        write_file((clean_dir.path() / "val" / "a" / name).string(), jpeg);
      }
      next_good.push_back(files - bad_files + (damaged ? 1 : 0));
      ++files;
    }
  }
  write_file((root() / "val" / "a" / "99.jpg").string(), valid);  // after the last damaged one
  write_file((clean_dir.path() / "val" / "a" / "99.jpg").string(), valid);
  const Splits s = make(config());
  ASSERT_EQ(s.val->size(), files + 1);
  auto clean_cfg = config();
  clean_cfg.root = clean_dir.path().string();
  const Splits clean = dataset_registry().get("imagefolder")(clean_cfg, DataContext{/*seed=*/0});
  ASSERT_EQ(clean.val->size(), files - bad_files + 1);
  const Batch all = s.val->get(range(files));  // one after another on this thread
  EXPECT_EQ(all.bad_samples, bad_files);
  const Batch reference = clean.val->get(range(clean.val->size()));
  for (int64_t i = 0; i < files; ++i) {
    const int64_t g = next_good[static_cast<size_t>(i)];
    EXPECT_TRUE(torch::equal(all.inputs[i], reference.inputs[g])) << "val/a file " << i;
  }
}

TEST_F(ImageFolderTest, LayoutErrorsNameThePath) {
  auto key_of = [&](const config::DataConfig& cfg) -> std::string {
    try {
      make(cfg);
    } catch (const DataConfigError& e) {
      return e.key() + " | " + e.what();
    } catch (const DataError& e) {
      return std::string("DataError | ") + e.what();
    }
    return "no error";
  };
  std::string r = key_of(config());
  EXPECT_EQ(r.rfind("data.train_dir", 0), 0u) << r;
  EXPECT_NE(r.find((root() / "train").string()), std::string::npos) << r;

  fs::create_directories(root() / "train");
  fs::create_directories(root() / "val");
  r = key_of(config());
  EXPECT_NE(r.find("DataError | " + (root() / "train").string() + ": no class folders"),
            std::string::npos)
      << r;

  add("train", "cat", "0.jpg");
  fs::create_directories(root() / "train" / "dog");
  r = key_of(config());
  EXPECT_NE(r.find((root() / "train" / "dog").string() + ": no images"), std::string::npos) << r;

  add("train", "dog", "0.jpg");
  add("val", "cow", "0.jpg");
  r = key_of(config());
  EXPECT_NE(r.find("class 'cow' is not among the training split's classes"), std::string::npos)
      << r;

  auto cfg = config();
  cfg.root = (root() / "absent").string();
  r = key_of(cfg);
  EXPECT_EQ(r.rfind("data.root", 0), 0u) << r;
}

TEST_F(ImageFolderTest, SameBatchesWithOneAndFourWorkers) {
  for (int i = 0; i < 12; ++i) add("train", i % 3 ? "a" : "b", std::to_string(i) + ".jpg", i * 20);
  add("val", "a", "0.jpg");
  const Splits s = make(config());
  auto batches = [&](int64_t workers) {
    LoaderOptions o;
    o.batch_size = 5;
    o.workers = workers;
    o.drop_last = false;
    o.seed = 3;
    Loader loader(s.train, o);
    std::vector<torch::Tensor> out;
    for (int64_t epoch : {0, 1}) {
      loader.start_epoch(epoch);
      while (auto b = loader.next())
        out.push_back(torch::cat({b->inputs.flatten(), b->targets.to(torch::kFloat32)}));
    }
    return out;
  };
  const auto one = batches(1), four = batches(4);
  ASSERT_EQ(one.size(), 6u);
  ASSERT_EQ(four.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(torch::equal(one[i], four[i])) << i;
  EXPECT_FALSE(torch::equal(one[0], one[3]));  // epoch 1 is another draw
}

}  // namespace
}  // namespace trainer::data
