#!/usr/bin/env bash
# Sets up, builds the trainer (only it: the tests build when scripts/test.sh runs them), links it
# as ~/.local/bin/trainer, trains lenet on Fashion-MNIST for one epoch (configs/quickstart.yaml),
# then classifies the first 8 test images with the checkpoint (trainer predict). A run dir left by an
# earlier quickstart is moved aside (run.overwrite). Extra arguments go to trainer, e.g.
# scripts/quickstart.sh --set train.epochs=3
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
# The trainer alone first: the tests build when they run (scripts/test.sh).
BUILD_TARGETS=trainer BUILD_DIR="$BUILD_DIR" "$ROOT/scripts/build.sh"
# `trainer` on the PATH, as the README spells it: a link in ~/.local/bin.
mkdir -p "$HOME/.local/bin"
ln -sf "$BUILD_DIR/trainer" "$HOME/.local/bin/trainer"
cd "$ROOT"
"$BUILD_DIR/trainer" --config configs/quickstart.yaml --run-dir runs/quickstart \
  --set run.overwrite=true "$@"
images=$(mktemp -d "${TMPDIR:-/tmp}/quickstart_images.XXXXXX")
trap 'rm -rf "$images"' EXIT
python3 scripts/fashion_mnist_images.py "$images" 8 > /dev/null
echo "trainer predict on 8 Fashion-MNIST test images (file names carry the true class):"
"$BUILD_DIR/trainer" predict --checkpoint runs/quickstart --input "$images"
if [[ "$(command -v trainer)" != "$HOME/.local/bin/trainer" ]]; then
  echo "The trainer is $BUILD_DIR/trainer, linked as ~/.local/bin/trainer; to call it \`trainer\`" \
       "as the README does: export PATH=\"\$HOME/.local/bin:\$PATH\"" >&2
fi
