#!/usr/bin/env bash
# Sets up, builds and runs every test (CTest labels: cpu, gpu, multi_process), then lists the ten
# slowest (scripts/test_times.sh) and fails naming any test that ran longer than
# TEST_TIME_LIMIT seconds (default 120; skipped tests aside).
# Extra arguments go to ctest, e.g. scripts/test.sh -L cpu  or  scripts/test.sh -R Config
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
start=$(date +%s)
BUILD_DIR="$BUILD_DIR" "$ROOT/scripts/build.sh"
cd "$BUILD_DIR"
# ctest runs one test per core at once: the cores counted before OMP_NUM_THREADS is set, since
# nproc reports OMP_NUM_THREADS when it is set (with it set to 1 first, the suite ran one test at
# a time).
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
# One intra-op thread per test process (unless the caller sets another count): LibTorch's threads
# of one test waiting on cores the others hold made single operations take milliseconds. Tests
# that need threads set run.threads themselves.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Each test's time and status of this run (and of no other): ctest writes the file anew.
junit=$BUILD_DIR/Testing/Temporary/LastTest.junit.xml
rm -f "$junit"
rc=0
ctest --output-on-failure --timeout 900 -j "$jobs" --output-junit "$junit" "$@" || rc=$?
if grep -q "<testcase " "$junit" 2>/dev/null; then
  echo "scripts/test.sh: the slowest tests of this run:" >&2
  "$ROOT/scripts/test_times.sh" --top 10 --limit "${TEST_TIME_LIMIT:-120}" "$junit" >&2 || rc=1
fi
echo "scripts/test.sh: $(( $(date +%s) - start )) s in all" >&2
exit "$rc"
