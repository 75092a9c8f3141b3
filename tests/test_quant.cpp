// nn/quant against bitsandbytes 0.50: tests/quant_check.py writes bitsandbytes' quantized states
// and dequantized weights for inputs with ragged blocks, odd sizes, exact ties, zeros and three
// input dtypes, and a tiny model transformers saved in 4 bits; here every byte and float must be
// equal. Skips when the venv or its bitsandbytes is missing (quant_check.py exits 77).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "checkpoint/safetensors.h"
#include "nn/quant/int8.h"
#include "nn/quant/nf4.h"
#include "temp_dir.h"

namespace trainer::nn::quant {
namespace {

namespace fs = std::filesystem;
using Tensors = std::map<std::string, torch::Tensor>;

Tensors read_tensors(const fs::path& path, std::map<std::string, std::string>* metadata = nullptr) {
  auto file = checkpoint::read_safetensors(path.string());
  if (metadata) *metadata = file.metadata;
  Tensors out;
  for (auto& [name, t] : file.tensors) out[name] = t;
  return out;
}

std::string text_of(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Bit equality, NaN included: the bytes of both tensors.
bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.numel() != b.numel()) return false;
  const torch::Tensor x = a.contiguous().view(-1).view(torch::kUInt8);
  const torch::Tensor y = b.contiguous().view(-1).view(torch::kUInt8);
  return torch::equal(x, y);
}

std::string diff_text(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.numel() != b.numel())
    return std::string(c10::toString(a.scalar_type())) + " " + std::to_string(a.numel()) + " vs " +
           c10::toString(b.scalar_type()) + " " + std::to_string(b.numel());
  const torch::Tensor x = a.reshape(-1).to(torch::kDouble), y = b.reshape(-1).to(torch::kDouble);
  const torch::Tensor ne = x.ne(y);
  return std::to_string(ne.sum().item<int64_t>()) + " differ, max abs diff " +
         std::to_string((x - y).abs().max().item<double>());
}

// bitsandbytes' references, made once by quant_check.py (it takes tens of seconds), read by the
// checks of Quant.EqualsBitsandbytes below.
struct References {
  std::unique_ptr<test_support::TempDir> dir;
  Tensors refs;
  std::map<std::string, std::string> meta;

  int cases() const { return std::stoi(meta.at("cases")); }
  const torch::Tensor& ref(int i, const std::string& what) const {
    return refs.at(std::to_string(i) + "." + what);
  }
  std::string what(int i) const {
    return "case " + std::to_string(i) + ": " + meta.at("case." + std::to_string(i));
  }
};

// Runs quant_check.py into a fresh directory: its exit status (77: bitsandbytes is missing).
int make_references(References& r) {
  r.dir = std::make_unique<test_support::TempDir>("quant");
  const fs::path src = TRAINER_SOURCE_DIR;
  const std::string py = (src / ".venv/bin/python").string();
  if (!fs::exists(py)) return 77;
  const std::string cmd = "OMP_NUM_THREADS=1 '" + py + "' '" +
                          (src / "tests/quant_check.py").string() + "' '" + r.dir->path().string() +
                          "' > '" + (r.dir->path() / "log.txt").string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  if (code == 0) r.refs = read_tensors(r.dir->path() / "refs.safetensors", &r.meta);
  return code;
}

void check_tables(const References& r) {
  EXPECT_TRUE(same_bits(nf4_code(), r.refs.at("nf4_code")));
  EXPECT_TRUE(same_bits(dynamic_code(), r.refs.at("dynamic_code")));
}

void check_nf4_states(const References& r) {
  for (int i = 0; i < r.cases(); ++i) {
    const Nf4Weight w = quantize_nf4(r.ref(i, "w"));
    EXPECT_TRUE(same_bits(w.packed, r.ref(i, "packed")))
        << r.what(i) << ": packed " << diff_text(w.packed, r.ref(i, "packed"));
    EXPECT_EQ(w.packed.sizes(), r.ref(i, "packed").sizes()) << r.what(i);
    EXPECT_TRUE(same_bits(w.absmax, r.ref(i, "absmax")))
        << r.what(i) << ": absmax " << diff_text(w.absmax, r.ref(i, "absmax"));
    EXPECT_TRUE(same_bits(w.nested_absmax, r.ref(i, "nested_absmax")))
        << r.what(i) << ": nested absmax " << diff_text(w.nested_absmax, r.ref(i, "nested_absmax"));
    EXPECT_TRUE(same_bits(w.nested_code, r.ref(i, "nested_code"))) << r.what(i);
    EXPECT_TRUE(same_bits(w.offset, r.ref(i, "offset")))
        << r.what(i) << ": offset " << w.offset.item<float>() << " vs "
        << r.ref(i, "offset").item<float>();
    const Nf4Weight plain = quantize_nf4(r.ref(i, "w"), 64, /*double_quant=*/false);
    EXPECT_TRUE(same_bits(plain.absmax, r.ref(i, "absmax_plain"))) << r.what(i);
    EXPECT_TRUE(same_bits(plain.packed, r.ref(i, "packed"))) << r.what(i);
  }
}

void check_nf4_dequantization(const References& r) {
  const std::pair<torch::ScalarType, std::string> outs[] = {{torch::kFloat, "deq_float32"},
                                                            {torch::kBFloat16, "deq_bfloat16"},
                                                            {torch::kHalf, "deq_float16"}};
  for (int i = 0; i < r.cases(); ++i) {
    const Nf4Weight w = quantize_nf4(r.ref(i, "w"));
    for (const auto& [dtype, key] : outs) {
      const torch::Tensor got = dequantize(w, dtype);
      EXPECT_EQ(got.sizes(), r.ref(i, key).sizes()) << r.what(i) << " " << key;
      EXPECT_TRUE(same_bits(got, r.ref(i, key)))
          << r.what(i) << " " << key << ": " << diff_text(got, r.ref(i, key));
    }
  }
}

void check_int8(const References& r) {
  for (int i = 0; i < r.cases(); ++i) {
    const Int8Weight w = quantize_int8(r.ref(i, "w"));
    EXPECT_TRUE(same_bits(w.cb, r.ref(i, "cb")))
        << r.what(i) << ": CB " << diff_text(w.cb, r.ref(i, "cb"));
    EXPECT_TRUE(same_bits(w.scb, r.ref(i, "scb")))
        << r.what(i) << ": SCB " << diff_text(w.scb, r.ref(i, "scb"));
    const torch::Tensor deq = dequantize(w, torch::kFloat);
    EXPECT_TRUE(same_bits(deq, r.ref(i, "i8_deq")))
        << r.what(i) << ": " << diff_text(deq, r.ref(i, "i8_deq"));
    for (const auto& [dtype, key] : {std::pair{torch::kFloat, "i8_mm_float32"},
                                     std::pair{torch::kBFloat16, "i8_mm_bfloat16"}}) {
      const torch::Tensor mm = dequantize_for_matmul(w, dtype);
      EXPECT_TRUE(same_bits(mm, r.ref(i, key)))
          << r.what(i) << " " << key << ": " << diff_text(mm, r.ref(i, key));
    }
  }
}

// Held bytes measured from the quantized tensors: at a real layer's size NF4 with double
// quantization holds at most 0.53 bytes a parameter, int8 one byte and a float per row. The
// reference is the size of what bitsandbytes holds for the same weight.
void check_held_bytes(const References& r) {
  const int big = r.cases() - 1;
  const torch::Tensor& weight = r.ref(big, "w");
  const Nf4Weight w = quantize_nf4(weight);
  int64_t bnb = 0;
  for (const char* k : {"packed", "absmax", "nested_absmax", "nested_code", "offset"})
    bnb += r.ref(big, k).nbytes();
  bnb += r.refs.at("nf4_code").nbytes();
  EXPECT_EQ(w.held_bytes(), bnb);
  const double per_param =
      static_cast<double>(w.held_bytes()) / static_cast<double>(weight.numel());
  EXPECT_LE(per_param, 0.53) << w.held_bytes() << " bytes for " << weight.numel();
  const Int8Weight q = quantize_int8(weight);
  EXPECT_EQ(q.held_bytes(),
            static_cast<int64_t>(r.ref(big, "cb").nbytes() + r.ref(big, "scb").nbytes()));
  EXPECT_LE(static_cast<double>(q.held_bytes()) / static_cast<double>(weight.numel()),
            1.0 + 4.0 / weight.size(1));
}

Nf4SavedTensors saved_of(const Tensors& file, const std::string& weight_name) {
  Nf4SavedTensors t;
  torch::Tensor* slots[] = {&t.weight,        &t.absmax,           &t.quant_map,
                            &t.nested_absmax, &t.nested_quant_map, &t.quant_state};
  for (size_t k = 0; k < nf4_saved_suffixes().size(); ++k) {
    const auto it = file.find(weight_name + nf4_saved_suffixes()[k]);
    if (it != file.end()) *slots[k] = it->second;
  }
  return t;
}

// A folder transformers saved from a model it quantized: each layer loads as saved, dequantizes
// as bitsandbytes dequantizes it, equals quantize_nf4 of the weight transformers quantized (its
// float16 copy of the bfloat16 weight), and survives nf4_to_saved -> nf4_from_saved.
void check_saved_folder(const References& r) {
  const fs::path folder = r.dir->path() / "tiny_nf4";
  if (!fs::exists(folder)) {
    std::cerr << "transformers is not installed: no saved folder checked\n";
    return;
  }
  const Tensors file = read_tensors(folder / "model.safetensors");
  const Tensors deq = read_tensors(r.dir->path() / "tiny_nf4_refs.safetensors");
  const Tensors plain = read_tensors(r.dir->path() / "tiny_plain" / "model.safetensors");
  ASSERT_EQ(deq.size(), 7u);  // q, k, v, o, gate, up, down
  for (const auto& [key, expected] : deq) {
    const std::string name = key.substr(0, key.size() - 4);  // less ".deq"
    const Nf4Weight w = nf4_from_saved(saved_of(file, name), name);
    EXPECT_EQ(w.dtype, torch::kHalf) << name;
    const torch::Tensor got = dequantize(w, w.dtype);
    EXPECT_TRUE(same_bits(got, expected)) << name << ": " << diff_text(got, expected);
    const Nf4Weight fresh = quantize_nf4(plain.at(name).to(torch::kHalf));
    EXPECT_TRUE(same_bits(fresh.packed, w.packed)) << name;
    EXPECT_TRUE(same_bits(fresh.absmax, w.absmax)) << name;
    EXPECT_TRUE(same_bits(fresh.nested_absmax, w.nested_absmax)) << name;
    EXPECT_TRUE(same_bits(fresh.offset, w.offset)) << name;
    const Nf4Weight back = nf4_from_saved(nf4_to_saved(w), name);
    EXPECT_TRUE(same_bits(dequantize(back, torch::kFloat), dequantize(w, torch::kFloat))) << name;
  }
}

// Every check against the same references (made once: quant_check.py takes tens of seconds).
TEST(Quant, EqualsBitsandbytes) {
  References r;
  const int code = make_references(r);
  if (code == 77) GTEST_SKIP() << "bitsandbytes (or the venv) is not installed";
  ASSERT_EQ(code, 0) << "quant_check.py failed:\n" << text_of(r.dir->path() / "log.txt");
  // The offset is ATen's mean, whose summation order follows the thread count: the references
  // were made with one thread.
  torch::set_num_threads(1);
  check_tables(r);
  check_nf4_states(r);
  check_nf4_dequantization(r);
  check_int8(r);
  check_held_bytes(r);
  check_saved_folder(r);
}

std::string error_of(const Nf4SavedTensors& t) {
  try {
    nf4_from_saved(t, "layers.0.q_proj.weight");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Quant, BadSavedTensorsAreNamed) {
  const Nf4Weight w = quantize_nf4(torch::randn({64, 128}));
  const Nf4SavedTensors good = nf4_to_saved(w);
  Nf4SavedTensors t = good;
  t.quant_state = torch::Tensor();
  EXPECT_NE(error_of(t).find("layers.0.q_proj.weight.quant_state.bitsandbytes__nf4: missing"),
            std::string::npos)
      << error_of(t);
  t = good;
  t.absmax = t.absmax.slice(0, 1);
  EXPECT_NE(error_of(t).find(
                "layers.0.q_proj.weight.absmax: uint8 [127], expected uint8 with 128 values"),
            std::string::npos)
      << error_of(t);
  t = good;
  const std::string fp4 =
      R"({"quant_type": "fp4", "blocksize": 64, "dtype": "float32", "shape": [64, 128]})";
  t.quant_state = torch::from_blob(const_cast<char*>(fp4.data()),
                                   {static_cast<int64_t>(fp4.size())}, torch::kUInt8)
                      .clone();
  EXPECT_NE(error_of(t).find("quant_type \"fp4\": only nf4 loads"), std::string::npos)
      << error_of(t);
  t = good;
  t.quant_map = t.quant_map.flip(0);
  EXPECT_NE(error_of(t).find(".quant_map: is not bitsandbytes' NF4 table"), std::string::npos)
      << error_of(t);
}

TEST(Quant, RejectsWhatItCannotQuantize) {
  EXPECT_THROW(quantize_nf4(torch::ones({4, 64}, torch::kLong)), std::invalid_argument);
  EXPECT_THROW(quantize_nf4(torch::full({4, 64}, NAN)), std::invalid_argument);
  EXPECT_THROW(quantize_nf4(torch::ones({4, 64}), 100), std::invalid_argument);
  EXPECT_THROW(quantize_int8(torch::full({4, 64}, 1e6)), std::invalid_argument);  // beyond float16
  EXPECT_THROW(dequantize(quantize_nf4(torch::ones({4, 64})), torch::kLong), std::invalid_argument);
}

}  // namespace
}  // namespace trainer::nn::quant
