#!/usr/bin/env bash
# Sets up (scripts/setup.sh), configures and builds trainer into build/ (or $BUILD_DIR).
# Configures with a preset of CMakePresets.json: $PRESET, default `release` (`image`: no tests,
# for docker/Dockerfile), so that CI, the container image and IDEs build the same way.
# Extra arguments go to the CMake configure step, e.g. -DTorch_DIR=/opt/libtorch/share/cmake/Torch.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
PRESET=${PRESET:-release}
"$ROOT/scripts/setup.sh"
# An interrupted configure leaves a cache without build.ninja: configure again then.
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" || ! -f "$BUILD_DIR/build.ninja" || $# -gt 0 ]]; then
  mkdir -p "$BUILD_DIR"
  # LibTorch's CMake files are chatty; the log is kept, and shown when configuring fails.
  cmake -S "$ROOT" -B "$BUILD_DIR" --preset "$PRESET" "$@" \
    > "$BUILD_DIR/configure.log" 2>&1 || { cat "$BUILD_DIR/configure.log" >&2; exit 1; }
fi
cmake --build "$BUILD_DIR" --parallel "$(nproc)"
