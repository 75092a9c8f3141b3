#!/usr/bin/env bash
# `trainer bench` against the same configs in PyTorch (scripts/bench_reference.py): eager, and
# torch.compile with COMPILE=1. Each case runs REPEATS times, the implementations alternating
# (their order reversed every other repeat), each run in a fresh process; every JSON object and
# log stays in RESULTS. The medians go into a markdown table, printed and written into OUT between
# the lines `<!-- bench_compare:begin -->` and `<!-- bench_compare:end -->` (a section with them
# is appended to OUT when it has none).
#
#   scripts/bench_compare.sh [CASES="mlp lenet resnet18 gpt lenet_ddp"] [REPEATS=3] [STEPS=N]
#       [WARMUP=N] [COMPILE=1] [FIXED_BATCH=0] [OUT=docs/benchmarks.md] [RESULTS=DIR]
#
# Settings are KEY=VALUE arguments or environment variables. STEPS and WARMUP, when set, replace
# every case's own defaults (below). FIXED_BATCH=1 passes --fixed-batch to every run: each trains
# on one batch kept on the device, the step's speed without the data loader. RESULTS defaults to
# runs/bench_compare/<UTC time>. OUT= (empty) prints the table without writing it anywhere.
# build/trainer is built (scripts/build.sh) only when missing.
#
# Cases (configs/bench/): steps / warm-up by default, single processes with run.threads=2,
# lenet_ddp with 2 processes of 1 thread (`trainer launch` against torchrun):
#   mlp        mlp_fmnist.yaml        500 / 50
#   lenet      lenet_fmnist.yaml      100 / 10
#   resnet18   resnet18_cifar32.yaml   20 / 3
#   gpt        gpt_6x256.yaml          20 / 3
#   llama      llama_4x256.yaml        10 / 2   (not in the default CASES: CASES=llama)
#   llama_lora llama_lora_4x256.yaml   10 / 2   (LoRA against PEFT; not in the default CASES)
#   lenet_ddp  lenet_fmnist.yaml      100 / 10
# The default run (5 cases, 3 repeats, with torch.compile) takes about 12 minutes on 2 cores, the
# first compilation of each model (up to a minute for resnet18) included.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
COMMAND="scripts/bench_compare.sh"
for arg in "$@"; do
  if [[ $arg == *" "* ]]; then COMMAND+=" ${arg%%=*}=\"${arg#*=}\""; else COMMAND+=" $arg"; fi
  case "$arg" in
    CASES=* | REPEATS=* | STEPS=* | WARMUP=* | COMPILE=* | FIXED_BATCH=* | OUT=* | RESULTS=*)
      export "${arg%%=*}=${arg#*=}" ;;
    *)
      echo "bench_compare: unknown argument '$arg'; expected CASES=, REPEATS=, STEPS=, WARMUP=," \
        "COMPILE=, FIXED_BATCH=, OUT= or RESULTS=" >&2
      exit 2 ;;
  esac
done
CASES=${CASES:-mlp lenet resnet18 gpt lenet_ddp}
REPEATS=${REPEATS:-3}
STEPS=${STEPS:-}
WARMUP=${WARMUP:-}
COMPILE=${COMPILE:-1}
FIXED_BATCH=${FIXED_BATCH:-0}
OUT=${OUT-docs/benchmarks.md}
RESULTS=${RESULTS:-runs/bench_compare/$(date -u +%Y%m%d-%H%M%S)}
PY=.venv/bin/python
TORCHRUN=.venv/bin/torchrun
TRAINER=build/trainer

declare -A CONFIG=([mlp]=mlp_fmnist [lenet]=lenet_fmnist [resnet18]=resnet18_cifar32
  [gpt]=gpt_6x256 [lenet_ddp]=lenet_fmnist [llama]=llama_4x256 [llama_lora]=llama_lora_4x256)
declare -A CASE_STEPS=([mlp]=500 [lenet]=100 [resnet18]=20 [gpt]=20 [lenet_ddp]=100 [llama]=10
  [llama_lora]=10)
declare -A CASE_WARMUP=([mlp]=50 [lenet]=10 [resnet18]=3 [gpt]=3 [lenet_ddp]=10 [llama]=2
  [llama_lora]=2)
declare -A PROCS=([lenet_ddp]=2)

for c in $CASES; do
  [[ -n ${CONFIG[$c]:-} ]] || {
    echo "bench_compare: unknown case '$c'; known: ${!CONFIG[*]}" >&2
    exit 2
  }
done
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || { echo "bench_compare: REPEATS must be >= 1" >&2; exit 2; }
[[ -x $TRAINER ]] || scripts/build.sh
if ! "$TRAINER" bench --help >/dev/null 2>&1; then
  echo "bench_compare: '$TRAINER bench --help' fails; rebuild (scripts/build.sh)" >&2
  exit 1
fi
mkdir -p "$RESULTS"

impls=(trainer eager)
if [[ $COMPILE == 1 ]]; then impls+=(compile); fi

# One run of case $1 by implementation $2, repeat $3: its JSON and log go to RESULTS. A trainer or
# eager failure stops the script; a torch.compile failure leaves that cell n/a.
run_one() {
  local c=$1 impl=$2 rep=$3
  local config=configs/bench/${CONFIG[$c]}.yaml procs=${PROCS[$c]:-1}
  local steps=${STEPS:-${CASE_STEPS[$c]}} warmup=${WARMUP:-${CASE_WARMUP[$c]}}
  local threads=$((procs > 1 ? 1 : 2))
  local base="$RESULTS/$c.$impl.$rep"
  local args=(--config "$config" --set "run.threads=$threads" --steps "$steps" --warmup "$warmup"
    --json "$base.json")
  if [[ $FIXED_BATCH == 1 ]]; then args+=(--fixed-batch); fi
  local cmd
  case "$impl" in
    trainer) cmd=("$TRAINER" bench "${args[@]}") ;;
    eager) cmd=(scripts/bench_reference.py "${args[@]}") ;;
    compile) cmd=(scripts/bench_reference.py "${args[@]}" --compile) ;;
  esac
  if ((procs > 1)); then
    if [[ $impl == trainer ]]; then
      cmd=("$TRAINER" launch --standalone --nproc-per-node "$procs" -- "${cmd[@]:1}")
    else
      cmd=("$TORCHRUN" --standalone --nproc-per-node "$procs" "${cmd[@]}")
    fi
  elif [[ $impl != trainer ]]; then
    cmd=("$PY" "${cmd[@]}")
  fi
  local start=$SECONDS rc=0
  echo "${cmd[*]}" >"$base.log"
  "${cmd[@]}" >>"$base.log" 2>&1 || rc=$?
  if ((rc != 0)); then
    rm -f "$base.json"
    if [[ $impl == compile ]]; then
      echo "  $c $impl #$rep: failed (exit $rc), n/a: $(grep -m1 'torch.compile failed' \
        "$base.log" || tail -n 1 "$base.log")"
      return 0
    fi
    echo "bench_compare: $c $impl #$rep failed (exit $rc); the end of $base.log:" >&2
    tail -n 20 "$base.log" >&2
    exit 1
  fi
  local sps
  sps=$("$PY" -c 'import json, sys
print("%.1f" % json.load(open(sys.argv[1]))["samples_per_sec"])' "$base.json")
  echo "  $c $impl #$rep: $sps samples/s ($((SECONDS - start)) s)"
}

for c in $CASES; do
  echo "$c (configs/bench/${CONFIG[$c]}.yaml, ${PROCS[$c]:-1} process(es))"
  for ((rep = 1; rep <= REPEATS; rep++)); do
    order=("${impls[@]}")
    if ((rep % 2 == 0)); then
      order=()
      for ((i = ${#impls[@]} - 1; i >= 0; i--)); do order+=("${impls[i]}"); done
    fi
    for impl in "${order[@]}"; do run_one "$c" "$impl" "$rep"; done
  done
done

cpu=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
trainer_version=$("$TRAINER" --version | paste -sd ',' | sed 's/,/, /g')
torch_version=$("$PY" -c 'import torch; print(torch.__version__)')
"$PY" - "$RESULTS" "$OUT" "$CASES" "$REPEATS" "$COMPILE" "$COMMAND" "$cpu" "$(nproc)" \
  "$trainer_version" "$torch_version" "$(date -u '+%Y-%m-%d %H:%M UTC')" "$FIXED_BATCH" <<'PY'
"""Medians of the JSON objects in RESULTS as a markdown table; printed, and written into OUT."""
import json
import os
import statistics
import sys

(results, out, cases, repeats, compile_on, command, cpu, nproc, trainer_version, torch_version,
 date, fixed_batch) = sys.argv[1:]
IMPLS = ("trainer", "eager", "compile")
BEGIN, END = "<!-- bench_compare:begin -->", "<!-- bench_compare:end -->"
HEADING = "## trainer bench vs PyTorch (scripts/bench_compare.sh)"


def runs(case, impl):
    found = []
    for name in sorted(os.listdir(results)):
        if name.startswith(f"{case}.{impl}.") and name.endswith(".json"):
            with open(os.path.join(results, name)) as f:
                found.append(json.load(f))
    return found


def median(objs, *path):
    values = []
    for o in objs:
        for key in path:
            o = o.get(key) if isinstance(o, dict) else None
        if o is not None:
            values.append(o)
    return statistics.median(values) if values else None


def fmt(v, digits=1, suffix=""):
    return "n/a" if v is None else f"{v:,.{digits}f}{suffix}"


def ratio(a, b):
    return "n/a" if a is None or b is None else f"**{a / b:.2f}x**"


def pct(v):
    return "n/a" if v is None else f"{100 * v:.1f}%"


header = ["case", "model", "batch", "threads", "steps (warm-up)", "trainer samples/s",
          "PyTorch eager samples/s", "trainer / eager"]
if compile_on == "1":
    header += ["torch.compile samples/s", "trainer / compile"]
header += ["trainer step p50 ms", "eager step p50 ms", "trainer peak MiB", "eager peak MiB",
           "MFU trainer / eager"]
rows = []
for case in cases.split():
    by = {impl: runs(case, impl) for impl in IMPLS}
    first = (by["trainer"] or by["eager"] or [None])[0]
    if first is None:
        continue
    world = first["world_size"]
    sps = {impl: median(objs, "samples_per_sec") for impl, objs in by.items()}
    row = [case, first["model"],
           f"{first['batch_size']}" + (f" x {world} processes" if world > 1 else ""),
           f"{first['threads']}" + (" per process" if world > 1 else ""),
           f"{first['steps']} ({first['warmup']})",
           fmt(sps["trainer"]), fmt(sps["eager"]), ratio(sps["trainer"], sps["eager"])]
    if compile_on == "1":
        row += [fmt(sps["compile"]), ratio(sps["trainer"], sps["compile"])]
    row += [fmt(median(by["trainer"], "step_time_ms", "p50"), 2),
            fmt(median(by["eager"], "step_time_ms", "p50"), 2),
            fmt(median(by["trainer"], "peak_memory_mb"), 0),
            fmt(median(by["eager"], "peak_memory_mb"), 0),
            f"{pct(median(by['trainer'], 'mfu'))} / {pct(median(by['eager'], 'mfu'))}"]
    rows.append(row)

lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
lines += ["| " + " | ".join(r) + " |" for r in rows]
lines += [
    "",
    f"Medians of {repeats} run{'s' if repeats != '1' else ''} per implementation, alternating, "
    "each a fresh process"
    + ("; every run on one fixed batch kept on the device (no data loader)"
       if fixed_batch == "1" else "")
    + "; samples/s "
    "over all processes, step time and peak memory of rank 0 (peak RSS on the CPU, the caching "
    "allocator's peak on CUDA); MFU against the measured matrix-product peak of the device. "
    f"Machine: {cpu}, {nproc} cores. Versions: {trainer_version}; PyTorch {torch_version}. "
    f"Date: {date}. Command: `{command}` (JSON and logs: {results}).",
]
table = "\n".join(lines)
print(table)

if out:
    text = open(out).read() if os.path.exists(out) else ""
    block = f"{BEGIN}\n{table}\n{END}"
    if BEGIN in text and END in text:
        head, _, rest = text.partition(BEGIN)
        text = head + block + rest.partition(END)[2]
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + f"{HEADING}\n\n{block}\n"
    with open(out, "w") as f:
        f.write(text)
    print(f"written into {out}", file=sys.stderr)
PY
