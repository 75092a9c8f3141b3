#!/usr/bin/env bash
# Sets up, builds and trains lenet on Fashion-MNIST for one epoch (configs/quickstart.yaml), then
# classifies the first 8 test images with the checkpoint (trainer predict). A run dir left by an
# earlier quickstart is moved aside (run.overwrite). Extra arguments go to trainer, e.g.
# scripts/quickstart.sh --set train.epochs=3
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
BUILD_DIR="$BUILD_DIR" "$ROOT/scripts/build.sh"
cd "$ROOT"
"$BUILD_DIR/trainer" --config configs/quickstart.yaml --run-dir runs/quickstart \
  --set run.overwrite=true "$@"
images=$(mktemp -d "${TMPDIR:-/tmp}/quickstart_images.XXXXXX")
trap 'rm -rf "$images"' EXIT
python3 scripts/fashion_mnist_images.py "$images" 8 > /dev/null
echo "trainer predict on 8 Fashion-MNIST test images (file names carry the true class):"
"$BUILD_DIR/trainer" predict --checkpoint runs/quickstart --input "$images"
