#!/usr/bin/env bash
# Installs what is missing, builds, checks the style (scripts/check_style.sh:
# clang-format, ruff, mypy --strict) and runs every test: the Python suite, the
# installed-package consumer, a wheel in a clean venv and a short libFuzzer
# session (through CTest in the Release build), builds the manual (mkdocs
# build --strict), checks a reader-only build (tests/install/reader_only.sh:
# the ingest libraries hidden from CMake), then builds the GoogleTest suites
# with AddressSanitizer and UndefinedBehaviorSanitizer and runs them there,
# failing on any report. Each step prints the time since the start.
# Usage: bash scripts/test.sh [ctest args...]   (passed to both CTest runs)
# Environment: PATCHSTORE_SKIP_SANITIZERS=1 skips the sanitizer build (the
# GoogleTest suites then run in the Release build);
# PATCHSTORE_SKIP_READER_ONLY=1 skips the reader-only build;
# Long variants (documented in docs/install.md): PATCHSTORE_CRASH_KILLS (default 25),
# PATCHSTORE_READERS / PATCHSTORE_READER_SECONDS (64 / 20),
# PATCHSTORE_KILL_CYCLES (200), and tests/fuzz/run.sh with a longer time.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
step() { printf '== [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
ROOT=$PWD
BUILD=${PATCHSTORE_BUILD_DIR:-build}
SANITIZE=1
[ "${PATCHSTORE_SKIP_SANITIZERS:-0}" = 1 ] && SANITIZE=0
# The GoogleTest suites run once: under the sanitizers when that build runs
# (compiling them twice on 2 cores cost minutes), else in the Release build.
GTESTS=ON
[ "$SANITIZE" = 1 ] && GTESTS=OFF

step "bootstrap: packages, venv, Release build in $BUILD"
PATCHSTORE_CMAKE_ARGS="-DPATCHSTORE_BUILD_GTESTS=$GTESTS ${PATCHSTORE_CMAKE_ARGS:-}" bash scripts/bootstrap.sh

# The style gate first (a minute or two), so a formatting or typing finding
# shows before the long test run: clang-format, ruff, mypy --strict.
step "style"
bash scripts/check_style.sh
step "CTest in $BUILD"
(cd "$BUILD" && ctest --output-on-failure -j2 "$@")

# The manual: --strict turns a broken link, a missing include or a docstring
# mkdocstrings cannot read into a failure.
if [ -x .venv/bin/mkdocs ]; then
  step "mkdocs build --strict (the manual in docs/)"
  # (not --quiet: it hides warnings from --strict, which then passes)
  .venv/bin/mkdocs build --strict -d "$BUILD/site"
else
  echo "== SKIPPED: mkdocs build --strict: .venv/bin/mkdocs is not installed (pip install -r requirements-dev.txt)"
fi

if [ "${PATCHSTORE_SKIP_READER_ONLY:-0}" != 1 ]; then
  # A second build beside the first (build-reader-only), so ccache serves the
  # objects the two share.
  step "reader-only build"
  bash tests/install/reader_only.sh . "$BUILD" "$ROOT/.venv/bin/python"
fi

if [ "$SANITIZE" = 1 ]; then
  step "GoogleTest suites under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan)"
  # -Og -g1 (line tables: reports still name file and line) compiles in about
  # half the time of -O1; only the three test programs and the `patchstore`
  # program they run are built, without ITK (no C++ test uses it; the Python
  # suite checks the ITK path).
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPATCHSTORE_SANITIZE=ON \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-Og -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-Og -g1 -DNDEBUG" \
    -DPATCHSTORE_BUILD_PYTHON=OFF -DPATCHSTORE_BUILD_BENCH=OFF -DPATCHSTORE_ITK=OFF ${PATCHSTORE_CMAKE_ARGS:-} >/dev/null
  cmake --build build-asan -j2 --target store_tests reader_tests ingest_tests patchstore
  step "CTest in build-asan"
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:halt_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  (cd build-asan && ctest --output-on-failure -j2 -E 'install_consumer|fuzz_record_parsers|readme_up_to_date' "$@")
fi
step "all passed"
