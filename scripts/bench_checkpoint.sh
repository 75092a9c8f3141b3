#!/usr/bin/env bash
# Checkpoint save time and size for ResNet-50 with SGD momentum state: the trainer's checkpoint
# (safetensors + xxHash64, written atomically with fsync) beside torch.save of the same state
# (model state_dict, optimizer state_dict, RNG state) in Python, with and without an fsync.
#
#   scripts/bench_checkpoint.sh          Environment: BUILD (build), REPEATS (5)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD:-$ROOT/build}
REPEATS=${REPEATS:-5}
PY="$ROOT/.venv/bin/python"
ninja -C "$BUILD" trainer >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cat >"$tmp/r50.yaml" <<YAML
model: {name: resnet50, num_classes: 1000}
data: {name: synthetic, shape: [3, 32, 32], num_classes: 10, train_samples: 8, val_samples: 2,
       batch_size: 2, workers: 0}
train: {max_steps: $REPEATS, eval_at_end: false}
optim: {name: sgd, lr: 0.01, momentum: 0.9}
run: {checkpoint_every: 1, keep_last: 1, progress: never, tensorboard: false}
YAML
"$BUILD/trainer" --config "$tmp/r50.yaml" --run-dir "$tmp/run" 2>"$tmp/log" >/dev/null
ours=$(sed -n 's/.*checkpoint .* (\([0-9.]*\) MB in \([0-9.]*\) s).*/\1 \2/p' "$tmp/log")

"$PY" - "$tmp" "$REPEATS" "$ours" <<'PY'
import os, statistics, sys, time
import torch, torchvision
tmp, repeats, ours = sys.argv[1], int(sys.argv[2]), sys.argv[3].split("\n")
model = torchvision.models.resnet50(num_classes=1000)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
model(torch.randn(2, 3, 32, 32)).sum().backward()
opt.step()
state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": torch.get_rng_state()}
def timed(sync):
    times = []
    for i in range(repeats):
        path = os.path.join(tmp, f"py{i}.pt")
        start = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(state, f)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        times.append(time.perf_counter() - start)
    return statistics.median(times), os.path.getsize(path) / 1e6
py_sync, size = timed(True)
py_nosync, _ = timed(False)
sizes = [float(l.split()[0]) for l in ours if l]
secs = [float(l.split()[1]) for l in ours if l]
print(f"torch {torch.__version__}; {repeats} saves each, median")
print(f"trainer checkpoint:        {statistics.median(sizes):.1f} MB, {statistics.median(secs):.3f} s (fsync, checksum, manifest)")
print(f"torch.save + fsync:        {size:.1f} MB, {py_sync:.3f} s")
print(f"torch.save (no fsync):     {size:.1f} MB, {py_nosync:.3f} s")
print(f"ratio (torch.save+fsync / trainer): {py_sync / statistics.median(secs):.2f}x")
PY
