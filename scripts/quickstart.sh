#!/usr/bin/env bash
# Sets up, builds and trains lenet on Fashion-MNIST for one epoch (configs/quickstart.yaml).
# Extra arguments go to trainer, e.g. scripts/quickstart.sh --set train.epochs=3
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
BUILD_DIR="$BUILD_DIR" "$ROOT/scripts/build.sh"
cd "$ROOT"
exec "$BUILD_DIR/trainer" --config configs/quickstart.yaml "$@"
