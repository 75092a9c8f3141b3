#!/usr/bin/env bash
# Fully sharded data parallel training on the CPU over Gloo: the trainer's dist.strategy fsdp
# (`trainer bench` under `trainer launch`) beside PyTorch FSDP2's fully_shard under torchrun
# (scripts/bench_fsdp.py), same GPT, per-rank batch, optimizer, clipping and threads, one fixed
# batch per rank (no data loader in the timing). Runs alternate between the two, REPEATS times;
# prints the medians of the median step times, their ratio, each rank's held bytes (parameters +
# gradients + optimizer state), the top-level ATen operators and host reads per step (counted
# over 3 untimed steps on both sides) and the bytes communicated per step against 3x the
# parameter bytes, as a markdown table.
#
#   scripts/bench_fsdp.sh [REPEATS=3] [NPROC=2] [LAYERS=4] [EMBD=128] [HEADS=4] [BATCH=8]
#                         [SEQ=128] [STEPS=20] [WARMUP=5] [RESULTS=DIR]
set -euo pipefail
# shellcheck source=scripts/bench_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_common.sh" bench_fsdp
bench_args "REPEATS NPROC LAYERS EMBD HEADS BATCH SEQ STEPS WARMUP RESULTS" "$@"
bench_defaults
TRAINER=build/trainer
[[ -x $TRAINER ]] || scripts/build.sh >&2
mkdir -p "$RESULTS"
export OMP_NUM_THREADS=1
# The model and step of bench_fsdp.py's defaults (gpt_config).
CONFIG=$(gpt_config fsdp)
for rep in $(seq "$REPEATS"); do
  # shellcheck disable=SC2086
  run "trainer_$rep" "$TRAINER" launch --standalone --nproc-per-node "$NPROC" -- bench $CONFIG \
    --fixed-batch --steps "$STEPS" --warmup "$WARMUP" --json "$RESULTS/trainer_$rep.json"
  run "pytorch_$rep" "$PY" -m torch.distributed.run --standalone --nproc-per-node "$NPROC" \
    scripts/bench_fsdp.py --n-layer "$LAYERS" --n-head "$HEADS" --n-embd "$EMBD" \
    --block-size "$SEQ" --batch "$BATCH" --steps "$STEPS" --warmup "$WARMUP" \
    --json "$RESULTS/pytorch_$rep.json"
done
"$PY" - "$RESULTS" "$REPEATS" "$NPROC" <<'PY'
import json, os, statistics, sys
results, repeats, nproc = sys.argv[1], int(sys.argv[2]), sys.argv[3]
load = lambda name: json.load(open(os.path.join(results, name)))
t = [load(f"trainer_{r}.json") for r in range(1, repeats + 1)]
p = [load(f"pytorch_{r}.json") for r in range(1, repeats + 1)]
ts = statistics.median(x["step_time_ms"]["p50"] for x in t)
ps = statistics.median(x["step_ms_median"] for x in p)
th = t[-1]["held_bytes"]["total"]
ph = max(r["total"] for r in p[-1]["state_bytes_per_rank"])
tc = t[-1]["comm_bytes_per_step"]
params = p[-1]["param_bytes"]
print(f"| fsdp, {nproc} Gloo processes, GPT {p[-1]['n_layer']}x{p[-1]['n_embd']} "
      f"({p[-1]['params']:,} parameters), batch {p[-1]['batch']}x{p[-1]['seq']} per rank | trainer | "
      f"PyTorch FSDP2 | trainer / PyTorch |")
print("| --- | --- | --- | --- |")
print(f"| step time, ms (median of {repeats} runs' medians) | {ts:.1f} | {ps:.1f} | {ts / ps:.2f} |")
print(f"| held bytes per rank (params + grads + optimizer) | {th:,} | {ph:,} | {th / ph:.2f} |")
to, po = t[-1]["ops_per_step"]["total"], p[-1]["ops_per_step"]["total"]
print(f"| ATen operators per step (top-level) | {to:.0f} | {po:.0f} | {to / po:.2f} |")
print(f"| host reads per step | {t[-1]['host_syncs_per_step']:.0f} | "
      f"{p[-1]['host_syncs_per_step']:.0f} | |")
print(f"| communicated bytes per step / parameter bytes | {tc / params:.3f} | "
      f"{p[-1]['comm_bytes_per_step_theoretical'] / params:.3f} (theoretical) | |")
PY
echo "bench_fsdp: results in $RESULTS" >&2
