#!/usr/bin/env bash
# Tensor-parallel training on the CPU over Gloo: the trainer's dist.tp_size (`trainer bench` under
# `trainer launch`, dist.strategy ddp) beside PyTorch's DTensor tensor parallelism
# (parallelize_module, loss_parallel) under torchrun (scripts/bench_tp.py), same GPT, batch,
# optimizer, clipping and threads, one fixed batch that every tensor-parallel rank shares (no data
# loader in the timing). Runs alternate between the two, REPEATS times. Before them: PyTorch's
# --check (its TP losses against one process's, 5 steps; fatal on a mismatch) and each side's
# single-process run (held bytes only). Prints, as a markdown table, the medians of the median
# step times and their ratio, each side's held bytes per rank (parameters + gradients + optimizer
# state) and against its single process, the bytes communicated per step by kind and against the
# analytic count 4 * (B*T*C*(4L + 2) + 3*B*T) (bench_tp.py's docstring), the top-level ATen
# operators and host reads per step.
#
#   scripts/bench_tp.sh [REPEATS=3] [NPROC=2] [LAYERS=4] [EMBD=128] [HEADS=4] [BATCH=8]
#                       [SEQ=128] [STEPS=20] [WARMUP=5] [RESULTS=DIR] [SIDES=both|pytorch|trainer]
#
# NPROC is the tensor-parallel size too (one tensor-parallel group of all ranks). SIDES=pytorch
# runs only PyTorch's side (the trainer's columns read n/a), SIDES=trainer only the trainer's.
set -euo pipefail
# shellcheck source=scripts/bench_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_common.sh" bench_tp
bench_args "REPEATS NPROC LAYERS EMBD HEADS BATCH SEQ STEPS WARMUP RESULTS SIDES" "$@"
bench_defaults
SIDES=${SIDES:-both}
for v in REPEATS NPROC LAYERS EMBD HEADS BATCH SEQ STEPS WARMUP; do
  if ! [[ ${!v} =~ ^[0-9]+$ ]] || ((${!v} < 1)); then
    echo "bench_tp: $v=${!v} is not a positive integer" >&2
    exit 2
  fi
done
case "$SIDES" in
  both | pytorch | trainer) ;;
  *) echo "bench_tp: SIDES=$SIDES; expected both, pytorch or trainer" >&2; exit 2 ;;
esac
if ((HEADS % NPROC || EMBD % HEADS || 256 % NPROC)); then
  echo "bench_tp: HEADS=$HEADS and the vocabulary (256) must be multiples of NPROC=$NPROC," \
    "EMBD=$EMBD a multiple of HEADS" >&2
  exit 2
fi
TRAINER=${TRAINER:-build/trainer}  # overridable, e.g. by a stub when testing this script
trainer_side() { [[ $SIDES != pytorch ]]; }
pytorch_side() { [[ $SIDES != trainer ]]; }
if trainer_side && [[ ! -x $TRAINER ]]; then scripts/build.sh >&2; fi
mkdir -p "$RESULTS"
export OMP_NUM_THREADS=1
# The model and step of bench_tp.py's defaults (gpt_config). BASE is the single-process run's
# config; CONFIG adds tensor parallelism over all NPROC ranks.
BASE=$(gpt_config ddp)
CONFIG="$BASE --set dist.tp_size=$NPROC"
MODEL=(--n-layer "$LAYERS" --n-head "$HEADS" --n-embd "$EMBD" --block-size "$SEQ" --batch "$BATCH")
torchrun() { "$PY" -m torch.distributed.run --standalone --nproc-per-node "$NPROC" "$@"; }
if pytorch_side; then
  run pytorch_check torchrun scripts/bench_tp.py "${MODEL[@]}" --check \
    --json "$RESULTS/pytorch_check.json"
  if ! "$PY" -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))["match"] else 1)' \
      "$RESULTS/pytorch_check.json"; then
    echo "bench_tp: PyTorch's tensor-parallel losses differ from one process's:" >&2
    grep -A 7 -- '--check' "$RESULTS/pytorch_check.log" >&2 || true
    exit 1
  fi
  run pytorch_single "$PY" scripts/bench_tp.py --tp 1 "${MODEL[@]}" --steps 3 --warmup 1 \
    --json "$RESULTS/pytorch_single.json"
fi
if trainer_side; then
  # shellcheck disable=SC2086
  run trainer_single "$TRAINER" bench $BASE --fixed-batch --steps 3 --warmup 1 \
    --json "$RESULTS/trainer_single.json"
fi
for rep in $(seq "$REPEATS"); do
  if trainer_side; then
    # shellcheck disable=SC2086
    run "trainer_$rep" "$TRAINER" launch --standalone --nproc-per-node "$NPROC" -- bench $CONFIG \
      --fixed-batch --steps "$STEPS" --warmup "$WARMUP" --json "$RESULTS/trainer_$rep.json"
  fi
  if pytorch_side; then
    run "pytorch_$rep" torchrun scripts/bench_tp.py "${MODEL[@]}" --steps "$STEPS" \
      --warmup "$WARMUP" --json "$RESULTS/pytorch_$rep.json"
  fi
done
"$PY" - "$RESULTS" "$REPEATS" "$NPROC" "$SIDES" "$LAYERS" "$EMBD" "$BATCH" "$SEQ" <<'PY'
import json, os, statistics, sys
results, repeats, nproc, sides = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
L, C, B, T = (int(v) for v in sys.argv[5:9])


def load(name):
    path = os.path.join(results, name)
    return json.load(open(path)) if os.path.exists(path) else None


def get(d, *keys):
    """d[k0][k1]...; None when a level is missing (the trainer's fields may not all be there)."""
    for k in keys:
        if not isinstance(d, dict) or d.get(k) is None:
            return None
        d = d[k]
    return d


def fmt(v, spec=",.0f"):
    return "n/a" if v is None else format(v, spec)


def ratio(a, b, spec=".2f"):
    return "n/a" if a is None or b in (None, 0) else format(a / b, spec)


def median(vs):
    vs = [v for v in vs if v is not None]
    return statistics.median(vs) if vs else None


t = [load(f"trainer_{r}.json") for r in range(1, repeats + 1)] if sides != "pytorch" else []
p = [load(f"pytorch_{r}.json") for r in range(1, repeats + 1)] if sides != "trainer" else []
t1, p1, chk = load("trainer_single.json"), load("pytorch_single.json"), load("pytorch_check.json")
tl, pl = (t[-1] if t else None), (p[-1] if p else None)
analytic = 4 * (B * T * C * (4 * L + 2) + 3 * B * T)
ts = median(get(x, "step_time_ms", "p50") for x in t)
ps = median(get(x, "step_ms_median") for x in p)
t1s, p1s = get(t1, "step_time_ms", "p50"), get(p1, "step_ms_median")
th = get(tl, "held_bytes", "total")
ph = max(r["total"] for r in pl["state_bytes_per_rank"]) if pl else None
th1 = get(t1, "held_bytes", "total")
ph1 = p1["state_bytes_per_rank"][0]["total"] if p1 else None
tc, pc = get(tl, "comm_bytes_per_step"), get(pl, "comm_bytes_per_step")
desc = pl or tl or {}
params = f" ({desc['params']:,} parameters)" if "params" in desc else ""
print(f"| tensor parallel, {nproc} Gloo processes (tp {nproc}), GPT {L}x{C}{params}, "
      f"batch {B}x{T} shared by the ranks | trainer | PyTorch DTensor TP | trainer / PyTorch |")
print("| --- | --- | --- | --- |")
print(f"| step time, ms (median of {repeats} runs' medians) | {fmt(ts, '.1f')} | {fmt(ps, '.1f')} "
      f"| {ratio(ts, ps)} |")
print(f"| steps per second | {fmt(ts and 1000 / ts, '.2f')} | {fmt(ps and 1000 / ps, '.2f')} | |")
print(f"| one process's step time, ms (3 steps; median) | {fmt(t1s, '.1f')} | {fmt(p1s, '.1f')} "
      f"| {ratio(t1s, p1s)} |")
print(f"| held bytes per rank (params + grads + optimizer) | {fmt(th)} | {fmt(ph)} "
      f"| {ratio(th, ph)} |")
print(f"| held bytes, one process | {fmt(th1)} | {fmt(ph1)} | {ratio(th1, ph1)} |")
print(f"| held bytes per rank / one process | {ratio(th, th1, '.3f')} | {ratio(ph, ph1, '.3f')} | |")
print(f"| communicated bytes per step | {fmt(tc)} | {fmt(pc)} | {ratio(tc, pc)} |")
for kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
    tk = get(tl, "comm_bytes_per_step_by_kind", kind)
    pk = get(pl, "comm_bytes_per_step_by_kind", kind)
    if tk or pk:
        print(f"| &nbsp;&nbsp;{kind} | {fmt(tk)} | {fmt(pk)} | {ratio(tk, pk)} |")
print(f"| communicated bytes per step / analytic {analytic:,} "
      f"(4*(B*T*C*(4L+2) + 3*B*T)) | {ratio(tc, analytic, '.4f')} | {ratio(pc, analytic, '.4f')} "
      "| |")
to, po = get(tl, "ops_per_step", "total"), get(pl, "ops_per_step", "total")
print(f"| ATen operators per step (top-level) | {fmt(to)} | {fmt(po)} | {ratio(to, po)} |")
print(f"| host reads per step | {fmt(get(tl, 'host_syncs_per_step'))} | "
      f"{fmt(get(pl, 'host_syncs_per_step'))} | |")
if chk:
    print(f"| PyTorch TP vs one process, {len(chk['rel_diff'])} steps' losses | | "
          f"{'match' if chk['match'] else 'MISMATCH'}, largest relative difference "
          f"{max(chk['rel_diff']):.1e} | |")
if pl:
    print(f"\nPyTorch: weight tie {'kept' if pl['tied'] else 'NOT kept'}, c_attn {pl['qkv']}, "
          f"AdamW {pl['optimizer_impl']}, collectives per step {pl['comm_counts_per_step']}.")
PY
echo "bench_tp: results in $RESULTS" >&2
