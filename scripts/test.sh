#!/usr/bin/env bash
# Sets up, builds and runs every test (CTest labels: cpu, gpu, multi_process).
# Extra arguments go to ctest, e.g. scripts/test.sh -L cpu  or  scripts/test.sh -R Config
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
start=$(date +%s)
BUILD_DIR="$BUILD_DIR" "$ROOT/scripts/build.sh"
cd "$BUILD_DIR"
ctest --output-on-failure --timeout 900 -j "$(nproc)" "$@"
echo "scripts/test.sh: $(( $(date +%s) - start )) s in all" >&2
