#!/usr/bin/env bash
# What a training step dispatches, and what the optimizer implementations cost on the CPU:
#   1. ATen operators per step by phase and host reads per step (`trainer bench`'s ops_per_step
#      and host_syncs_per_step) against PyTorch with fused=True optimizers (bench_reference.py,
#      the same counting over torch.profiler), for mlp, lenet, resnet18, resnet50 and GPT-2 small;
#   2. the optimizer phase's operators for each optim.impl (fused, foreach, loop), trainer and
#      PyTorch (fused=True, foreach=True, the single-tensor path), on resnet50 and GPT-2 small;
#   3. the optimizer phase's time for each optim.impl on resnet50 and GPT-2 small: REPEATS rounds,
#      the implementations' order rotating, each run a fresh `trainer bench --fixed-batch`
#      process; the median milliseconds per step and loop's time over fused's.
# Prints the three markdown tables; every JSON object stays in RESULTS.
#
#   scripts/bench_dispatch.sh [OPS=1] [TIMING=1] [REPEATS=5] [RESULTS=DIR]
#
# Cases (configs/bench/): mlp_fmnist, lenet_fmnist, resnet18_cifar32, cpu_resnet50,
# cpu_gpt2_small. Counting runs 1 warm-up, 2 timed and 3 counted steps on one fixed batch; timing
# runs 2 warm-up and 5 timed steps. The default run takes about 25 minutes on 2 cores.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
for arg in "$@"; do
  case "$arg" in
    OPS=* | TIMING=* | REPEATS=* | RESULTS=*) export "${arg%%=*}=${arg#*=}" ;;
    *) echo "bench_dispatch: unknown argument '$arg'; expected OPS=, TIMING=, REPEATS= or RESULTS=" >&2
       exit 2 ;;
  esac
done
OPS=${OPS:-1}
TIMING=${TIMING:-1}
REPEATS=${REPEATS:-5}
RESULTS=${RESULTS:-runs/bench_dispatch/$(date -u +%Y%m%d-%H%M%S)}
PY=.venv/bin/python
TRAINER=build/trainer
[[ -x $TRAINER ]] || scripts/build.sh >&2
mkdir -p "$RESULTS"
declare -A CONFIG=([mlp]=mlp_fmnist [lenet]=lenet_fmnist [resnet18]=resnet18_cifar32
  [resnet50]=cpu_resnet50 [gpt2_small]=cpu_gpt2_small)
IMPLS=(fused foreach loop)

# count CASE IMPL: the trainer's and PyTorch's counts into RESULTS.
count() {
  local cfg=configs/bench/${CONFIG[$1]}.yaml
  "$TRAINER" bench --config "$cfg" --set optim.impl="$2" --fixed-batch --steps 2 --warmup 1 \
    --json "$RESULTS/ops_trainer_$1_$2.json" > /dev/null
  "$PY" scripts/bench_reference.py --config "$cfg" --set optim.impl="$2" --fixed-batch --steps 2 \
    --warmup 1 --json "$RESULTS/ops_pytorch_$1_$2.json" > /dev/null
}

if [[ $OPS == 1 ]]; then
  for c in mlp lenet resnet18 resnet50 gpt2_small; do count "$c" fused; done
  for c in resnet50 gpt2_small; do
    for impl in foreach loop; do count "$c" "$impl"; done
  done
fi
if [[ $TIMING == 1 ]]; then
  for rep in $(seq "$REPEATS"); do
    for c in resnet50 gpt2_small; do
      for k in 0 1 2; do
        impl=${IMPLS[$(((rep + k) % 3))]}
        "$TRAINER" bench --config "configs/bench/${CONFIG[$c]}.yaml" --set optim.impl="$impl" \
          --fixed-batch --steps 5 --warmup 2 --json "$RESULTS/time_${c}_${impl}_$rep.json" > /dev/null
      done
    done
  done
fi

"$PY" - "$RESULTS" "$OPS" "$TIMING" <<'PY'
import glob, json, os, statistics, sys
results, ops, timing = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
def load(name):
    with open(os.path.join(results, name)) as f:
        return json.load(f)
def split(r):
    o = r["ops_per_step"]
    return (f"{o['total']:.0f} ({o['forward']:.0f} / {o['backward']:.0f} / "
            f"{o['optimizer']:.0f} / {o['other']:.0f})")
if ops:
    print("| model | trainer, fused | PyTorch, fused=True | trainer / PyTorch | host reads: trainer, PyTorch |")
    print("| --- | --- | --- | --- | --- |")
    for c in ("mlp", "lenet", "resnet18", "resnet50", "gpt2_small"):
        t, p = load(f"ops_trainer_{c}_fused.json"), load(f"ops_pytorch_{c}_fused.json")
        ratio = t["ops_per_step"]["total"] / p["ops_per_step"]["total"]
        print(f"| {c} | {split(t)} | {split(p)} | {ratio:.2f} | "
              f"{t['host_syncs_per_step']:.0f}, {p['host_syncs_per_step']:.0f} |")
    print()
    print("| model | optimizer phase: trainer fused / foreach / loop | PyTorch fused=True / foreach=True / single-tensor |")
    print("| --- | --- | --- |")
    for c in ("resnet50", "gpt2_small"):
        t = [load(f"ops_trainer_{c}_{i}.json")["ops_per_step"]["optimizer"] for i in ("fused", "foreach", "loop")]
        p = [load(f"ops_pytorch_{c}_{i}.json")["ops_per_step"]["optimizer"] for i in ("fused", "foreach", "loop")]
        print(f"| {c} | {' / '.join(f'{x:.0f}' for x in t)} | {' / '.join(f'{x:.0f}' for x in p)} |")
    print()
if timing:
    print("| model | optimizer phase, ms per step: fused / foreach / loop (median) | loop / fused |")
    print("| --- | --- | --- |")
    for c in ("resnet50", "gpt2_small"):
        med = {}
        for impl in ("fused", "foreach", "loop"):
            runs = [json.load(open(f))["phases_ms"]["optimizer"]
                    for f in glob.glob(os.path.join(results, f"time_{c}_{impl}_*.json"))]
            med[impl] = statistics.median(runs)
        print(f"| {c} | {med['fused']:.1f} / {med['foreach']:.1f} / {med['loop']:.1f} | "
              f"{med['loop'] / med['fused']:.2f} |")
PY
echo "bench_dispatch: results in $RESULTS" >&2
