#include "engine/measure/memory_plan.h"

#include <algorithm>

#include "util/format.h"

namespace trainer::engine {

int64_t MemoryPlan::total() const {
  int64_t sum = 0;
  for (const auto& p : parts) sum += p.bytes;
  return sum;
}

MemoryPlan plan_memory(const MemoryEstimate& e, const JobLayout& job) {
  const int64_t t = std::max<int64_t>(job.tp, 1), dp = std::max<int64_t>(job.world / t, 1);
  const int64_t shard = t * (job.fsdp ? dp : 1);  // what the state is divided by
  MemoryPlan plan;
  const auto add = [&](std::string name, int64_t bytes) {
    if (bytes > 0) plan.parts.push_back({std::move(name), bytes});
  };
  int64_t counted = 0;  // the parameters by dtype: their sum stands for params_bytes
  for (const auto& [dtype, bytes] : e.params_by_dtype) {
    add("parameters (" + dtype + ")", bytes / shard);
    counted += bytes;
  }
  if (counted == 0) plan.parts.push_back({"parameters", e.params_bytes / shard});
  add("reference copy", e.reference_bytes / shard);
  add("gradients", e.gradient_bytes / shard);
  add("optimizer state", e.optimizer_bytes / shard);
  const int64_t step = e.step_fixed_bytes + e.step_bytes_per_sample * job.batch;
  const int64_t activations = std::max<int64_t>(step - e.gradient_bytes, 0);
  add("activations", activations * (10 * t + 24) / (34 * t));
  if (t > 1) {
    add("vocabulary-parallel loss",
        kVocabularyParallelLossBytes * e.logits_per_sample / t * job.batch);
  }
  add("dequantized layer", e.dequantized_bytes / t);
  if (job.fsdp) add("gathered fsdp units", 2 * (e.root_bytes + 2 * e.largest_block_bytes) / t);
  if (job.gpu) {
    const int64_t rest = plan.total();
    add("CUDA context", kCudaContextBytes);
    const int64_t communicators = job.world <= 1 ? 0 : t > 1 && dp > 1 ? 3 : 1;
    add("NCCL buffers", communicators * kNcclCommunicatorBytes);
    add("fragmentation", rest / 20);
  }
  return plan;
}

std::string plan_text(const MemoryPlan& plan) {
  std::string parts;
  for (const auto& p : plan.parts) {
    if (!parts.empty()) parts += ", ";
    parts += p.name + " " + bytes_text(p.bytes);
  }
  return bytes_text(plan.total()) + " (" + parts + ")";
}

}  // namespace trainer::engine
