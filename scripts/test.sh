#!/usr/bin/env bash
# Sets up, builds and runs every test (CTest labels: cpu, gpu, multi_process).
# Extra arguments go to ctest, e.g. scripts/test.sh -L cpu  or  scripts/test.sh -R Config
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
start=$(date +%s)
BUILD_DIR="$BUILD_DIR" "$ROOT/scripts/build.sh"
cd "$BUILD_DIR"
# One intra-op thread per test process (unless the caller sets another count): ctest runs nproc
# tests at once, and LibTorch's threads of one test waiting on cores the others hold made single
# operations take milliseconds. Tests that need threads set run.threads themselves.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
ctest --output-on-failure --timeout 900 -j "$(nproc)" "$@"
echo "scripts/test.sh: $(( $(date +%s) - start )) s in all" >&2
