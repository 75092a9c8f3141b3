#!/usr/bin/env bash
# Sets up (scripts/setup.sh), configures and builds trainer into build/ (or $BUILD_DIR).
# Configures with a preset of CMakePresets.json: $PRESET, default `release` (`image`: no tests,
# for docker/Dockerfile), so that CI, the container image and IDEs build the same way.
# Extra arguments go to the CMake configure step, e.g. -DTorch_DIR=/opt/libtorch/share/cmake/Torch.
# TRAINER_WERROR=ON makes warnings errors (CI); BUILD_TARGETS builds only the targets named.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
PRESET=${PRESET:-release}
"$ROOT/scripts/setup.sh"
# An interrupted configure leaves a cache without build.ninja: configure again then.
WERROR=${TRAINER_WERROR:-OFF}
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" || ! -f "$BUILD_DIR/build.ninja" || $# -gt 0 ||
      "$(sed -n 's/^TRAINER_WERROR:BOOL=//p' "$BUILD_DIR/CMakeCache.txt")" != "$WERROR" ]]; then
  mkdir -p "$BUILD_DIR"
  # LibTorch's CMake files are chatty; the log is kept, and shown when configuring fails.
  cmake -S "$ROOT" -B "$BUILD_DIR" --preset "$PRESET" "-DTRAINER_WERROR=$WERROR" "$@" \
    > "$BUILD_DIR/configure.log" 2>&1 || { cat "$BUILD_DIR/configure.log" >&2; exit 1; }
fi
# BUILD_TARGETS: only these (scripts/quickstart.sh builds the trainer alone, then trains).
# shellcheck disable=SC2086  # a list of target names
cmake --build "$BUILD_DIR" --parallel "$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS}
