#!/usr/bin/env bash
# Data-parallel training on the CPU over Gloo: the trainer's DDP (`trainer launch`, 2 processes)
# beside PyTorch's DistributedDataParallel under torchrun (scripts/bench_ddp.py), same model, data,
# per-rank batch, optimizer and threads, on Fashion-MNIST; then the cost of the trainer's DDP path
# at world size 1 (a plain run against `trainer launch --nproc-per-node 1`, a 1-rank Gloo group),
# and the same for PyTorch (no DDP against DDP under torchrun). Alone the trainer builds no reducer;
# a third world-size-1 run sets dist.reducer_at_world_size_1 to measure the reducer itself. Runs alternate between the
# implementations, REPEATS times; the medians are printed as markdown tables, appended to $OUT.
# A world-size-1 overhead is the median over the repeats of each repeat's own ratio (its runs are
# neighbours in time, so a machine whose speed drifts between repeats affects both alike); a second
# plain trainer run per repeat gives the same statistic between two identical runs: the noise.
#
# The trainer's throughput is taken from <run dir>/metrics.jsonl: the train windows (run.log_every
# steps each; samples_per_sec summed over the ranks) after the first WARMUP steps, weighted by
# their length. PyTorch's is timed around its loop of STEPS steps after WARMUP untimed steps. Both
# include building each batch (the trainer in its loader thread, PyTorch in the main process).
# Evaluation and checkpoints are pushed past the last step (one final checkpoint is written after
# the timed windows); dropout is 0, SGD lr 0.05 momentum 0.9, no weight decay, constant lr.
#
#   scripts/bench_ddp.sh      Environment: MODELS ("lenet mlp"), BATCH (64 per rank), STEPS (300),
#                             WARMUP (30), REPEATS (3), THREADS (1 per process, 2 processes),
#                             WS1_THREADS (2, world-size-1 runs), WS2 (1: the 2-process
#                             comparison; 0: only world size 1), LOG_EVERY (a divisor of WARMUP
#                             giving >= 4 windows after it), PY_WS1 (1: also PyTorch at world
#                             size 1), TRAINER (build/trainer), OUT (markdown file, appended to)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TRAINER=${TRAINER:-$ROOT/build/trainer}
MODELS=${MODELS:-lenet mlp}
BATCH=${BATCH:-64}
STEPS=${STEPS:-300}
WARMUP=${WARMUP:-30}
REPEATS=${REPEATS:-3}
THREADS=${THREADS:-1}
WS1_THREADS=${WS1_THREADS:-2}
PY_WS1=${PY_WS1:-1}
WS2=${WS2:-1}
OUT=${OUT:-}
PY="$ROOT/.venv/bin/python"
TORCHRUN="$ROOT/.venv/bin/torchrun"
TOTAL=$((WARMUP + STEPS))
if [[ -z ${LOG_EVERY:-} ]]; then  # the largest divisor of WARMUP leaving >= 4 windows after it
  LOG_EVERY=$(( STEPS / 10 > 0 ? STEPS / 10 : 1 ))
  if (( WARMUP > 0 )); then
    for ((d = WARMUP; d >= 1; d--)); do
      if (( WARMUP % d == 0 && STEPS / d >= 4 )); then LOG_EVERY=$d; break; fi
    done
  fi
fi
if (( WARMUP % LOG_EVERY != 0 )); then
  echo "bench_ddp: LOG_EVERY ($LOG_EVERY) must divide WARMUP ($WARMUP)" >&2; exit 2
fi
if ! "$TRAINER" launch --help >/dev/null 2>&1; then
  echo "bench_ddp: '$TRAINER launch --help' fails; build a trainer with the launch command" >&2
  exit 1
fi

cd "$ROOT"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/bench_ddp.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
RESULTS=$TMP/results.jsonl
REPEAT=0  # the repeat under way, recorded with each result
: >"$RESULTS"

# The conditions.
cpu=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
torch_version=$("$PY" -c 'import torch; print(torch.__version__)')
trainer_version=$("$TRAINER" --version | head -1)
conditions="$(date -u '+%Y-%m-%d %H:%M UTC'); $cpu, nproc $(nproc); $trainer_version; torch \
$torch_version; Gloo; Fashion-MNIST, batch $BATCH per rank, $STEPS steps after $WARMUP warm-up \
(trainer windows of $LOG_EVERY steps), $REPEATS repeats"
echo "conditions: $conditions"

# Trainer settings shared by every trainer run (the PyTorch side's protocol), into targs.
trainer_args() {  # model threads run_dir
  targs=(--config "configs/fashion_mnist_$1.yaml" --set model.dropout=0
    --set optim.name=sgd --set optim.lr=0.05 --set optim.momentum=0.9 --set optim.nesterov=false
    --set optim.weight_decay=0 --set sched.name=constant --set sched.warmup_steps=0
    --set data.batch_size="$BATCH" --set train.max_steps="$TOTAL" --set run.log_every="$LOG_EVERY"
    --set run.eval_every=$((TOTAL + 1)) --set run.checkpoint_every=$((TOTAL + 1))
    --set run.keep_last=1 --set train.eval_at_end=false --set run.threads="$2"
    --set run.progress=never --set run.tensorboard=false --run-dir "$3")
}

fail() {  # log
  echo "bench_ddp: run failed; the end of its log ($1):" >&2
  tail -n 30 "$1" >&2
  exit 1
}

# One trainer run; appends its JSON line to $RESULTS. mode: plain | plain2 (the same, again) | ddp
# (under trainer launch) | reducer (ddp with the reducer at world size 1).
run_trainer() {  # model mode nproc threads
  local model=$1 mode=$2 nproc=$3 threads=$4 dir targs
  dir=$(mktemp -d "$TMP/run.XXXXXX")
  trainer_args "$model" "$threads" "$dir/run"
  if [[ $mode == plain* ]]; then
    OMP_NUM_THREADS=$threads "$TRAINER" "${targs[@]}" >"$dir/log" 2>&1 || fail "$dir/log"
  else
    [[ $mode == reducer ]] && targs+=(--set dist.reducer_at_world_size_1=true)
    OMP_NUM_THREADS=$threads "$TRAINER" launch --standalone --nproc-per-node "$nproc" -- \
      "${targs[@]}" >"$dir/log" 2>&1 || fail "$dir/log"
  fi
  "$PY" - "$dir/run/metrics.jsonl" "$model" "$mode" "$nproc" "$threads" "$BATCH" "$STEPS" \
    "$WARMUP" <<'PY' | record || fail "$dir/log"
import json, sys
path, model, mode = sys.argv[1:4]
world, threads, batch, steps, warmup = map(int, sys.argv[4:9])
rows = [json.loads(l) for l in open(path)]
rows = sorted((r for r in rows if r.get("split") == "train"), key=lambda r: r["step"])
samples = seconds = 0.0
prev = 0
for r in rows:  # each window's length from the step before; its samples over its rate = seconds
    n = (r["step"] - prev) * batch * world
    if prev >= warmup and r["samples_per_sec"] > 0:
        samples += n
        seconds += n / r["samples_per_sec"]
    prev = r["step"]
if seconds <= 0:
    sys.exit(f"{path}: no train window after step {warmup}")
sps = samples / seconds
print(json.dumps({"impl": "trainer", "mode": mode, "model": model, "world_size": world,
                  "batch": batch, "threads": threads, "steps": steps, "samples_per_sec": sps,
                  "step_ms_mean": 1000 * batch * world / sps}))
PY
  rm -rf "$dir"
}

# One PyTorch run; appends its JSON line to $RESULTS. mode: plain (no torchrun) | ddp.
run_python() {  # model mode nproc threads
  local model=$1 mode=$2 nproc=$3 threads=$4 log=$TMP/python.log line
  local args=(--model "$model" --batch "$BATCH" --steps "$STEPS" --warmup "$WARMUP"
              --threads "$threads")
  if [[ $mode == plain ]]; then
    line=$(OMP_NUM_THREADS=$threads "$PY" scripts/bench_ddp.py --no-ddp "${args[@]}" 2>"$log") \
      || fail "$log"
  else
    line=$(OMP_NUM_THREADS=$threads "$TORCHRUN" --standalone --nproc-per-node "$nproc" \
      scripts/bench_ddp.py "${args[@]}" 2>"$log") || fail "$log"
  fi
  grep '^{' <<<"$line" | record || fail "$log"
}

record() {  # the JSON lines on stdin, each with the current repeat ($REPEAT), onto $RESULTS
  "$PY" -c 'import json, sys
for line in sys.stdin:
    print(json.dumps({**json.loads(line), "repeat": int(sys.argv[1])}))' "$REPEAT" >>"$RESULTS"
}

show() {  # the newest result, one line
  "$PY" -c 'import json, sys
r = json.loads(sys.stdin.readlines()[-1])
print("  %(impl)-7s %(mode)-7s %(model)-5s world %(world_size)s, %(threads)s threads: "
      "%(samples_per_sec)8.0f samples/s" % r)' <"$RESULTS"
}

for model in $MODELS; do
  # The models agree: the trainer's parameter count against PyTorch's.
  params=$("$TRAINER" --config "configs/fashion_mnist_$model.yaml" --dry-run 2>/dev/null \
           | sed -n 's/^parameters: //p')
  echo "{\"impl\": \"trainer\", \"mode\": \"dry-run\", \"model\": \"$model\", \"parameters\": ${params:-null}}" \
    >>"$RESULTS"
  echo "$model: 2 processes x $THREADS threads"
  for ((REPEAT = 1; REPEAT <= REPEATS * WS2; REPEAT++)); do
    run_trainer "$model" ddp 2 "$THREADS"; show
    run_python "$model" ddp 2 "$THREADS"; show
  done
  echo "$model: world size 1, $WS1_THREADS threads"
  for ((REPEAT = 1; REPEAT <= REPEATS; REPEAT++)); do
    # Each repeat starts at another place in the order, so that no mode always runs first (the
    # first run after the PyTorch ones measures slower here).
    modes=(plain ddp reducer plain2)
    for ((i = 0; i < 4; i++)); do
      run_trainer "$model" "${modes[(i + REPEAT) % 4]}" 1 "$WS1_THREADS"; show
    done
    if [[ $PY_WS1 == 1 ]]; then
      modes=(plain ddp)
      for ((i = 0; i < 2; i++)); do
        run_python "$model" "${modes[(i + REPEAT) % 2]}" 1 "$WS1_THREADS"; show
      done
    fi
  done
done

"$PY" - "$RESULTS" "$conditions" "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
conditions, out = sys.argv[2], sys.argv[3]

def med(impl, mode, model, world):
    v = [r["samples_per_sec"] for r in rows if (r["impl"], r["mode"], r["model"],
         r.get("world_size")) == (impl, mode, model, world)]
    return statistics.median(v) if v else None

def fmt(x):
    return f"{x:.0f}" if x is not None else "–"

models = list(dict.fromkeys(r["model"] for r in rows))
lines = [f"Conditions: {conditions}.", ""]
for m in models:  # the parameter counts agree
    t = next((r["parameters"] for r in rows if r["model"] == m and r["mode"] == "dry-run"), None)
    p = next((r["parameters"] for r in rows if r["model"] == m and r["impl"] == "python"), None)
    note = "equal" if t == p else "DIFFERENT"
    print(f"{m}: parameters trainer {t}, python {p} ({note})")
first = next(r for r in rows if r["mode"] != "dry-run")
threads = {(r["model"], r.get("world_size")): r["threads"] for r in rows if "threads" in r}
if any(r.get("world_size") == 2 for r in rows):  # the 2-process comparison (WS2=1)
    lines += ["| model | batch per rank | processes | threads per process | trainer samples/s "
              "| python samples/s | trainer/python samples/s | step time trainer/python |",
              "|---|---|---|---|---|---|---|---|"]
    for m in models:
        t, p = med("trainer", "ddp", m, 2), med("python", "ddp", m, 2)
        ratio = t / p if t and p else None
        lines.append(f"| {m} | {first['batch']} | 2 | {threads.get((m, 2), '?')} | {fmt(t)} | {fmt(p)} "
                     f"| {ratio:.2f} | {1 / ratio:.2f} |" if ratio else
                     f"| {m} | {first['batch']} | 2 | ? | {fmt(t)} | {fmt(p)} | – | – |")
        if ratio:
            print(f"{m}, 2 processes: trainer {t:.0f} samples/s, python {p:.0f} samples/s: "
                  f"trainer/python {ratio:.2f} (goal >= 1.0), step time trainer/python "
                  f"{1 / ratio:.2f} (goal <= 1.0)")
    lines.append("")
def paired(impl, mode, m):
    """Per repeat: the step time in `mode` over the plain step time, less one; their median and
    the middle half of them (quartiles)."""
    by = {}
    for r in rows:
        if (r["impl"], r["model"], r.get("world_size")) == (impl, m, 1) and "repeat" in r:
            by.setdefault(r["repeat"], {})[r["mode"]] = r["samples_per_sec"]
    v = sorted(x["plain"] / x[mode] - 1 for x in by.values() if "plain" in x and mode in x)
    if not v:
        return None
    q = statistics.quantiles(v, n=4, method="inclusive") if len(v) >= 2 else [v[0], v[0], v[0]]
    return statistics.median(v), q[0], q[2], len(v)

lines += ["| model | batch | threads | implementation | plain samples/s "
          "| DDP (1 rank) samples/s | DDP overhead (median of repeats) | middle half of repeats |",
          "|---|---|---|---|---|---|---|---|"]
for m in models:
    for impl, mode, label in (("trainer", "ddp", "trainer"),
                              ("trainer", "reducer", "trainer, reducer at world size 1"),
                              ("trainer", "plain2", "trainer, a second plain run (noise)"),
                              ("python", "ddp", "python")):
        a, b = med(impl, "plain", m, 1), med(impl, mode, m, 1)
        p = paired(impl, mode, m)
        if p is None:
            continue
        over = f"{100 * p[0]:+.1f}%"
        spread = f"{100 * p[1]:+.1f}% .. {100 * p[2]:+.1f}% ({p[3]} repeats)"
        lines.append(f"| {m} | {first['batch']} | {threads.get((m, 1), '?')} | {label} | {fmt(a)} "
                     f"| {fmt(b)} | {over} | {spread} |")
text = "\n".join(lines) + "\n"
print()
print(text, end="")
if out:
    with open(out, "a") as f:
        f.write("\n" + text)
PY
