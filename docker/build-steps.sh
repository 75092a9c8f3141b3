#!/usr/bin/env bash
# The build stage of docker/Dockerfile. The image runs this script, and so does
# scripts/docker_steps_check.sh on a machine without Docker, with the same flags.
#
#   docker/build-steps.sh PREFIX
#       set up (scripts/setup.sh with TRAINER_SETUP_MINIMAL=1), configure with the CMake preset
#       `image` and build (scripts/build.sh) into $BUILD_DIR, then stage into PREFIX
#   docker/build-steps.sh --stage-only BUILD_DIR PREFIX
#       only stage, from a finished build (configured with any preset)
#
# PREFIX then holds everything the runtime stage copies, and nothing that points back to the
# build machine:
#   bin/trainer                      RUNPATH $ORIGIN/../lib/torch/lib (and the wheel's CUDA
#                                    runtime's folder, lib/nvidia/<cu13>/lib, when it has one)
#   lib/torch/lib/                   LibTorch's libraries (the torch wheel's, without the Python
#                                    bindings; or the lib folder of an official LibTorch zip)
#   lib/nvidia/*/lib/                the wheel's CUDA libraries (cuBLAS, cuDNN, NCCL, ...), where
#                                    LibTorch's RPATHs ($ORIGIN/../../nvidia/...) look for them
#   lib/arrow/                       Arrow's and Parquet's libraries (the pyarrow wheel's), in
#                                    the binary's RUNPATH after LibTorch's
#   configs/                         the repository's configs
#   share/trainer/healthcheck.yaml   the config of the image's HEALTHCHECK
#   share/trainer/runtime-packages   the distribution's packages that hold the other libraries
#                                    trainer loads (yaml-cpp, spdlog, fmt, libjpeg-turbo, ...),
#                                    one per line, found with ldd and dpkg
#
# Environment:
#   BUILD_DIR             the build folder (default: build-image in the repository)
#   TORCH_CUDA_ARCH_LIST  the GPU architectures for CUDA code compiled by this build, read by
#                         LibTorch's CMake files (default: those of the pinned wheel's kernels).
#                         Set, configuring needs no GPU (unset, it compiles and runs a probe).
#   TRAINER_TORCH_VERSION, TRAINER_TORCH_INDEX_URL   another torch wheel (scripts/setup.sh)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

say() { echo "build-steps: $*" >&2; }
die() { say "$*"; exit 1; }

# Copies the shared libraries of folder $1 into folder $2: hard links when both are on one file
# system, copies otherwise. Static archives and LLVM bitcode stay behind.
copy_libs() {
  local from=$1 to=$2 f
  mkdir -p "$to"
  for f in "$from"/*.so "$from"/*.so.*; do
    [[ -e "$f" ]] || continue
    [[ "$(basename "$f")" == libtorch_python.so ]] && continue
    ln -f "$f" "$to/" 2>/dev/null || cp -pL "$f" "$to/"
  done
}

# The package that owns library file $1, or nothing.
owner() {
  local path=$1 alt
  # With a merged /usr, dpkg may have recorded either /lib/... or /usr/lib/....
  case "$path" in
    /usr/*) alt=${path#/usr} ;;
    *) alt=/usr$path ;;
  esac
  { dpkg-query -S "$path" 2>/dev/null || dpkg-query -S "$alt" 2>/dev/null; } | head -n 1 | cut -d: -f1
}

stage() {
  local build=$1 prefix=$2
  [[ -x "$build/trainer" ]] || die "$build/trainer does not exist: build first"
  local torch_dir torch_root
  torch_dir=$(sed -n 's/^Torch_DIR:[A-Z]*=//p' "$build/CMakeCache.txt")
  [[ -n "$torch_dir" ]] || die "no Torch_DIR in $build/CMakeCache.txt"
  # <torch>/share/cmake/Torch, both in the wheel and in the zip.
  torch_root=$(cd "$torch_dir/../../.." && pwd)

  # A previous staging is replaced; any other folder with contents is left alone.
  if [[ -d "$prefix" && -n "$(ls -A "$prefix")" ]]; then
    [[ -f "$prefix/bin/trainer" ]] || die "$prefix is not empty"
    rm -rf "$prefix"
  fi
  mkdir -p "$prefix/bin" "$prefix/share/trainer" "$prefix/configs"
  prefix=$(cd "$prefix" && pwd)
  cp "$build/trainer" "$prefix/bin/trainer"
  copy_libs "$torch_root/lib" "$prefix/lib/torch/lib"
  local d
  if [[ -d "$torch_root/../nvidia" ]]; then
    for d in "$torch_root"/../nvidia/*/lib; do
      copy_libs "$d" "$prefix/lib/nvidia/$(basename "$(dirname "$d")")/lib"
    done
  fi
  # Arrow's and Parquet's libraries (the pyarrow wheel's, that data/formats reads with).
  local lib
  for lib in $(ldd "$build/trainer" | awk '/lib(arrow|parquet)[^ ]* => \// {print $3}'); do
    mkdir -p "$prefix/lib/arrow"
    cp -L "$lib" "$prefix/lib/arrow/"
  done
  # The build's RUNPATH names the build machine's LibTorch; the staged binary finds its own, and
  # the CUDA runtime its kernels launch through (the wheel's, beside LibTorch's other CUDA
  # libraries).
  # shellcheck disable=SC2016  # $ORIGIN is the dynamic loader's, not the shell's
  local script runpath='$ORIGIN/../lib/torch/lib'
  for d in "$prefix"/lib/nvidia/*/lib; do
    if compgen -G "$d/libcudart.so*" >/dev/null; then
      runpath+=":\$ORIGIN/../lib/nvidia/$(basename "$(dirname "$d")")/lib"
    fi
  done
  [[ -d "$prefix/lib/arrow" ]] && runpath+=":\$ORIGIN/../lib/arrow"
  script=$(mktemp)
  # shellcheck disable=SC2016  # CMake's variables, not the shell's
  printf 'file(RPATH_SET FILE "${FILE}" NEW_RPATH "${RUNPATH}")\n' > "$script"
  cmake -DFILE="$prefix/bin/trainer" "-DRUNPATH=$runpath" -P "$script" >/dev/null
  rm -f "$script"
  cp "$ROOT"/configs/*.yaml "$prefix/configs/"
  cp "$ROOT/docker/healthcheck.yaml" "$prefix/share/trainer/healthcheck.yaml"

  # Every library the staged binary loads comes from PREFIX or from a distribution package.
  local deps line path pkg packages=()
  deps=$(env -u LD_LIBRARY_PATH ldd "$prefix/bin/trainer")
  if grep -q "not found" <<<"$deps"; then
    die "libraries missing from $prefix: $(grep "not found" <<<"$deps" | tr -s ' \t' ' ')"
  fi
  while read -r line; do
    path=$(sed -n 's/.*=> \(\/[^ ]*\) (0x.*/\1/p; s/^\(\/[^ ]*\) (0x.*/\1/p' <<<"$line")
    [[ -n "$path" ]] || continue
    [[ "$path" == "$prefix"/* ]] && continue
    pkg=$(owner "$(readlink -f "$path")")
    [[ -n "$pkg" ]] || die "$path is neither in $prefix nor in a distribution package"
    packages+=("$pkg")
  done <<<"$deps"
  printf '%s\n' "${packages[@]}" | sort -u > "$prefix/share/trainer/runtime-packages"
  env -u LD_LIBRARY_PATH "$prefix/bin/trainer" --version >/dev/null ||
    die "the staged $prefix/bin/trainer does not run"
  say "staged into $prefix ($(du -sh "$prefix" | cut -f1)); packages: $(tr '\n' ' ' < "$prefix/share/trainer/runtime-packages")"
}

if [[ "${1:-}" == --stage-only ]]; then
  [[ $# -eq 3 ]] || die "usage: $0 --stage-only BUILD_DIR PREFIX"
  stage "$(cd "$2" && pwd)" "$3"
  exit 0
fi
[[ $# -eq 1 ]] || die "usage: $0 PREFIX  |  $0 --stage-only BUILD_DIR PREFIX"
PREFIX=$1
export BUILD_DIR=${BUILD_DIR:-$ROOT/build-image}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-7.5 8.0 8.6 8.9 9.0 10.0 10.3 12.0 12.1}
TRAINER_SETUP_MINIMAL=1 PRESET=image "$ROOT/scripts/build.sh"
stage "$(cd "$BUILD_DIR" && pwd)" "$PREFIX"
