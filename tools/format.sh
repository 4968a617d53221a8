#!/usr/bin/env bash
# Reformats the sources in place so that scripts/check_style.sh passes its
# formatting checks: every tracked C++ file with clang-format-14 (.clang-format),
# then ruff's safe fixes on the Python files (import order, unused imports).
# What ruff cannot fix, and mypy's findings, it lists for fixing by hand.
# Usage: bash tools/format.sh [FILE...]   (default: every tracked *.cc / *.h)
# Environment: CLANG_FORMAT (default clang-format-14).
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format-14}
if [ $# -gt 0 ]; then
  "$CLANG_FORMAT" --style=file -i "$@"
else
  git ls-files -z -- '*.cc' '*.h' | xargs -0 "$CLANG_FORMAT" --style=file -i
  if [ -x .venv/bin/ruff ]; then
    .venv/bin/ruff check --fix-only --exit-zero --quiet
    .venv/bin/ruff check --output-format concise || echo "format.sh: fix the ruff findings above by hand"
  fi
fi
git diff --stat
