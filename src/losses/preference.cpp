#include "losses/preference.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "losses/output_loss.h"
#include "nn/aligned_linear.h"

namespace trainer::losses {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kIgnore = -100;

// Positions per block of float32 work: `block_rows`, or about 4M logits (16 MiB a temporary).
int64_t block_of(int64_t rows, int64_t vocab, int64_t block_rows) {
  if (block_rows > 0) return std::min(rows, block_rows);
  return std::clamp<int64_t>((int64_t{4} << 20) / std::max<int64_t>(vocab, 1), 1,
                             std::max<int64_t>(rows, 1));
}

// labels [B, T] -> [B * T]: position t's target is labels[t + 1], the last position's kIgnore.
torch::Tensor shifted_targets(const torch::Tensor& labels) {
  auto t = torch::full_like(labels, kIgnore, labels.options().dtype(torch::kLong));
  t.slice(/*dim=*/1, 0, -1).copy_(labels.slice(/*dim=*/1, 1));
  return t.reshape({-1});
}

// The per-position sums of logits x [N, V] against targets t1 (and t2 unless empty), [N] each:
// log-probabilities (0 where ignored), log-sum-exps, and with `stats` the mean logit, the entropy,
// the top-1 flag and the row's sum of logits (float64).
struct RowStats {
  torch::Tensor lp1, lp2, lse, mean_logit, entropy, top1, row_sum;
};

RowStats rows_forward(const torch::Tensor& x, const torch::Tensor& t1, const torch::Tensor& t2,
                      bool stats, int64_t block_rows) {
  const int64_t n = x.size(0), v = x.size(1);
  const auto f32 = x.options().dtype(torch::kFloat);
  RowStats s;
  s.lse = torch::empty({n}, f32);
  s.lp1 = torch::empty({n}, f32);
  if (t2.numel() > 0) s.lp2 = torch::empty({n}, f32);
  if (stats) {
    s.mean_logit = torch::empty({n}, f32);
    s.entropy = torch::empty({n}, f32);
    s.top1 = torch::empty({n}, f32);
    s.row_sum = torch::empty({n}, f32.dtype(torch::kDouble));
  }
  const int64_t block = block_of(n, v, block_rows);
  const auto gather = [](const torch::Tensor& f, const torch::Tensor& lse, const torch::Tensor& t) {
    const auto kept = t.ne(kIgnore);
    const auto logit = f.gather(1, t.clamp_min(0).unsqueeze(1)).squeeze(1);
    return (logit - lse).masked_fill(~kept, 0.0);
  };
  for (int64_t r = 0; r < n; r += block) {
    const int64_t e = std::min(n, r + block);
    const auto f = x.slice(0, r, e).to(torch::kFloat);   // [b, V]
    const auto m = std::get<0>(f.max(/*dim=*/1, true));  // [b, 1]
    const auto ex = (f - m).exp_();                      // [b, V]
    const auto sum = ex.sum(1);                          // [b]
    const auto lse = m.squeeze(1) + sum.log();           // [b]
    s.lse.slice(0, r, e).copy_(lse);
    const auto tt1 = t1.slice(0, r, e);
    s.lp1.slice(0, r, e).copy_(gather(f, lse, tt1));
    if (t2.numel() > 0) s.lp2.slice(0, r, e).copy_(gather(f, lse, t2.slice(0, r, e)));
    if (!stats) continue;
    const auto row_sum = f.sum(1, false, torch::kDouble);
    s.row_sum.slice(0, r, e).copy_(row_sum);
    s.mean_logit.slice(0, r, e).copy_(row_sum / static_cast<double>(v));
    s.entropy.slice(0, r, e).copy_(lse - (ex * f).sum(1) / sum);
    s.top1.slice(0, r, e).copy_(f.argmax(1).eq(tt1));
  }
  return s;
}

// Σ_k w_k[i] (onehot(t_k[i]) - softmax(x[i])) over the label sets, written block by block into a
// tensor of x's dtype: the gradient of Σ_k Σ_i w_k[i] log p(t_k[i]) with respect to x.
torch::Tensor rows_backward(const torch::Tensor& x, const torch::Tensor& lse,
                            const std::vector<std::pair<torch::Tensor, torch::Tensor>>& sets,
                            int64_t block_rows) {
  const int64_t n = x.size(0), v = x.size(1);
  auto grad = torch::empty_like(x, torch::MemoryFormat::Contiguous);
  const int64_t block = block_of(n, v, block_rows);
  for (int64_t r = 0; r < n; r += block) {
    const int64_t e = std::min(n, r + block);
    const auto f = x.slice(0, r, e).to(torch::kFloat);
    auto g = (f - lse.slice(0, r, e).unsqueeze(1)).exp_();  // [b, V] softmax
    torch::Tensor total;
    for (const auto& [w, t] : sets) {
      const auto wb = w.slice(0, r, e);
      total = total.defined() ? total + wb : wb;
    }
    g.mul_(-total.unsqueeze(1));
    for (const auto& [w, t] : sets) {
      g.scatter_add_(1, t.slice(0, r, e).clamp_min(0).unsqueeze(1), w.slice(0, r, e).unsqueeze(1));
    }
    grad.slice(0, r, e).copy_(g);
  }
  return grad;
}

// The incoming gradients of the per-position log-probabilities of label sets t1 and t2 (empty
// when absent), zero where a target is ignored: (weight, targets) for rows_backward.
std::vector<std::pair<torch::Tensor, torch::Tensor>> weighted_sets(const variable_list& grads,
                                                                   const torch::Tensor& t1,
                                                                   const torch::Tensor& t2) {
  std::vector<std::pair<torch::Tensor, torch::Tensor>> sets;
  if (grads[0].defined()) sets.emplace_back(grads[0].to(torch::kFloat), t1);
  if (grads[1].defined() && t2.numel() > 0) sets.emplace_back(grads[1].to(torch::kFloat), t2);
  for (auto& [w, t] : sets) w = w.masked_fill(t.eq(kIgnore), 0.0);
  return sets;
}

// The autograd outputs of RowStats: the log-probabilities of both label sets, then the detached
// statistics; an output not computed is an empty tensor of its own (autograd takes each once).
variable_list outputs(AutogradContext* ctx, const RowStats& s, const torch::Tensor& like) {
  const auto or_none = [&](const torch::Tensor& t) {
    return t.defined() ? t : torch::zeros({0}, like.options().dtype(torch::kFloat));
  };
  variable_list out = {
      s.lp1,           or_none(s.lp2),    or_none(s.mean_logit), or_none(s.entropy),
      or_none(s.top1), or_none(s.row_sum)};
  ctx->mark_non_differentiable({out[2], out[3], out[4], out[5]});
  return out;
}

// logits [B, T, V] -> per-position log-probabilities [N] for one or two label sets, with the
// statistics as non-differentiable outputs. Saves the logits (not a copy of them) and the
// log-sum-exps for backward, which recomputes the softmax a block at a time.
class SequenceLogProbs : public torch::autograd::Function<SequenceLogProbs> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& t1, const torch::Tensor& t2, bool stats,
                               int64_t block_rows) {
    const auto x = logits.reshape({-1, logits.size(-1)}).contiguous();
    const auto s = rows_forward(x, t1, t2, stats, block_rows);
    auto out = outputs(ctx, s, x);
    if (logits.requires_grad()) {
      ctx->save_for_backward({x, s.lse, t1, t2});
      ctx->saved_data["shape"] = logits.sizes();
      ctx->saved_data["block_rows"] = block_rows;
    }
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto sets = weighted_sets(grads, saved[2], saved[3]);
    torch::Tensor grad;
    if (!sets.empty()) {
      grad = rows_backward(saved[0], saved[1], sets, ctx->saved_data["block_rows"].toInt())
                 .reshape(ctx->saved_data["shape"].toIntVector());
    }
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Positions per chunk of the product: logits of about 4M elements, and at most 8 chunks (each is
// a pass over the weight's gradient, losses/output_loss.cpp's kMaxChunks).
int64_t chunk_of(int64_t n, int64_t v, int64_t chunk_rows) {
  if (chunk_rows > 0) return chunk_rows;
  const int64_t by_size = (int64_t{4} << 20) / std::max<int64_t>(v, 1);
  return std::max<int64_t>({int64_t{1}, by_size, (n + 7) / 8});
}

RowStats cat_stats(const std::vector<RowStats>& parts) {
  const auto cat = [&](torch::Tensor RowStats::*field) {
    if (!(parts.front().*field).defined()) return torch::Tensor();
    std::vector<torch::Tensor> all;
    for (const auto& p : parts) all.push_back(p.*field);
    return torch::cat(all);
  };
  return {cat(&RowStats::lp1),        cat(&RowStats::lp2),     cat(&RowStats::lse),
          cat(&RowStats::mean_logit), cat(&RowStats::entropy), cat(&RowStats::top1),
          cat(&RowStats::row_sum)};
}

// hidden [N, C] and weight [V, C] -> SequenceLogProbs's outputs for logits = hidden · weightᵀ,
// made a chunk of positions at a time (nn::aligned_linear's product) and never held whole.
// Saves hidden, weight and the log-sum-exps; backward recomputes each chunk's logits, turns them
// into their gradient and multiplies it into hidden's and weight's (TRL's fused LM head).
class LinearSequenceLogProbs : public torch::autograd::Function<LinearSequenceLogProbs> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& t1,
                               const torch::Tensor& t2, bool stats, int64_t chunk_rows) {
    const auto type = product_type(hidden, weight);  // before autocast is excluded
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto h = hidden.to(type), w = weight.to(type);
    const int64_t n = h.size(0), rows = chunk_of(n, w.size(0), chunk_rows);
    std::vector<RowStats> parts;
    for (int64_t r = 0; r < n; r += rows) {
      const int64_t e = std::min(n, r + rows);
      const auto tt2 = t2.numel() > 0 ? t2.slice(0, r, e) : t2;
      const auto logits = nn::aligned_linear(h.slice(0, r, e), w);  // [b, V]
      parts.push_back(rows_forward(logits, t1.slice(0, r, e), tt2, stats, 0));
    }
    const auto s = cat_stats(parts);
    if (hidden.requires_grad() || weight.requires_grad()) {
      ctx->save_for_backward({hidden, weight, s.lse, t1, t2});
      ctx->saved_data["rows"] = rows;
      ctx->saved_data["type"] = static_cast<int64_t>(type);  // backward may run outside autocast
    }
    return outputs(ctx, s, h);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto sets = weighted_sets(grads, saved[3], saved[4]);
    const bool want_h = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    if (sets.empty()) return {torch::Tensor(), torch::Tensor(), {}, {}, {}, {}};
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto &hidden = saved[0], &weight = saved[1];
    const auto type = static_cast<torch::ScalarType>(ctx->saved_data["type"].toInt());
    const auto h = hidden.to(type), w = weight.to(type);
    const int64_t n = h.size(0), rows = ctx->saved_data["rows"].toInt();
    auto grad_h = want_h ? torch::empty_like(hidden) : torch::Tensor();  // [N, C]
    auto grad_w = want_w ? torch::zeros(w.sizes(), w.options().dtype(torch::kFloat))
                         : torch::Tensor();  // [V, C], summed in float32
    for (int64_t r = 0; r < n; r += rows) {
      const int64_t e = std::min(n, r + rows);
      std::vector<std::pair<torch::Tensor, torch::Tensor>> chunk;
      for (const auto& [wt, t] : sets) chunk.emplace_back(wt.slice(0, r, e), t.slice(0, r, e));
      const auto hc = h.slice(0, r, e);
      const auto g = rows_backward(nn::aligned_linear(hc, w), saved[2].slice(0, r, e), chunk, 0);
      if (want_h) grad_h.slice(0, r, e).copy_(g.mm(w));
      if (want_w) grad_w.add_(g.t().mm(hc));
    }
    if (want_w) grad_w = grad_w.to(weight.scalar_type());
    return {grad_h, grad_w, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor per_row(const torch::Tensor& per_position, int64_t rows) {
  return per_position.reshape({rows, -1}).sum(1);
}

void check_shapes(const char* what, const torch::Tensor& x, const torch::Tensor& labels,
                  const torch::Tensor& full_labels) {
  if (x.dim() != 3 || labels.dim() != 2 || x.size(0) != labels.size(0) ||
      x.size(1) != labels.size(1) ||
      (full_labels.defined() && full_labels.sizes() != labels.sizes())) {
    throw std::invalid_argument(std::string(what) + ": [B, T, *] and labels [B, T] expected, got " +
                                c10::str(x.sizes()) + " and " + c10::str(labels.sizes()));
  }
}

// Without full labels, an empty second label set (autograd takes no undefined inputs).
torch::Tensor second_targets(const torch::Tensor& full_labels, const torch::Tensor& t1) {
  return full_labels.defined() ? shifted_targets(full_labels.to(t1.device()))
                               : torch::empty({0}, t1.options());
}

// The per-row sums of the per-position outputs of SequenceLogProbs or LinearSequenceLogProbs.
SequenceLogps assemble(const variable_list& out, const torch::Tensor& labels,
                       const torch::Tensor& full_labels, const torch::Tensor& t1,
                       const torch::Tensor& t2, int64_t vocab, bool stats) {
  const int64_t b = labels.size(0), t = labels.size(1);
  const auto kept1 = t1.ne(kIgnore).to(torch::kFloat);
  SequenceLogps s;
  s.positions = t;
  s.vocab = vocab;
  s.logps = per_row(out[0], b);
  s.tokens = per_row(kept1, b);
  s.labelled = labels.to(t1.device()).ne(kIgnore).sum(1).to(torch::kFloat);
  if (full_labels.defined()) {
    s.full_logps = per_row(out[1], b);
    s.full_tokens = per_row(t2.ne(kIgnore).to(torch::kFloat), b);
  }
  if (stats) {
    s.mean_logit_sum = per_row(out[2] * kept1, b);
    s.entropy_sum = per_row(out[3] * kept1, b);
    s.top1 = per_row(out[4] * kept1, b);
    const auto row_sum = out[5].reshape({b, t});
    s.logit_sum = row_sum.slice(1, 0, t - 1).sum(1);
    s.last_logit_sum = row_sum.select(1, t - 1);
  }
  return s;
}

}  // namespace

SequenceLogps sequence_logps(const torch::Tensor& logits, const torch::Tensor& labels,
                             const torch::Tensor& full_labels,
                             const SequenceLogpsOptions& options) {
  check_shapes("sequence_logps", logits, labels, full_labels);
  const auto t1 = shifted_targets(labels.to(logits.device()));
  const auto t2 = second_targets(full_labels, t1);
  const auto out = SequenceLogProbs::apply(logits, t1, t2, options.stats, options.block_rows);
  return assemble(out, labels, full_labels, t1, t2, logits.size(2), options.stats);
}

SequenceLogps sequence_logps_linear(const torch::Tensor& hidden, const torch::Tensor& weight,
                                    const torch::Tensor& labels, const torch::Tensor& full_labels,
                                    const SequenceLogpsOptions& options) {
  check_shapes("sequence_logps_linear", hidden, labels, full_labels);
  if (weight.dim() != 2 || weight.size(1) != hidden.size(2)) {
    throw std::invalid_argument("sequence_logps_linear: weight [V, C] for hidden [B, T, C], got " +
                                c10::str(weight.sizes()) + " for " + c10::str(hidden.sizes()));
  }
  const auto t1 = shifted_targets(labels.to(hidden.device()));
  const auto t2 = second_targets(full_labels, t1);
  const auto out = LinearSequenceLogProbs::apply(hidden.reshape({-1, hidden.size(2)}), weight, t1,
                                                 t2, options.stats, options.block_rows);
  return assemble(out, labels, full_labels, t1, t2, weight.size(0), options.stats);
}

}  // namespace trainer::losses
