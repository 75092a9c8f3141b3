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
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
for arg in "$@"; do
  case "$arg" in
    REPEATS=* | NPROC=* | LAYERS=* | EMBD=* | HEADS=* | BATCH=* | SEQ=* | STEPS=* | WARMUP=* | RESULTS=*)
      export "${arg%%=*}=${arg#*=}" ;;
    *) echo "bench_fsdp: unknown argument '$arg'; expected REPEATS=, NPROC=, LAYERS=, EMBD=," \
         "HEADS=, BATCH=, SEQ=, STEPS=, WARMUP= or RESULTS=" >&2
       exit 2 ;;
  esac
done
REPEATS=${REPEATS:-3} NPROC=${NPROC:-2} LAYERS=${LAYERS:-4} EMBD=${EMBD:-128} HEADS=${HEADS:-4}
BATCH=${BATCH:-8} SEQ=${SEQ:-128} STEPS=${STEPS:-20} WARMUP=${WARMUP:-5}
RESULTS=${RESULTS:-runs/bench_fsdp/$(date -u +%Y%m%d-%H%M%S)}
PY=.venv/bin/python
TRAINER=build/trainer
[[ -x $TRAINER ]] || scripts/build.sh >&2
mkdir -p "$RESULTS"
export OMP_NUM_THREADS=1
# The model and step of bench_fsdp.py's defaults: bytes of Debian's fortunes (vocabulary 256),
# AdamW (0.9, 0.99) lr 1e-3, weight decay 0.1 on matrices, clipping at 1.0, fp32.
CONFIG="--config configs/gpt_char.yaml --set model.n_layer=$LAYERS --set model.n_head=$HEADS
  --set model.n_embd=$EMBD --set model.block_size=$SEQ --set model.dropout=0 --set model.bias=false
  --set data.batch_size=$BATCH --set data.workers=0 --set optim.name=adamw --set optim.lr=0.001
  --set optim.weight_decay=0.1 --set train.clip_grad_norm=1.0 --set sched.name=constant
  --set sched.warmup_steps=0 --set run.threads=1 --set dist.strategy=fsdp"
# run NAME COMMAND...: COMMAND's output in $RESULTS/NAME.log; its last lines when it fails
# without having written $RESULTS/NAME.json (PyTorch's Gloo teardown at exit sometimes aborts
# after the results are out: "terminate called without an active exception").
run() {
  local name=$1
  shift
  if ! "$@" > "$RESULTS/$name.log" 2>&1 && [[ ! -s "$RESULTS/$name.json" ]]; then
    echo "bench_fsdp: $name failed; the end of $RESULTS/$name.log:" >&2
    tail -n 5 "$RESULTS/$name.log" >&2
    exit 1
  fi
}
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
