#!/usr/bin/env bash
# One command for the side-by-side benchmark:
#   bash bench/compare/run.sh [--quick] [--work DIR] [--keep] [--only KEYS]
# 1. makes sure patchstore is built (scripts/bootstrap.sh if build/ is missing);
# 2. installs requirements-bench.txt into .venv (idempotent; torch and numpy
#    pinned by bench/compare/constraints.txt, checked afterwards);
# 3. tries FFCV once (needs Debian's libturbojpeg0-dev; compiled from source,
#    time-limited) and records the outcome in .venv/.bench-ffcv-status;
# 4. runs bench/compare/run.py --out bench/compare/results "$@".
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=.venv/bin/python
CONS=bench/compare/constraints.txt

if [ ! -x build/patchstore ] || [ ! -x "$PY" ]; then
  echo "run.sh: patchstore is not built; running scripts/bootstrap.sh"
  bash scripts/bootstrap.sh
fi

if ! cmp -s requirements-bench.txt .venv/.bench-requirements-installed 2>/dev/null; then
  echo "run.sh: installing the pinned peers (requirements-bench.txt) into .venv"
  "$PY" -m pip install -q -r requirements-bench.txt -c "$CONS"
  cp requirements-bench.txt .venv/.bench-requirements-installed
fi

# FFCV: tried once per requirements/pip state; the status line ends up in RESULTS.md.
FFCV_STATUS=.venv/.bench-ffcv-status
if "$PY" -c "import ffcv.loader" >/dev/null 2>&1; then
  [ -f "$FFCV_STATUS" ] || echo "ffcv $("$PY" -c 'import importlib.metadata as m; print(m.version("ffcv"))') was already installed" > "$FFCV_STATUS"
elif [ ! -f "$FFCV_STATUS" ]; then
  echo "run.sh: trying to install FFCV 1.0.2 (compiled from source, at most 10 minutes)"
  if ! pkg-config --exists libturbojpeg 2>/dev/null; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    ( $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
        --no-install-recommends libturbojpeg0-dev pkg-config libopencv-dev ) >/dev/null 2>&1 || true
  fi
  log=$(mktemp)
  # --no-deps: ffcv declares opencv-python, which would shadow opencv-python-headless;
  # its other dependencies are pinned in requirements-bench.txt.
  if timeout 600 "$PY" -m pip install --no-deps -c "$CONS" ffcv==1.0.2 >"$log" 2>&1 \
      && "$PY" -c "import ffcv.loader" >>"$log" 2>&1; then
    echo "installed ffcv 1.0.2 from source with --no-deps (needs Debian's libturbojpeg0-dev and libopencv-dev)" \
      > "$FFCV_STATUS"
  else
    rc=$?
    reason=$(grep -E "Error|error:|RuntimeError|Could not" "$log" | grep -v "^ *$" | tail -3 | tr '\n' ' ' | cut -c1-400)
    echo "pip install ffcv==1.0.2 failed (exit $rc$([ $rc -eq 124 ] && echo ', timed out after 600 s')): ${reason:-see pip output}" \
      > "$FFCV_STATUS"
  fi
  rm -f "$log"
  cat "$FFCV_STATUS"
fi

# Nothing here may have changed torch or numpy.
"$PY" - <<'PYEOF'
import importlib.metadata as md, sys
want = {"torch": "2.13.0", "numpy": "2.4.6"}
bad = {k: md.version(k) for k in want if not md.version(k).startswith(want[k])}
if bad:
    sys.exit(f"run.sh: pinned packages changed: {bad} (expected {want})")
PYEOF

export BENCH_COMMAND="bash bench/compare/run.sh${*:+ $*}"
exec "$PY" bench/compare/run.py --out "${BENCH_OUT:-bench/compare/results}" "$@"
