// llama: the decoder-only transformer of Llama 3.x, Qwen 2/2.5/3 and Mistral-style dense models,
// with Hugging Face Transformers' module tree and parameter names (LlamaForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM), so that their safetensors load by name.
//
// Input: token ids [B, T] (int64, T <= block_size). Output: next-token logits [B, T, vocab].
// Pre-norm blocks, x + attn(input_layernorm(x)) then x + mlp(post_attention_layernorm(x)), as
// transformers computes them: RMSNorm in float32, cast back to the input's dtype before the weight
// multiply; rotary position embeddings in the rotate-half layout (rope_theta, optionally scaled
// as Llama 3.1's `llama3` rope_scaling), their cos and sin in float32; grouped-query attention
// (n_kv_head key/value heads shared by n_head / n_kv_head query heads each) through
// scaled_dot_product_attention's enable_gqa, which repeats no keys or values; a SwiGLU MLP,
// down(silu(gate(x)) * up(x)); q/k/v biases (Qwen 2's) and a per-head RMSNorm of queries and keys
// before the rotation (Qwen 3's) optional; head_dim independent of n_embd / n_head. No dropout.
//
// lm_head's weight is model.embed_tokens.weight when tied (model.tie_embeddings): one tensor under
// both names, as gpt ties. A Hugging Face file of a tied model has no lm_head.weight: loading
// fills it from model.embed_tokens.weight (models/llama_hf.cpp, the model's Hugging Face layout).
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/builtin.h"
#include "models/decoder.h"
#include "models/llama_layers.h"
#include "nn/deferred_init.h"
#include "nn/init_replay.h"
#include "nn/parameters.h"

namespace trainer::models {
namespace {

using llama::inverse_frequencies;
using llama::LlamaAttention;
using llama::LlamaBlock;
using llama::LlamaOptions;
using llama::LlamaRmsNorm;
using llama::Rope;

// Where a deferred parameter lives: the meta device for a planned model, else the CPU.
torch::TensorOptions deferred_options() {
  return torch::TensorOptions().device(nn::shapes_only() ? torch::kMeta : torch::kCPU);
}

// transformers' LlamaModel: embeddings, the blocks `layers`, the final norm.
class LlamaStackImpl : public torch::nn::Module {
 public:
  LlamaStackImpl(const LlamaOptions& o, int64_t vocab) {
    // nn::deferred_init(): the embedding's weight never written, each block's parameters given
    // fresh unwritten memory as soon as the block is built (its layers' draws freed at once);
    // under nn::shapes_only() both on the meta device (the blocks' linear layers never allocate).
    const bool deferred = nn::deferred_init();
    auto embedding = torch::nn::EmbeddingOptions(vocab, o.n_embd);
    if (deferred) embedding._weight(torch::empty({vocab, o.n_embd}, deferred_options()));
    embed_tokens = register_module("embed_tokens", torch::nn::Embedding(embedding));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < o.n_layer; ++i) {
      blocks.push_back(LlamaBlock(o));
      layers->push_back(blocks.back());
      if (nn::shapes_only()) {
        nn::move_to_meta(*blocks.back());
      } else if (deferred) {
        for (auto& p : blocks.back()->parameters()) p.set_data(torch::empty_like(p));
      } else if (nn::replaying()) {
        nn::release_matrices(*blocks.back());
      }
    }
    norm = register_module("norm", LlamaRmsNorm(o.n_embd, o.rms_norm_eps, o.fused()));
  }

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<LlamaBlock> blocks;  // the modules in layers, typed
  LlamaRmsNorm norm{nullptr};
};
TORCH_MODULE(LlamaStack);

// The sizes a model of options `o` reading `input` needs; ModelError naming the key otherwise.
void check_options(const LlamaOptions& o, const InputSpec& input) {
  if (o.n_layer <= 0) throw ModelError("model.n_layer", "llama needs n_layer > 0");
  if (o.n_head <= 0) throw ModelError("model.n_head", "llama needs n_head > 0");
  if (o.block_size <= 0) throw ModelError("model.block_size", "llama needs block_size > 0");
  if (o.n_embd <= 0) throw ModelError("model.n_embd", "llama needs n_embd > 0");
  if (o.head_dim == 0 && o.n_embd % o.n_head != 0) {
    throw ModelError("model.head_dim", "n_embd (" + std::to_string(o.n_embd) +
                                           ") is not a multiple of n_head (" +
                                           std::to_string(o.n_head) + "); set model.head_dim");
  }
  if (o.head_width() % 2 != 0) {
    throw ModelError("model.head_dim", "the head width " + std::to_string(o.head_width()) +
                                           " must be even (rotary embeddings rotate pairs)");
  }
  if (o.n_kv_head < 0 || o.n_head % o.kv_heads() != 0) {
    throw ModelError("model.n_kv_head", "model.n_kv_head " + std::to_string(o.n_kv_head) +
                                            " must divide model.n_head " +
                                            std::to_string(o.n_head));
  }
  check_token_input(o.block_size, o.vocab_size, input);
}

class LlamaImpl : public DecoderModelImpl<LlamaBlock, LlamaRmsNorm, Rope> {
 public:
  LlamaImpl(const LlamaOptions& o, const nn::CheckpointPolicy& policy, const InputSpec& input)
      : DecoderModelImpl("llama", o.fused_kernels, o.block_size),
        n_head_(o.n_head),
        n_kv_head_(o.kv_heads()) {
    runner_ = nn::BlockRunner(policy);
    fused_rotary_ = o.fused();
    const int64_t vocab = decoder_vocabulary("llama", o.vocab_size, input);
    check_options(o, input);
    inv_freq_ = inverse_frequencies(o);
    model = register_module("model", LlamaStack(o, vocab));
    set_stack(model->embed_tokens, model->blocks, model->norm);
    add_head(o.tie_embeddings, model->embed_tokens->weight, deferred_options());
    init_weights();
  }

  // Megatron-LM's splits: q_proj, k_proj and v_proj column-parallel by heads (this rank's query
  // heads and key/value heads, biases with them), o_proj row-parallel; gate_proj and up_proj
  // column-parallel, down_proj row-parallel; model.embed_tokens and lm_head (tied or not)
  // vocabulary-parallel; the RMSNorms whole on every rank, the per-head q/k norms (qk_norm)
  // too, their weights' gradients summed over the group (LlamaAttention's per_head_norm).
  nn::SplitPlan split_over(std::shared_ptr<nn::TensorParallel> tp) override {
    const int n = tp->size();
    if (n_head_ % n != 0 || n_kv_head_ % n != 0) {
      throw ModelError("dist.tp_size", "model.n_head " + std::to_string(n_head_) +
                                           " and model.n_kv_head " + std::to_string(n_kv_head_) +
                                           " must both split over dist.tp_size " +
                                           std::to_string(n) + "; use a tp_size that divides both");
    }
    check_tp_split("model.intermediate_size", model->blocks[0]->mlp->gate_proj->weight.size(0), n);
    check_tp_split("model.vocab_size", vocabulary(), n,
                   " or a vocabulary padded to a multiple of it");
    nn::SplitPlan plan{{"model.embed_tokens.weight", {0, 1}}, {"lm_head.weight", {0, 1}}};
    for (size_t i = 0; i < model->blocks.size(); ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
        plan[p + "self_attn." + proj + ".weight"] =
            plan[p + "self_attn." + proj + ".bias"] = {0, 1};
      }
      plan[p + "self_attn.o_proj.weight"] = plan[p + "mlp.down_proj.weight"] = {1, 1};
      plan[p + "mlp.gate_proj.weight"] = plan[p + "mlp.up_proj.weight"] = {0, 1};
    }
    nn::keep_parts(*this, plan, tp->rank(), n);
    for (auto& block : model->blocks) block->self_attn->tp = block->mlp->tp = tp;
    tp_ = std::move(tp);
    return plan;
  }

 private:
  // Packed rows: each token rotated by its position within its document.
  Rope place(torch::Tensor& h, const torch::Tensor& positions, int64_t start, int64_t T) override {
    // [T, 1, hd] each, or [B, T, 1, hd] each when packed
    return positions.defined() ? rotation_at(positions, h) : rotation(start, T, h);
  }

  // transformers' init (LlamaPreTrainedModel._init_weights): Linear and Embedding weights
  // N(0, 0.02), biases 0, RMSNorm weights 1. Skipped under nn::deferred_init(): the files about to
  // fill the parameters draw nothing; while nn::replaying(), the matrices' draws are recorded.
  void init_weights() {
    if (nn::deferred_init()) return;
    torch::NoGradGuard no_grad;
    for (auto& p : named_parameters()) {
      if (p.value().dim() == 2) {
        nn::normal_or_record(p.value(), /*mean=*/0.0, /*std=*/0.02);
      } else if (p.key().size() >= 5 && p.key().compare(p.key().size() - 5, 5, ".bias") == 0) {
        p.value().zero_();
      }
    }
  }

  // The rotation of positions [start, start + T) (llama::Rope), computed in float32 on the device
  // of `h` and cast to its dtype.
  Rope rotation(int64_t start, int64_t T, const torch::Tensor& h) {
    if (fused_tables(h)) return tables_rope(start + T, {}, start, h);
    if (inv_freq_.device() != h.device()) inv_freq_ = inv_freq_.to(h.device());
    const auto pos = torch::arange(start, start + T, inv_freq_.options());  // [T]
    return rope_of(torch::outer(pos, inv_freq_), h);                        // [T, 1, hd] each
  }

  // The rotation of each token by its packed position, positions [B, T] (int64, on h's device):
  // the products of rotation()'s for the same positions. [B, T, 1, hd] each.
  Rope rotation_at(const torch::Tensor& positions, const torch::Tensor& h) {
    if (fused_tables(h)) return tables_rope(positions.size(1), positions, 0, h);
    if (inv_freq_.device() != h.device()) inv_freq_ = inv_freq_.to(h.device());
    const auto pos = positions.to(inv_freq_.scalar_type()).unsqueeze(-1);  // [B, T, 1]
    return rope_of(pos * inv_freq_, h);                                    // [B, T, 1, hd] each
  }

  // cos and half-negated sin of the angles freqs [..., hd / 2] (float32), in h's dtype, a head
  // dimension inserted before the last: [..., 1, hd] each.
  static Rope rope_of(const torch::Tensor& freqs, const torch::Tensor& h) {
    return llama::rope_of(freqs.cos(), freqs.sin(), h.scalar_type());
  }

  // Whether the blocks rotate by the fused kernel's tables: model.fused_kernels on a CUDA device,
  // in a build with the kernels.
  bool fused_tables(const torch::Tensor& h) const {
    return fused_rotary_ && h.is_cuda() && nn::fused_kernels_built();
  }

  // The rotation as the fused kernel's tables (llama::Rope::tables): tokens at `positions` [B, T]
  // (undefined: start, start + 1, ...), the tables covering at least `rows` positions and the
  // block size, computed on h's device once (the same float32 angles, cos and sin as rotation()'s).
  Rope tables_rope(int64_t rows, const torch::Tensor& positions, int64_t start,
                   const torch::Tensor& h) {
    if (!cos_table_.defined() || cos_table_.device() != h.device() || cos_table_.size(0) < rows) {
      if (inv_freq_.device() != h.device()) inv_freq_ = inv_freq_.to(h.device());
      const auto pos = torch::arange(0, std::max(rows, block_size()), inv_freq_.options());
      const auto freqs = torch::outer(pos, inv_freq_);  // [rows, hd / 2]
      cos_table_ = freqs.cos();
      sin_table_ = freqs.sin();
    }
    Rope rope;
    rope.tables.cos = cos_table_;
    rope.tables.sin = sin_table_;
    if (positions.defined()) rope.tables.positions = positions.to(h.device(), torch::kLong);
    rope.tables.start = start;
    rope.tables.dtype = h.scalar_type();
    return rope;
  }

  int64_t n_head_, n_kv_head_;
  torch::Tensor inv_freq_;               // [hd / 2] float32, on the device last used
  bool fused_rotary_ = false;            // model.fused_kernels: rotary by tables_rope()
  torch::Tensor cos_table_, sin_table_;  // with it: [rows, hd / 2] float32, row p position p's
  LlamaStack model{nullptr};
};
TORCH_MODULE(Llama);

}  // namespace

void register_llama(ModelRegistry& registry) {
  registry.add("llama", decoder_kind<LlamaOptions, Llama>(llama_hf_format()),
               config::options_of<LlamaOptions>());
}

}  // namespace trainer::models
