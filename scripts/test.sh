#!/usr/bin/env bash
# Installs what is missing, builds, checks the style (scripts/check_style.sh:
# clang-format, ruff, mypy --strict) and runs every test: GoogleTest, pytest,
# the installed-package consumer and a short libFuzzer session (all through
# CTest), builds the manual (mkdocs build --strict), checks a reader-only
# build (tests/install/reader_only.sh: the ingest libraries hidden from CMake),
# then the GoogleTest suites again in a build with AddressSanitizer and
# UndefinedBehaviorSanitizer, failing on any report.
# Usage: bash scripts/test.sh [ctest args...]
# Environment: PATCHSTORE_SKIP_SANITIZERS=1 skips the sanitizer pass;
# PATCHSTORE_SKIP_READER_ONLY=1 skips the reader-only build;
# Long variants (documented in docs/install.md): PATCHSTORE_CRASH_KILLS (default 25),
# PATCHSTORE_READERS / PATCHSTORE_READER_SECONDS (64 / 20),
# PATCHSTORE_KILL_CYCLES (200), and tests/fuzz/run.sh with a longer time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
ROOT=$PWD

# The style gate first (a minute or two), so a formatting or typing finding
# shows before the long test run: clang-format, ruff, mypy --strict.
bash scripts/check_style.sh
(cd "${PATCHSTORE_BUILD_DIR:-build}" && ctest --output-on-failure -j2 "$@")

# The manual: --strict turns a broken link, a missing include or a docstring
# mkdocstrings cannot read into a failure.
if [ -x .venv/bin/mkdocs ]; then
  echo "== mkdocs build --strict (the manual in docs/)"
  # (not --quiet: it hides warnings from --strict, which then passes)
  .venv/bin/mkdocs build --strict -d "${PATCHSTORE_BUILD_DIR:-build}/site"
else
  echo "== SKIPPED: mkdocs build --strict: .venv/bin/mkdocs is not installed (pip install -r requirements-dev.txt)"
fi

if [ "${PATCHSTORE_SKIP_READER_ONLY:-0}" != 1 ]; then
  # A second build beside the first (build-reader-only), so ccache serves the
  # objects the two share: a few minutes on 2 cores.
  bash tests/install/reader_only.sh . "${PATCHSTORE_BUILD_DIR:-build}" "$ROOT/.venv/bin/python"
fi

if [ "${PATCHSTORE_SKIP_SANITIZERS:-0}" != 1 ]; then
  echo "== GoogleTest suites under AddressSanitizer + UndefinedBehaviorSanitizer"
  # -O1 -g1 (line tables: reports still name file and line) compiles much
  # faster than -O2 -g, and only the three test programs (and the
  # `patchstore` program they run) are built.
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPATCHSTORE_SANITIZE=ON \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DPATCHSTORE_BUILD_PYTHON=OFF -DPATCHSTORE_BUILD_BENCH=OFF ${PATCHSTORE_CMAKE_ARGS:-} >/dev/null
  cmake --build build-asan -j2 --target store_tests reader_tests ingest_tests patchstore
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:halt_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # The 64-reader soak already ran its 20 s above; under the sanitizers 10 s suffice.
  (cd build-asan && PATCHSTORE_READER_SECONDS=10 ctest --output-on-failure -j2 \
    -E 'python_tests|install_consumer|fuzz_record_parsers|pip_install')
fi
