// nf4.h's saved form: the tensors transformers writes for a bitsandbytes 4-bit layer.
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>
#include <vector>

#include "nn/quant/nf4.h"

namespace trainer::nn::quant {
namespace {

using nlohmann::json;

std::string type_text(torch::ScalarType t) {
  switch (t) {
    case torch::kUInt8:
      return "uint8";
    case torch::kFloat:
      return "float32";
    case torch::kBFloat16:
      return "bfloat16";
    case torch::kHalf:
      return "float16";
    default:
      return c10::toString(t);
  }
}

std::string shape_text(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

[[noreturn]] void fail(const std::string& name, const std::string& suffix,
                       const std::string& what) {
  throw std::invalid_argument(
      name + suffix + ": " + what +
      " (bitsandbytes' 4-bit checkpoints hold what transformers' save_pretrained "
      "writes for BitsAndBytesConfig(load_in_4bit=True))");
}

void expect(const torch::Tensor& t, const std::string& name, const std::string& suffix,
            torch::ScalarType dtype, int64_t numel) {
  if (!t.defined()) fail(name, suffix, "missing");
  if (t.scalar_type() != dtype || t.numel() != numel)
    fail(name, suffix,
         type_text(t.scalar_type()) + " " + shape_text(t) + ", expected " + type_text(dtype) +
             " with " + std::to_string(numel) + " values");
}

torch::ScalarType dtype_named(const std::string& s, const std::string& name) {
  if (s == "float32") return torch::kFloat;
  if (s == "bfloat16") return torch::kBFloat16;
  if (s == "float16") return torch::kHalf;
  fail(name, ".quant_state.bitsandbytes__nf4",
       "dtype \"" + s + "\" is not float32, bfloat16 or float16");
}

std::string dtype_name(torch::ScalarType t) {
  return t == torch::kBFloat16 ? "bfloat16" : t == torch::kHalf ? "float16" : "float32";
}

json state_json(const torch::Tensor& t, const std::string& name) {
  const std::string suffix = ".quant_state.bitsandbytes__nf4";
  if (!t.defined())
    fail(name, suffix, "missing (an fp4 layer has .quant_state.bitsandbytes__fp4: only nf4 loads)");
  if (t.scalar_type() != torch::kUInt8 || t.dim() != 1)
    fail(name, suffix, "not a uint8 vector of JSON bytes");
  const torch::Tensor c = t.contiguous().cpu();
  const std::string text(reinterpret_cast<const char*>(c.data_ptr<uint8_t>()), c.numel());
  try {
    return json::parse(text);
  } catch (const std::exception&) {
    fail(name, suffix, "not JSON: " + text.substr(0, 80));
  }
}

// Reads the JSON's fields into `w` (blocksize, shape, dtype, nested settings and offset).
void read_state(const json& j, Nf4Weight& w, const std::string& name) {
  const std::string suffix = ".quant_state.bitsandbytes__nf4";
  try {
    if (j.at("quant_type").get<std::string>() != "nf4")
      fail(name, suffix,
           "quant_type \"" + j.at("quant_type").get<std::string>() + "\": only nf4 loads");
    w.blocksize = j.at("blocksize").get<int64_t>();
    w.shape = j.at("shape").get<std::vector<int64_t>>();
    w.dtype = dtype_named(j.at("dtype").get<std::string>(), name);
    if (j.contains("nested_offset")) {
      w.nested_blocksize = j.at("nested_blocksize").get<int64_t>();
      if (j.value("nested_dtype", std::string("float32")) != "float32")
        fail(name, suffix, "nested_dtype is not float32");
      w.offset = torch::tensor(static_cast<float>(j.at("nested_offset").get<double>()));
    }
  } catch (const json::exception& e) {
    fail(name, suffix, std::string("a key is missing or of the wrong type (") + e.what() + ")");
  }
  if (w.blocksize < 32 || w.blocksize > 4096 || (w.blocksize & (w.blocksize - 1)) != 0)
    fail(name, suffix,
         "blocksize " + std::to_string(w.blocksize) + " is not a power of two from 32 to 4096");
  if (w.offset.defined() && w.nested_blocksize <= 0)
    fail(name, suffix, "nested_blocksize is not positive");
}

}  // namespace

const std::vector<std::string>& nf4_saved_suffixes() {
  static const std::vector<std::string> s = {"",
                                             ".absmax",
                                             ".quant_map",
                                             ".nested_absmax",
                                             ".nested_quant_map",
                                             ".quant_state.bitsandbytes__nf4"};
  return s;
}

Nf4Weight nf4_from_saved(const Nf4SavedTensors& t, const std::string& name) {
  Nf4Weight w;
  read_state(state_json(t.quant_state, name), w, name);
  const int64_t n = w.numel();
  if (!t.weight.defined()) fail(name, "", "missing");
  // bnb_4bit_quant_storage other than uint8 stores the same bytes under another dtype.
  const torch::Tensor bytes = t.weight.contiguous().view(torch::kUInt8).view({-1, 1});
  expect(bytes, name, "", torch::kUInt8, (n + 1) / 2);
  w.packed = bytes;
  const bool nested = w.offset.defined();
  expect(t.absmax, name, ".absmax", nested ? torch::kUInt8 : torch::kFloat, w.blocks());
  w.absmax = t.absmax.view(-1);
  expect(t.quant_map, name, ".quant_map", torch::kFloat, 16);
  // bitsandbytes dequantizes with its own table whatever quant_map holds: a different one would
  // give other weights here than there.
  if (!torch::equal(t.quant_map.cpu().view(-1), nf4_code()))
    fail(name, ".quant_map", "is not bitsandbytes' NF4 table");
  w.code = t.quant_map.view(-1);
  if (nested) {
    const int64_t nested_blocks = (w.blocks() + w.nested_blocksize - 1) / w.nested_blocksize;
    expect(t.nested_absmax, name, ".nested_absmax", torch::kFloat, nested_blocks);
    expect(t.nested_quant_map, name, ".nested_quant_map", torch::kFloat, 256);
    w.nested_absmax = t.nested_absmax.view(-1);
    w.nested_code = t.nested_quant_map.view(-1);
    w.offset = w.offset.to(w.absmax.device());
  } else if (t.nested_absmax.defined() || t.nested_quant_map.defined()) {
    fail(name, ".nested_absmax", "present, but the quant state has no nested_offset");
  }
  return w;
}

Nf4SavedTensors nf4_to_saved(const Nf4Weight& w) {
  json j = {{"quant_type", "nf4"},
            {"blocksize", w.blocksize},
            {"dtype", dtype_name(w.dtype)},
            {"shape", w.shape}};
  Nf4SavedTensors t;
  t.weight = w.packed;
  t.absmax = w.absmax;
  t.quant_map = w.code;
  if (w.nested()) {
    j["nested_blocksize"] = w.nested_blocksize;
    j["nested_dtype"] = "float32";
    j["nested_offset"] = static_cast<double>(w.offset.item<float>());
    t.nested_absmax = w.nested_absmax;
    t.nested_quant_map = w.nested_code;
  }
  const std::string text = j.dump();
  t.quant_state = torch::from_blob(const_cast<char*>(text.data()),
                                   {static_cast<int64_t>(text.size())}, torch::kUInt8)
                      .clone();
  return t;
}

}  // namespace trainer::nn::quant
