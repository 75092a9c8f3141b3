// The fixture of the end-to-end suites: runs the trainer binary in a fresh directory.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "image_files.h"
#include "temp_dir.h"

namespace trainer::test_support {

namespace fs = std::filesystem;

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

inline std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The float32 tensors of a safetensors file whose names start with `prefix`, by name.
inline std::map<std::string, std::vector<float>> float_tensors(const fs::path& file,
                                                               const std::string& prefix = "") {
  const std::string bytes = read_file(file);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), sizeof n);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__" || name.rfind(prefix, 0) != 0 || info["dtype"] != "F32") continue;
    const size_t begin = 8 + n + info["data_offsets"][0].get<size_t>();
    const size_t end = 8 + n + info["data_offsets"][1].get<size_t>();
    std::vector<float> v((end - begin) / sizeof(float));
    std::memcpy(v.data(), bytes.data() + begin, end - begin);
    out[name] = std::move(v);
  }
  return out;
}

// The largest |a - b| over the float32 tensors named `prefix`... of two safetensors files; +inf
// when their names or sizes differ, or there are none.
inline double max_abs_diff(const fs::path& a, const fs::path& b, const std::string& prefix = "") {
  const auto ta = float_tensors(a, prefix), tb = float_tensors(b, prefix);
  if (ta.empty() || ta.size() != tb.size()) return INFINITY;
  double worst = 0.0;
  for (const auto& [name, va] : ta) {
    const auto it = tb.find(name);
    if (it == tb.end() || it->second.size() != va.size()) return INFINITY;
    for (size_t i = 0; i < va.size(); ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(va[i]) - it->second[i]));
    }
  }
  return worst;
}

class Cli : public ::testing::Test {
 protected:
  // Runs `trainer <args>` from the source dir; stdout and stderr captured separately.
  Result run(const std::string& args) { return sh(std::string("'") + TRAINER_BIN + "' " + args); }

  // Runs a bash script from the source dir, with $TRAINER set to the binary.
  Result sh(const std::string& script) {
    const fs::path err_file = dir_ / "stderr.txt";
    const fs::path script_file = dir_ / "script.sh";
    std::ofstream(script_file) << "TRAINER='" << TRAINER_BIN << "'\n" << script << "\n";
    const std::string cmd = std::string("cd '") + TRAINER_SOURCE_DIR + "' && bash '" +
                            script_file.string() + "' 2>'" + err_file.string() + "'";
    Result r;
    FILE* pipe = popen(cmd.c_str(), "r");
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) r.out.append(buf, n);
    const int status = pclose(pipe);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.err = read_file(err_file);
    return r;
  }

  fs::path write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }

  static std::vector<nlohmann::json> metrics(const fs::path& run_dir, const std::string& split) {
    std::vector<nlohmann::json> out;
    std::ifstream in(run_dir / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (j["split"] == split) out.push_back(j);
    }
    return out;
  }

  static std::vector<double> losses(const fs::path& run_dir) {
    std::vector<double> out;
    for (const auto& j : metrics(run_dir, "train")) out.push_back(j["loss"].get<double>());
    return out;
  }

  // `args` on `ranks` processes (a plain run for 1) with `batch` samples per data-parallel rank,
  // into `dir`; the test fails when it does not exit 0.
  void train(int ranks, int batch, const std::string& args, const fs::path& dir) {
    const std::string common = args + " --set data.batch_size=" + std::to_string(batch) +
                               " --run-dir '" + dir.string() + "'";
    const auto r = ranks == 1 ? run(common)
                              : run("launch --standalone --nproc-per-node " +
                                    std::to_string(ranks) + " -- " + common);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
  }

  // The runs in `a` and `b` logged `steps` training losses each, every one within `absolute` +
  // `relative` x |b's| of the other's.
  static void expect_same_losses(const fs::path& a, const fs::path& b, size_t steps,
                                 double absolute, double relative = 0.0) {
    const auto la = losses(a), lb = losses(b);
    ASSERT_EQ(la.size(), steps);
    ASSERT_EQ(lb.size(), steps);
    for (size_t i = 0; i < steps; ++i) {
      EXPECT_NEAR(la[i], lb[i], absolute + relative * std::abs(lb[i])) << "step " << i + 1;
    }
  }

  TempDir tmp_{"cli"};  // removed without std::filesystem::remove_all (see temp_dir.h)
  const fs::path dir_ = tmp_.path();
};

// The name of the checkpoint of `step`.
inline std::string step_file(int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "step_%08lld.safetensors", static_cast<long long>(step));
  return name;
}

// root/<split>/<class>/<i>.jpg for two classes, `per_class` training images each and one
// validation image.
inline void write_image_folder(const fs::path& root, int per_class, int width, int height) {
  for (const char* split : {"train", "val"}) {
    for (int c = 0; c < 2; ++c) {
      const fs::path dir = root / split / ("class" + std::to_string(c));
      fs::create_directories(dir);
      for (int i = 0; i < (split == std::string("train") ? per_class : 1); ++i) {
        const auto rgb = ramp_image(width, height, static_cast<uint8_t>(c * 200 + i));
        write_file((dir / (std::to_string(i) + ".jpg")).string(), encode_jpeg(rgb, width, height));
      }
    }
  }
}

}  // namespace trainer::test_support
