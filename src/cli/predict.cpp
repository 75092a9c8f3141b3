// trainer predict: classifies image files with a checkpoint.
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "cli/checkpoint_model.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "data/dataset.h"
#include "distributed/env.h"
#include "engine/loop/trainer.h"
#include "util/fileio.h"
#include "util/format.h"

namespace trainer::cli {
namespace {

namespace fs = std::filesystem;

bool image_name(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// The image files of --input: the file itself, or every JPEG/PNG under the folder, by name.
std::vector<std::string> inputs_of(const std::string& input) {
  std::error_code ec;
  if (fs::is_regular_file(input, ec)) return {input};
  if (!fs::is_directory(input, ec)) {
    throw UsageError("--input: " + input + " is neither an image file nor a folder");
  }
  std::vector<std::string> files;
  for (fs::recursive_directory_iterator it(input, ec), end; !ec && it != end; it.increment(ec)) {
    // A symbolic link whose target is missing too: it is then reported as skipped.
    const bool file = it->is_regular_file(ec) || (it->is_symlink(ec) && !fs::exists(it->path(), ec));
    if (file && image_name(it->path())) files.push_back(it->path().string());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) throw UsageError("--input: no .jpg, .jpeg or .png file under " + input);
  return files;
}

// `text` for one field of a tab-separated line: tabs, newlines and backslashes escaped.
std::string tsv_field(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\\') {
      out += "\\\\";
    } else {
      out += c;
    }
  }
  return out;
}

cxxopts::Options predict_options() {
  cxxopts::Options options("trainer predict", "Classifies image files with a checkpoint.");
  // clang-format off
  add_checkpoint_options(options);
  options.add_options()
      ("input", "an image file, or a folder of them (JPEG, PNG; searched recursively)",
       cxxopts::value<std::string>(), "FILE|DIR")
      ("top-k", "the K likeliest classes of each image", cxxopts::value<int64_t>()->default_value("1"),
       "K")
      ("batch-size", "images per forward pass", cxxopts::value<int64_t>()->default_value("32"), "N")
      ("json", "print one JSON object instead of the lines")
      ("h,help", "print this help");
  // clang-format on
  return options;
}

// Classifies `files` in one forward pass: each image's top-k into `all` (and printed unless
// `json`), the unreadable ones reported and into `skipped`.
void predict_batch(engine::Trainer& trainer, const std::vector<std::string>& files, int64_t top_k,
                   bool json, nlohmann::json& all, nlohmann::json& skipped) {
  // The checkpoint's class names where it saved them, else the data's.
  const auto& names = trainer.class_names();
  std::vector<torch::Tensor> inputs;
  std::vector<std::string> paths;
  for (const auto& file : files) {
    try {
      inputs.push_back(trainer.input_from_image(read_bytes(file), file));
      paths.push_back(file);
    } catch (const std::exception& e) {  // data::DataError, IoError: reported, skipped
      std::cerr << "trainer predict: " << e.what() << "; skipped\n";
      skipped.push_back(file);
    }
  }
  if (inputs.empty()) return;
  const auto probs = trainer.predict(torch::stack(inputs));  // [B, K]
  const auto [p, idx] = probs.topk(std::min<int64_t>(top_k, probs.size(1)), /*dim=*/1);
  for (size_t i = 0; i < paths.size(); ++i) {
    nlohmann::json top = nlohmann::json::array();
    for (int64_t k = 0; k < idx.size(1); ++k) {
      const int64_t c = idx[static_cast<int64_t>(i)][k].item<int64_t>();
      const double prob = p[static_cast<int64_t>(i)][k].item<double>();
      const std::string label =
          c < static_cast<int64_t>(names.size()) ? names[static_cast<size_t>(c)] : std::to_string(c);
      top.push_back({{"label", label}, {"index", c}, {"probability", prob}});
      if (!json) {
        std::cout << strprintf("%s\t%s\t%.4f\n", tsv_field(paths[i]).c_str(),
                               tsv_field(label).c_str(), prob);
      }
    }
    all.push_back({{"path", paths[i]}, {"top", top}});
  }
}

}  // namespace

int predict_command(int argc, char** argv) {
  auto options = predict_options();
  const cxxopts::ParseResult args = parse_or_usage(options, argc, argv);
  if (args.count("help")) {
    std::cout << options.help()
              << "\nPrints PATH<TAB>LABEL<TAB>PROBABILITY for each image and each of its top-k "
                 "classes (tabs, newlines and backslashes in them escaped as \\t, \\n, \\\\); an "
                 "unreadable image is reported on stderr and skipped; exit 1 when none could be "
                 "classified.\n";
    return 0;
  }
  if (!args.count("input")) throw UsageError("predict: --input FILE|DIR is required");
  const int64_t top_k = args["top-k"].as<int64_t>(), batch = args["batch-size"].as<int64_t>();
  if (top_k < 1 || batch < 1) throw UsageError("--top-k and --batch-size must be at least 1");
  const auto files = inputs_of(args["input"].as<std::string>());
  if (distributed::read_process_env().launched()) {
    throw UsageError("predict runs in one process: run it without trainer launch");
  }
  const auto m = load_checkpoint_model(args, distributed::DistEnv{}, "predict");
  auto& trainer = *m.trainer;
  if (trainer.tokens_per_sample() > 0) {
    throw UsageError("predict: " + m.checkpoint + " holds a language model (" +
                     m.loaded.cfg.model.name + "); use trainer generate");
  }
  nlohmann::json all = nlohmann::json::array(), skipped = nlohmann::json::array();
  for (size_t first = 0; first < files.size(); first += static_cast<size_t>(batch)) {
    const auto last = std::min(files.size(), first + static_cast<size_t>(batch));
    predict_batch(trainer, {files.begin() + first, files.begin() + last}, top_k,
                  args.count("json") > 0, all, skipped);
  }
  if (args.count("json")) {
    std::cout << nlohmann::json{{"checkpoint", m.checkpoint},
                                {"weights", m.weights},
                                {"predictions", all},
                                {"skipped", skipped}}
                     .dump()
              << "\n";
  }
  if (all.empty()) {
    std::cerr << strprintf("trainer predict: none of the %zu images of %s could be classified\n",
                           files.size(), args["input"].as<std::string>().c_str());
    return 1;
  }
  return 0;
}

}  // namespace trainer::cli
