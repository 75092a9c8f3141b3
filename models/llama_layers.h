// The layers of the `llama` model (models/llama.cpp): its options, RMSNorm, rotary embeddings,
// grouped-query attention, the SwiGLU MLP and the pre-norm block, with transformers' names and
// arithmetic (modeling_llama.py, modeling_qwen2.py, modeling_qwen3.py).
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "models/builtin.h"
#include "nn/fused/fused_ops.h"
#include "nn/fused/fused_rotary_ops.h"

namespace trainer::models::llama {

// The `model.` keys of llama. Those shared with gpt (n_layer, n_head, n_embd, block_size,
// vocab_size, tie_embeddings) have gpt's defaults: config.yaml lists a shared key once.
struct LlamaOptions {
  int64_t n_layer = 12;                  // transformer blocks
  int64_t n_head = 12;                   // query heads
  int64_t n_kv_head = 0;                 // key/value heads (grouped-query attention); 0 = n_head
  int64_t n_embd = 768;                  // hidden width
  int64_t head_dim = 0;                  // width of a head; 0 = n_embd / n_head
  int64_t intermediate_size = 2048;      // the SwiGLU MLP's hidden width
  int64_t block_size = 1024;             // context length in tokens (max_position_embeddings)
  int64_t vocab_size = 50257;            // vocabulary size; 0 = the data's class count
  double rms_norm_eps = 1e-5;            // epsilon of every RMSNorm
  double rope_theta = 10000.0;           // base of the rotary embeddings' wavelengths
  std::string rope_scaling = "none";     // none | llama3 (Llama 3.1's frequency scaling)
  double rope_factor = 8.0;              // llama3: long wavelengths divided by this
  double rope_low_freq_factor = 1.0;     // llama3: wavelengths above context / this are scaled
  double rope_high_freq_factor = 4.0;    // llama3: wavelengths below context / this are kept
  int64_t rope_original_context = 8192;  // llama3: the context the model was pretrained with
  bool qkv_bias = false;                 // biases in q_proj, k_proj and v_proj (Qwen 2)
  bool qk_norm = false;                  // per-head RMSNorm of queries and keys (Qwen 3)
  bool tie_embeddings = true;            // lm_head's weight is model.embed_tokens'
  std::string fused_kernels = "off";  // auto (fused kernels on a GPU) | on (also the CPU's) | off:
                                      // as gpt's, whose checks cover it

  template <class V>
  void visit(V& v) {
    v("n_layer", n_layer);
    v("n_head", n_head);
    v("n_kv_head", n_kv_head);
    v("n_embd", n_embd);
    v("head_dim", head_dim);
    v("intermediate_size", intermediate_size);
    v("block_size", block_size);
    v("vocab_size", vocab_size);
    v("rms_norm_eps", rms_norm_eps);
    v("rope_theta", rope_theta);
    v("rope_scaling", rope_scaling);
    v("rope_factor", rope_factor);
    v("rope_low_freq_factor", rope_low_freq_factor);
    v("rope_high_freq_factor", rope_high_freq_factor);
    v("rope_original_context", rope_original_context);
    v("qkv_bias", qkv_bias);
    v("qk_norm", qk_norm);
    v("tie_embeddings", tie_embeddings);
    v("fused_kernels", fused_kernels);
  }
  // The keys llama alone declares (gpt checks the shared ones; the sizes that depend on both are
  // checked when the model is built).
  void validate(config::Checks& c) const {
    c.at_least("n_kv_head", n_kv_head, 0);
    if (n_kv_head >= 1 && n_head >= 1 && n_head % n_kv_head != 0) {
      c.add("n_kv_head", "must divide model.n_head (" + std::to_string(n_head) + "), got " +
                             std::to_string(n_kv_head));
    }
    c.at_least("head_dim", head_dim, 0);
    if (head_dim % 2 != 0) c.add("head_dim", "must be even (rotary embeddings rotate pairs)");
    c.at_least("intermediate_size", intermediate_size, 1);
    c.above("rms_norm_eps", rms_norm_eps, 0.0);
    c.above("rope_theta", rope_theta, 0.0);
    c.one_of("rope_scaling", rope_scaling, {"none", "llama3"});
    c.above("rope_factor", rope_factor, 0.0);
    c.above("rope_low_freq_factor", rope_low_freq_factor, 0.0);
    if (rope_high_freq_factor <= rope_low_freq_factor) {
      c.add("rope_high_freq_factor", "must be above model.rope_low_freq_factor (" +
                                         std::to_string(rope_low_freq_factor) + ")");
    }
    c.at_least("rope_original_context", rope_original_context, 1);
  }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t head_width() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  // Whether RMSNorm, SwiGLU and the rotary embeddings take the fused kernels (nn/fused/fused_ops.h,
  // nn/fused/fused_rotary_ops.h) where their tensors allow (CUDA).
  bool fused() const { return fused_kernels != "off"; }
};

// The rotary embeddings' inverse frequencies [head_dim / 2] (float32), as transformers'
// _compute_default_rope_parameters and _compute_llama3_parameters compute them, operation for
// operation.
inline torch::Tensor inverse_frequencies(const LlamaOptions& o) {
  const int64_t dim = o.head_width();
  const auto exponents =
      torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / static_cast<double>(dim);
  auto inv_freq = torch::pow(o.rope_theta, exponents).reciprocal();  // [dim / 2]
  if (o.rope_scaling != "llama3") return inv_freq;
  const double factor = o.rope_factor, low = o.rope_low_freq_factor, high = o.rope_high_freq_factor;
  const auto context = static_cast<double>(o.rope_original_context);
  const double low_freq_wavelen = context / low, high_freq_wavelen = context / high;
  const auto wavelen = inv_freq.reciprocal() * (2 * M_PI);
  // Long wavelengths divided by the factor, short ones kept, those between interpolated.
  auto scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
  const auto smooth = (wavelen.reciprocal() * context - low) / (high - low);
  const auto smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
  const auto medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return torch::where(medium, smoothed, scaled);
}

// The rotation of positions [start, start + T), in the dtype of the embeddings (transformers
// computes cos and sin in float32 and casts them to its hidden states'): cos [T, 1, head_dim] and
// sin [T, 1, head_dim] with its first half negated (what rotate() multiplies by); of packed rows'
// positions [B, T] (data::Batch::positions), each token's own: [B, T, 1, head_dim] each.
// With model.fused_kernels on a CUDA device the rotation is `tables` instead (cos and sin
// undefined): every position's float32 cos and sin, and the row each token reads, for the fused
// kernel (nn/fused/fused_rotary_ops.h).
struct Rope {
  Rope() = default;
  Rope(torch::Tensor cos_, torch::Tensor sin_) : cos(std::move(cos_)), sin(std::move(sin_)) {}

  torch::Tensor cos, sin;
  nn::RotaryTables tables;
};

// The Rope of the cosines and sines [..., head_dim / 2] (float32) of the tokens' angles, cast to
// `dtype`: [..., 1, head_dim] each.
inline Rope rope_of(const torch::Tensor& cos, const torch::Tensor& sin, torch::ScalarType dtype) {
  return Rope{torch::cat({cos, cos}, /*dim=*/-1).to(dtype).unsqueeze(-2),
              torch::cat({-sin, sin}, /*dim=*/-1).to(dtype).unsqueeze(-2)};
}

// The rows of `tables` that T tokens read, as the Rope above: [T, 1, hd] or [B, T, 1, hd] each.
inline Rope rope_of(const nn::RotaryTables& tables, int64_t T) {
  const auto& p = tables.positions;
  auto rows = [&](const torch::Tensor& table) {  // [T, hd / 2] or [B, T, hd / 2]
    return p.defined() ? table.index_select(0, p.flatten()).view({p.size(0), T, -1})
                       : table.narrow(0, tables.start, T);
  };
  return rope_of(rows(tables.cos), rows(tables.sin), tables.dtype);
}

// q or k [B, T, H, hd] rotated as transformers' apply_rotary_pos_emb rotates them, x * cos +
// rotate_half(x) * sin with rotate_half(x) = [-x2, x1]: here [x2, x1] times the half-negated sin,
// the same products without a negation pass. The rotation broadcasts ([T, 1, hd] or
// [B, T, 1, hd]).
inline torch::Tensor rotate(const torch::Tensor& x, const Rope& rope) {
  const int64_t half = x.size(-1) / 2;
  const auto swapped = torch::cat({x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * rope.cos + swapped * rope.sin;  // [B, T, H, hd]
}

// q [B, T, nh, hd] and k [B, T, nkv, hd] rotated by `rope`: by the fused kernel in one pass when
// rope holds its tables and the kernel takes q and k, else by rotate(). Each [B, T, h, hd].
inline std::pair<torch::Tensor, torch::Tensor> rotate_qk(const torch::Tensor& q,
                                                         const torch::Tensor& k, const Rope& rope) {
  if (!rope.tables.cos.defined()) return {rotate(q, rope), rotate(k, rope)};
  if (nn::fused_rotary_supports(q, k, rope.tables)) return nn::fused_rotary(q, k, rope.tables);
  const Rope aten = rope_of(rope.tables, q.size(1));
  return {rotate(q, aten), rotate(k, aten)};
}

// transformers' LlamaRMSNorm: x / sqrt(mean(x^2) + eps) in float32, cast back, times the weight.
// `fused`: on a CUDA device one kernel each way (nn/fused/fused_ops.h), the same arithmetic.
class LlamaRmsNormImpl : public torch::nn::Module {
 public:
  LlamaRmsNormImpl(int64_t dim, double eps, bool fused = false) : eps_(eps), fused_(fused) {
    weight = register_parameter("weight", torch::ones({dim}));
  }

  torch::Tensor forward(const torch::Tensor& x) { return normalize(x, weight); }

  // forward() multiplying by `w` [D] (the weight as the caller passes it on: under tensor
  // parallelism a per-head norm's weight through nn::TensorParallel::copy_in).
  torch::Tensor normalize(const torch::Tensor& x, const torch::Tensor& w) const {
    // x: [..., D]
    if (fused_ && nn::fused_rms_norm_supports(x, w)) {
      return nn::fused_rms_norm(x, w, eps_);  // [..., D]
    }
    // In float32 the same operations as at::rms_norm's (one fused kernel on CUDA).
    if (x.scalar_type() == torch::kFloat && w.scalar_type() == torch::kFloat) {
      return at::rms_norm(x, {w.size(0)}, w, eps_);
    }
    const auto x32 = x.to(torch::kFloat);
    const auto normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps_);
    return w * normed.to(x.scalar_type());  // [..., D]
  }

  // {x + residual, forward(x + residual)}: the sum for the next residual and its norm, [..., D]
  // each; with `fused` on a CUDA device the add and the norm are one kernel.
  std::pair<torch::Tensor, torch::Tensor> forward_add(const torch::Tensor& x,
                                                      const torch::Tensor& residual) {
    if (fused_ && nn::fused_add_rms_norm_supports(x, residual, weight)) {
      return nn::fused_add_rms_norm(x, residual, weight, eps_);
    }
    auto sum = x + residual;  // [..., D]
    return {sum, forward(sum)};
  }

  void pretty_print(std::ostream& stream) const override {
    stream << "RMSNorm(" << weight.size(0) << ", eps=" << eps_ << ")";
  }

  torch::Tensor weight;

 private:
  double eps_;
  bool fused_;
};
TORCH_MODULE(LlamaRmsNorm);

// A linear layer that LoRA may adapt (nn/lora.h).
inline nn::Linear linear(int64_t in, int64_t out, bool bias) {
  return nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// Causal self-attention with n_kv_head key/value heads, or block-causal with a mask [B, 1, T, T]
// (packed rows: models/builtin.h's block_causal_mask; every head takes it). With tensor
// parallelism (`tp`) this rank computes its n_head / tp query heads and n_kv_head / tp key/value
// heads (q/k/v_proj column-parallel, o_proj row-parallel): nh', nkv' below. The per-head norms
// (qk_norm) stay whole on every rank: their weights' gradients are summed over the group.
class LlamaAttentionImpl : public torch::nn::Module {
 public:
  explicit LlamaAttentionImpl(const LlamaOptions& o)
      : head_dim_(o.head_width()), grouped_(o.kv_heads() != o.n_head) {
    const int64_t q_width = o.n_head * head_dim_, kv_width = o.kv_heads() * head_dim_;
    q_proj = register_module("q_proj", linear(o.n_embd, q_width, o.qkv_bias));
    k_proj = register_module("k_proj", linear(o.n_embd, kv_width, o.qkv_bias));
    v_proj = register_module("v_proj", linear(o.n_embd, kv_width, o.qkv_bias));
    o_proj = register_module("o_proj", linear(q_width, o.n_embd, /*bias=*/false));
    if (o.qk_norm) {
      q_norm = register_module("q_norm", LlamaRmsNorm(head_dim_, o.rms_norm_eps, o.fused()));
      k_norm = register_module("k_norm", LlamaRmsNorm(head_dim_, o.rms_norm_eps, o.fused()));
    }
  }

  torch::Tensor forward(const torch::Tensor& x, const Rope& rope, const torch::Tensor& mask = {}) {
    // x: [B, T, C]; mask: [B, 1, T, T] bool (true: attends) or undefined (causal)
    const int64_t B = x.size(0), T = x.size(1);
    auto [q, k, v] = project_in(x, rope);  // [B, nh', T, hd], [B, nkv', T, hd] x 2
    auto y = attend(q, k, v, /*causal=*/!mask.defined(), mask);           // [B, nh', T, hd]
    return project_out(y.transpose(1, 2).contiguous().view({B, T, -1}));  // [B, T, C]
  }

  // Decoding: x [B, T, C] the new positions after those whose rotated keys and values `cache`
  // holds ([B, nkv', P, hd] each, undefined when none), which grows by them. T > 1 only when it
  // is empty.
  torch::Tensor forward_cached(const torch::Tensor& x, const Rope& rope,
                               std::pair<torch::Tensor, torch::Tensor>& cache) {
    const int64_t B = x.size(0), T = x.size(1);
    auto [q, k_new, v_new] = project_in(x, rope);
    auto& [k, v] = cache;
    const bool first = !k.defined();
    k = first ? k_new : torch::cat({k, k_new}, /*dim=*/2);                // [B, nkv', P+T, hd]
    v = first ? v_new : torch::cat({v, v_new}, /*dim=*/2);                // [B, nkv', P+T, hd]
    auto y = attend(q, k, v, /*causal=*/first);                           // [B, nh', T, hd]
    return project_out(y.transpose(1, 2).contiguous().view({B, T, -1}));  // [B, T, C]
  }

  nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  LlamaRmsNorm q_norm{nullptr}, k_norm{nullptr};  // qk_norm only
  std::shared_ptr<nn::TensorParallel> tp;         // the group the projections split over

 private:
  // The queries, keys and values of x [B, T, C] by head, q/k normalised where qk_norm says and
  // rotated: [B, nh', T, hd], [B, nkv', T, hd], [B, nkv', T, hd]. Under tp the input's gradient is
  // summed over the group once for the three.
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> project_in(const torch::Tensor& x,
                                                                     const Rope& rope) {
    const auto in = tp ? tp->copy_in(x) : x;
    auto q = heads(apply_column(q_proj, tp, x, in));  // [B, T, h, hd]
    auto k = heads(apply_column(k_proj, tp, x, in));
    if (q_norm) {
      q = per_head_norm(q_norm, q);
      k = per_head_norm(k_norm, k);
    }
    std::tie(q, k) = rotate_qk(q, k, rope);
    return {q.transpose(1, 2), k.transpose(1, 2),
            heads(apply_column(v_proj, tp, x, in)).transpose(1, 2)};
  }
  // The per-head RMSNorm `norm` of t [B, T, h, hd]. Under tp t holds this rank's heads only,
  // while the weight [hd], whole on every rank, scales every head: it enters through copy_in, so
  // that its gradient is the sum of all the group's heads', as one process computes it.
  torch::Tensor per_head_norm(const LlamaRmsNorm& norm, const torch::Tensor& t) const {
    return norm->normalize(t, tp ? tp->copy_in(norm->weight) : norm->weight);
  }
  // [B, T, h * hd] -> [B, T, h, hd]
  torch::Tensor heads(const torch::Tensor& t) const {
    return t.view({t.size(0), t.size(1), -1, head_dim_});
  }
  // Scaled dot-product attention, 1 / sqrt(hd), the key/value heads shared by groups of query
  // heads without being repeated, causal or under `mask` (undefined: none): [B, nh', T, hd].
  torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       bool causal, const torch::Tensor& mask = {}) const {
    const std::optional<torch::Tensor> attn_mask =
        mask.defined() ? std::optional<torch::Tensor>(mask) : std::nullopt;
    return at::scaled_dot_product_attention(q, k, v, attn_mask, /*dropout_p=*/0.0, causal,
                                            /*scale=*/std::nullopt, /*enable_gqa=*/grouped_);
  }
  // o_proj, row-parallel under tp: [B, T, nh' * hd] -> [B, T, C]
  torch::Tensor project_out(const torch::Tensor& y) {
    return tp ? o_proj->row_parallel(*tp, y) : apply_linear(o_proj, y);
  }

  int64_t head_dim_;
  bool grouped_;
};
TORCH_MODULE(LlamaAttention);

// SwiGLU: down(silu(gate(x)) * up(x)). Under tp gate and up are column-parallel and down
// row-parallel: this rank computes I' = intermediate_size / tp of the hidden units. With
// model.fused_kernels on a CUDA device silu(gate) * up is one kernel each way
// (nn/fused/fused_ops.h).
class LlamaMlpImpl : public torch::nn::Module {
 public:
  explicit LlamaMlpImpl(const LlamaOptions& o) : fused_(o.fused()) {
    gate_proj = register_module("gate_proj", linear(o.n_embd, o.intermediate_size, false));
    up_proj = register_module("up_proj", linear(o.n_embd, o.intermediate_size, false));
    down_proj = register_module("down_proj", linear(o.intermediate_size, o.n_embd, false));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    // x: [B, T, C]
    const auto in = tp ? tp->copy_in(x) : x;
    const auto gate = apply_column(gate_proj, tp, x, in);  // [B, T, I']
    const auto up = apply_column(up_proj, tp, x, in);      // [B, T, I']
    const auto h = fused_ && nn::fused_swiglu_supports(gate, up) ? nn::fused_swiglu(gate, up)
                                                                 : torch::silu(gate) * up;
    return tp ? down_proj->row_parallel(*tp, h) : apply_linear(down_proj, h);  // [B, T, C]
  }

  nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  std::shared_ptr<nn::TensorParallel> tp;  // the group the projections split over; null: whole

 private:
  bool fused_;
};
TORCH_MODULE(LlamaMlp);

// transformers' LlamaDecoderLayer.
class LlamaBlockImpl : public torch::nn::Module {
 public:
  explicit LlamaBlockImpl(const LlamaOptions& o) {
    self_attn = register_module("self_attn", LlamaAttention(o));
    mlp = register_module("mlp", LlamaMlp(o));
    input_layernorm =
        register_module("input_layernorm", LlamaRmsNorm(o.n_embd, o.rms_norm_eps, o.fused()));
    post_attention_layernorm = register_module("post_attention_layernorm",
                                               LlamaRmsNorm(o.n_embd, o.rms_norm_eps, o.fused()));
  }

  // mask: packed rows' block-causal mask [B, 1, T, T], or undefined (causal).
  torch::Tensor forward(torch::Tensor x, const Rope& rope, const torch::Tensor& mask = {}) {
    // x: [B, T, C]; the attention's residual add and the norm after it are one kernel where
    // fused: h = x + attn(...), [B, T, C] each.
    auto [h, normed] = post_attention_layernorm->forward_add(
        x, self_attn->forward(input_layernorm->forward(x), rope, mask));
    return h + mlp->forward(normed);  // [B, T, C]
  }

  torch::Tensor forward_cached(torch::Tensor x, const Rope& rope,
                               std::pair<torch::Tensor, torch::Tensor>& cache) {
    auto [h, normed] = post_attention_layernorm->forward_add(
        x, self_attn->forward_cached(input_layernorm->forward(x), rope, cache));  // [B, T, C] x 2
    return h + mlp->forward(normed);                                              // [B, T, C]
  }

  LlamaAttention self_attn{nullptr};
  LlamaMlp mlp{nullptr};
  LlamaRmsNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(LlamaBlock);

}  // namespace trainer::models::llama
