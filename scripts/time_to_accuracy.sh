#!/usr/bin/env bash
# Time to accuracy on Fashion-MNIST: the trainer on configs/fashion_mnist_lenet.yaml, then the
# same recipe in plain PyTorch (scripts/time_to_accuracy.py: Dataset + DataLoader), one after the
# other; each stops after the first epoch whose test top-1 reaches TARGET. Wall-clock is the whole
# process of each (start-up and data loading included), measured here around it.
#
#   scripts/time_to_accuracy.sh [TARGET] [OUT]
#     TARGET  top-1 fraction to reach (default 0.916: the Fashion-MNIST benchmark's
#             "2 Conv + pooling" figure; the full comparison takes 20+ minutes on 2 cores)
#     OUT     directory for the runs, logs and results.md (default runs/time_to_accuracy)
#   TARGET=... and OUT=... in the environment work too; the arguments win.
# Environment: CONFIG (configs/fashion_mnist_lenet.yaml), BUILD (build), PY (.venv/bin/python),
#   TRAINER_ARGS / PY_ARGS: extra arguments for each side, split on spaces (quick checks, e.g.
#   PY_ARGS="--train-subset 6000"; the table then no longer compares the same work).
# The script takes no lock: on a shared machine run it as
#   flock /tmp/trainer-cpu.lock scripts/time_to_accuracy.sh
# Prints a markdown table and writes it to OUT/results.md. Needs train.stop_at_top1 in the trainer.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET=${1:-${TARGET:-0.916}}
OUT=${2:-${OUT:-runs/time_to_accuracy}}
CONFIG=${CONFIG:-configs/fashion_mnist_lenet.yaml}
BUILD=${BUILD:-build}
PY=${PY:-$ROOT/.venv/bin/python}
read -r -a trainer_args <<<"${TRAINER_ARGS:-}"
read -r -a py_args <<<"${PY_ARGS:-}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$ROOT"
TRAINER="$BUILD/trainer"
command_line="scripts/time_to_accuracy.sh $*"

if [[ ! -x "$TRAINER" ]]; then
  echo "time_to_accuracy.sh: $TRAINER not found; build it first (scripts/build.sh)" >&2
  exit 2
fi
rm -rf "$OUT/trainer"
# The resolved config: what the trainer runs, and what the Python reference reads (every
# default spelled out). Fails when this trainer has no train.stop_at_top1.
if ! "$TRAINER" --print-config --config "$CONFIG" --set "train.stop_at_top1=$TARGET" \
    "${trainer_args[@]}" >"$OUT/config.yaml" 2>"$OUT/config.err"; then
  cat "$OUT/config.err" >&2
  echo "time_to_accuracy.sh: $TRAINER rejects the config above (a trainer without" \
       "train.stop_at_top1 needs a rebuild: scripts/build.sh)" >&2
  exit 2
fi
rm -f "$OUT/config.err"

now() { date +%s.%N; }

trainer_cmd=("$TRAINER" --config "$CONFIG" --set "train.stop_at_top1=$TARGET"
             "${trainer_args[@]}" --run-dir "$OUT/trainer" --set run.overwrite=true)
echo "== trainer: ${trainer_cmd[*]}" >&2
t0=$(now)
"${trainer_cmd[@]}" 2>&1 | tee "$OUT/trainer.log" | sed -un '/eval step\|reached\|done:/p' >&2
t1=$(now)

py_cmd=("$PY" scripts/time_to_accuracy.py --config "$OUT/config.yaml" --target "$TARGET"
        "${py_args[@]}")
echo "== pytorch: ${py_cmd[*]}" >&2
t2=$(now)
"${py_cmd[@]}" 2>&1 >"$OUT/pytorch.json" | tee "$OUT/pytorch.log" >&2
t3=$(now)

cpu=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)
"$PY" - "$OUT" "$TARGET" "$t0" "$t1" "$t2" "$t3" "$cpu" "$(nproc)" "$("$TRAINER" --version | tr '\n' ' ')" \
  "$command_line" "${trainer_cmd[*]}" "${py_cmd[*]}" "$CONFIG" <<'PY' | tee "$OUT/results.md"
import datetime, json, platform, sys
out, target, t0, t1, t2, t3, cpu, nproc, version, command, trainer_cmd, py_cmd, config = sys.argv[1:]
target = float(target)
trainer_wall, py_wall = float(t1) - float(t0), float(t3) - float(t2)

evals = []
with open(f"{out}/trainer/metrics.jsonl") as f:
    for line in f:
        r = json.loads(line)
        if r.get("split") == "val" and "top1" in r:
            evals.append(r)
trainer_top1 = [r["top1"] for r in evals]
with open(f"{out}/pytorch.json") as f:
    py = json.loads(f.read().strip().splitlines()[-1])
py_top1 = py["top1"]

def reached(top1s):
    return next((i + 1 for i, t in enumerate(top1s) if t >= target), None)

def row(name, top1s, wall, ratio):
    n = reached(top1s)
    epochs = str(n) if n else f"not reached in {len(top1s)}"
    best = top1s[n - 1] if n else max(top1s, default=float("nan"))
    return f"| {name} | {epochs} | {100 * best:.2f}% | {wall:.1f} | {ratio} |"

both = reached(trainer_top1) and reached(py_top1)
ratio = f"{py_wall / trainer_wall:.2f}" if both else "n/a (a side did not reach the target)"
print(f"## Time to {100 * target:.1f}% test top-1, Fashion-MNIST, {config}\n")
print("| implementation | epochs to target | top-1 reached | wall seconds to target | python/trainer |")
print("| --- | --- | --- | --- | --- |")
print(row("trainer (C++/LibTorch)", trainer_top1, trainer_wall, "1.00" if both else "n/a"))
workers = f"{py['workers']} worker" + ("" if py["workers"] == 1 else "s")
print(row(f"PyTorch {py['torch']} (Dataset + DataLoader, {workers})", py_top1,
          py_wall, ratio))
print("\n| epoch | trainer top-1 | PyTorch top-1 |")
print("| --- | --- | --- |")
for i in range(max(len(trainer_top1), len(py_top1))):
    cell = lambda v: f"{100 * v[i]:.2f}%" if i < len(v) else ""
    print(f"| {i + 1} | {cell(trainer_top1)} | {cell(py_top1)} |")
print()
print(f"- machine: {cpu}, {nproc} cores; PyTorch used {py['threads']} intra-op threads, the trainer "
      "LibTorch's default (run.threads 0)")
print(f"- versions: {version.strip()}; PyTorch {py['torch']}, Python {platform.python_version()}")
print(f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
print(f"- command: `{command.strip()}`")
print(f"  - trainer: `{trainer_cmd}`")
print(f"  - PyTorch: `{py_cmd}`")
print("- wall seconds: the whole process of each, start-up and data loading included, measured "
      "around it; it stops after the evaluation that reaches the target (the trainer also writes "
      "its checkpoint and TensorBoard events). Same recipe and same initial weights; the sample "
      "order and dropout masks come from each side's own generators.")
if py["train_samples"] != 60000 or py["test_samples"] != 10000:
    print(f"- PyTorch on a subset: {py['train_samples']} train / {py['test_samples']} test images")
PY
