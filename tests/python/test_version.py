"""One version: the VERSION file at the source root is what CMake's project, the program's --version,
patchstore.__version__ and a new store's metadata say (pyproject.toml reads the same file;
tests/install/pip_install.sh checks the wheel's metadata)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import patchstore

SOURCE = Path(os.environ.get("PATCHSTORE_SOURCE_DIR", Path(__file__).resolve().parents[2]))


@pytest.fixture(scope="module")
def version() -> str:
    text = (SOURCE / "VERSION").read_text()
    assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+\n", text), f"VERSION holds {text!r}, not one line MAJOR.MINOR.PATCH"
    return text.strip()


def test_python_version_is_the_version_file(version):
    assert patchstore.__version__ == version


def test_cli_version_is_the_version_file(cli, version):
    assert cli, "the patchstore program was not found (PATCHSTORE_CLI)"
    out = subprocess.run([cli, "--version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"patchstore {version}"


def test_cmake_project_version_is_the_version_file(version):
    cmake_version = os.environ.get("PATCHSTORE_PROJECT_VERSION")  # CTest sets it from PROJECT_VERSION
    if cmake_version is None:
        pytest.skip("PATCHSTORE_PROJECT_VERSION is set by CTest (python_tests), not here")
    assert cmake_version == version


def test_new_store_metadata_names_the_version(cli, version, tmp_path):
    assert cli, "the patchstore program was not found (PATCHSTORE_CLI)"
    Image.fromarray(np.zeros((2, 3), np.uint8), "L").save(tmp_path / "a.png")
    (tmp_path / "m.csv").write_text("id,x\ns,a.png\n")
    store = tmp_path / "v.ps"
    r = subprocess.run([cli, "-q", "ingest", "images", str(store), "--manifest", str(tmp_path / "m.csv"), "--no-sync"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    info = subprocess.run([cli, "info", str(store)], capture_output=True, text=True, timeout=30)
    assert info.returncode == 0, info.stderr
    assert f"(written by patchstore {version})" in info.stdout, info.stdout
