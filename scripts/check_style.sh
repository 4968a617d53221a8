#!/usr/bin/env bash
# The style gate, run by scripts/test.sh before the tests (and alone:
# `bash scripts/check_style.sh`). Each check names file and line of every
# finding and says what to run to fix it; the script fails if any check does.
#   - C++: clang-format-14 --dry-run --Werror over the tracked *.cc / *.h files
#     (.clang-format); fix: bash tools/format.sh
#   - Python: ruff check (pyproject.toml [tool.ruff]: bindings/, tests/python,
#     tools/, bench/); fix: .venv/bin/ruff check --fix, then by hand
#   - Python: mypy --strict over bindings/patchstore (pyproject.toml
#     [tool.mypy]; the compiled modules are typed by their .pyi stubs)
# Environment: CLANG_FORMAT (default clang-format-14), PATCHSTORE_STYLE_SHOW
# (findings shown per check, default 50).
set -uo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format-14}
SHOW=${PATCHSTORE_STYLE_SHOW:-50}
failed=()

# Prints the first $SHOW lines of a check's output and how many more there are.
show() {
  local out=$1 n
  n=$(wc -l <"$out")
  head -n "$SHOW" "$out"
  if [ "$n" -gt "$SHOW" ]; then echo "... and $((n - SHOW)) more lines"; fi
}

cpp_files() {
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z -- '*.cc' '*.h'
  else
    find store reader ingest cli bindings tests bench include -name '*.cc' -o -name '*.h' 2>/dev/null | tr '\n' '\0'
  fi
}

out=$(mktemp)
trap 'rm -f "$out" "$out.lines"' EXIT

echo "== style: clang-format ($CLANG_FORMAT, .clang-format) over the C++ sources"
if ! command -v "$CLANG_FORMAT" >/dev/null 2>&1; then
  echo "style: $CLANG_FORMAT is not installed (bash scripts/bootstrap.sh installs it: apt-get install clang-format-14)"
  failed+=(clang-format)
elif ! cpp_files | xargs -0 "$CLANG_FORMAT" --style=file --dry-run --Werror >"$out" 2>&1; then
  # One line per file:line (clang-format reports every column that differs).
  sed -nE 's/^([^ :]+:[0-9]+):[0-9]+: (error|warning): .*/\1: not formatted as .clang-format says/p' "$out" |
    uniq >"$out.lines"
  if [ -s "$out.lines" ]; then
    echo "style: $(wc -l <"$out.lines") lines differ from what clang-format makes of them:"
    show "$out.lines"
  else
    show "$out"  # clang-format itself failed (a bad .clang-format, an unreadable file)
  fi
  rm -f "$out.lines"
  echo "style: to fix: bash tools/format.sh (reformats every tracked C++ file in place)"
  failed+=(clang-format)
fi

echo "== style: ruff check (pyproject.toml [tool.ruff])"
if [ ! -x .venv/bin/ruff ]; then
  echo "style: .venv/bin/ruff is not installed (bash scripts/bootstrap.sh, or pip install -r requirements-dev.txt)"
  failed+=(ruff)
elif ! .venv/bin/ruff check --no-cache --output-format concise >"$out" 2>&1; then
  show "$out"
  echo "style: to fix: .venv/bin/ruff check --fix (imports), the rest by hand; the rules are in pyproject.toml"
  failed+=(ruff)
fi

echo "== style: mypy --strict on bindings/patchstore (pyproject.toml [tool.mypy])"
if [ ! -x .venv/bin/mypy ]; then
  echo "style: .venv/bin/mypy is not installed (bash scripts/bootstrap.sh, or pip install -r requirements-dev.txt)"
  failed+=(mypy)
elif ! .venv/bin/mypy --cache-dir "${PATCHSTORE_BUILD_DIR:-build}/.mypy_cache" >"$out" 2>&1; then
  show "$out"
  echo "style: to fix: annotate or correct the lines above; run .venv/bin/mypy to check again"
  failed+=(mypy)
fi

if ((${#failed[@]})); then
  echo "style: FAILED: ${failed[*]}"
  exit 1
fi
echo "style: clang-format, ruff and mypy --strict: no findings"
