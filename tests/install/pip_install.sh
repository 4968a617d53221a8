#!/usr/bin/env bash
# Builds a wheel of the project with pip (scikit-build-core, the same CMake
# project), installs it into a fresh virtual environment that has nothing but
# the wheel and NumPy, and uses it: import, ingest with the bundled program,
# read a patch. Usage: pip_install.sh SOURCE_DIR PYTHON [GENERATOR CC CXX]
# GENERATOR, CC, CXX: those of the build that runs the test (CTest passes
# them), so the wheel's build compiles the same commands and ccache serves it.
set -euo pipefail
SRC=$1; PY=$2
if [ $# -ge 5 ]; then export CMAKE_GENERATOR=$3 CC=$4 CXX=$5; fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
VERSION=$(cat "$SRC/VERSION")
# The wheel's build takes its parallelism from the environment
# (CMAKE_BUILD_PARALLEL_LEVEL); here PATCHSTORE_JOBS, default 2, as bootstrap.sh.
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-${PATCHSTORE_JOBS:-2}}
# Build isolation off: the build tools (scikit-build-core, pybind11) come
# from the developer venv, so this works without network access too.
# The build folder: build-pip in the source (pyproject.toml's build-wheel/TAG
# is one level deeper), so with the same generator and compilers ccache serves
# the objects the main build compiled (see CCACHE_BASEDIR in CMakeLists.txt),
# and a second run builds only what changed.
"$PY" -m pip wheel -q --no-build-isolation --no-deps -Cbuild-dir=build-pip -w "$TMP/wheels" "$SRC"
WHEEL=$(ls "$TMP"/wheels/patchstore-"$VERSION"-*.whl)
python3 -m venv "$TMP/venv"
"$TMP/venv/bin/pip" install -q "$WHEEL" numpy==2.4.6
cd "$TMP"
mkdir -p data
# The input PNG is written with the developer venv's Pillow; the clean venv
# holds only the wheel and NumPy.
"$PY" - <<'PY'
import numpy as np
from PIL import Image
a = np.array([[x * 40 + y * 10 for x in range(4)] for y in range(3)], np.uint8)
Image.fromarray(a, "L").save("data/a.png")
open("data/manifest.csv", "w").write("id,x\nsample/1,a.png\n")
PY
"$TMP/venv/bin/patchstore" --version | grep -qx "patchstore $VERSION"
"$TMP/venv/bin/patchstore" -q ingest images s.ps --manifest data/manifest.csv
PATCHSTORE_EXPECT_VERSION=$VERSION "$TMP/venv/bin/python" - <<'PY'
import importlib.metadata, os
import numpy as np, patchstore
v = os.environ["PATCHSTORE_EXPECT_VERSION"]
assert patchstore.__version__ == v and importlib.metadata.version("patchstore") == v, (
    patchstore.__version__, importlib.metadata.version("patchstore"), v)
s = patchstore.open("s.ps")
assert len(s) == 1 and s.ids[0] == "sample/1", (len(s), list(s.ids))
p = s.patch("sample/1", "x", 1, 1, 2, 2)
expect = (np.array([[50, 90], [60, 100]], np.float32) / 255 * 2 - 1).astype(np.float32)
assert p.shape == (1, 2, 2) and np.array_equal(p[0], expect), p
print("pip-installed patchstore", patchstore.__version__, "works:", p.shape)
PY
