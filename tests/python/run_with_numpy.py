#!/usr/bin/env python3
"""Runs the Python test suite with another NumPy first on PYTHONPATH (CTest: python_tests_numpy126).

    run_with_numpy.py TARGET_DIR VERSION TESTS_DIR [test_x.py ...] [pytest args...]

Test files named after TESTS_DIR (relative to it) run instead of the whole
folder.

TARGET_DIR holds a NumPy installed apart from the virtual environment, e.g.
    .venv/bin/python -m pip install --no-deps --target .venv/numpy126 numpy==1.26.4
(scripts/bootstrap.sh does this). Without it the test is skipped (exit 77,
CTest's SKIP_RETURN_CODE). The suite checks that it really runs on VERSION
(PATCHSTORE_EXPECT_NUMPY, see conftest.py); subprocesses and DataLoader
workers inherit the PYTHONPATH.
"""

from __future__ import annotations

import os
import subprocess
import sys


def main() -> int:
    target, version, tests = sys.argv[1:4]
    if not os.path.isdir(os.path.join(target, "numpy")):
        print(f"SKIPPED: no NumPy {version} in '{target}'. Install it with:\n"
              f"  {sys.executable} -m pip install --no-deps --target {target} numpy=={version}")
        return 77
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([target] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PATCHSTORE_EXPECT_NUMPY"] = version
    rest = sys.argv[4:]
    files = [os.path.join(tests, a) for a in rest if a.endswith(".py") and not a.startswith("-")]
    args = [a for a in rest if not (a.endswith(".py") and not a.startswith("-"))]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"] + (files or [tests]) + args
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
