// NF4 weights as bitsandbytes 0.50 stores them (QLoRA's frozen base), equal to
// `bitsandbytes.functional.quantize_4bit(w, blocksize=64, quant_type="nf4",
// compress_statistics=True)` bit for bit, and `dequantize_4bit` likewise (tests/quant_check.py,
// Quant.* in tests/test_quant.cpp hold it against the installed bitsandbytes).
//
// Quantization (bitsandbytes/backends/default/ops.py, `quantize_4bit`, the path every device
// without a 4-bit kernel of its own takes, the CPU included):
//   - the weight, flattened row-major and cast to float32, is cut into blocks of `blocksize`; a
//     ragged last block is its own block. absmax = max |x| of each block;
//   - x is scaled into [-1, 1]: x * (1 / max(absmax, 1e-38)) for whole blocks (the reciprocal
//     rounded first), x / max(absmax, 1e-38) for the ragged block, then clamped. An all-zero
//     block keeps absmax 0 when whole, 1e-38 (as float32) when it is the ragged block;
//   - the code is the index of the nearest NF4 value: the number of midpoints
//     (code[i] + code[i+1]) / 2 strictly below the scaled value, so a value on a midpoint takes
//     the lower code (torch.bucketize, right=False);
//   - two codes a byte: element 2i in the high nibble, 2i+1 in the low nibble; an odd count is
//     padded with code 7 (the value 0 scaled, bucketized). Packed shape [(numel + 1) / 2, 1].
// Double quantization of the absmax (`compress_statistics`):
//   - offset = mean(absmax) (float32, ATen's mean: its summation order depends on the number of
//     intra-op threads once there are more than 32768 blocks, so the offset equals bitsandbytes'
//     computed with the same thread count);
//   - absmax - offset is quantized to 8 bits in blocks of 256 with bitsandbytes' signed "dynamic"
//     map (create_dynamic_map(), 256 values) by its CPU kernel (csrc/cpu_ops.cpp,
//     quantize_cpu_impl): per block m = max |a|; an all-zero block gives codes 0; otherwise
//     v = clamp(a * (1 / m), -1, 1), i = trunc(fma((v + 1) * 0.5, 65535, 0.5)) and the code is
//     lut[i], where lut[i] = the number of midpoints of the map strictly below
//     (2i) / 65535 - 1 (all float32). This is a 65536-bin approximation of nearest-value
//     rounding, not nearest itself; equality with bitsandbytes needs the same table.
// Dequantization (bitsandbytes' CPU kernels, cdequantize_blockwise_cpu_fp32 and
// cdequantize_blockwise_cpu_nf4_*; the default path for odd last dimensions is the same
// arithmetic): absmax = dynamic[q] * nested_absmax + offset (float32), then
// w = nf4[code] * absmax (float32) rounded once to the output dtype (round to nearest even).
//
// All functions here are torch operations on the tensors' device (no per-element C++ loops), so
// they run wherever the weight is; CUDA kernels for the dequantization are a later addition.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace trainer::nn::quant {

// bitsandbytes' NF4 table (functional.get_4bit_type("nf4")): 16 float32 values, -1 ... 1.
torch::Tensor nf4_code(const torch::Device& device = torch::kCPU);

// bitsandbytes' signed 8-bit "dynamic" map (functional.create_dynamic_map()): 256 float32 values
// in ascending order, computed as it computes them.
torch::Tensor dynamic_code(const torch::Device& device = torch::kCPU);

// A weight held in NF4 with its quantization state (bitsandbytes' QuantState).
struct Nf4Weight {
  torch::Tensor packed;         // uint8 [(numel + 1) / 2, 1], two codes a byte, high first
  torch::Tensor absmax;         // double-quantized: uint8 [blocks]; else float32 [blocks]
  torch::Tensor nested_absmax;  // float32 [ceil(blocks / nested_blocksize)]; undefined if not
  torch::Tensor nested_code;    // float32 [256], the map of absmax's codes; undefined if not
  torch::Tensor offset;         // float32, 0-dim: mean of the absmax; undefined if not nested
  torch::Tensor code;           // float32 [16], the NF4 table (bnb's quant_map)
  int64_t blocksize = 64;
  int64_t nested_blocksize = 256;
  std::vector<int64_t> shape;               // of the weight, [out, in] for a linear layer
  torch::ScalarType dtype = torch::kFloat;  // the weight's dtype when it was quantized

  bool nested() const { return nested_absmax.defined(); }
  int64_t numel() const;
  int64_t blocks() const { return (numel() + blocksize - 1) / blocksize; }
  // Bytes of every tensor above (the tables included), measured from the tensors themselves.
  int64_t held_bytes() const;
  // The same weight with every tensor on `device`.
  Nf4Weight to(const torch::Device& device) const;
};

// `w` (float32, bfloat16 or float16, any shape, finite) in NF4 with blocks of `blocksize`
// (32 ... 4096, a power of two, as bitsandbytes allows) and, when `double_quant`, its absmax
// quantized in blocks of 256. On w's device. Throws std::invalid_argument on other input.
Nf4Weight quantize_nf4(const torch::Tensor& w, int64_t blocksize = 64, bool double_quant = true);

// The float32 absmax of each block, restored from its double quantization when nested.
torch::Tensor restore_absmax(const Nf4Weight& w);

// The weight [shape] in `out` (float32, bfloat16 or float16), on the weight's device:
// bitsandbytes' dequantize_4bit with quant_state.dtype = out.
torch::Tensor dequantize(const Nf4Weight& w, torch::ScalarType out);

// The tensors transformers saves for a bitsandbytes 4-bit linear layer `P` (save_pretrained of a
// model loaded with BitsAndBytesConfig(load_in_4bit=True, ...); checked against transformers
// 4.57.6 + bitsandbytes 0.50.2), under these names:
//   P.weight                               uint8 [(numel + 1) / 2, 1] packed codes (another
//                                          dtype when bnb_4bit_quant_storage is not uint8: the
//                                          same bytes)
//   P.weight.absmax                        uint8 [blocks] (nested) or float32 [blocks]
//   P.weight.quant_map                     float32 [16], the NF4 table
//   P.weight.nested_absmax                 float32 [ceil(blocks / 256)] (nested only)
//   P.weight.nested_quant_map              float32 [256], the dynamic map (nested only)
//   P.weight.quant_state.bitsandbytes__nf4 uint8 [bytes]: UTF-8 JSON (QuantState.as_dict,
//                                          utils.pack_dict_to_tensor), e.g.
//     {"quant_type": "nf4", "blocksize": 64, "dtype": "float16", "shape": [64, 96],
//      "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.0519943237}
// "dtype" is the dtype the weight had when quantized (float16 when from_pretrained was given no
// torch_dtype): bitsandbytes dequantizes into it before casting to the compute dtype. The
// layer's bias, the norms, embeddings and the output layer are saved unquantized.
struct Nf4SavedTensors {
  torch::Tensor weight, absmax, quant_map, nested_absmax, nested_quant_map, quant_state;
};

// The suffixes above after "P.weight" ("", ".absmax", ...), in Nf4SavedTensors' order.
const std::vector<std::string>& nf4_saved_suffixes();

// The weight those tensors hold, as saved (no re-quantization). `name` (the parameter's name,
// e.g. "model.layers.0.mlp.down_proj.weight") is in every error: std::invalid_argument naming
// the tensor, what is wrong and what bitsandbytes would have written.
Nf4Weight nf4_from_saved(const Nf4SavedTensors& t, const std::string& name);

// The tensors of nf4_from_saved's input for `w` (as transformers would save them), with the
// suffixes of nf4_saved_suffixes(); nested_* left undefined when `w` is not nested.
Nf4SavedTensors nf4_to_saved(const Nf4Weight& w);

}  // namespace trainer::nn::quant
