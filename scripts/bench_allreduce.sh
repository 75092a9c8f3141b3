#!/usr/bin/env bash
# The all-reduce bus bandwidth `trainer doctor --perf` reports for 64 MiB against PyTorch's
# (scripts/allreduce_reference.py, the same protocol), both with 2 processes on this machine:
# REPEATS rounds, the two alternating, each a fresh job; prints the medians and their ratio.
#
#   scripts/bench_allreduce.sh [REPEATS=5] [RESULTS=DIR]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
for arg in "$@"; do
  case "$arg" in
    REPEATS=* | RESULTS=*) export "${arg%%=*}=${arg#*=}" ;;
    *) echo "bench_allreduce: unknown argument '$arg'; expected REPEATS= or RESULTS=" >&2
       exit 2 ;;
  esac
done
REPEATS=${REPEATS:-5}
RESULTS=${RESULTS:-runs/bench_allreduce/$(date -u +%Y%m%d-%H%M%S)}
PY=.venv/bin/python
TRAINER=build/trainer
[[ -x $TRAINER ]] || scripts/build.sh >&2
mkdir -p "$RESULTS"
export OMP_NUM_THREADS=1
for rep in $(seq "$REPEATS"); do
  "$TRAINER" launch --standalone --nproc-per-node 2 -- doctor --perf --quick --json 2>/dev/null |
    sed 's/^\[rank0\]: //' > "$RESULTS/trainer_$rep.json"
  "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 scripts/allreduce_reference.py \
    --bytes $((64 << 20)) --iters 5 --json "$RESULTS/pytorch_$rep.json" > /dev/null 2>&1
done
"$PY" - "$RESULTS" "$REPEATS" <<'PY'
import json, os, statistics, sys
results, repeats = sys.argv[1], int(sys.argv[2])
trainer, pytorch = [], []
for rep in range(1, repeats + 1):
    with open(os.path.join(results, f"trainer_{rep}.json")) as f:
        text = f.read()
    report = json.loads(text[text.index("{"):])
    trainer += [c["busbw_gbps"] for c in report["collectives"]
                if c["collective"] == "all_reduce" and c["message_bytes"] == 64 << 20]
    with open(os.path.join(results, f"pytorch_{rep}.json")) as f:
        pytorch.append(json.load(f)["busbw_gbps"])
t, p = statistics.median(trainer), statistics.median(pytorch)
print("| all-reduce 64 MiB, 2 processes, Gloo | trainer doctor --perf | PyTorch (torch.distributed) | trainer / PyTorch |")
print("| --- | --- | --- | --- |")
print(f"| bus bandwidth, GB/s (median of {repeats}) | {t:.3f} | {p:.3f} | {t / p:.2f} |")
PY
echo "bench_allreduce: results in $RESULTS" >&2
