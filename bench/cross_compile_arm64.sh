#!/usr/bin/env bash
# Compiles every source of the C++ CPU op (engine/kernels/csrc/*.cpp) for Linux ARM64 with
# Debian's cross compiler, against the headers of the real ARM64 torch wheel (the version the
# project pins), each with the flags engine/kernels/cpu_build.py uses, and fails on any error.
#
# What it proves: the sources compile for aarch64, every x86 intrinsic, target attribute and
# x86-only header (immintrin.h, cpuid.h) is behind its guard, and cpu_isa.cpp's ARM64 probe
# (getauxval hwcaps) builds, against the torch headers an ARM64 install has.
# What it does not: nothing is linked or run (no ARM64 machine or emulator here), so neither the
# library's loading nor the scalar routines' results on ARM64 are checked by it.
#
#   bench/cross_compile_arm64.sh      (the wheel is cached in .cache/arm64; the compiler comes from apt)
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION="2.13.0"
PLATFORM="manylinux_2_28_aarch64"
CACHE=".cache/arm64"
CXX="aarch64-linux-gnu-g++"
PY=".venv/bin/python"

if ! command -v "$CXX" >/dev/null; then
  echo "installing $CXX (Debian's g++-aarch64-linux-gnu)"
  apt-get update -qq
  apt-get install -y -qq g++-aarch64-linux-gnu >/dev/null
fi

mkdir -p "$CACHE"
wheel=$(find "$CACHE" -maxdepth 1 -name "torch-${TORCH_VERSION}-*-${PLATFORM}.whl" | head -n 1)
if [ -z "$wheel" ]; then
  "$PY" -m pip download "torch==${TORCH_VERSION}" --no-deps --only-binary=:all: \
    --platform "$PLATFORM" --python-version 3.11 -d "$CACHE" --quiet
  wheel=$(find "$CACHE" -maxdepth 1 -name "torch-${TORCH_VERSION}-*-${PLATFORM}.whl" | head -n 1)
fi
[ -n "$wheel" ] || { echo "no torch ${TORCH_VERSION} ${PLATFORM} wheel in $CACHE" >&2; exit 1; }

headers="$CACHE/torch-${TORCH_VERSION}"
if [ ! -f "$headers/.unpacked" ]; then
  rm -rf "$headers"
  unzip -q -o "$wheel" 'torch/include/*' -d "$headers"
  touch "$headers/.unpacked"
fi
include="$headers/torch/include"

# cpu_build.py's flags (torch's extension builder adds -std=c++17 -fPIC -O3 and the ABI macro).
flags=(-std=c++17 -O3 -fPIC -fopenmp -fno-math-errno -fno-trapping-math -Wall -Wno-unused-function -Werror
  -D_GLIBCXX_USE_CXX11_ABI=1 -isystem "$include" -isystem "$include/torch/csrc/api/include")
out="$CACHE/obj"
mkdir -p "$out"
echo "$("$CXX" --version | head -n 1); torch headers from $(basename "$wheel")"
for src in engine/kernels/csrc/*.cpp; do
  obj="$out/$(basename "${src%.cpp}").o"
  "$CXX" "${flags[@]}" -c "$src" -o "$obj"
  file "$obj" | grep -q "ARM aarch64" || { echo "$obj is not an ARM64 object" >&2; exit 1; }
  echo "ok  $src"
done
echo "every source of engine/kernels/csrc/ compiles for ARM64 (compiled only: not linked or run)"
