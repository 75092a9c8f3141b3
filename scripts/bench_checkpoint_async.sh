#!/usr/bin/env bash
# run.checkpoint_async's stall: GPT-2 small's width (12 layers, 768 wide, 50,257 tokens; AdamW, so
# about 1.5 GB a checkpoint) trained on the CPU, checkpointing every EVERY steps, once with
# synchronous saves and once with run.checkpoint_async. Prints each save's time (synchronous), the
# time training was blocked per save (asynchronous), their medians and the ratio, and the runs'
# whole times.
#
#   scripts/bench_checkpoint_async.sh      Environment: BUILD (build), SAVES (3), EVERY (8)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD:-$ROOT/build}
SAVES=${SAVES:-3}
EVERY=${EVERY:-8}
ninja -C "$BUILD" trainer >/dev/null
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench_ckpt.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

cat >"$tmp/gpt2.yaml" <<YAML
model: {name: gpt, n_layer: 12, n_head: 12, n_embd: 768, block_size: 1024, vocab_size: 50257,
        dropout: 0}
data: {name: synthetic_tokens, num_classes: 50257, seq_len: 64, train_samples: 256,
       val_samples: 2, batch_size: 1, workers: 0}
train: {max_steps: $((SAVES * EVERY)), eval_at_end: false}
optim: {name: adamw, lr: 0.0001}
run: {checkpoint_every: $EVERY, keep_last: 1, progress: never, tensorboard: false, log_every: 1}
YAML
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
for mode in sync async; do
  async=$([[ $mode == async ]] && echo true || echo false)
  start=$(date +%s.%N)
  "$BUILD/trainer" --config "$tmp/gpt2.yaml" --run-dir "$tmp/$mode" \
    --set run.checkpoint_async="$async" 2>"$tmp/$mode.log" >/dev/null
  end=$(date +%s.%N)
  echo "$mode: run $(echo "$end - $start" | bc) s"
  grep -o 'checkpoint .*' "$tmp/$mode.log" | sed 's/^/  /'
  rm -rf "$tmp/$mode"
done
sync_s=$(sed -n 's/.*checkpoint .* MB in \([0-9.]*\) s).*/\1/p' "$tmp/sync.log" | median)
blocked_s=$(sed -n 's/.*training blocked \([0-9.]*\) s.*/\1/p' "$tmp/async.log" | median)
echo "median synchronous save: $sync_s s; median time training was blocked by an asynchronous save: $blocked_s s"
echo "stall ratio: $(echo "scale=3; $blocked_s / $sync_s" | bc)"
