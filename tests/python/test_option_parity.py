"""Every option of `patchstore ingest images|hdf5` is reachable from patchstore.ingest_images / ingest_hdf5.

The CLI's --help is parsed, each option is mapped to a keyword of the Python
function (the same name with '-' -> '_', or the table below for renamed ones),
and the keyword must exist: an option added to the CLI without a Python
keyword fails here. The keywords reach the bound C++ option structs
(patchstore._ingest.ImageIngestOptions / Hdf5IngestOptions), whose defaults
the Python defaults must equal.
"""
import inspect
import re
import subprocess

import numpy as np
import pytest

import patchstore
from patchstore import _ingest

from conftest import TEMPLATES, make_frames

# CLI option -> Python keyword(s), where the name differs. None: no keyword (help, or a global flag).
RENAMED = {
    "images": {
        "STORE": ("store",),
        "--field": ("fields",),  # with --root: {name: template}
        "--mask": ("masks",),
        "--report": ("report",),
        "--commit-every": ("batch_samples",),
        "--in-process": ("isolate_decoders",),  # isolate_decoders=False
        "--decode-timeout": ("decode_timeout",),
        "--no-sync": ("durable",),  # durable=False
        "--help": None,
    },
    "hdf5": {
        "PATHS": ("files", "store"),  # FILE.h5 ... STORE
        "--group": ("groups",),
        "--mask": ("masks",),
        "--report": ("report",),
        "--no-sync": ("durable",),
        "--help": None,
    },
}
FUNCTIONS = {"images": patchstore.ingest_images, "hdf5": patchstore.ingest_hdf5}

# Python keyword -> field of the bound C++ options (same default on both sides).
DEFAULTS = {
    "images": (_ingest.ImageIngestOptions, {
        "threads": "threads", "batch_bytes": "batch_bytes", "batch_samples": "batch_samples",
        "durable": "durable", "max_pixels": "max_pixels", "isolate_decoders": "isolate_decoders",
        "decode_timeout": "decode_timeout_s", "layout": "layout", "tile_size": "tile_size"}),
    "hdf5": (_ingest.Hdf5IngestOptions, {
        "slice_axis": "slice_axis", "ids": "ids", "strict_ids": "strict_ids", "allow_external": "allow_external",
        "batch_bytes": "batch_bytes", "slab_bytes": "slab_bytes", "chunk_cache_bytes": "chunk_cache_bytes",
        "durable": "durable", "layout": "layout", "tile_size": "tile_size"}),
}


def cli_options(cli, command):
    """The option names of `patchstore ingest COMMAND --help`: positionals (STORE) and long options (--root)."""
    out = subprocess.run([cli, "ingest", command, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    names, section = [], None
    for line in out.stdout.splitlines():
        if line in ("Positionals:", "Options:"):
            section = line
        elif not line.strip() or not line.startswith("  "):
            section = None if not line.strip() else section
        elif section == "Positionals:" and re.match(r"  [A-Z]", line):
            names.append(line.split()[0])
        elif section == "Options:" and re.match(r"  -", line):
            flags = line.split()[0].split(",")
            names.append(next((f for f in flags if f.startswith("--")), flags[0]))
    return names


@pytest.mark.parametrize("command", ["images", "hdf5"])
def test_every_cli_option_is_a_python_keyword(cli, command):
    if cli is None:
        pytest.skip("the patchstore program is not built")
    names = cli_options(cli, command)
    # The parser must see the options every version has (else the check below proves nothing).
    assert {"--mask", "--norm", "--on-error", "--report", "--no-sync", "--help"} <= set(names), names
    params = inspect.signature(FUNCTIONS[command]).parameters
    missing = []
    for name in names:
        keywords = RENAMED[command].get(name, (name.lstrip("-").replace("-", "_"),))
        if keywords is None:
            continue
        missing += [f"{name} -> {k}" for k in keywords if k not in params]
    assert not missing, (f"`patchstore ingest {command}` options without a keyword of "
                         f"patchstore.ingest_{command}: {missing} (add the keyword, or map it in RENAMED)")


def test_the_help_parser_reads_both_sections(cli):
    if cli is None:
        pytest.skip("the patchstore program is not built")
    names = cli_options(cli, "images")
    assert names[:2] == ["STORE", "--help"]
    assert {"--threads", "--commit-every", "--in-process", "--decode-timeout"} <= set(names)


@pytest.mark.parametrize("command", ["images", "hdf5"])
def test_python_defaults_are_the_cpp_defaults(command):
    cls, mapping = DEFAULTS[command]
    cpp = cls()
    params = inspect.signature(FUNCTIONS[command]).parameters
    for keyword, field in mapping.items():
        default = params[keyword].default
        # tile_size=None is the engine's "default edge" (0): kDefaultTileSize, or a resumed store's own.
        want = 0 if (keyword, default) == ("tile_size", None) else default
        assert want == getattr(cpp, field), (keyword, field)
    # Every bound field is named in the repr (what a user sees when debugging).
    assert all(f"{f}=" in repr(cpp) for f in cls._fields)


def test_ingest_images_keywords_fill_the_options(tmp_path, monkeypatch):
    seen = {}

    def fake(options, progress=None, cancel=None):
        seen["o"] = options
        return dict(samples_total=0, samples_written=0, samples_present=0, samples_failed=0, bytes_written=0,
                    bytes_decoded=0, seconds=0.0, report_path="", report_error="", errors=[], warnings=[])

    monkeypatch.setattr(_ingest, "ingest_images", fake)
    patchstore.ingest_images(tmp_path / "s.ps", root=tmp_path, fields=TEMPLATES, masks=["mask"], threads=3,
                             on_error="skip", report=tmp_path / "r.tsv", batch_bytes=1000, batch_samples=7,
                             durable=False, max_pixels=12345, isolate_decoders=False, decode_timeout=2.5,
                             layout="tiles", tile_size=64, encoding={"*": "compact", "depth": "float16"},
                             progress=False)
    o = seen["o"]
    assert isinstance(o, _ingest.ImageIngestOptions)
    assert (o.store, o.root, o.manifest) == (str(tmp_path / "s.ps"), str(tmp_path), "")
    assert o.field_templates == list(TEMPLATES.items()) and o.mask_fields == ["mask"]
    assert (o.threads, o.skip_errors, o.report_path) == (3, True, str(tmp_path / "r.tsv"))
    assert (o.batch_bytes, o.batch_samples, o.durable, o.max_pixels) == (1000, 7, False, 12345)
    assert (o.isolate_decoders, o.decode_timeout_s) == (False, 2.5)
    assert (o.layout, o.tile_size, o.encoding) == ("tiles", 64, ["compact", "depth=float16"])
    assert o.command_line.startswith("patchstore.ingest_images(")
    assert "layout='tiles', tile_size=64" in o.command_line and "encoding=" in o.command_line


def test_ingest_hdf5_keywords_fill_the_options(tmp_path, monkeypatch):
    seen = {}

    def fake(options, progress=None, cancel=None):
        seen["o"] = options
        return dict(samples_total=0, samples_written=0, samples_present=0, samples_failed=0, bytes_written=0,
                    bytes_decoded=0, seconds=0.0, report_path="", report_error="", errors=[], warnings=[])

    monkeypatch.setattr(_ingest, "ingest_hdf5", fake)
    patchstore.ingest_hdf5(["a.h5", "b.h5"], tmp_path / "v.ps", {"MR": None, "/seg": "MASK"}, slice_axis=0,
                           ids="stem", masks=["MASK"], norm={"MR": "range:0,3000"}, allow_external=True,
                           on_error="skip", durable=False, batch_bytes=99, strict_ids=True, slab_bytes=1 << 20,
                           chunk_cache_bytes=1 << 21, encoding=["compact", "MR=float16"], progress=False)
    o = seen["o"]
    assert (o.files, o.store, o.groups) == (["a.h5", "b.h5"], str(tmp_path / "v.ps"), ["MR", "/seg=MASK"])
    assert (o.slice_axis, o.ids, o.strict_ids, o.mask_fields) == (0, "stem", True, ["MASK"])
    assert (o.norm, o.allow_external, o.skip_errors, o.durable) == ({"MR": "range:0,3000"}, True, True, False)
    assert (o.batch_bytes, o.slab_bytes, o.chunk_cache_bytes) == (99, 1 << 20, 1 << 21)
    assert (o.encoding, o.layout) == (["compact", "MR=float16"], "rows")


def test_new_image_keywords_reach_the_ingest(tmp_path):
    frames = make_frames(tmp_path / "data", ["v"], range(3))
    store = tmp_path / "s.ps"
    s = patchstore.ingest_images(store, root=tmp_path / "data", fields=TEMPLATES, durable=False,
                                 isolate_decoders=False, batch_samples=1, decode_timeout=5, progress=False)
    assert s.samples_written == 3
    ps = patchstore.open(store)
    for fid, fr in frames.items():
        for name, want in fr.expected().items():
            np.testing.assert_array_equal(ps[fid][name], want)
    with pytest.raises(ValueError, match="decode timeout must be a positive number of seconds, got 0"):
        patchstore.ingest_images(tmp_path / "t.ps", root=tmp_path / "data", fields=TEMPLATES, decode_timeout=0,
                                 progress=False)
    with pytest.raises(ValueError, match="batch_samples must be >= 1, got 0"):
        patchstore.ingest_images(tmp_path / "t.ps", root=tmp_path / "data", fields=TEMPLATES, batch_samples=0,
                                 progress=False)
