#!/usr/bin/env bash
# Installs what patchstore needs on a fresh Debian 12 machine and builds it.
# Idempotent: re-running it only does what is missing.
#   - Debian packages (C++ libraries, build tools) through apt-get
#   - a Python virtual environment in .venv with pinned packages from PyPI
#   - a Release build in build/ (C++ libraries, the `patchstore` program,
#     tests, benchmarks and the Python module)
# Environment: PATCHSTORE_BUILD_DIR (default build), PATCHSTORE_BUILD_TYPE
# (default Release), PATCHSTORE_JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

APT_PACKAGES=(build-essential cmake pkg-config liblmdb-dev lmdb-utils libopencv-dev
  libtiff-dev libjpeg-dev libopenexr-dev libhdf5-dev libxxhash-dev libbenchmark-dev libgtest-dev libcli11-dev
  clang-14 libclang-rt-14-dev clang-format-14 ccache libinsighttoolkit5-dev)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv"
  "$PY" -m venv .venv
fi
if ! cmp -s requirements-dev.txt .venv/.requirements-installed 2>/dev/null; then
  echo "bootstrap: installing Python packages (requirements-dev.txt)"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -r requirements-dev.txt
  cp requirements-dev.txt .venv/.requirements-installed
fi

# NumPy 1.26 beside the venv's 2.x, for the test that runs the Python suite
# with it first on PYTHONPATH (the module uses the buffer protocol only).
[ -d .venv/numpy126/numpy ] || .venv/bin/python -m pip install -q --no-deps --target .venv/numpy126 numpy==1.26.4

BUILD=${PATCHSTORE_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE="${PATCHSTORE_BUILD_TYPE:-Release}" \
  -DPython_EXECUTABLE="$ROOT/.venv/bin/python" \
  -Dpybind11_DIR="$(.venv/bin/python -m pybind11 --cmakedir)" ${PATCHSTORE_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD" -j"${PATCHSTORE_JOBS:-2}"
