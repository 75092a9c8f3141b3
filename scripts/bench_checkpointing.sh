#!/usr/bin/env bash
# Activation checkpointing on the CPU: step time and step memory of resnet50 (batch 32, 224 px)
# and a 12-layer GPT-2 small (batch 8, block 1024), with and without checkpointing every block,
# for the trainer (bench/bench_checkpointing.cpp) and PyTorch with torch.utils.checkpoint
# (scripts/bench_checkpointing.py). Every case runs in a fresh process, the two implementations
# alternating; malloc returns freed tensors to the system at once (MALLOC_MMAP_THRESHOLD_) so the
# resident set follows live memory. Prints a markdown table; the JSON lines go to $OUT.
#
#   scripts/bench_checkpointing.sh     Environment: MODELS ("resnet50 gpt"), IMPLS ("trainer python"),
#                                      STEPS (3), THREADS (2), BUILD (build),
#                                      OUT (bench_checkpointing.jsonl, appended to)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD:-$ROOT/build}
MODELS=${MODELS:-resnet50 gpt}
IMPLS=${IMPLS:-trainer python}
STEPS=${STEPS:-3}
THREADS=${THREADS:-2}
OUT=${OUT:-bench_checkpointing.jsonl}
PY="$ROOT/.venv/bin/python"
ninja -C "$BUILD" bench_checkpointing >/dev/null
export MALLOC_MMAP_THRESHOLD_=65536 OMP_NUM_THREADS=$THREADS
for model in $MODELS; do
  for mode in none blocks; do
    args=(--model "$model" --checkpointing "$mode" --steps "$STEPS" --threads "$THREADS")
    for impl in $IMPLS; do
      case $impl in
        trainer) "$BUILD/bench_checkpointing" "${args[@]}" >>"$OUT" ;;
        python) "$PY" "$ROOT/scripts/bench_checkpointing.py" "${args[@]}" >>"$OUT" ;;
      esac
    done
  done
done

"$PY" - "$OUT" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
by = {(r["impl"], r["model"], r["checkpointing"]): r for r in rows}  # the newest of each
print("| model | implementation | step s (none → blocks) | step time | step peak MB (none → blocks) "
      "| activations MB (none → blocks) | activation memory |")
print("|---|---|---|---|---|---|---|")
for model in dict.fromkeys(r["model"] for r in rows):
    for impl in ("trainer", "python"):
        a, b = by.get((impl, model, "none")), by.get((impl, model, "blocks"))
        if not a or not b:
            continue
        # The step's peak above its start holds the new gradients (set_to_none) plus activations.
        act_a = a["step_peak_mb"] - a["params_mb"]
        act_b = b["step_peak_mb"] - b["params_mb"]
        print(f"| {model} b{a['batch']} | {impl} | {a['step_s_median']:.2f} → {b['step_s_median']:.2f} "
              f"| {100 * (b['step_s_median'] / a['step_s_median'] - 1):+.0f}% "
              f"| {a['step_peak_mb']:.0f} → {b['step_peak_mb']:.0f} "
              f"| {act_a:.0f} → {act_b:.0f} | {100 * (act_b / act_a - 1):+.0f}% |")
PY
