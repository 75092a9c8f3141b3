#!/usr/bin/env bash
# Loader throughput on real-sized JPEGs: the trainer's imagefolder pipeline (bench_data) beside
# torchvision's ImageFolder + DataLoader, same files, same training transform, same worker count;
# then the same images as WebDataset shards (scripts/make_shards.py, 250 a shard): the trainer's
# webdataset data set beside the Python webdataset library's pipeline.
#
#   scripts/bench_loader.sh [DIR]      DIR: where the image folder is made (default
#                                      ~/.cache/trainer/bench_jpeg_500x375), reused when present
# Environment: WORKERS (2), BATCH (64), BATCHES (40), BUILD (build).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${1:-${TRAINER_CACHE:-$HOME/.cache/trainer}/bench_jpeg_500x375}
WORKERS=${WORKERS:-2}
BATCH=${BATCH:-64}
BATCHES=${BATCHES:-40}
BUILD=${BUILD:-$ROOT/build}
PY="$ROOT/.venv/bin/python"

"$PY" "$ROOT/scripts/bench_loader.py" make "$DIR"
ninja -C "$BUILD" bench_data >/dev/null

config=$(mktemp --suffix=.yaml)
trap 'rm -f "$config"' EXIT
cat >"$config" <<YAML
data:
  name: imagefolder
  root: $DIR
  batch_size: $BATCH
  workers: $WORKERS
  hflip: 0.5
YAML

ours=$("$BUILD/bench_data" --config "$config" --batches "$BATCHES")
theirs=$("$PY" "$ROOT/scripts/bench_loader.py" torchvision "$DIR" --batch "$BATCH" \
         --workers "$WORKERS" --batches "$BATCHES")
[[ -f "$DIR/shards/classes.txt" ]] || "$PY" "$ROOT/scripts/make_shards.py" "$DIR" "$DIR/shards" \
  --per-shard 250 --splits train > /dev/null
last=$(printf '%06d' $(($(ls "$DIR"/shards/train-*.tar | wc -l) - 1)))
cat >"$config" <<YAML
data:
  name: webdataset
  shards: "$DIR/shards/train-{000000..$last}.tar"
  batch_size: $BATCH
  workers: $WORKERS
  hflip: 0.5
YAML
ours_wds=$("$BUILD/bench_data" --config "$config" --batches "$BATCHES" | tail -n 1)
theirs_wds=$("$PY" "$ROOT/scripts/bench_loader.py" webdataset "$DIR/shards/train-{000000..$last}.tar" \
             --batch "$BATCH" --workers "$WORKERS" --batches "$BATCHES")
"$PY" - "$ours" "$theirs" "$ours_wds" "$theirs_wds" <<'PY'
import json, os, platform, sys
import torch, torchvision, PIL, webdataset
ours, theirs, ours_wds, theirs_wds = map(json.loads, sys.argv[1:5])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"machine: {cpu}, {os.cpu_count()} cores; torch {torch.__version__}, torchvision "
      f"{torchvision.__version__}, Pillow {PIL.__version__}")
print(f"trainer imagefolder: {ours['images_per_sec']:.0f} images/s ({ours['workers']} threads, batch {ours['batch_size']})")
print(f"torchvision:         {theirs['images_per_sec']:.0f} images/s ({theirs['workers']} workers, batch {theirs['batch_size']}, transforms {theirs['transforms']})")
print(f"ratio: {ours['images_per_sec'] / theirs['images_per_sec']:.2f}x")
print(f"trainer webdataset:  {ours_wds['images_per_sec']:.0f} images/s (shards of 250)")
print(f"webdataset {webdataset.__version__}:    {theirs_wds['images_per_sec']:.0f} images/s ({theirs_wds['workers']} workers, WebLoader)")
print(f"ratio: {ours_wds['images_per_sec'] / theirs_wds['images_per_sec']:.2f}x")
PY
