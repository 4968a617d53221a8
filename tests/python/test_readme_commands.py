"""Runs the README quick starts' shell commands (the ```sh blocks under "## Quick start") as written, with
`patchstore` on PATH, on generated data in the layouts they name.

test_readme_snippet.py runs the Python blocks; this covers the commands a user types first (ingest, info,
montage), so a flag renamed or a default changed breaks here and not in a user's terminal.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import List

import h5py
import numpy as np
import pytest
from PIL import Image

import patchstore

from conftest import make_frames

ROOT = Path(__file__).resolve().parents[2]


def quick_start_commands(section: str) -> List[str]:
    """The commands of the ```sh blocks in README section '## Quick start: <section>...', one per
    logical line (backslash continuations joined, comments dropped)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(rf"^## Quick start: {re.escape(section)}.*?(?=^## )", text, re.S | re.M)
    assert m, f"README has no '## Quick start: {section}' section"
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", m.group(0), re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line:
                commands.append(line)
    return commands


def run_as_written(commands: List[str], cwd: Path, cli: str) -> List[str]:
    bindir = cwd / "bin"
    bindir.mkdir()
    (bindir / "patchstore").symlink_to(cli)
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    outs = []
    for cmd in commands:
        assert shlex.split(cmd)[0] == "patchstore", cmd
        r = subprocess.run(cmd, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{cmd}\n{r.stderr}"
        outs.append(r.stdout)
    return outs


def test_frames_quick_start_commands_run_as_written(tmp_path, cli):
    if not cli:
        pytest.skip("the patchstore program was not found (set PATCHSTORE_CLI)")
    commands = quick_start_commands("frames")
    assert [shlex.split(c)[1] for c in commands] == ["ingest", "montage"], commands
    # 3 frames of 264x296: --patch 256 fits, and every frame holds a mask pixel.
    frames = make_frames(tmp_path / "data", ["clipA"], [3, 5, 8], h=264, w=296, seed=29)
    run_as_written(commands, tmp_path, cli)
    store = patchstore.open(tmp_path / "frames.ps")
    assert list(store.ids) == sorted(frames)
    # The layout and encoding the quick start chose: 64-pixel tiles, rgb and mask in their 8 bits,
    # depth (a float EXR) in float32.
    assert {f: (i.dtype, i.tile) for f, i in store.fields.items()} == {
        "rgb": ("uint8", 64), "mask": ("uint8", 64), "depth": ("float32", 64)}
    for sid, fr in frames.items():
        np.testing.assert_array_equal(store[sid]["rgb"], fr.expected()["rgb"])
    with Image.open(tmp_path / "sheet.png") as sheet:
        assert sheet.mode == "RGB" and sheet.size[0] >= 256 and sheet.size[1] >= 256


def test_volumes_quick_start_commands_run_as_written(tmp_path, cli):
    if not cli:
        pytest.skip("the patchstore program was not found (set PATCHSTORE_CLI)")
    commands = quick_start_commands("volumes")
    assert [shlex.split(c)[1] for c in commands] == ["ingest", "info", "montage"], commands
    # 2 patients of 260x270 with 5 and 3 slices, (H, W, S): MR int16, CT int16 HU, MASK uint8.
    rng = np.random.default_rng(31)
    vols = {g: {} for g in ("MR", "CT", "MASK")}
    for p, s in (("pat7", 5), ("pat9", 3)):
        vols["MR"][p] = rng.integers(0, 3001, (260, 270, s)).astype(np.int16)
        vols["CT"][p] = rng.integers(-1024, 3001, (260, 270, s)).astype(np.int16)
        vols["MASK"][p] = (rng.random((260, 270, s)) < 0.3).astype(np.uint8)
    with h5py.File(tmp_path / "synthrad.h5", "w") as f:
        for g, per in vols.items():
            for p, a in per.items():
                f.create_dataset(f"{g}/{p}", data=a, compression="gzip")
    outs = run_as_written(commands, tmp_path, cli)
    info = outs[1].splitlines()
    assert "kind:           volumes" in info and "samples:        2" in info, outs[1]
    assert any(line.split()[:2] == ["CT", "C=1"] and "dtype=int16" in line and "range[-1024,3000]" in line
               for line in info), outs[1]
    store = patchstore.open(tmp_path / "synthrad.ps")
    assert list(store.ids) == ["pat7", "pat9"]
    # compact keeps each volume in its source type; range:LO,HI maps [LO, HI] onto [-1, 1].
    assert [store.fields[g].dtype for g in ("MR", "CT", "MASK")] == ["int16", "int16", "uint8"]
    for g, (lo, hi) in (("MR", (0, 3000)), ("CT", (-1024, 3000))):
        want = (np.moveaxis(vols[g]["pat9"], -1, 0).astype(np.float64) - (lo + hi) / 2) / ((hi - lo) / 2)
        np.testing.assert_array_equal(store.volume("pat9", g), want.astype(np.float32))
    with Image.open(tmp_path / "ct.png") as sheet:
        assert sheet.size[0] >= 256 and sheet.size[1] >= 256
