#include "engine/use/kernel_bench.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <functional>
#include <stdexcept>
#include <utility>

#include "engine/use/bench.h"
#include "engine/use/perf_probe.h"
#include "nn/fused/fused_gpt_ops.h"
#include "nn/fused/fused_ops.h"
#include "nn/fused/fused_rotary_ops.h"

namespace trainer::engine {
namespace {

using Fn = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;

// One kernel: its inputs (the ones that take gradients first), the fused function and the ATen
// composition of the same outputs, and the bytes of a forward and of a backward.
struct Case {
  std::string name, shape;
  std::vector<torch::Tensor> inputs;  // leaves
  Fn fused, aten;
  double forward_bytes = 0, backward_bytes = 0;
};

Case named(std::string name, std::string shape, std::vector<torch::Tensor> inputs) {
  Case c;
  c.name = std::move(name);
  c.shape = std::move(shape);
  c.inputs = std::move(inputs);
  return c;
}

double bytes_of(const std::vector<torch::Tensor>& ts) {
  double b = 0;
  for (const auto& t : ts) b += static_cast<double>(t.numel() * t.element_size());
  return b;
}

// Seconds of `fn`'s forward alone, and of forward and backward (gradients of ones).
std::pair<double, double> time_case(torch::Device device, int repeats, const Case& c,
                                    const Fn& fn) {
  const double forward = best_seconds(device, repeats, [&] {
    torch::NoGradGuard no_grad;
    fn(c.inputs);
  });
  std::vector<torch::Tensor> leaves;
  for (const auto& t : c.inputs) {
    if (t.requires_grad()) leaves.push_back(t);
  }
  const double both = best_seconds(device, repeats, [&] {
    const auto outs = fn(c.inputs);
    std::vector<torch::Tensor> grads;
    for (const auto& o : outs) grads.push_back(torch::ones_like(o));
    torch::autograd::grad(outs, leaves, grads);
  });
  return {forward, both};
}

torch::Tensor leaf(std::vector<int64_t> shape, torch::Device device, torch::ScalarType type) {
  return torch::randn(shape, torch::TensorOptions().device(device).dtype(type))
      .requires_grad_(true);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out;
  for (const auto d : shape) out += (out.empty() ? "" : " x ") + std::to_string(d);
  return out + " bf16";
}

torch::Tensor aten_rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  const auto f = x.to(torch::kFloat);
  return w * (f * torch::rsqrt(f.pow(2).mean(-1, true) + eps)).to(x.scalar_type());
}

// GPT-2 small: 16 x 1024 tokens of width 768 (MLP 3072).
std::vector<Case> gpt_cases(torch::Device d) {
  const auto bf = torch::kBFloat16;
  const int64_t n = 16 * 1024, c = 768;
  const double row = static_cast<double>(n * c * 2);
  std::vector<Case> out;
  {
    Case k = named("layer_norm", shape_text({n, c}),
                   {leaf({n, c}, d, bf), leaf({c}, d, bf), leaf({c}, d, bf)});
    k.fused = [](const auto& in) {
      return std::vector<torch::Tensor>{nn::fused_layer_norm(in[0], in[1], in[2], 1e-5)};
    };
    k.aten = [](const auto& in) {
      return std::vector<torch::Tensor>{torch::layer_norm(in[0], {in[0].size(-1)}, in[1], in[2])};
    };
    k.forward_bytes = 2 * row, k.backward_bytes = 3 * row;
    out.push_back(std::move(k));
  }
  {
    Case k = named("layer_norm + residual", shape_text({n, c}),
                   {leaf({n, c}, d, bf), leaf({n, c}, d, bf), leaf({c}, d, bf), leaf({c}, d, bf)});
    k.fused = [](const auto& in) {
      auto [s, y] = nn::fused_add_layer_norm(in[0], in[1], in[2], in[3], 1e-5);
      return std::vector<torch::Tensor>{s, y};
    };
    k.aten = [](const auto& in) {
      const auto s = in[0] + in[1];
      return std::vector<torch::Tensor>{s, torch::layer_norm(s, {s.size(-1)}, in[2], in[3])};
    };
    k.forward_bytes = 4 * row, k.backward_bytes = 4 * row;
    out.push_back(std::move(k));
  }
  {
    const int64_t h = 4 * c;
    Case k = named("bias + gelu", shape_text({n, h}), {leaf({n, h}, d, bf), leaf({h}, d, bf)});
    k.fused = [](const auto& in) {
      return std::vector<torch::Tensor>{nn::fused_bias_gelu(in[0], in[1])};
    };
    k.aten = [](const auto& in) {
      return std::vector<torch::Tensor>{torch::gelu(in[0] + in[1], "tanh")};
    };
    k.forward_bytes = 8 * row, k.backward_bytes = 12 * row;
    out.push_back(std::move(k));
  }
  return out;
}

torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// Rotary embeddings of `n` tokens' queries (32 heads of 64) and keys (8 heads), one row of 4 x
// n / 4 tokens, the tables in bfloat16 (a bfloat16 model's).
Case rotary_case(torch::Device d, int64_t n) {
  const auto bf = torch::kBFloat16;
  const int64_t b = 4, t = n / 4, hd = 64;
  const auto f32 = torch::TensorOptions().device(d).dtype(torch::kFloat);
  const auto angles = torch::arange(t, f32).unsqueeze(1) *
                      torch::pow(500000.0, -torch::arange(0, hd, 2, f32) / hd);  // [T, hd / 2]
  nn::RotaryTables tables;
  tables.cos = angles.cos().contiguous();
  tables.sin = angles.sin().contiguous();
  tables.dtype = bf;
  const auto cos = torch::cat({tables.cos, tables.cos}, -1).to(bf).unsqueeze(-2);  // [T, 1, hd]
  const auto sin = torch::cat({tables.sin, tables.sin}, -1).to(bf).unsqueeze(-2);
  Case k = named("rotary q, k", shape_text({b, t, 32 + 8, hd}),
                 {leaf({b, t, 32, hd}, d, bf), leaf({b, t, 8, hd}, d, bf)});
  k.fused = [tables](const auto& in) {
    auto [q, kk] = nn::fused_rotary(in[0], in[1], tables);
    return std::vector<torch::Tensor>{q, kk};
  };
  k.aten = [cos, sin](const auto& in) {
    std::vector<torch::Tensor> out;
    for (const auto& x : in) out.push_back(x * cos + rotate_half(x) * sin);
    return out;
  };
  k.forward_bytes = 2 * bytes_of(k.inputs), k.backward_bytes = 2 * bytes_of(k.inputs);
  return k;
}

// Llama 3.2 1B-shaped: 4 x 2048 tokens of width 2048 (MLP 8192; 32 query heads, 8 key/value
// heads of 64).
std::vector<Case> llama_cases(torch::Device d) {
  const auto bf = torch::kBFloat16;
  const int64_t n = 4 * 2048, c = 2048, m = 8192;
  const double row = static_cast<double>(n * c * 2);
  std::vector<Case> out;
  {
    Case k = named("rms_norm", shape_text({n, c}), {leaf({n, c}, d, bf), leaf({c}, d, bf)});
    k.fused = [](const auto& in) {
      return std::vector<torch::Tensor>{nn::fused_rms_norm(in[0], in[1], 1e-5)};
    };
    k.aten = [](const auto& in) {
      return std::vector<torch::Tensor>{aten_rms_norm(in[0], in[1], 1e-5)};
    };
    k.forward_bytes = 2 * row, k.backward_bytes = 3 * row;
    out.push_back(std::move(k));
  }
  {
    Case k = named("rms_norm + residual", shape_text({n, c}),
                   {leaf({n, c}, d, bf), leaf({n, c}, d, bf), leaf({c}, d, bf)});
    k.fused = [](const auto& in) {
      auto [s, y] = nn::fused_add_rms_norm(in[0], in[1], in[2], 1e-5);
      return std::vector<torch::Tensor>{s, y};
    };
    k.aten = [](const auto& in) {
      const auto s = in[0] + in[1];
      return std::vector<torch::Tensor>{s, aten_rms_norm(s, in[2], 1e-5)};
    };
    k.forward_bytes = 4 * row, k.backward_bytes = 4 * row;
    out.push_back(std::move(k));
  }
  {
    Case k = named("swiglu", shape_text({n, m}), {leaf({n, m}, d, bf), leaf({n, m}, d, bf)});
    k.fused = [](const auto& in) {
      return std::vector<torch::Tensor>{nn::fused_swiglu(in[0], in[1])};
    };
    k.aten = [](const auto& in) { return std::vector<torch::Tensor>{torch::silu(in[0]) * in[1]}; };
    const double mrow = static_cast<double>(n * m * 2);
    k.forward_bytes = 3 * mrow, k.backward_bytes = 5 * mrow;
    out.push_back(std::move(k));
  }
  out.push_back(rotary_case(d, n));
  return out;
}

KernelRow row_of(const Case& c, const std::string& pass, double bytes, double fused_s,
                 double aten_s, double copy_gbps) {
  KernelRow r;
  r.name = c.name + ", " + pass;
  r.shape = c.shape;
  r.bytes = bytes;
  r.fused_ms = 1e3 * fused_s;
  r.aten_ms = 1e3 * aten_s;
  r.fused_gbps = bytes / fused_s / 1e9;
  r.aten_gbps = bytes / aten_s / 1e9;
  r.of_copy = copy_gbps > 0 ? r.fused_gbps / copy_gbps : 0.0;
  return r;
}

}  // namespace

KernelReport bench_kernels(torch::Device device, int repeats) {
  if (!device.is_cuda()) {
    throw std::runtime_error("bench --kernels: the fused kernels run on a CUDA device; " +
                             device.str() + " given (--device cuda)");
  }
  if (!torch::cuda::is_available()) {
    throw std::runtime_error(
        "bench --kernels: no CUDA device is visible; the fused kernels run only on a GPU");
  }
  if (!nn::fused_kernels_built()) {
    throw std::runtime_error(
        "bench --kernels: this build has no fused kernels (LibTorch with CUDA and nvcc needed)");
  }
  KernelReport out;
  out.device = device_name(device);
  out.copy_gbps = device_copy_gbps(device, int64_t{1} << 30, repeats);
  torch::manual_seed(0);
  auto cases = gpt_cases(device);
  for (auto& c : llama_cases(device)) cases.push_back(std::move(c));
  for (const auto& c : cases) {
    const auto [fused_f, fused_fb] = time_case(device, repeats, c, c.fused);
    const auto [aten_f, aten_fb] = time_case(device, repeats, c, c.aten);
    out.rows.push_back(row_of(c, "forward", c.forward_bytes, fused_f, aten_f, out.copy_gbps));
    out.rows.push_back(row_of(c, "forward + backward", c.forward_bytes + c.backward_bytes, fused_fb,
                              aten_fb, out.copy_gbps));
  }
  return out;
}

}  // namespace trainer::engine
