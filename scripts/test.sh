#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (GoogleTest and
# pytest, both through CTest). Usage: bash scripts/test.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
cd "${PATCHSTORE_BUILD_DIR:-build}"
ctest --output-on-failure -j2 "$@"
