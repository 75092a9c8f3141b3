#!/usr/bin/env bash
# CI as a fresh machine meets it, phase by phase: a clone of this repository's HEAD in WORK with no
# virtual-environment cache, no ccache and no pip cache (the Debian packages are taken as
# installed), then setup, build and .ci/run, each timed. Prints "SETUP s", "BUILD s",
# "TESTS s rc=N" and "TOTAL s"; exits with .ci/run's status. docs/benchmarks.md, "A fresh
# machine's CI", holds its figures.
#
#   scripts/fresh_ci.sh WORK     # WORK: an empty or missing folder (about 10 GB)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${1:?usage: scripts/fresh_ci.sh WORK}
if [[ -e "$WORK" && -n "$(ls -A "$WORK" 2>/dev/null)" ]]; then
  echo "fresh_ci: $WORK is not empty; give an empty or missing folder" >&2
  exit 2
fi
mkdir -p "$WORK"
git clone -q "$ROOT" "$WORK/repo" || exit 1
export TRAINER_CACHE=$WORK/cache CCACHE_DISABLE=1 PIP_NO_CACHE_DIR=1 TRAINER_WERROR=ON
cd "$WORK/repo" || exit 1
t0=$(date +%s)
scripts/setup.sh || exit 1
t1=$(date +%s)
echo "SETUP $((t1 - t0))"
scripts/build.sh || exit 1
t2=$(date +%s)
echo "BUILD $((t2 - t1))"
rc=0
.ci/run || rc=$?
t3=$(date +%s)
echo "TESTS $((t3 - t2)) rc=$rc"
echo "TOTAL $((t3 - t0))"
exit "$rc"
