#include "engine/use/perf_probe.h"

#include <fcntl.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "engine/use/bench.h"
#include "util/device.h"
#include "util/format.h"

namespace trainer::engine {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// "1 KiB", "64 MiB", "1 GiB".
std::string size_text(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) return strprintf("%" PRId64 " GiB", bytes >> 30);
  if (bytes >= (int64_t{1} << 20)) return strprintf("%" PRId64 " MiB", bytes >> 20);
  return strprintf("%" PRId64 " KiB", bytes >> 10);
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// GB/s of copying `bytes` from `from` to a tensor on `to` (pinned host memory when `pinned`).
double copy_gbps(torch::Device from, torch::Device to, int64_t bytes, bool pinned, int repeats) {
  auto src = torch::empty({bytes / 4}, torch::TensorOptions().device(from).dtype(torch::kFloat));
  auto dst = torch::empty({bytes / 4}, torch::TensorOptions().device(to).dtype(torch::kFloat));
  if (pinned) (from.is_cpu() ? src : dst) = (from.is_cpu() ? src : dst).pin_memory();
  const torch::Device timed = from.is_cuda() ? from : to;
  const double s = best_seconds(timed, repeats, [&] { dst.copy_(src); });
  return static_cast<double>(bytes) / s / 1e9;
}

void measure_cuda_copies(torch::Device device, int64_t bytes, int repeats, DevicePerf& out) {
  const torch::Device cpu(torch::kCPU);
  out.h2d_pinned = copy_gbps(cpu, device, bytes, /*pinned=*/true, repeats);
  out.h2d_pageable = copy_gbps(cpu, device, bytes, /*pinned=*/false, repeats);
  out.d2h_pinned = copy_gbps(device, cpu, bytes, /*pinned=*/true, repeats);
  out.d2h_pageable = copy_gbps(device, cpu, bytes, /*pinned=*/false, repeats);
  const int gpus = static_cast<int>(torch::cuda::device_count());
  for (int i = 0; i < gpus && gpus <= 8; ++i) {
    for (int j = 0; j < gpus; ++j) {
      if (i == j) continue;
      const torch::Device a(torch::kCUDA, i), b(torch::kCUDA, j);
      out.peers.push_back({i, j, copy_gbps(a, b, bytes, /*pinned=*/false, repeats)});
    }
  }
}

// TFLOP/s of an 8192 x 8192 float8 (e4m3) matrix product with bfloat16 output
// (at::_scaled_mm, per-tensor scales), the best of 5; 0 where the GPU or LibTorch has none
// (before compute capability 8.9 ATen refuses it).
double fp8_tflops(torch::Device device) {
  const int64_t n = 8192;
  const auto on = torch::TensorOptions().device(device);
  try {
    const auto a = torch::randn({n, n}, on).to(at::kFloat8_e4m3fn);      // [n, n] row-major
    const auto b = torch::randn({n, n}, on).to(at::kFloat8_e4m3fn).t();  // [n, n] column-major
    const auto scale = torch::ones({}, on.dtype(torch::kFloat));
    const double s = best_seconds(device, 5, [&] {
      at::_scaled_mm(a, b, scale, scale, std::nullopt, std::nullopt, at::kBFloat16);
    });
    return 2.0 * static_cast<double>(n * n) * static_cast<double>(n) / s / 1e12;
  } catch (const c10::Error&) {
    return 0.0;  // this LibTorch build has no float8 product for the device
  }
}

}  // namespace

double best_seconds(torch::Device device, int repeats, const std::function<void()>& fn) {
  fn();
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    synchronize(device);
    const auto start = Clock::now();
    fn();
    synchronize(device);
    best = std::min(best, seconds_since(start));
  }
  return best;
}

double device_copy_gbps(torch::Device device, int64_t bytes, int repeats) {
  auto src = torch::ones({bytes / 4}, torch::TensorOptions().device(device).dtype(torch::kFloat));
  auto dst = torch::empty_like(src);
  constexpr int kCopies = 8;
  const double s = best_seconds(device, repeats, [&] {
    for (int i = 0; i < kCopies; ++i) dst.copy_(src);
  });
  return 2.0 * kCopies * static_cast<double>(bytes) / s / 1e9;
}

DevicePerf measure_device(torch::Device device, const PerfOptions& options) {
  DevicePerf out;
  out.name = device_name(device);
  out.cuda = device.is_cuda();
  out.threads = at::get_num_threads();
  const int repeats = options.quick ? 3 : 10;
  std::vector<std::pair<std::string, c10::ScalarType>> dtypes = {{"fp32", torch::kFloat},
                                                                 {"bf16", torch::kBFloat16}};
  if (out.cuda) dtypes.insert(dtypes.begin() + 1, {"tf32", torch::kFloat});
  if (out.cuda) dtypes.push_back({"fp16", torch::kHalf});
  for (const auto& [name, dtype] : dtypes) {
    options.progress("matmul " + name);
    const bool tf32 = name == "tf32";
    at::globalContext().setAllowTF32CuBLAS(tf32);
    out.matmul_tflops.emplace_back(name, matmul_peak_tflops(device, dtype));
  }
  at::globalContext().setAllowTF32CuBLAS(false);
  if (out.cuda) {
    options.progress("matmul fp8");
    if (const double fp8 = fp8_tflops(device); fp8 > 0) out.matmul_tflops.emplace_back("fp8", fp8);
  }
  const int64_t bytes = (options.quick ? 64 : 256) << 20;
  options.progress("memory copy");
  // On a GPU 1 GiB buffers, many times its last-level cache (50 MB on an H100).
  out.copy_gbps = device_copy_gbps(device, out.cuda ? int64_t{1} << 30 : bytes, repeats);
  if (!out.cuda) {
    options.progress("one thread");
    const int threads = at::get_num_threads();
    at::set_num_threads(1);
    out.single_thread_tflops = matmul_peak_tflops(device, torch::kFloat);
    out.single_thread_copy_gbps = device_copy_gbps(device, bytes, repeats);
    at::set_num_threads(threads);
    return out;
  }
  options.progress("host-device copies");
  measure_cuda_copies(device, bytes, repeats, out);
  return out;
}

std::vector<CollectivePerf> measure_collectives(distributed::Group& group,
                                                const PerfOptions& options) {
  const int64_t largest = options.quick ? int64_t{64} << 20 : int64_t{1} << 30;
  const double budget_s = options.quick ? 10 : 60;
  const auto on = torch::TensorOptions().device(group.device()).dtype(torch::kFloat);
  const int n = group.world_size();
  std::vector<CollectivePerf> out;
  const auto start = Clock::now();
  for (int64_t bytes = 1024; bytes <= largest; bytes *= 4) {
    options.progress(strprintf("collectives %s", size_text(bytes).c_str()));
    auto x = torch::ones({bytes / 4}, on);
    const int64_t per_rank = std::max<int64_t>(1, bytes / 4 / n);  // float32 elements
    std::vector<torch::Tensor> gathered;
    for (int r = 0; r < n; ++r) gathered.push_back(torch::empty({per_rank}, on));
    auto part = torch::ones({per_rank}, on);
    const int iters = bytes >= (int64_t{64} << 20) ? 5 : options.quick ? 10 : 20;
    for (const char* collective : {"all_reduce", "all_gather"}) {
      const bool reduce = collective == std::string("all_reduce");
      auto run = [&] {
        if (reduce) {
          group.all_reduce({x}, distributed::Reduce::sum);
        } else {
          group.all_gather(part, gathered);
        }
      };
      run();  // warm-up, and every rank past the previous size
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) run();
      synchronize(group.device());
      auto slowest = torch::full({1}, seconds_since(t0) / iters, on.dtype(torch::kDouble));
      group.all_reduce({slowest}, distributed::Reduce::max);
      out.push_back({collective, bytes, reduce ? bytes : per_rank * 4 * n, host_double(slowest)});
    }
    // The same decision on every rank: rank 0's clock, shared.
    auto elapsed = torch::full({1}, seconds_since(start), on.dtype(torch::kDouble));
    group.broadcast({elapsed}, /*root=*/0);
    if (host_double(elapsed) > budget_s) break;
  }
  return out;
}

double read_gbps(const std::string& root, const PerfOptions& options) {
  const uint64_t limit = options.quick ? uint64_t{256} << 20 : uint64_t{1} << 30;
  const double budget_s = 10;
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_regular_file(root, ec)) {
    files.push_back(root);
  } else {
    for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->is_regular_file(ec)) files.push_back(it->path());
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<char> buffer(size_t{4} << 20);
  uint64_t total = 0;
  const auto start = Clock::now();
  for (const auto& f : files) {
    if (total >= limit || seconds_since(start) > budget_s) break;
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // cold-ish: drop what the cache holds
    for (ssize_t n; total < limit && (n = ::read(fd, buffer.data(), buffer.size())) > 0;) {
      total += static_cast<uint64_t>(n);
    }
    ::close(fd);
  }
  const double s = seconds_since(start);
  return total > 0 && s > 0 ? static_cast<double>(total) / s / 1e9 : 0.0;
}

// The most steps the training-step probe times.
constexpr int64_t kMaxProbeSteps = 100000;

JobPerf measure_job(Trainer& trainer, const PerfOptions& options) {
  JobPerf out;
  // The step first, as bench times it in a fresh process: nothing the input probe leaves behind
  // (its batches, a loader part-way through an epoch) shares the timed steps.
  options.progress("training step");
  BenchOptions bench;
  bench.steps = 10;
  bench.warmup = 3;
  bench.fixed_batch = true;
  bench.counted = 0;
  BenchResult r = run_bench(trainer, bench);
  // Short steps again, as many as fill the target span, so that the clock's and the system's
  // noise stays small against it. One process only: ranks would disagree on the count.
  const double target_s = options.quick ? 0.5 : 2.0;
  if (trainer.world_size() == 1 && r.seconds > 0 && r.seconds < target_s) {
    bench.steps = std::min<int64_t>(kMaxProbeSteps,
                                    static_cast<int64_t>(std::ceil(10.0 * target_s / r.seconds)));
    bench.warmup = 0;
    r = run_bench(trainer, bench);
  }
  out.steps = bench.steps;
  out.step_samples_per_sec = r.samples_per_sec / std::max(1, trainer.data_parallel_size());
  out.step_ms_p50 = r.step_ms.p50;
  const double step = r.step_ms.mean;
  out.grad_sync_fraction = step > 0 ? r.phase_ms[static_cast<size_t>(Phase::grad_sync)] / step : 0;
  options.progress("input pipeline");
  out.input_samples_per_sec =
      trainer.input_samples_per_sec(options.quick ? 10 : 50, options.quick ? 1.0 : 3.0);
  return out;
}

}  // namespace trainer::engine
