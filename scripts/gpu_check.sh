#!/usr/bin/env bash
# The GPU check: on a CUDA machine with PyTorch, CMake, ninja and a C++ compiler but no package
# registry and no internet, builds trainer in Release against the offline bundle of
# scripts/make_gpu_bundle.sh, runs the CUDA tests (ctest -L gpu), runs the GPU benchmark cases with
# `trainer bench` beside scripts/bench_reference.py (PyTorch eager), and prints a short table last.
#
#   scripts/gpu_check.sh [options] [OUTDIR]
#
# With the device tool (one H200; the bundle made here first with scripts/make_gpu_bundle.sh):
#
#   run(command="bash scripts/gpu_check.sh \"$OUT\"", carry=[".gpu_bundle"], timeout_s=560)
#
# Elsewhere: scripts/make_gpu_bundle.sh on a Debian 12 machine, copy the repository with
# .gpu_bundle/ to the GPU machine, then `scripts/gpu_check.sh OUTDIR` there (--python PY when the
# python3 on PATH lacks torch). On a machine that has the Debian packages the bundle is optional
# (--no-bundle).
#
# Cases (configs/bench/gpu_resnet50.yaml, configs/bench/gpu_gpt2.yaml; synthetic data in memory):
#   r50_bf16_b256, r50_fp16_b256, r50_bf16_b32, r50_fp16_b32   ResNet-50, channels_last, 224 px
#   gpt2_bf16                GPT-2 small (12 x 12 heads x 768, context 1024, vocabulary 50257), batch 16
#   gpt2_ckpt                the same with model.checkpointing=blocks: peak memory and step time
#   ddp_ws1                  r50_bf16_b256 under `trainer launch --standalone --nproc-per-node 1`
#   ddp_ws1_reducer          the same with dist.reducer_at_world_size_1=true (c10d's Reducer alone)
#   *_loop                   r50_bf16_b32, r50_bf16_b256, gpt2_bf16 with optim.impl=loop (the
#                            default is fused): the optimizer phase's time per implementation
#   *_graph                  r50_bf16_b32, gpt2_bf16 with train.cuda_graph=true (the step replayed
#                            from a CUDA graph after 3 eager steps)
#   graph_losses             r50 at batch 32 trained 100 steps eagerly and from a CUDA graph
#                            (`trainer --config`, not bench): the two loss curves compared
#   gpt2_fsdp, gpt2_fsdp_ddp gpt2_bf16 with dist.strategy fsdp and ddp under `trainer launch` on
#                            every GPU (NCCL; world size 1 on a one-GPU machine): step time, held
#                            bytes per rank, peak memory, bytes communicated per step
#   fsdp_losses              GPT-2 small trained 50 steps with ddp and with fsdp on every GPU
#                            (`trainer --config`): the two loss curves compared
#   observe                  r50 b32 with profile: and profile.memory_snapshot: the trace's CUDA
#                            kernels, and torch.cuda._memory_viz rendering the snapshot
#   r50_shards               5,000 ImageNet-like JPEGs written as WebDataset shards
#                            (make_shards.py --synthetic), r50_bf16_b256 trained 60 steps from them
#                            with a loader thread per core: img/s against the fixed-batch rate,
#                            and doctor --perf's verdict on the job
#   gpt2_ckpt_async          gpt2_bf16 trained 90 steps with a checkpoint every 30, synchronous and
#                            with run.checkpoint_async: the save time against the time blocked
#   kernels                  trainer bench --kernels: each fused kernel's GB/s against the
#                            device's copy rate, and its speedup over ATen's operators
#   gpt2_bf16_fused          gpt2_bf16 with model.fused_kernels=auto (fused LayerNorm + residual,
#                            bias + GELU, the chunked output layer and loss)
#   fused_losses             100 deterministic steps of gpt2 (batch 8) with model.fused_kernels
#                            off and auto: the two loss curves
#   gpt2_bf16_tp1            gpt2_bf16 with dist.tp_size=1 under `trainer launch --nproc-per-node 1`
#                            (an NCCL group of one): against gpt2_bf16's PyTorch eager
# Before the cases, `trainer doctor --perf --quick --json`: the GPU's matmul TFLOP/s per dtype,
# HBM copy and PCIe bandwidth against the spec table (kept in results.json, rows in the table).
# Each case runs `trainer bench` and, for the plain cases, scripts/bench_reference.py (PyTorch,
# fused=True optimizers) with the same --config/--set/--warmup/--steps/--json, all on one batch
# kept on the device (--fixed-batch). Every bench reports ATen operators and host reads per step.
# A case that would not finish within the time budget (GPU_CHECK_BUDGET_S, default 480 s from the
# start, build included) is skipped and marked so.
#
# OUTDIR (default: $OUT, else runs/gpu_check) receives at most 4 files, which the device tool
# brings back: table.txt (the table printed last), results.json (every bench JSON object with its
# case, implementation, exit code and wall time), logs.tar.gz (configure, build, ctest, bundle
# check, environment and every bench run's output) and gpu_check.log (this script's progress).
# The build tree goes to --build-dir (default /tmp/gpu-check-build), outside OUTDIR.
#
# Options:
#   --dry-run        no GPU: build and test the same way, then one tiny CPU case of each kind
#                    (--set device=cpu, small shapes, 1+2 steps), to prove the plumbing. As root
#                    with unshare(1), it first hides the files of the system's copies of the
#                    bundled Debian packages (bind mounts in a private mount namespace), so the
#                    build can only use the bundle.
#   --no-isolate     --dry-run without hiding the system's packages
#   --bundle DIR     the bundle (default: .gpu_bundle in the repository)
#   --no-bundle      use the machine's own packages
#   --build-dir DIR  the build tree (default: /tmp/gpu-check-build)
#   --python PY      the Python with torch (default: python3; --dry-run: the repository's .venv)
#   --jobs N         build parallelism (default: nproc)
#   --skip-build     reuse a finished build in --build-dir
# Environment: GPU_CHECK_BUDGET_S (480), GPU_CHECK_RUN_TIMEOUT_S (150, one bench run at most),
# GPU_CHECK_CASES (case names to run, space-separated; default all, --dry-run: r50_bf16_b256
# r50_fp16_b32 gpt2_bf16 gpt2_ckpt ddp_ws1, with float16 replaced by bfloat16 on the CPU),
# GPU_CHECK_FORCE_WHEELS=1 (install the bundle's wheels even when torchvision and yaml import),
# GPU_CHECK_CTEST_REGEX (only the CUDA tests whose names match, ctest -R),
# GPU_CHECK_PROFILE=1 (the plain trainer and pytorch runs also record 3 steps with the Kineto
# profiler / torch.profiler: their operator tables in the bench logs, the Chrome traces gzipped
# into logs.tar.gz under profiles/),
# TORCH_CUDA_ARCH_LIST (default: the GPU's compute capability; 9.0 with --dry-run).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
START=$SECONDS
BUDGET=${GPU_CHECK_BUDGET_S:-480}
RUN_TIMEOUT=${GPU_CHECK_RUN_TIMEOUT_S:-150}

DRY=0 ISOLATE=1 USE_BUNDLE=1 SKIP_BUILD=0
BUNDLE=$ROOT/.gpu_bundle BUILD=/tmp/gpu-check-build PY="" JOBS=$(nproc) OUTDIR=""
ARGS=("$@")
while (($#)); do
  case "$1" in
    --dry-run) DRY=1 ;;
    --no-isolate) ISOLATE=0 ;;
    --bundle) BUNDLE=$2; shift ;;
    --no-bundle) USE_BUNDLE=0 ;;
    --build-dir) BUILD=$2; shift ;;
    --python) PY=$2; shift ;;
    --jobs) JOBS=$2; shift ;;
    --skip-build) SKIP_BUILD=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [[ -z "$OUTDIR" ]] || { echo "gpu_check: one OUTDIR only" >&2; exit 2; }; OUTDIR=$1 ;;
  esac
  shift
done
OUTDIR=${OUTDIR:-${OUT:-$ROOT/runs/gpu_check}}

# --dry-run as root: again, in a private mount namespace where the system's packages are hidden.
if [[ $DRY == 1 && $ISOLATE == 1 && $USE_BUNDLE == 1 && -z "${GPU_CHECK_ISOLATED:-}" &&
      $(id -u) == 0 ]] && command -v unshare >/dev/null && unshare -m true 2>/dev/null; then
  exec env GPU_CHECK_ISOLATED=1 unshare -m --propagation private bash "${BASH_SOURCE[0]}" "${ARGS[@]}"
fi

mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
rm -f "$OUTDIR"/{table.txt,results.json,logs.tar.gz,gpu_check.log}
WORK=$(mktemp -d /tmp/gpu-check-work.XXXXXX)
mkdir -p "$WORK/bench"
LOG=$OUTDIR/gpu_check.log
pack_logs() { tar -C "$WORK" -czf "$OUTDIR/logs.tar.gz" . 2>/dev/null || true; rm -rf "$WORK"; }
trap pack_logs EXIT

say() { echo "gpu_check [$((SECONDS - START))s]: $*" | tee -a "$LOG" >&2; }
die() { say "FAILED: $*"; exit 1; }
# Runs a command with its output in $WORK/$1.log; on failure shows the log's end.
logged() {
  local name=$1
  shift
  "$@" > "$WORK/$name.log" 2>&1 || { local rc=$?; tail -n 40 "$WORK/$name.log" >&2; return $rc; }
}

# --- the bundle ----------------------------------------------------------------------------------
hide_system_packages() {
  # Every regular file of the system's copies of the bundled packages (headers, archives, shared
  # libraries, CMake and pkg-config files, pkgconf) becomes /dev/null in this mount namespace:
  # a build that used one would fail to compile, link or load.
  local pkg f n=0
  while read -r pkg _; do
    while read -r f; do
      [[ -f "$f" && ! -L "$f" ]] || continue
      case "$f" in /usr/share/doc/* | /usr/share/man/* | /usr/share/lintian/*) continue ;; esac
      mount --bind /dev/null "$f"
      n=$((n + 1))
    done < <(dpkg-query -L "$pkg" 2>/dev/null || true)
  done < "$BUNDLE/packages.txt"
  say "isolated: $n files of the system's $(wc -l < "$BUNDLE/packages.txt") bundled packages hidden"
}

CMAKE_BUNDLE_ARGS=()
BP="" BLIB=""
if [[ $USE_BUNDLE == 1 ]]; then
  [[ -f "$BUNDLE/MANIFEST.txt" && -f "$BUNDLE/packages.txt" ]] ||
    die "no bundle in $BUNDLE: run scripts/make_gpu_bundle.sh (on Debian 12) first, or --no-bundle"
  BUNDLE=$(cd "$BUNDLE" && pwd)
  BP=$BUNDLE/prefix/usr
  BLIB=$BP/lib/x86_64-linux-gnu
  [[ -n "${GPU_CHECK_ISOLATED:-}" ]] && hide_system_packages
  export PKG_CONFIG_PATH=$BLIB/pkgconfig:$BP/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export CMAKE_PREFIX_PATH=$BP${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export LD_LIBRARY_PATH=$BLIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # A pkg-config for machines without one.
  if ! command -v pkg-config >/dev/null; then
    mkdir -p "$WORK/bin"
    ln -s "$BP/bin/pkgconf" "$WORK/bin/pkg-config"
    export PATH=$WORK/bin:$PATH
    say "no pkg-config on this machine: using the bundle's pkgconf"
  fi
  # Every package named, so that none comes from elsewhere.
  CMAKE_BUNDLE_ARGS=(
    "-DCMAKE_PREFIX_PATH=$BP"
    "-Dyaml-cpp_DIR=$BLIB/cmake/yaml-cpp" "-Dspdlog_DIR=$BLIB/cmake/spdlog"
    "-Dfmt_DIR=$BLIB/cmake/fmt" "-DGTest_DIR=$BLIB/cmake/GTest"
    "-Dcxxopts_DIR=$BP/lib/cmake/cxxopts" "-Dnlohmann_json_DIR=$BP/share/cmake/nlohmann_json"
    "-DZLIB_INCLUDE_DIR=$BP/include" "-DZLIB_LIBRARY=$BLIB/libz.a"
    "-DTRAINER_GLOO_INCLUDE_DIR=$BP/include")
fi

# --- Python, torch, CUDA -------------------------------------------------------------------------
if [[ -z "$PY" ]]; then
  if [[ $DRY == 1 && -x "$ROOT/.venv/bin/python" ]]; then PY=$ROOT/.venv/bin/python; else PY=python3; fi
fi
PY=$(command -v "$PY") || die "no Python '$PY'"
[[ "$PY" == /* ]] || PY=$PWD/$PY
"$PY" - > "$WORK/torch.txt" 2>&1 <<'PYEOF' || { cat "$WORK/torch.txt" >&2; die "$PY cannot import torch"; }
import torch
cuda = torch.cuda.is_available()
print("torch", torch.__version__)
print("cuda", torch.version.cuda)
print("available", int(cuda))
print("capability", "%d.%d" % torch.cuda.get_device_capability(0) if cuda else "")
print("device", torch.cuda.get_device_name(0) if cuda else "cpu")
PYEOF
tv() { sed -n "s/^$1 //p" "$WORK/torch.txt"; }
TORCH_VERSION=$(tv torch)
say "python $PY: torch $TORCH_VERSION, CUDA $(tv cuda), device: $(tv device)"
"$PY" -c "import sys, torch; v = tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2]); sys.exit(v < (2, 11))" ||
  die "torch $TORCH_VERSION is older than 2.11, the oldest trainer builds against"
[[ "$TORCH_VERSION" == 2.11.* ]] || say "warning: torch $TORCH_VERSION, not the pinned 2.11.0: the bundle's torchvision wheel may not fit it"
if [[ $DRY == 0 ]]; then
  [[ "$(tv available)" == 1 ]] || die "torch sees no CUDA device (use --dry-run on a machine without a GPU)"
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$(tv capability)}
  DEVICE=cuda
  GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
else
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
  DEVICE=cpu
  GPUS=2  # Gloo processes standing in for GPUs
fi
# LibTorch's CMake files look for the CUDA toolkit (FindTorchSomewhere.cmake tries /usr/local/cuda;
# else nvcc on PATH, a versioned /usr/local/cuda-*, or the pip packages' nvidia/cu*/bin).
if [[ ! -x /usr/local/cuda/bin/nvcc && -z "${CUDAToolkit_ROOT:-}" ]]; then
  NVCC=$(command -v nvcc || true)
  if [[ -z "$NVCC" ]]; then
    site=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    for f in /usr/local/cuda-*/bin/nvcc "$site"/nvidia/cu*/bin/nvcc; do
      [[ -x "$f" ]] && NVCC=$f
    done
  fi
  if [[ -n "$NVCC" ]]; then
    CUDAToolkit_ROOT=$(cd "$(dirname "$NVCC")/.." && pwd)
    export CUDAToolkit_ROOT CUDACXX=${CUDACXX:-$NVCC}
    say "CUDA toolkit: $CUDAToolkit_ROOT"
  fi
fi

# scripts/bench_reference.py needs torchvision and yaml beside torch: the bundle's wheels, installed
# into a throwaway folder on PYTHONPATH (a venv made from a venv's python would not see its torch).
REF=1
if [[ "${GPU_CHECK_FORCE_WHEELS:-0}" == 1 ]] || ! "$PY" -c "import torchvision, yaml" 2>/dev/null; then
  if [[ $USE_BUNDLE == 1 ]] && ls "$BUNDLE"/wheels/*.whl >/dev/null 2>&1 &&
     logged pip "$PY" -m pip install --disable-pip-version-check --no-index --no-deps --no-compile \
       --find-links "$BUNDLE/wheels" --target "$WORK/pysite" torchvision pyyaml &&
     PYTHONPATH=$WORK/pysite${PYTHONPATH:+:$PYTHONPATH} "$PY" -c "import torchvision, yaml; print('using', torchvision.__file__, yaml.__file__)" >>"$WORK/pip.log" 2>&1; then
    export PYTHONPATH=$WORK/pysite${PYTHONPATH:+:$PYTHONPATH}
    say "installed the bundle's torchvision and pyyaml wheels into $WORK/pysite"
  else
    REF=0
    say "warning: no torchvision/yaml for $PY (see pip.log): the PyTorch reference runs are skipped"
  fi
fi
[[ -f "$ROOT/scripts/bench_reference.py" ]] || { REF=0; say "warning: no scripts/bench_reference.py: reference runs skipped"; }

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -a)"
  grep PRETTY_NAME /etc/os-release 2>/dev/null || true
  echo "glibc: $(ldd --version 2>&1 | head -n 1)"
  echo "c++: $(c++ --version 2>&1 | head -n 1)"
  echo "cmake: $(cmake --version | head -n 1); ninja: $(ninja --version 2>&1)"
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -n 1 || echo none)"
  echo "python: $PY ($("$PY" --version 2>&1))"
  cat "$WORK/torch.txt"
  echo "bundle: ${BUNDLE:-none} (isolated: ${GPU_CHECK_ISOLATED:-0})"
  echo "TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST"
  nvidia-smi 2>/dev/null || echo "nvidia-smi: none"
  nproc
} > "$WORK/environment.txt" 2>&1

# --- build ---------------------------------------------------------------------------------------
command -v ninja >/dev/null || die "no ninja on PATH (the CMake preset uses the Ninja generator)"
T0=$SECONDS
if [[ $SKIP_BUILD == 0 || ! -x "$BUILD/trainer" ]]; then
  mkdir -p "$BUILD"
  say "configuring (Release, preset release) in $BUILD"
  logged configure cmake -S "$ROOT" -B "$BUILD" --preset release "-DTRAINER_PYTHON=$PY" \
    "${CMAKE_BUNDLE_ARGS[@]}" || die "configure failed (logs.tar.gz: configure.log)"
  say "building trainer and test_gpu with $JOBS jobs"
  logged build cmake --build "$BUILD" --target trainer test_gpu --parallel "$JOBS" ||
    die "build failed (logs.tar.gz: build.log)"
fi
BUILD_S=$((SECONDS - T0))
TRAINER=$BUILD/trainer
say "built in ${BUILD_S}s: $("$TRAINER" --version 2>&1 | head -n 1)"

# Which packages the build used: CMake's cache, the compilers' header dependencies, the loader.
BUNDLE_OK=1
if [[ $USE_BUNDLE == 1 ]]; then
  (
    bad=0
    echo "CMake cache (each must lie in $BUNDLE):"
    for key in yaml-cpp_DIR spdlog_DIR fmt_DIR GTest_DIR cxxopts_DIR nlohmann_json_DIR ZLIB_LIBRARY \
               ZLIB_INCLUDE_DIR TRAINER_GLOO_INCLUDE_DIR pkgcfg_lib_TURBOJPEG_turbojpeg \
               pkgcfg_lib_SPNG_spng pkgcfg_lib_XXHASH_xxhash TURBOJPEG_INCLUDEDIR SPNG_INCLUDEDIR \
               XXHASH_INCLUDEDIR; do
      val=$(sed -n "s/^$key:[A-Z]*=//p" "$BUILD/CMakeCache.txt")
      ok=ok
      IFS=';' read -r -a vals <<<"$val"
      for v in "${vals[@]}"; do
        [[ "$(realpath -m "$v")" == "$BUNDLE"/* ]] || { ok=NOT-BUNDLE; bad=1; }
      done
      [[ -n "$val" ]] || { ok=MISSING; bad=1; }
      printf '  %-26s %-10s %s\n' "$key" "$ok" "$val"
    done
    echo "headers the objects include (ninja -t deps):"
    ninja -C "$BUILD" -t deps > "$WORK/deps.txt"
    sys=$(grep -E '^ +/usr/include/(yaml-cpp|spdlog|fmt|nlohmann|cxxopts\.hpp|gtest|gloo|turbojpeg\.h|spng\.h|xxhash\.h|zlib\.h|zconf\.h)' "$WORK/deps.txt" | sort -u || true)
    echo "  from the bundle: $(grep -c "^ *$BUNDLE/" "$WORK/deps.txt" || true) (distinct: $(grep "^ *$BUNDLE/" "$WORK/deps.txt" | sort -u | wc -l))"
    echo "  from the system's copies of bundled packages: $(grep -c . <<<"$sys" || true)"
    [[ -z "$sys" ]] || { echo "$sys" | head -n 20; bad=1; }
    echo "shared libraries (ldd):"
    for bin in "$TRAINER" "$BUILD/tests/test_gpu"; do
      ldd "$bin" > "$WORK/ldd.txt" 2>&1 || true
      while read -r lib; do
        path=$(sed -n "s/^[[:space:]]*${lib}[^ ]* => \([^ ]*\).*/\1/p" "$WORK/ldd.txt" | head -n 1)
        case "$lib" in
          libspdlog | libfmt | libspng) want=bundle ;;
          *) want=static ;;
        esac
        if [[ $want == static ]]; then
          [[ -z "$path" ]] && ok=ok || { ok=NOT-STATIC; bad=1; }
        else
          [[ "$(realpath -m "${path:-/none}")" == "$BUNDLE"/* ]] && ok=ok || { ok=NOT-BUNDLE; bad=1; }
        fi
        printf '  %-10s %-14s %-10s %s\n' "$(basename "$bin")" "$lib ($want)" "$ok" "${path:-linked statically}"
      done <<<"$(printf '%s\n' libspdlog libfmt libspng libyaml-cpp libturbojpeg libxxhash)"
    done
    [[ $bad == 0 ]] && echo "RESULT: the build used the bundle's packages only" ||
      echo "RESULT: some of the packages came from elsewhere"
    exit "$bad"
  ) > "$WORK/bundle_check.txt" 2>&1 || BUNDLE_OK=0
  cat "$WORK/bundle_check.txt" >> "$LOG"
  if [[ $BUNDLE_OK == 0 ]]; then
    [[ $DRY == 1 ]] && { cat "$WORK/bundle_check.txt" >&2; die "the build did not use the bundle alone"; }
    say "warning: the build did not use the bundle alone (bundle_check.txt)"
  else
    say "bundle check: the build used the bundle's packages only"
  fi
fi

# --- the CUDA tests ------------------------------------------------------------------------------
say "ctest -L gpu"
T0=$SECONDS
left=$((BUDGET - (SECONDS - START) - 60))
timeout -k 10 "$((left > 240 ? 240 : (left > 30 ? left : 30)))" \
  ctest --test-dir "$BUILD" -L gpu ${GPU_CHECK_CTEST_REGEX:+-R "$GPU_CHECK_CTEST_REGEX"} \
    --output-on-failure --timeout 180 -j 4 > "$WORK/ctest.log" 2>&1 || true
CTEST_S=$((SECONDS - T0))
c_pass=$(grep -c ' Passed ' "$WORK/ctest.log" || true)
c_skip=$(grep -c '\*\*\*Skipped' "$WORK/ctest.log" || true)
c_fail=$(grep -cE '\*\*\*(Failed|Timeout|Exception)|Not Run' "$WORK/ctest.log" || true)
CTEST="ctest -L gpu: $c_pass passed, $c_skip skipped, $c_fail failed (${CTEST_S}s)"
say "$CTEST"
grep -E '\*\*\*(Failed|Timeout|Exception)' "$WORK/ctest.log" | tee -a "$LOG" >&2 || true
# The failed tests' names, for the table.
sed -n 's/^ *[0-9]* - \([^ ]*\) (.*$/ctest:\1/p' "$WORK/ctest.log" | sort -u > "$WORK/ctest_failed.txt" || true

# --- the server against its specification: doctor --perf --quick (about 30 s) -------------------
say "doctor --perf --quick"
T0=$SECONDS
timeout -k 10 90 "$TRAINER" doctor --perf --quick --json > "$WORK/bench/doctor_perf.trainer.json" \
  2>> "$LOG" && rc=0 || rc=$?
echo "$rc $((SECONDS - T0))" > "$WORK/bench/doctor_perf.trainer.status"
say "doctor --perf: exit $rc in $((SECONDS - T0))s"

# --- the benchmark cases -------------------------------------------------------------------------
# Tiny CPU versions of each case for --dry-run.
R50_TINY=("data.shape=[3,32,32]" data.train_samples=16 data.workers=1 run.threads=2)
GPT_TINY=(model.n_layer=2 model.n_head=2 model.n_embd=64 model.block_size=64 model.vocab_size=512
          data.num_classes=512 data.seq_len=64 data.batch_size=2 data.train_samples=16 data.workers=1
          run.threads=2)
LLAMA_TINY=(model.n_layer=2 model.n_head=4 model.n_kv_head=2 model.n_embd=64 model.head_dim=16
            model.intermediate_size=128 model.block_size=64 model.vocab_size=512
            data.num_classes=512 data.seq_len=64 data.batch_size=2 data.train_samples=16
            data.workers=1 run.threads=2)
# case | config | warmup | steps | expected seconds per run on an H200 | implementations | --set...
# (scripts/bench_reference.py has no activation checkpointing: gpt2_ckpt runs the trainer alone.)
# In priority order: a case that would not finish within the budget is skipped and marked.
CASES=(
  "r50_bf16_b256|gpu_resnet50.yaml|8|25|25|trainer pytorch"
  "r50_bf16_b32|gpu_resnet50.yaml|10|50|15|trainer pytorch|data.batch_size=32"
  "r50_bf16_b32_graph|gpu_resnet50.yaml|10|50|15|trainer|data.batch_size=32|train.cuda_graph=true"
  "gpt2_bf16|gpu_gpt2.yaml|5|20|25|trainer pytorch"
  "gpt2_bf16_graph|gpu_gpt2.yaml|5|20|25|trainer|train.cuda_graph=true"
  "graph_losses|gpu_resnet50.yaml|0|100|30|losses|data.batch_size=32|deterministic=true|run.checkpoint_every=25"
  "r50_bf16_b32_compile|gpu_resnet50.yaml|10|50|90|compile|data.batch_size=32"
  "gpt2_bf16_compile|gpu_gpt2.yaml|5|20|90|compile"
  "gpt2_bf16_fused|gpu_gpt2.yaml|5|20|25|trainer|model.fused_kernels=auto"
  "kernels|gpu_gpt2.yaml|0|0|30|kernels"
  "fused_losses|gpu_gpt2.yaml|0|100|60|fused_losses|data.batch_size=8|deterministic=true"
  "r50_bf16_b256_compile|gpu_resnet50.yaml|8|25|90|compile"
  "gpt2_ckpt|gpu_gpt2.yaml|5|20|25|trainer|model.checkpointing=blocks"
  "ddp_ws1|gpu_resnet50.yaml|8|25|30|launch"
  "r50_fp16_b256|gpu_resnet50.yaml|8|25|25|trainer pytorch|amp.dtype=float16"
  "r50_bf16_b32_loop|gpu_resnet50.yaml|10|50|15|trainer|data.batch_size=32|optim.impl=loop"
  "gpt2_fsdp|gpu_gpt2.yaml|5|20|30|launch_all|dist.strategy=fsdp"
  "gpt2_fsdp_ddp|gpu_gpt2.yaml|5|20|30|launch_all"
  "fsdp_losses|gpu_gpt2.yaml|0|50|60|fsdp_losses|data.batch_size=8|deterministic=true|dist.fsdp_param_dtype=float32"
  "r50_bf16_b32_autotune|gpu_resnet50.yaml|10|50|240|autotune|data.batch_size=32"
  "gpt2_bf16_autotune|gpu_gpt2.yaml|5|20|240|autotune"
  "ddp_ws1_reducer|gpu_resnet50.yaml|8|25|30|launch|dist.reducer_at_world_size_1=true"
  "gpt2_bf16_loop|gpu_gpt2.yaml|5|20|25|trainer|optim.impl=loop"
  "r50_bf16_b256_loop|gpu_resnet50.yaml|8|25|25|trainer|optim.impl=loop"
  "r50_fp16_b32|gpu_resnet50.yaml|10|50|15|trainer pytorch|amp.dtype=float16|data.batch_size=32"
  "observe|gpu_resnet50.yaml|0|6|40|observe|data.batch_size=32"
  "r50_shards|gpu_resnet50.yaml|0|60|150|shards"
  "gpt2_ckpt_async|gpu_gpt2.yaml|0|90|120|ckpt_async"
  "gpt2_bf16_tp1|gpu_gpt2.yaml|5|20|30|launch|dist.tp_size=1"
  "llama1b_bf16|gpu_llama1b.yaml|3|10|60|trainer pytorch plan"
  "llama1b_bf16_compile|gpu_llama1b.yaml|3|10|150|compile"
  "llama1b_lora_bf16|gpu_llama1b_lora.yaml|3|10|60|trainer pytorch plan"
  "llama1b_bf16_fused|gpu_llama1b.yaml|3|10|60|trainer|model.fused_kernels=auto"
  "llama1b_ckpt|gpu_llama1b.yaml|3|10|60|trainer plan|model.checkpointing=blocks"
  "llama1b_offload|gpu_llama1b.yaml|3|10|60|trainer plan|model.checkpointing=offload"
  "llama1b_qlora_bf16|gpu_llama1b_qlora.yaml|3|10|60|trainer pytorch plan"
  "llama8b_qlora_bf16|gpu_llama8b_qlora.yaml|2|6|120|trainer pytorch plan"
)

# PyTorch's DataLoader workers are processes that hand batches over through /dev/shm (154 MB a
# ResNet-50 batch of 256): where it is small (containers), the reference loads in the main process.
SHM_MB=$(df -Pm /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')
REF_SETS=()
if [[ ${SHM_MB:-0} -lt 4096 ]]; then
  REF_SETS=(data.workers=0)
  say "/dev/shm has ${SHM_MB:-no} MB free: the PyTorch reference runs with data.workers=0"
fi

# run_bench CASE IMPL CONFIG WARMUP STEPS EXPECTED_S SET...: one run, its JSON in bench/CASE.IMPL.json
# and its status in bench/CASE.IMPL.status ("rc wall_s" or "skipped reason").
run_bench() {
  local name=$1 impl=$2 config=configs/bench/$3 warmup=$4 steps=$5 expect=$6
  shift 6
  local sets=() s
  for s in "$@"; do sets+=(--set "$s"); done
  local base=$WORK/bench/$name.$impl left=$((BUDGET - (SECONDS - START)))
  if ((left < expect)); then
    echo "skipped time" > "$base.status"
    say "$name/$impl: skipped (${left}s of the budget left, ~${expect}s needed)"
    return 0
  fi
  local limit=$((left < RUN_TIMEOUT ? left : RUN_TIMEOUT))
  local cmd=()
  case "$impl" in
    losses) two_curves "$base" "$config" "$steps" "$limit" train.cuda_graph "false true" 0 \
              "${sets[@]}"
            return 0 ;;
    fused_losses) two_curves "$base" "$config" "$steps" "$limit" model.fused_kernels "off auto" 0 \
                    "${sets[@]}"
                  return 0 ;;
    fsdp_losses) two_curves "$base" "$config" "$steps" "$limit" dist.strategy "ddp fsdp" "$GPUS" \
                   "${sets[@]}"
                 return 0 ;;
    observe) observe_run "$base" "$config" "$steps" "$limit" "${sets[@]}"
             return 0 ;;
    kernels) local t0=$SECONDS rc=0
             (cd "$ROOT" && timeout -k 10 "$limit" "$TRAINER" bench --kernels --json "$base.json") \
               > "$base.log" 2>&1 || rc=$?
             echo "$rc $((SECONDS - t0))" > "$base.status"
             say "$name/$impl: done in $((SECONDS - t0))s (exit $rc)"
             return 0 ;;
    shards) shards_run "$base" "$config" "$steps" "$limit" "${sets[@]}"
            return 0 ;;
    plan) local t0=$SECONDS rc=0  # the memory plan of the case's config (doctor's JSON "plan")
          (cd "$ROOT" && timeout -k 10 "$limit" "$TRAINER" doctor --json --config "$config" \
             --gpus 1 "${sets[@]}") > "$base.doctor.json" 2> "$base.log" || rc=$?
          "$PY" -c 'import json, sys; json.dump(json.load(open(sys.argv[1]))["memory"]["plan"],
                    open(sys.argv[2], "w"))' "$base.doctor.json" "$base.json" && rc=0 || rc=1
          echo "$rc $((SECONDS - t0))" > "$base.status"
          say "$name/$impl: done in $((SECONDS - t0))s (exit $rc)"
          return 0 ;;
    ckpt_async) ckpt_async_run "$base" "$config" "$steps" "$limit" "${sets[@]}"
                return 0 ;;
    launch_all) cmd=("$TRAINER" launch --standalone --nproc-per-node "$GPUS" -- bench) ;;
    trainer) cmd=("$TRAINER" bench) ;;
    launch) cmd=("$TRAINER" launch --standalone --nproc-per-node 1 -- bench) ;;
    pytorch | compile | autotune)
             cmd=("$PY" "$ROOT/scripts/bench_reference.py")
             [[ $impl == compile ]] && cmd+=(--compile)
             [[ $impl == autotune ]] && cmd+=(--compile --compile-mode max-autotune-no-cudagraphs)
             for s in "${REF_SETS[@]}"; do
               sets+=(--set "$s")
               echo "--set $s (/dev/shm: ${SHM_MB:-none} MB free)" >> "$base.note"
             done ;;
  esac
  # One batch kept on the device (--fixed-batch, both sides): the training step's speed, as
  # DeepLearningExamples' synthetic-data figures measure it, without the loader in the loop.
  cmd+=(--config "$config" --fixed-batch "${sets[@]}" --warmup "$warmup" --steps "$steps"
        --json "$base.json")
  if [[ "${GPU_CHECK_PROFILE:-0}" == 1 && ( $impl == trainer || $impl == pytorch ) ]]; then
    cmd+=(--profile "$WORK/profiles/$name.$impl")
  fi
  local t0=$SECONDS rc=0
  (cd "$ROOT" && timeout -k 10 "$limit" "${cmd[@]}") > "$base.log" 2>&1 || rc=$?
  echo "$rc $((SECONDS - t0))" > "$base.status"
  find "$WORK/profiles" -name '*.json' -exec gzip -9 {} + 2>/dev/null || true
  if [[ $rc == 0 && -s "$base.json" ]]; then
    say "$name/$impl: done in $((SECONDS - t0))s"
  else
    say "$name/$impl: FAILED (exit $rc; logs.tar.gz: bench/$name.$impl.log)"
    tail -n 5 "$base.log" | sed 's/^/    /' | tee -a "$LOG" >&2
  fi
}

# two_curves BASE CONFIG STEPS LIMIT KEY "A B" NPROC --set...: STEPS steps of training with KEY=A and
# with KEY=B (the same seed and data), by `trainer --config` (NPROC 0) or under `trainer launch`
# on NPROC processes; the two loss curves compared into BASE.json.
two_curves() {
  local base=$1 config=$2 steps=$3 limit=$4 key=$5 modes=$6 nproc=$7 mode rc=0 t0=$SECONDS
  shift 7
  local run=("$TRAINER")
  [[ $nproc == 0 ]] || run=("$TRAINER" launch --standalone --nproc-per-node "$nproc" --)
  for mode in $modes; do
    (cd "$ROOT" && timeout -k 10 "$limit" "${run[@]}" --config "$config" \
      --set train.max_steps="$steps" --set run.log_every=1 --set run.eval_every=0 \
      --set train.eval_at_end=false --set run.checkpoint_every=1000000 "$@" \
      --set "$key=$mode" --run-dir "$base.$mode") >> "$base.log" 2>&1 || rc=$?
  done
  echo "$rc $((SECONDS - t0))" > "$base.status"
  # The logs come back small: the runs' metrics and logs, not their checkpoints.
  for mode in $modes; do rm -rf "$base.$mode/checkpoints" "$base.$mode/tb"; done
  # shellcheck disable=SC2086  # the two modes, as two arguments
  "$PY" - "$base" "$steps" $modes > "$base.json" 2>> "$base.log" <<'CURVES' || echo "1 $((SECONDS - t0))" > "$base.status"
import json, sys
base, steps, a, b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def losses(mode):
    try:
        return [r["loss"] for r in map(json.loads, open(base + "." + mode + "/metrics.jsonl"))
                if r["split"] == "train"]
    except OSError:
        return []
la, lb = losses(a), losses(b)
# Curves of unequal length, or shorter than asked, compare nothing: the comparison fails.
if len(la) != steps or len(lb) != steps:
    print(json.dumps({"steps": min(len(la), len(lb)), "error": "%s: %d steps, %s: %d steps, %d asked"
                      % (a, len(la), b, len(lb), steps)}))
    sys.exit(1)
absd = [abs(x - y) for x, y in zip(la, lb)]
rel = [d / max(abs(x), 1e-12) for d, x in zip(absd, la)]
print(json.dumps({"steps": len(la), "first_last": {a: [la[0], la[-1]], b: [lb[0], lb[-1]]},
                  "max_rel_diff": max(rel), "mean_rel_diff": sum(rel) / len(rel),
                  "max_abs_diff": max(absd), "mean_abs_diff": sum(absd) / len(absd)}))
CURVES
  say "$(basename "$base"): done in $((SECONDS - t0))s (exit $rc)"
}

# observe_run BASE CONFIG STEPS LIMIT --set...: STEPS steps of training with steps 3-4 under the
# profiler (profile:) and the allocator's history written after step 4 (profile.memory_snapshot);
# BASE.json counts the trace's CUDA kernels and copies and says whether torch.cuda._memory_viz
# renders the snapshot.
observe_run() {
  local base=$1 config=$2 steps=$3 limit=$4 rc=0 t0=$SECONDS
  shift 4
  (cd "$ROOT" && timeout -k 10 "$limit" "$TRAINER" --config "$config" "$@" \
    --set train.max_steps="$steps" --set run.eval_every=0 --set train.eval_at_end=false \
    --set profile.start_step=3 --set profile.steps=2 --set profile.memory_snapshot=true \
    --set profile.memory_snapshot_step=4 --run-dir "$base.run") >> "$base.log" 2>&1 || rc=$?
  "$PY" - "$base.run" > "$base.json" 2>> "$base.log" <<'OBSERVE' || rc=1
import json, os, subprocess, sys
run = sys.argv[1]
trace = json.load(open(os.path.join(run, "profile", "rank_0.trace.json")))
cats = {}
for e in trace["traceEvents"] if isinstance(trace, dict) else trace:
    cats[e.get("cat", "")] = cats.get(e.get("cat", ""), 0) + 1
snap, html = os.path.join(run, "memory_snapshot.pickle"), os.path.join(run, "memory.html")
viz = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", snap, "-o",
                      html], capture_output=True, text=True)
size = lambda p: os.path.getsize(p) if os.path.exists(p) else 0
out = {"kernels": cats.get("kernel", 0), "gpu_memcpy": cats.get("gpu_memcpy", 0),
       "cpu_ops": cats.get("cpu_op", 0), "snapshot_bytes": size(snap),
       "memory_viz_rc": viz.returncode, "memory_viz_html_bytes": size(html)}
if viz.returncode != 0 or out["kernels"] == 0:
    out["error"] = viz.stderr[-400:] or "no CUDA kernel in the trace"
print(json.dumps(out))
sys.exit(1 if "error" in out else 0)
OBSERVE
  echo "$rc $((SECONDS - t0))" > "$base.status"
  rm -rf "$base.run/checkpoints" "$base.run/tb" "$base.run/memory.html"
  say "$(basename "$base"): done in $((SECONDS - t0))s (exit $rc)"
}

# shards_run BASE CONFIG STEPS LIMIT --set...: ImageNet-like JPEGs (500x375, quality 90;
# GPU_CHECK_SHARD_IMAGES, default 5,000) written as WebDataset shards by scripts/make_shards.py,
# then STEPS steps of training from them (data.name webdataset, a loader thread per core, the
# training transforms); BASE.json holds the median images/s of the logged steps after the first
# two, against which the table sets r50_bf16_b256's fixed-batch rate, and `doctor --perf`'s verdict
# on the job (input-, compute- or communication-bound).
shards_run() {
  local base=$1 config=$2 steps=$3 limit=$4 rc=0 t0=$SECONDS n=${GPU_CHECK_SHARD_IMAGES:-5000}
  shift 4
  local dir=$WORK/shards
  [[ -d $dir ]] || "$PY" "$ROOT/scripts/make_shards.py" --synthetic "$n" "$dir" --per-shard 250 \
    >> "$base.log" 2>&1 || rc=$?
  local last
  last=$(printf '%06d' $(((n + 249) / 250 - 1)))
  local data=(--set data.name=webdataset --set "data.shards=$dir/train-{000000..$last}.tar"
              --set "data.val_shards=$dir/val-000000.tar" --set data.classes=1000
              --set data.hflip=0.5 --set data.workers="$(nproc)")
  (cd "$ROOT" && timeout -k 10 "$limit" "$TRAINER" --config "$config" "$@" "${data[@]}" \
    --set train.max_steps="$steps" --set run.eval_every=0 --set train.eval_at_end=false \
    --set run.log_every=5 --run-dir "$base.run") >> "$base.log" 2>&1 || rc=$?
  (cd "$ROOT" && timeout -k 10 120 "$TRAINER" doctor --perf --quick --json --config "$config" \
    "$@" "${data[@]}") > "$base.doctor.json" 2>> "$base.log" || rc=$?
  "$PY" - "$base.run/metrics.jsonl" "$base.doctor.json" > "$base.json" 2>> "$base.log" <<'SHARDS' || rc=1
import json, statistics, sys
rates = [r["samples_per_sec"] for r in map(json.loads, open(sys.argv[1])) if r["split"] == "train"]
job = [r for r in json.load(open(sys.argv[2]))["rows"] if r["group"] == "job"]
out = {"samples_per_sec": statistics.median(rates[2:] or rates), "steps_logged": len(rates),
       "doctor": job[0] if job else None}
print(json.dumps(out))
SHARDS
  echo "$rc $((SECONDS - t0))" > "$base.status"
  rm -rf "$base.run/checkpoints" "$base.run/tb"
  say "$(basename "$base"): done in $((SECONDS - t0))s (exit $rc)"
}

# ckpt_async_run BASE CONFIG STEPS LIMIT --set...: STEPS steps of training with a checkpoint every
# STEPS/3 steps, with synchronous saves and with run.checkpoint_async; BASE.json holds the median
# save time of the first and the median time training was blocked per save of the second (the
# copy to pinned host memory, and any wait for the write before).
ckpt_async_run() {
  local base=$1 config=$2 steps=$3 limit=$4 rc=0 t0=$SECONDS mode
  shift 4
  for mode in false true; do
    (cd "$ROOT" && timeout -k 10 $((limit / 2)) "$TRAINER" --config "$config" "$@" \
      --set train.max_steps="$steps" --set run.checkpoint_every=$((steps / 3)) \
      --set run.checkpoint_async=$mode --set run.keep_last=1 --set run.eval_every=0 \
      --set train.eval_at_end=false --set run.log_every=10 --run-dir "$base.$mode") \
      > "$base.$mode.log" 2>&1 || rc=$?
    rm -rf "$base.$mode"
  done
  "$PY" - "$base.false.log" "$base.true.log" > "$base.json" 2>> "$base.log" <<'CKPT' || rc=1
import json, re, statistics, sys
sync = [float(m) for m in re.findall(r"checkpoint \S+ \([0-9.]+ MB in ([0-9.]+) s\)", open(sys.argv[1]).read())]
blocked = [float(m) for m in re.findall(r"training blocked ([0-9.]+) s", open(sys.argv[2]).read())]
out = {"sync_save_s": statistics.median(sync), "blocked_s": statistics.median(blocked),
       "saves": [len(sync), len(blocked)]}
out["ratio"] = out["blocked_s"] / out["sync_save_s"]
print(json.dumps(out))
CKPT
  echo "$rc $((SECONDS - t0))" > "$base.status"
  say "$(basename "$base"): done in $((SECONDS - t0))s (exit $rc)"
}

# Which cases run: $GPU_CHECK_CASES (names), else all; --dry-run: one of each kind.
SELECTED=${GPU_CHECK_CASES:-}
[[ -n "$SELECTED" || $DRY == 0 ]] || SELECTED="r50_bf16_b256 r50_fp16_b32 gpt2_bf16 gpt2_ckpt ddp_ws1 ddp_ws1_reducer r50_bf16_b32_loop"
for c in "${CASES[@]}"; do
  IFS='|' read -r -a f <<<"$c"
  name=${f[0]} config=${f[1]} warmup=${f[2]} steps=${f[3]} expect=${f[4]}
  [[ -z "$SELECTED" || " $SELECTED " == *" $name "* ]] || continue
  read -r -a impls <<<"${f[5]}"
  sets=("${f[@]:6}")
  sets=(device="$DEVICE" "${sets[@]}")
  if [[ $DRY == 1 ]]; then
    warmup=1 steps=2 expect=5
    case "$name" in
      r50_*) sets+=("${R50_TINY[@]}" data.batch_size=4)
             [[ "$name" == *_b32 ]] && sets+=(data.batch_size=2)
             # float16 autocast is CUDA's alone: the plumbing runs with bfloat16 on the CPU.
             [[ "$name" == *fp16* ]] && sets+=(amp.dtype=bfloat16) ;;
      ddp_*) sets+=("${R50_TINY[@]}" data.batch_size=4) ;;
      gpt2_* | fsdp_*) sets+=("${GPT_TINY[@]}") ;;
      llama1b_* | llama8b_*) sets+=("${LLAMA_TINY[@]}") ;;
    esac
  fi
  for impl in "${impls[@]}"; do
    [[ ( $impl != pytorch && $impl != compile && $impl != autotune ) || $REF == 1 ]] || continue
    run_bench "$name" "$impl" "$config" "$warmup" "$steps" "$expect" "${sets[@]}"
  done
done

# --- results and the table -----------------------------------------------------------------------
BUNDLE_NOTE="not used"
if [[ $USE_BUNDLE == 1 ]]; then
  BUNDLE_NOTE="only the bundle's packages"
  [[ $BUNDLE_OK == 1 ]] || BUNDLE_NOTE="MIXED (bundle_check.txt)"
  [[ -z "${GPU_CHECK_ISOLATED:-}" ]] || BUNDLE_NOTE+=", the system's copies hidden"
fi
MODE=""
[[ $DRY == 0 ]] || MODE=" (--dry-run, CPU)"
HEADER="GPU check$MODE: $(tv device), torch $TORCH_VERSION (CUDA $(tv cuda)), $("$TRAINER" --version 2>&1 | head -n 1); build ${BUILD_S}s; $CTEST; bundle: $BUNDLE_NOTE; total $((SECONDS - START))s"
"$PY" - "$WORK/bench" "$OUTDIR/results.json" "$HEADER" > "$OUTDIR/table.txt" <<'PYEOF'
import json, os, sys

bench, out, header = sys.argv[1:4]
order = ["r50_bf16_b256", "r50_bf16_b256_compile", "r50_bf16_b256_loop", "r50_fp16_b256",
         "r50_bf16_b32", "r50_bf16_b32_graph", "r50_bf16_b32_compile", "r50_bf16_b32_autotune",
         "r50_bf16_b32_loop", "r50_fp16_b32", "gpt2_bf16", "gpt2_bf16_graph", "gpt2_bf16_compile", "gpt2_bf16_fused",
         "gpt2_bf16_autotune", "gpt2_bf16_loop", "gpt2_bf16_tp1", "llama1b_bf16",
         "llama1b_bf16_compile", "llama1b_bf16_fused", "llama1b_lora_bf16", "llama1b_ckpt", "llama1b_offload", "llama1b_qlora_bf16", "llama8b_qlora_bf16", "gpt2_ckpt", "ddp_ws1", "ddp_ws1_reducer",
         "graph_losses", "gpt2_fsdp", "gpt2_fsdp_ddp", "fsdp_losses"]
runs = {}
for f in sorted(os.listdir(bench)):
    if not f.endswith(".status"):
        continue
    case, impl = f[: -len(".status")].rsplit(".", 1)
    status = open(os.path.join(bench, f)).read().split()
    r = {"case": case, "impl": impl}
    note = os.path.join(bench, case + "." + impl + ".note")
    if os.path.exists(note):
        r["note"] = open(note).read().strip()
    if status[0] == "skipped":
        r["status"] = "skipped: " + " ".join(status[1:])
    else:
        r["rc"], r["wall_s"] = int(status[0]), int(status[1])
        path = os.path.join(bench, case + "." + impl + ".json")
        try:
            r["result"] = json.load(open(path))
            r["status"] = "ok" if r["rc"] == 0 else "exit %d" % r["rc"]
        except (OSError, ValueError):
            r["status"] = "FAILED (exit %d)" % r["rc"]
    runs[(case, impl)] = r
json.dump([runs[k] for k in sorted(runs, key=lambda k: (order.index(k[0]) if k[0] in order else 99, k[1]))],
          open(out, "w"), indent=1)

def get(r, *keys):
    v = (r or {}).get("result")
    for k in keys:
        v = v.get(k) if isinstance(v, dict) else None
    return v

def num(v, fmt):
    return format(v, fmt) if isinstance(v, (int, float)) else "-"

print(header)
cols = "%-22s %-8s %-9s %10s %10s %9s %9s %8s %6s %6s %8s %8s %7s %5s"
print(cols % ("case", "impl", "precision", "samples/s", "tokens/s", "step p50", "step p90",
              "peak MB", "TFLOPS", "MFU", "vs torch", "vs best", "ops", "syncs"))

def base_of(case):
    for tail in ("_graph", "_compile", "_autotune", "_loop", "_tp1", "_fused"):
        if case.endswith(tail):
            return case[: -len(tail)]
    return case

def sps(case, impl):
    return get(runs.get((case, impl)), "samples_per_sec")

def best_pytorch(case):
    # PyTorch's fastest measured path for the case: eager, torch.compile, max-autotune.
    b = base_of(case)
    found = [(sps(b, "pytorch"), "eager"), (sps(b + "_compile", "compile"), "compile"),
             (sps(b + "_autotune", "autotune"), "autotune")]
    found = [f for f in found if f[0]]
    return max(found) if found else (None, None)

for case in order + sorted({k[0] for k in runs} - set(order)):
    if case in ("graph_losses", "fsdp_losses", "doctor_perf", "observe", "r50_shards",
                "gpt2_ckpt_async"):
        continue
    for impl in ("trainer", "launch", "launch_all", "pytorch", "compile", "autotune"):
        r = runs.get((case, impl))
        if r is None:
            continue
        if "result" not in r:
            print("%-22s %-8s %s" % (case, impl, r["status"]))
            continue
        eager = sps(base_of(case), "pytorch")
        ratio = best = ""
        if impl not in ("pytorch", "compile", "autotune") and get(r, "samples_per_sec"):
            if eager:
                ratio = "%.2fx" % (get(r, "samples_per_sec") / eager)
            b, which = best_pytorch(case)
            if b:
                best = "%.2fx" % (get(r, "samples_per_sec") / b) + ("" if which == "eager" else which[0])
        print(cols % (case, impl, get(r, "precision") or "-", num(get(r, "samples_per_sec"), ".1f"),
                      num(get(r, "tokens_per_sec"), ".0f"), num(get(r, "step_time_ms", "p50"), ".1f"),
                      num(get(r, "step_time_ms", "p90"), ".1f"), num(get(r, "peak_memory_mb"), ".0f"),
                      num(get(r, "tflops"), ".3g"), num(get(r, "mfu"), ".2f"), ratio, best,
                      num(get(r, "ops_per_step", "total"), ".0f"),
                      num(get(r, "host_syncs_per_step"), ".1f"))
              + ("  [%s]" % r["note"] if "note" in r else ""))
print("vs best: against PyTorch's fastest path measured here (suffix c: torch.compile, a: "
      "max-autotune-no-cudagraphs; none: eager)")

perf = runs.get(("doctor_perf", "trainer"))
for row in (get(perf, "rows") or []):
    print("doctor --perf: %-12s %-16s %10.4g %10s %-9s %s %s" % (
        row["group"], row["name"], row["measured"],
        "%.4g" % row["expected"] if row["expected"] else "-", row["unit"], row["level"],
        row["verdict"]))

def pct(a, b):
    return "%+.1f%%" % (100.0 * (a / b - 1.0)) if isinstance(a, (int, float)) and b else "n/a"

# The memory plan (doctor --config, per process) against the measured peak: the plan's parts but
# the CUDA context, NCCL and fragmentation allowances are what the caching allocator's peak holds.
ALLOWANCES = ("CUDA context", "NCCL buffers", "fragmentation")
for case in order:
    plan = get(runs.get((case, "plan")))
    peak = get(runs.get((case, "trainer")), "peak_memory_mb")
    if not isinstance(plan, dict) or "parts" not in plan:
        continue
    tensors = sum(v for k, v in plan["parts"].items() if k not in ALLOWANCES) / 2**20
    print("memory plan %-20s planned %8.0f MB in tensors (%8.0f MB with the allowances), "
          "measured peak %s MB: %s" % (case, tensors, plan["per_process_bytes"] / 2**20,
                                      num(peak, ".0f"), pct(tensors, peak)))

for case in ("r50_bf16_b32", "r50_bf16_b256", "gpt2_bf16"):
    fused, loop = runs.get((case, "trainer")), runs.get((case + "_loop", "trainer"))
    if get(fused, "phases_ms", "optimizer") is None or get(loop, "phases_ms", "optimizer") is None:
        continue
    print("optimizer phase (%s): fused %.2f ms, loop %.2f ms per step (loop / fused %.2fx); "
          "optimizer operators %s vs %s" % (case, get(fused, "phases_ms", "optimizer"),
          get(loop, "phases_ms", "optimizer"),
          get(loop, "phases_ms", "optimizer") / get(fused, "phases_ms", "optimizer"),
          num(get(fused, "ops_per_step", "optimizer"), ".0f"),
          num(get(loop, "ops_per_step", "optimizer"), ".0f")))
# Where the time of a step goes, trainer against PyTorch eager (ms per step, and the ratio).
for case in ("r50_bf16_b32", "r50_bf16_b256", "gpt2_bf16"):
    t, p = runs.get((case, "trainer")), runs.get((case, "pytorch"))
    if get(t, "phases_ms") is None or get(p, "phases_ms") is None:
        continue
    parts = []
    for phase in ("data", "forward", "backward", "grad_sync", "optimizer"):
        a, b = get(t, "phases_ms", phase), get(p, "phases_ms", phase)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            parts.append("%s %.2f / %.2f%s" % (phase, a, b, " (%.2fx)" % (a / b) if b > 0 else ""))
    print("phases (%s), ms per step, trainer / eager: %s" % (case, ", ".join(parts)))
for case in ("r50_bf16_b32", "gpt2_bf16"):
    eager, graph = runs.get((case, "trainer")), runs.get((case + "_graph", "trainer"))
    if get(eager, "samples_per_sec") and get(graph, "samples_per_sec"):
        print("CUDA graph (%s): samples/s %s (graph vs eager)"
              % (case, pct(get(graph, "samples_per_sec"), get(eager, "samples_per_sec"))))
g = runs.get(("graph_losses", "losses"))
if g and isinstance(g.get("result"), dict) and "error" in g["result"]:
    print("graph vs eager losses: FAILED: " + g["result"]["error"])
elif g and isinstance(g.get("result"), dict):
    print("graph vs eager losses over %d steps: max relative difference %.2g, mean %.2g"
          % (g["result"]["steps"], g["result"]["max_rel_diff"], g["result"]["mean_rel_diff"]))

k = runs.get(("kernels", "kernels"))
if k and isinstance(k.get("result"), dict) and "kernels" in k["result"]:
    print("fused kernels (bench --kernels), device copy %.0f GB/s: fused GB/s (share of the copy "
          "rate), speedup over ATen" % k["result"]["copy_gbps"])
    for row in k["result"]["kernels"]:
        print("  %-40s %-22s %6.0f GB/s (%3.0f%%)  %.2fx"
              % (row["name"], row["shape"], row["fused_gbps"], 100 * row["of_copy"],
                 row["aten_ms"] / row["fused_ms"]))
elif k:
    print("fused kernels (bench --kernels): FAILED (logs.tar.gz: bench/kernels.kernels.log)")
u = runs.get(("fused_losses", "fused_losses"))
if u and isinstance(u.get("result"), dict) and "error" in u["result"]:
    print("fused vs unfused losses: FAILED: " + u["result"]["error"])
elif u and isinstance(u.get("result"), dict):
    print("fused vs unfused losses (gpt2, bf16) over %d steps: max relative difference %.2g, "
          "mean %.2g" % (u["result"]["steps"], u["result"]["max_rel_diff"],
                         u["result"]["mean_rel_diff"]))
f = runs.get(("fsdp_losses", "fsdp_losses"))
if f and isinstance(f.get("result"), dict) and "error" in f["result"]:
    print("fsdp vs ddp losses: FAILED: " + f["result"]["error"])
elif f and isinstance(f.get("result"), dict):
    print("fsdp vs ddp losses over %d steps: max absolute difference %.2g, mean %.2g"
          % (f["result"]["steps"], f["result"]["max_abs_diff"], f["result"]["mean_abs_diff"]))
fs, dd = runs.get(("gpt2_fsdp", "launch_all")), runs.get(("gpt2_fsdp_ddp", "launch_all"))
if get(fs, "step_time_ms", "p50") is not None and get(dd, "step_time_ms", "p50") is not None:
    print("fsdp vs ddp (gpt2_bf16, %s ranks): step p50 %s vs %s ms (%s), held %s vs %s MB per "
          "rank, peak %s vs %s MB, %s MB communicated per step"
          % (get(fs, "world_size"), num(get(fs, "step_time_ms", "p50"), ".1f"),
             num(get(dd, "step_time_ms", "p50"), ".1f"),
             pct(get(fs, "step_time_ms", "p50"), get(dd, "step_time_ms", "p50")),
             num(get(fs, "held_bytes", "total") / 1e6, ".0f"),
             num(get(dd, "held_bytes", "total") / 1e6, ".0f"),
             num(get(fs, "peak_memory_mb"), ".0f"), num(get(dd, "peak_memory_mb"), ".0f"),
             num(get(fs, "comm_bytes_per_step") / 1e6, ".0f")))

plain = runs.get(("r50_bf16_b256", "trainer"))
for case, what in (("ddp_ws1", ""), ("ddp_ws1_reducer", ", the reducer at world size 1")):
    ddp = runs.get((case, "launch"))
    if get(ddp, "step_time_ms", "mean") is None:
        continue
    print("DDP world size 1 (r50_bf16_b256, trainer launch --nproc-per-node 1%s vs plain): step "
          "time %s, samples/s %s" % (what, pct(get(ddp, "step_time_ms", "mean"),
                                               get(plain, "step_time_ms", "mean")),
                                     pct(get(ddp, "samples_per_sec"), get(plain, "samples_per_sec"))))
for impl in ("trainer", "pytorch"):
    a, b = runs.get(("gpt2_bf16", impl)), runs.get(("gpt2_ckpt", impl))
    if get(a, "peak_memory_mb") is None or get(b, "peak_memory_mb") is None:
        continue
    print("activation checkpointing (gpt2, %s, none -> blocks): peak %s -> %s MB (%s), step p50 %s -> %s ms (%s)"
          % (impl, num(get(a, "peak_memory_mb"), ".0f"), num(get(b, "peak_memory_mb"), ".0f"),
             pct(get(b, "peak_memory_mb"), get(a, "peak_memory_mb")),
             num(get(a, "step_time_ms", "p50"), ".1f"), num(get(b, "step_time_ms", "p50"), ".1f"),
             pct(get(b, "step_time_ms", "p50"), get(a, "step_time_ms", "p50"))))

sh = get(runs.get(("r50_shards", "shards")))
if isinstance(sh, dict):
    d = sh.get("doctor") or {}
    print("r50_shards (ResNet-50 bf16 b256 trained from WebDataset shards of 500x375 JPEGs, CPU "
          "decode): %s img/s, %s of r50_bf16_b256's fixed-batch rate; doctor --perf: %s (%s)"
          % (num(sh.get("samples_per_sec"), ".1f"),
             pct(sh.get("samples_per_sec"), get(plain, "samples_per_sec")),
             d.get("verdict"), d.get("fix") or d.get("measured")))

ck = get(runs.get(("gpt2_ckpt_async", "ckpt_async")))
if isinstance(ck, dict):
    print("gpt2_ckpt_async (GPT-2 small bf16, AdamW): synchronous save %s s, training blocked %s s "
          "per asynchronous save (%s of it)" % (num(ck.get("sync_save_s"), ".3f"),
                                              num(ck.get("blocked_s"), ".3f"),
                                              num(100 * ck.get("ratio", 0), ".1f") + "%"))

o = get(runs.get(("observe", "observe")))
if isinstance(o, dict):
    print("observe (r50 b32, profile: + profile.memory_snapshot): trace with %s CUDA kernels, %s "
          "copies, %s CPU operators; memory snapshot %s bytes, torch.cuda._memory_viz exit %s "
          "(%s bytes of HTML)" % (o.get("kernels"), o.get("gpu_memcpy"), o.get("cpu_ops"),
                                  o.get("snapshot_bytes"), o.get("memory_viz_rc"),
                                  o.get("memory_viz_html_bytes")))

failed = ["%s/%s (%s)" % (k[0], k[1], r["status"]) for k, r in sorted(runs.items())
          if not r["status"].startswith(("ok", "skipped")) or
          (isinstance(r.get("result"), dict) and "error" in r["result"])]
skipped = ["%s/%s" % k for k, r in sorted(runs.items()) if r["status"].startswith("skipped")]
ctest_failed = open(os.path.join(os.path.dirname(bench), "ctest_failed.txt")).read().split() \
    if os.path.exists(os.path.join(os.path.dirname(bench), "ctest_failed.txt")) else []
print("FAILED: " + (", ".join(ctest_failed + failed) if ctest_failed or failed else "none"))
if skipped:
    print("skipped (time budget): " + ", ".join(skipped))
PYEOF
echo >&2
cat "$OUTDIR/table.txt"
# Failed builds stop the script above; here a failed test or bench run makes the exit code 1.
if [[ $c_fail != 0 ]] || grep -qv '^0 \|^skipped' "$WORK"/bench/*.status; then
  exit 1
fi
