#!/usr/bin/env bash
# Each test's time in a ctest run, slowest first, with their sum; optionally fails when one test
# took longer than a limit.
#
#   scripts/test_times.sh [--top N] [--limit SECONDS] [FILE]
#
# FILE: what ctest wrote about the run: a JUnit file (ctest --output-junit FILE; scripts/test.sh
# writes build/Testing/Temporary/LastTest.junit.xml) or ctest's own log of its last run
# (build/Testing/Temporary/LastTest.log). Default: the newer of those two in $BUILD_DIR (default
# build/). Only the tests of that one run are listed. A JUnit file tells skipped tests (a gpu test
# without a GPU) and failed ones, marked so; LastTest.log does not (skipped tests read as passed
# there). CTestCostData.txt is not read: it holds a running average over runs, not the last run.
#
#   --top N          list only the N slowest (the sum is still of all)
#   --limit SECONDS  exit 1 naming each test that ran (not skipped) longer than SECONDS
# Exits 2 for a usage error or a missing or empty FILE.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}

die() { echo "test_times.sh: $*" >&2; exit 2; }
top=0 limit="" file=""
while (($#)); do
  case "$1" in
    --top) [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || die "--top needs a count"; top=$2; shift 2 ;;
    --limit) [[ $# -ge 2 && "$2" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--limit needs seconds"
             limit=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [[ -z "$file" ]] || die "one FILE only"; file=$1; shift ;;
  esac
done
if [[ -z "$file" ]]; then
  dir=$BUILD_DIR/Testing/Temporary
  file=$dir/LastTest.log
  [[ -f "$dir/LastTest.junit.xml" && ! "$dir/LastTest.junit.xml" -ot "$file" ]] &&
    file=$dir/LastTest.junit.xml
fi
[[ -f "$file" ]] || die "$file: no such file; run ctest first (or give the file ctest wrote)"

# One "SECONDS<TAB>STATUS<TAB>NAME" line per test (STATUS: passed, failed or skipped).
times() {
  awk '
    function attr(line, key,   m) {
      if (match(line, " " key "=\"[^\"]*\"") == 0) return ""
      m = substr(line, RSTART + length(key) + 3, RLENGTH - length(key) - 4)
      gsub(/&quot;/, "\"", m); gsub(/&apos;/, "\047", m); gsub(/&lt;/, "<", m)
      gsub(/&gt;/, ">", m); gsub(/&amp;/, "\\&", m)
      return m
    }
    /<testcase / {  # JUnit: status "run", "fail", or "notrun" (skipped, or not found)
      s = attr($0, "status")
      printf "%s\t%s\t%s\n", attr($0, "time") + 0, s == "run" ? "passed" : s == "fail" ? "failed" : "skipped", attr($0, "name")
      next
    }
    /^[0-9]+\/[0-9]+ Test: / { name = $0; sub(/^[0-9]+\/[0-9]+ Test: /, "", name); next }
    /^Test time = / && name != "" { t = $4 + 0; next }
    /^Test (Passed|Failed)\./ && name != "" {
      printf "%s\t%s\t%s\n", t, $2 == "Passed." ? "passed" : "failed", name; name = ""
    }
  ' "$1"
}

rows=$(times "$file" | sort -t $'\t' -k1,1gr -k3,3)
[[ -n "$rows" ]] || die "$file: no test times in it (not a ctest log or JUnit file, or no test ran)"
awk -F '\t' -v top="$top" -v src="$file" '
  { sum += $1; n++ }
  top == 0 || n <= top {
    printf "%9.2f s  %s%s\n", $1, $3, $2 == "passed" ? "" : " (" $2 ")"
  }
  END {
    if (top > 0 && n > top) printf "%13s  (%d more)\n", "...", n - top
    printf "%9.2f s  in all: %d tests, their times summed (%s)\n", sum, n, src
  }
' <<<"$rows"

[[ -n "$limit" ]] || exit 0
over=$(awk -F '\t' -v limit="$limit" '$2 != "skipped" && $1 > limit' <<<"$rows")
[[ -n "$over" ]] || exit 0
while IFS=$'\t' read -r seconds _ name; do
  printf 'test_times.sh: %s took %.1f s, over the %s s one test may take\n' "$name" "$seconds" \
    "$limit" >&2
done <<<"$over"
echo "test_times.sh: make each of these faster (share its set-up, run in-process where a process" \
     "start proves nothing, fewer repeats) or split it" >&2
exit 1
