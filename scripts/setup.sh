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
set -euo pipefail

TORCH_VERSION=2.11.0
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${TRAINER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trainer}

say() { echo "setup: $*" >&2; }

# --- Debian packages ---------------------------------------------------------------------------
PACKAGES=(cmake ninja-build g++ ccache lld pkg-config libyaml-cpp-dev libspdlog-dev libcxxopts-dev
          libgtest-dev libgloo-dev nlohmann-json3-dev zlib1g-dev libturbojpeg0-dev libspng-dev libxxhash-dev
          dataset-fashion-mnist fortunes procps)
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
VENV="$CACHE/venv-torch-$TORCH_VERSION"
# Beside torch: numpy, tensorboard (reads our event files in a test), matplotlib (plots),
# torchvision (the reference state-dict lists in tests/data, scripts/torchvision_reference.py, and
# the weight-exchange test) and safetensors (the weight-exchange test).
EXTRAS=(numpy tensorboard==2.21.0 matplotlib==3.11.2 torchvision==0.26.0 safetensors==0.8.0)
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
  "$VENV/bin/pip" install -q --disable-pip-version-check "torch==$TORCH_VERSION" "${EXTRAS[@]}"
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
