#!/usr/bin/env bash
# Collects, on a Debian 12 amd64 machine with a package registry, what scripts/gpu_check.sh needs
# on a CUDA machine that has PyTorch, CMake, ninja and a C++ compiler but no registry and no
# internet (the device tool's nvidia-h200 machine):
#
#   scripts/make_gpu_bundle.sh [DIR]          (default: .gpu_bundle in the repository, git-ignored)
#
#   DIR/prefix/usr/   the build's Debian libraries, unpacked (apt-get download + dpkg -x): headers,
#                     CMake and pkg-config files (relocatable: pkg-config paths are relative to
#                     ${pcfiledir}), static archives where Debian ships them (yaml-cpp, GoogleTest,
#                     libturbojpeg, xxhash, zlib: their shared objects are left out so the build links
#                     the archives), the shared libraries of the rest (spdlog, fmt, libspng), Gloo's
#                     headers (only headers: LibTorch's Gloo is the one that runs) and pkgconf (a
#                     pkg-config, for machines without one)
#   DIR/wheels/       what scripts/bench_reference.py needs beside torch: torchvision and pyyaml
#                     wheels for CPython $GPU_BUNDLE_PYTHON_VERSIONS, for
#                     `pip install --no-index --find-links` (no torch wheel: the machine has torch)
#   DIR/MANIFEST.txt  packages and versions, wheels, and the newest glibc / libstdc++ symbol
#                     versions each bundled binary needs; DIR/packages.txt: `name version` lines
#
# Every shared object and program in the bundle must load with glibc $GPU_BUNDLE_MAX_GLIBC (default
# 2.35, Ubuntu 22.04) or newer; the script fails otherwise. It also fails when the bundle exceeds
# $GPU_BUNDLE_MAX_MB (default 40 MiB): the device tool carries at most 64 MiB with the working tree.
#
# Environment:
#   GPU_BUNDLE_PYTHON_VERSIONS  CPython versions of the wheels, space-separated (default: 3.12, the
#                               device machine's python3)
#   GPU_BUNDLE_PIP              the Python whose pip downloads the wheels (default: .venv/bin/python,
#                               else python3)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${1:-$ROOT/.gpu_bundle}
PY_VERSIONS=${GPU_BUNDLE_PYTHON_VERSIONS:-3.12}
MAX_GLIBC=${GPU_BUNDLE_MAX_GLIBC:-2.35}
MAX_MB=${GPU_BUNDLE_MAX_MB:-40}
ARCH=x86_64-linux-gnu

say() { echo "make_gpu_bundle: $*" >&2; }
die() { say "$*"; exit 1; }

# The Debian packages: the -dev packages of CMakeLists.txt's find_package / pkg_check_modules /
# find_path, the runtime packages of the shared libraries kept, and pkgconf.
PACKAGES=(libyaml-cpp-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libcxxopts-dev
          libgtest-dev nlohmann-json3-dev libxxhash-dev libturbojpeg0-dev libspng-dev libspng0
          libgloo-dev zlib1g-dev pkgconf-bin libpkgconf3)
WHEELS=(torchvision==0.26.0 pyyaml==6.0.3)

[[ "$(dpkg --print-architecture 2>/dev/null)" == amd64 ]] || die "needs a Debian amd64 machine"
for tool in apt-get dpkg-deb objdump nm; do
  command -v "$tool" >/dev/null || die "needs $tool"
done
PIP_PY=${GPU_BUNDLE_PIP:-}
if [[ -z "$PIP_PY" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PIP_PY=$ROOT/.venv/bin/python; else PIP_PY=python3; fi
fi

# A previous bundle is replaced; any other folder with contents is left alone.
if [[ -d "$DIR" && -n "$(ls -A "$DIR")" ]]; then
  [[ -f "$DIR/MANIFEST.txt" ]] || die "$DIR is not empty and holds no bundle"
  rm -rf "$DIR"
fi
mkdir -p "$DIR/prefix" "$DIR/wheels"
DIR=$(cd "$DIR" && pwd)
echo "# incomplete: scripts/make_gpu_bundle.sh did not finish" > "$DIR/MANIFEST.txt"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# --- Debian packages -----------------------------------------------------------------------------
# The versions installed here (what the project is built and tested with), else the candidates.
specs=()
for p in "${PACKAGES[@]}"; do
  v=$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || true)
  specs+=("$p${v:+=$v}")
done
say "downloading ${#specs[@]} Debian packages"
(cd "$TMP" && apt-get download -q "${specs[@]}" >/dev/null 2>"$TMP/apt.err") ||
  { cat "$TMP/apt.err" >&2; die "apt-get download failed"; }
for deb in "$TMP"/*.deb; do
  dpkg -x "$deb" "$DIR/prefix"
  dpkg-deb -f "$deb" Package Version | sed 's/^[^:]*: //' | paste -sd' ' >> "$TMP/packages"
done

P=$DIR/prefix/usr
LIB=$P/lib/$ARCH
# Documentation, and what the build does not use: Gloo's library and CMake files (its headers
# only), libjpeg-turbo's CMake files (pkg-config is used), the source folder.
rm -rf "$P/share/doc" "$P/share/man" "$P/share/lintian" "$P/src" "$P"/lib/libgloo.so* \
       "$P/share/cmake/Gloo" "$LIB/cmake/libjpeg-turbo"
# Static archives where Debian has them: without the shared objects beside them, CMake's
# find_library (pkg-config) and FindZLIB pick the archives.
rm -f "$LIB"/libturbojpeg.so* "$LIB"/libxxhash.so* "$LIB"/libz.so* "$LIB"/libyaml-cpp.so*
# yaml-cpp's CMake package names its shared library: point it at the archive.
sed -i 's/add_library(yaml-cpp SHARED IMPORTED)/add_library(yaml-cpp STATIC IMPORTED)/' \
  "$LIB/cmake/yaml-cpp/yaml-cpp-targets.cmake"
sed -i -e 's/libyaml-cpp\.so\.[0-9.]*"/libyaml-cpp.a"/g' -e '/IMPORTED_SONAME_/d' \
  "$LIB/cmake/yaml-cpp/yaml-cpp-targets-none.cmake"
# pkg-config files: /usr becomes a path relative to the file, so the bundle works wherever it lies.
# shellcheck disable=SC2016  # ${pcfiledir} is pkg-config's variable, not the shell's
for pc in "$LIB"/pkgconfig/*.pc "$P"/share/pkgconfig/*.pc; do
  case "$pc" in
    "$LIB"/pkgconfig/*) rel='${pcfiledir}/../../..' ;;
    *) rel='${pcfiledir}/../..' ;;
  esac
  sed -i -E "s#(^|[=[:space:]]|-I|-L)/usr(/|\$|[[:space:]])#\\1${rel}\\2#g" "$pc"
done
if grep -l '/usr' "$LIB"/pkgconfig/*.pc "$P"/share/pkgconfig/*.pc | grep -q .; then
  die "absolute /usr paths left in pkg-config files: $(grep -l /usr "$LIB"/pkgconfig/*.pc "$P"/share/pkgconfig/*.pc)"
fi
# The ones the build must find.
for f in "$LIB/libyaml-cpp.a" "$LIB/libgtest.a" "$LIB/libturbojpeg.a" "$LIB/libxxhash.a" \
         "$LIB/libz.a" "$LIB/libspdlog.so" "$LIB/libfmt.so" "$LIB/libspng.so" "$P/bin/pkgconf" \
         "$P/include/gloo/rendezvous/store.h" "$P/include/cxxopts.hpp" \
         "$P/include/nlohmann/json.hpp"; do
  [[ -e "$f" ]] || die "missing from the bundle: $f"
done

# --- glibc / libstdc++ symbol versions -----------------------------------------------------------
# The newest version of each kind that an ELF file's undefined (imported) symbols name.
newest() { objdump -T "$1" | awk '$0 ~ /\*UND\*/' | grep -o "$2_[0-9.]*" | sort -uV | tail -n 1; }
{
  echo "glibc / libstdc++ symbol versions needed (objdump -T, undefined symbols):"
  bad=0
  while IFS= read -r f; do
    g=$(newest "$f" GLIBC)
    printf '  %-44s %-12s %-16s %s\n' "${f#"$DIR/"}" "${g:-none}" "$(newest "$f" GLIBCXX)" \
      "$(newest "$f" CXXABI)"
    if [[ -n "$g" && "$(printf '%s\n%s\n' "${g#GLIBC_}" "$MAX_GLIBC" | sort -V | tail -n 1)" != "$MAX_GLIBC" ]]; then
      say "$f needs $g, newer than glibc $MAX_GLIBC"
      bad=1
    fi
  done < <(find "$DIR/prefix" -type f \( -name '*.so*' -o -path '*/bin/*' \) | sort)
  # Static archives: their references bind at link time to the GPU machine's glibc; none may name
  # a function that glibc $MAX_GLIBC lacks (those added in 2.35 and 2.36, the glibc here).
  objdump -T /lib/$ARCH/libc.so.6 /lib/$ARCH/libm.so.6 | awk 'NF > 1 && $(NF-1) ~ /GLIBC_2\.3[5-9]/ {print $NF}' |
    sort -u > "$TMP/new-symbols"
  echo "static archives: glibc functions newer than 2.34 that they call:"
  for a in "$LIB"/*.a; do
    n=$(nm -u --format=just-symbols "$a" 2>/dev/null | sort -u | comm -12 - "$TMP/new-symbols" | paste -sd' ')
    printf '  %-44s %s\n' "${a#"$DIR/"}" "${n:-none}"
    [[ -z "$n" ]] || bad=1
  done
  [[ $bad == 0 ]] || die "the bundle needs a glibc newer than $MAX_GLIBC"
} > "$TMP/glibc"

# --- wheels ---------------------------------------------------------------------------------------
for v in $PY_VERSIONS; do
  say "downloading ${WHEELS[*]} for CPython $v"
  "$PIP_PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$v" --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$DIR/wheels" "${WHEELS[@]}"
done

# --- manifest and size ----------------------------------------------------------------------------
rm "$DIR/MANIFEST.txt"
sort "$TMP/packages" > "$DIR/packages.txt"
{
  echo "# GPU bundle for scripts/gpu_check.sh, made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release | tr -d '"') ($(ldd --version | head -n 1))"
  echo "Debian packages (unpacked into prefix/; also in packages.txt):"
  sed 's/^/  /' "$DIR/packages.txt"
  echo "wheels/:"
  find "$DIR/wheels" -name '*.whl' -printf '  %f\n' | sort
  cat "$TMP/glibc"
} > "$DIR/MANIFEST.txt"
mb=$(du -sm "$DIR" | cut -f1)
((mb <= MAX_MB)) || die "$DIR is $mb MiB, over $MAX_MB MiB"
echo "size: $(du -sh "$DIR" | cut -f1)" >> "$DIR/MANIFEST.txt"
say "bundle in $DIR ($(du -sh "$DIR" | cut -f1)); see $DIR/MANIFEST.txt"
