// Helper of tests/webdataset_check.py: what the webdataset data set hands one rank.
//
//   webdataset_tool --shards P [--val-shards P] [--split train|val] [--world W] [--rank R]
//                   [--epoch E] [--first-batch K] [--batch B] [--shuffle 0|1] [--streams V]
//                   [--buffer N] [--image-size S] [--resize-size R] [--on-bad-sample skip|fail]
//                   [--classes K] [--pixels OUT.safetensors]
//
// Builds the data set as the trainer does (data.* from the flags, seed 0) and runs the loader of
// rank R of W over epoch E from batch K. Prints one JSON line per batch: {"names": [shard:key,
// ...], "labels": [...], "bad": N}. --pixels writes every batch's inputs, concatenated, as
// "inputs" [N, 3, S, S] float32. Exit 1 with the error's message on any problem.
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "data/dataset.h"
#include "util/fileio.h"

namespace {

using namespace trainer;

std::map<std::string, std::string> parse_flags(int argc, char** argv) {
  std::map<std::string, std::string> flags = {
      {"split", "train"},   {"world", "1"},       {"rank", "0"},         {"epoch", "0"},
      {"first-batch", "0"}, {"batch", "4"},       {"shuffle", "1"},      {"streams", "0"},
      {"buffer", "1000"},   {"image-size", "16"}, {"resize-size", "16"}, {"on-bad-sample", "skip"},
      {"val-shards", ""},   {"pixels", ""},       {"classes", "0"}};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    if (key.rfind("--", 0) != 0) throw std::invalid_argument("expected --flag VALUE, got " + key);
    flags[key.substr(2)] = argv[i + 1];
  }
  if (!flags.count("shards")) throw std::invalid_argument("--shards is required");
  return flags;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto f = parse_flags(argc, argv);
    config::DataConfig cfg = data::default_data_config("webdataset");
    cfg.options.set("shards", f["shards"]);
    cfg.options.set("val_shards", f["val-shards"]);
    cfg.options.set("streams", int64_t{std::stoll(f["streams"])});
    cfg.options.set("shuffle_buffer", int64_t{std::stoll(f["buffer"])});
    cfg.options.set("image_size", int64_t{std::stoll(f["image-size"])});
    cfg.options.set("resize_size", int64_t{std::stoll(f["resize-size"])});
    cfg.options.set("on_bad_sample", f["on-bad-sample"]);
    cfg.options.set("classes", int64_t{std::stoll(f["classes"])});
    const auto splits = data::dataset_registry().get("webdataset")(cfg, data::DataContext{});
    const auto dataset = f["split"] == "val" ? splits.val : splits.train;
    data::LoaderOptions o;
    o.batch_size = std::stoll(f["batch"]);
    o.shuffle = f["shuffle"] == "1";
    o.world_size = std::stoll(f["world"]);
    o.rank = std::stoll(f["rank"]);
    o.drop_last = false;
    o.workers = 2;
    data::Loader loader(dataset, o);
    loader.start_epoch(std::stoll(f["epoch"]), std::stoll(f["first-batch"]));
    std::vector<torch::Tensor> inputs;
    while (auto batch = loader.next()) {
      nlohmann::json line;
      line["names"] = nlohmann::json::array();
      for (int64_t i : batch->indices) line["names"].push_back(dataset->sample_name(i));
      const auto labels = batch->targets.contiguous();
      line["labels"] = std::vector<int64_t>(labels.data_ptr<int64_t>(),
                                            labels.data_ptr<int64_t>() + labels.numel());
      line["bad"] = batch->bad_samples;
      std::cout << line.dump() << "\n";
      inputs.push_back(batch->inputs);
    }
    if (!f["pixels"].empty()) {
      const auto all = torch::cat(inputs);
      write_atomically(f["pixels"], [&](const ByteSink& sink) {
        checkpoint::write_safetensors({{"inputs", all}}, {}, sink);
      });
    }
  } catch (const std::exception& e) {
    std::cerr << "webdataset_tool: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
