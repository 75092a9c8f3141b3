# shellcheck shell=bash
# What scripts/bench_fsdp.sh and scripts/bench_tp.sh share; sourced (after `set -euo pipefail`)
# with the script's name as its argument: `source scripts/bench_common.sh bench_tp`. Moves to
# the repository's root and sets BENCH (that name) and PY (the virtual environment's python).
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit
BENCH=$1
# shellcheck disable=SC2034  # PY is the sourcing script's
PY=.venv/bin/python

# bench_args "VAR ..." ARG...: exports every ARG of the form VAR=VALUE whose VAR is one of the
# listed names; any other ARG is an error (exit 2) naming the names expected.
bench_args() {
  local names=$1 arg name expected
  shift
  for arg in "$@"; do
    name=${arg%%=*}
    if [[ $arg == *=* && " $names " == *" $name "* ]]; then
      export "$name=${arg#*=}"
    else
      # shellcheck disable=SC2086
      expected=$(printf '%s=, ' $names)
      expected=${expected%, }
      echo "$BENCH: unknown argument '$arg'; expected ${expected%, *} or ${expected##*, }" >&2
      exit 2
    fi
  done
}

# bench_defaults: the defaults of the arguments both scripts take; RESULTS a new folder under
# runs/$BENCH named by the UTC time.
bench_defaults() {
  REPEATS=${REPEATS:-3} NPROC=${NPROC:-2} LAYERS=${LAYERS:-4} EMBD=${EMBD:-128} HEADS=${HEADS:-4}
  BATCH=${BATCH:-8} SEQ=${SEQ:-128} STEPS=${STEPS:-20} WARMUP=${WARMUP:-5}
  RESULTS=${RESULTS:-runs/$BENCH/$(date -u +%Y%m%d-%H%M%S)}
}

# gpt_config STRATEGY: the trainer's flags for the model and step of bench_fsdp.py's and
# bench_tp.py's defaults: bytes of Debian's fortunes (vocabulary 256), AdamW (0.9, 0.99) lr 1e-3,
# weight decay 0.1 on matrices, clipping at 1.0, fp32, one thread, dist.strategy STRATEGY.
gpt_config() {
  echo "--config configs/gpt_char.yaml --set model.n_layer=$LAYERS --set model.n_head=$HEADS
  --set model.n_embd=$EMBD --set model.block_size=$SEQ --set model.dropout=0 --set model.bias=false
  --set data.batch_size=$BATCH --set data.workers=0 --set optim.name=adamw --set optim.lr=0.001
  --set optim.weight_decay=0.1 --set train.clip_grad_norm=1.0 --set sched.name=constant
  --set sched.warmup_steps=0 --set run.threads=1 --set dist.strategy=$1"
}

# run NAME COMMAND...: COMMAND's output in $RESULTS/NAME.log; its last lines when it fails
# without having written $RESULTS/NAME.json (PyTorch's Gloo teardown at exit can abort a process
# after the results are out: "terminate called without an active exception"; bench_tp.py
# sidesteps it).
run() {
  local name=$1
  shift
  if ! "$@" > "$RESULTS/$name.log" 2>&1 && [[ ! -s "$RESULTS/$name.json" ]]; then
    echo "$BENCH: $name failed; the end of $RESULTS/$name.log:" >&2
    tail -n 5 "$RESULTS/$name.log" >&2
    exit 1
  fi
}
