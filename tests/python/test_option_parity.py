"""One source per option: the sampler's options live in the C++ table, ingest options are reachable from Python.

Sampling options (PatchSampler, BatchLoader, PatchDataset, montage, the CLI
flag set): their names, flags, docs and defaults come from one C++ table
(PATCHSTORE_SAMPLER_OPTIONS and the SamplerOptions member defaults,
reader/sampler.h). The tests below check that nothing restates a default
(the Python sources and stubs are parsed), and that every option of the table
is accepted by every loader, SamplerConfig and the CLI, with the C++ default.

Ingest: every option of `patchstore ingest images|hdf5` is reachable from patchstore.ingest_images / ingest_hdf5.

The CLI's --help is parsed, each option is mapped to a keyword of the Python
function (the same name with '-' -> '_', or the table below for renamed ones),
and the keyword must exist: an option added to the CLI without a Python
keyword fails here. The keywords reach the bound C++ option structs
(patchstore._ingest.ImageIngestOptions / Hdf5IngestOptions), whose defaults
the Python defaults must equal.
"""
import ast
import dataclasses
import inspect
import pathlib
import re
import subprocess
import warnings

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



# ---------------------------------------------------------------------------------------------------------------
# Sampling options: one table in C++.

from patchstore import _patchstore as _C  # noqa: E402
from patchstore._sampler_options import from_native  # noqa: E402

SAMPLER_ROWS = _C.SAMPLER_OPTIONS  # (Python keyword, CLI flag or "", doc, C++ member)
SAMPLER_NAMES = [row[0] for row in SAMPLER_ROWS]
CPP_DEFAULTS = from_native(_C.SamplerOptions(fields=["-"]))  # the C++ defaults, in the Python spelling
PACKAGE = pathlib.Path(patchstore.__file__).resolve().parent
# Functions whose parameters share a name with a sampler option but are not the frame sampler's options.
OTHER_OPTIONS = {
    ("_export_api.py", "export"): "ids: the records to export",
    ("_ingest_api.py", "ingest_hdf5"): "ids: how volume ids are named",
    ("_rank_local.py", "__init__"): "RankLocalShards' seed (shard assignment; its samplers' default seed)",
    ("_sampler.py", "read_patches"): "num_threads of a raw gather (Store.read_patches)",
    ("_store.py", "read_patches"): "num_threads of a raw gather (Store.read_patches)",
    ("_patchstore.pyi", "copy_patches"): "num_threads of a raw gather",
    # The volume loaders have options of their own (crop, context, flip="independent"), not in the table yet.
    ("_store.py", "slice_index"): "volumes",
    ("_volumes.py", "__init__"): "volumes (SliceIndex)",
    ("slice_dataset.py", "__init__"): "volumes (SliceDataset)",
    ("_export_api.py", "volume_montage"): "volumes",
    ("_patchstore.pyi", "copy_slice_stacks"): "volumes",
}
# Not a default of a sampler option: the argument was not given (its value comes from the config);
# rank / world_size None: from torch.distributed.
SENTINELS = {"UNSET", "_UNSET"}
FROM_DISTRIBUTED = {"rank", "world_size"}


def _sources():
    files = sorted(PACKAGE.rglob("*.py")) + sorted(PACKAGE.rglob("*.pyi"))
    assert any(f.name == "batch_loader.py" for f in files) and any(f.name == "_config.pyi" for f in files), files
    return files


def _restated_defaults(path):
    """(function, parameter, default) of every sampler-option parameter of `path`
    with a default other than a sentinel or `...`."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if (path.name, node.name) in OTHER_OPTIONS:
                continue
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults))
            pairs += [(p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            for param, default in pairs:
                if param.arg not in SAMPLER_NAMES:
                    continue
                if isinstance(default, ast.Name) and default.id in SENTINELS:
                    continue
                if isinstance(default, ast.Constant) and default.value is Ellipsis:
                    continue
                if param.arg in FROM_DISTRIBUTED and isinstance(default, ast.Constant) and default.value is None:
                    continue
                found.append((node.name, param.arg, ast.unparse(default)))
        elif isinstance(node, ast.ClassDef) and node.name == "SamplerConfig":
            for item in node.body:  # the stub's fields: `name: type = ...`
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    v = item.value
                    if v is not None and not (isinstance(v, ast.Constant) and v.value is Ellipsis):
                        found.append(("SamplerConfig", item.target.id, ast.unparse(v)))
    return found


def test_no_python_source_or_stub_restates_a_sampler_default():
    restated = {str(f.relative_to(PACKAGE)): r for f in _sources() if (r := _restated_defaults(f))}
    assert not restated, (f"sampler option defaults written outside the C++ table (reader/sampler.h): {restated}; "
                          f"take them from SamplerConfig (leave the argument unset)")


def test_the_checker_sees_a_restated_default(tmp_path):
    # The check above must be able to fail: a signature that restates one, and a stub field with a value.
    bad = tmp_path / "bad.py"
    bad.write_text("def f(store, fields, patch_size=256, *, seed=0, flip=UNSET, other=3):\n    pass\n"
                   "class SamplerConfig:\n    rot90: bool = False\n    flip: bool = ...\n")
    assert _restated_defaults(bad) == [("f", "patch_size", "256"), ("f", "seed", "0"),
                                       ("SamplerConfig", "rot90", "False")]


def test_sampler_config_has_every_option_with_the_cpp_default():
    fields = {f.name: f.default for f in dataclasses.fields(patchstore.SamplerConfig)}
    assert list(fields) == SAMPLER_NAMES
    assert fields == CPP_DEFAULTS
    # The C++ defaults themselves, as documented (a change here is a change of every loader's behaviour).
    assert CPP_DEFAULTS == dict(patch_size=256, patches_per_sample=1, require=None, min_valid=1.0,
                                positive_fraction=None, policy="auto", seed=0, rank=0, world_size=1, flip=False,
                                rot90=False, ids=None, num_threads=1, prefetch=_C.DEFAULT_PREFETCH_BATCHES,
                                order="random", cache_budget=None, index_cache_bytes=256 << 20)
    # The stub declares the same fields, in the same order.
    stub = ast.parse((PACKAGE / "_config.pyi").read_text())
    cls = next(n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "SamplerConfig")
    assert [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)] == SAMPLER_NAMES
    # Every row has a doc, shown in SamplerConfig's docstring.
    assert all(row[2] and f"{row[0]} (default " in patchstore.SamplerConfig.__doc__ for row in SAMPLER_ROWS)


def _help_defaults(cli, *command):
    """{flag: default shown or None} of the long options of `patchstore COMMAND --help`."""
    out = subprocess.run([cli, *command, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    found = {}
    for line in out.stdout.splitlines():
        m = re.match(r"\s+((?:-\w,)?--[\w-]+)(?: [A-Z]+(?::\S*)?(?:=(\S+))?)?", line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


# The CLI's spelling of a default: -1 for positive_fraction None, "" (not shown) for require None.
CLI_SPELLING = {"positive_fraction": "-1", "min_valid": "1", "flip": None, "rot90": None, "require": None,
                "ids": None, "patch_size": None}


@pytest.mark.parametrize("command", [("montage",), ("export",)])
def test_cli_flag_set_is_the_table_with_the_cpp_defaults(cli, command):
    if cli is None:
        pytest.skip("the patchstore program is not built")
    shown = _help_defaults(cli, *command)
    for python, flag, _doc, _member in SAMPLER_ROWS:
        if not flag or (command == ("export",) and python == "ids"):
            continue
        assert flag in shown, (command, flag)
        want = CLI_SPELLING.get(python, str(CPP_DEFAULTS[python]))
        assert shown[flag] == want, (command, flag, shown[flag], want)
    # The window size's default is in its help text, from C++ too.
    text = subprocess.run([cli, *command, "--help"], capture_output=True, text=True, timeout=60).stdout
    assert f"default {CPP_DEFAULTS['patch_size']}" in text


# One value per option, none of them the default, that work together (a new option must be added here).
CHANGED = dict(patch_size=8, patches_per_sample=2, require="mask", min_valid=2.0, positive_fraction=0.5,
               policy="positive_fraction", seed=7, rank=1, world_size=2, flip=True, rot90=True,
               ids=["video01/0001", "video01/0003", 4, 5], num_threads=2, prefetch=3, order="locality",
               cache_budget=1 << 20, index_cache_bytes=1 << 20)


def _loaders():
    from patchstore.torch import BatchLoader, PatchDataset
    return {
        "PatchSampler": lambda store, **kw: patchstore.PatchSampler(store, ["rgb", "mask"], **kw),
        "BatchLoader": lambda store, **kw: BatchLoader(store, ["rgb", "mask"], batch_size=4, **kw).sampler,
        "PatchDataset": lambda store, **kw: PatchDataset(store, ["rgb", "mask"], **kw),
    }


def test_every_loader_takes_every_option_with_the_cpp_default(frameset):
    assert set(CHANGED) == set(SAMPLER_NAMES)
    assert all(CHANGED[k] != CPP_DEFAULTS[k] for k in CHANGED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # samples skipped by the mask rule
        for name, make in _loaders().items():
            o = make(frameset.store, patch_size=8).options  # the frames are smaller than the default window
            assert {k: o[k] for k in SAMPLER_NAMES} == dict(CPP_DEFAULTS, patch_size=8), name
            assert o["fields"] == ("rgb", "mask")
            by_keyword = make(frameset.store, **CHANGED).options
            by_config = make(frameset.store, config=patchstore.SamplerConfig(**CHANGED)).options
            assert by_keyword == by_config, name
            want = dict(CHANGED, ids=["video01/0001", "video01/0003", 4, 5])
            assert {k: by_keyword[k] for k in SAMPLER_NAMES} == want, name
        # Without patch_size, the C++ default window (which no frame here holds: every sample is skipped).
        assert patchstore.PatchSampler(frameset.store, ["rgb"]).options["patch_size"] == CPP_DEFAULTS["patch_size"]


def test_montage_takes_every_option_and_the_config(frameset):
    from patchstore._export_api import montage
    changed = dict(CHANGED, order="random", cache_budget=None)  # montage shows the random order only
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        a, wa = montage(frameset.store, 4, field="rgb", return_windows=True, **changed)
        b, wb = montage(frameset.store, 4, field="rgb", return_windows=True,
                        config=patchstore.SamplerConfig(**changed))
        s = patchstore.PatchSampler(frameset.store, ["rgb"], **changed)
    assert (a == b).all() and (wa == wb).all()
    # The windows PatchSampler serves with the same options.
    served = s.windows(0).array[:4]
    assert (wa == served).all()


def test_keywords_are_sugar_for_the_config_and_conflicts_name_the_keyword(frameset):
    cfg = patchstore.SamplerConfig(patch_size=8, seed=3)
    a = patchstore.PatchSampler(frameset.store, ["rgb"], config=cfg)
    b = patchstore.PatchSampler(frameset.store, ["rgb"], 8, seed=3)
    assert a.options == b.options and a.config == b.config == cfg
    # The same value in both places is no conflict; another value is, naming the keyword.
    assert patchstore.PatchSampler(frameset.store, ["rgb"], 8, config=cfg).options == a.options
    with pytest.raises(ValueError, match=r"patch_size=16 contradicts config.patch_size=8"):
        patchstore.PatchSampler(frameset.store, ["rgb"], 16, config=cfg)
    from patchstore.torch import BatchLoader, PatchDataset
    with pytest.raises(ValueError, match=r"seed=4 contradicts config.seed=3"):
        BatchLoader(frameset.store, ["rgb"], batch_size=2, seed=4, config=cfg)
    with pytest.raises(ValueError, match=r"flip=True contradicts config.flip=False"):
        PatchDataset(frameset.store, ["rgb"], config=cfg, flip=True)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'sed'"):
        patchstore.PatchSampler(frameset.store, ["rgb"], 8, sed=3)
    with pytest.raises(TypeError, match=r"config must be a patchstore.SamplerConfig"):
        patchstore.PatchSampler(frameset.store, ["rgb"], config={"seed": 3})
    # Pickling keeps the options.
    import pickle
    assert pickle.loads(pickle.dumps(a)).options == a.options
    assert pickle.loads(pickle.dumps(cfg)) == cfg


def test_values_are_checked_once_in_cpp_with_the_users_spelling(frameset):
    cases = [(dict(positive_fraction=1.5, require="mask"),
              "positive_fraction (--positive-fraction) must be in [0, 1] (None, CLI -1: off), got 1.5"),
             (dict(patches_per_sample=0), "patches_per_sample (-k, --patches-per-sample) must be positive, got 0"),
             (dict(rank=2, world_size=2),
              "need 0 <= rank < world_size, got rank (--rank) 2, world_size (--world-size) 2"),
             (dict(prefetch=65), "prefetch must be a number of batches in 1..64 (False or 0: off), got 65")]
    for options, message in cases:
        with pytest.raises(ValueError) as e:
            patchstore.PatchSampler(frameset.store, ["rgb"], 8, **options)
        assert str(e.value) == f"patchstore.PatchSampler: {message}"
        o = _C.SamplerOptions(fields=["rgb"], patch_size=8, **options)
        with pytest.raises(ValueError) as e:
            o.validate()
        assert str(e.value) == message


def test_cli_reports_the_same_check(cli, frameset, tmp_path):
    if cli is None:
        pytest.skip("the patchstore program is not built")
    out = subprocess.run([cli, "montage", frameset.store, str(tmp_path / "m.png"), "--field", "rgb", "--overlay",
                          "mask", "--patch", "8", "--positive-fraction", "1.5"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1, out.stderr
    assert "positive_fraction (--positive-fraction) must be in [0, 1] (None, CLI -1: off), got 1.5" in out.stderr
    assert not (tmp_path / "m.png").exists()
    # The picture's own limit: export --boxes draws every window of a frame.
    out = subprocess.run([cli, "export", frameset.store, str(tmp_path / "boxes"), "--boxes", "--patch", "8",
                          "-k", "5000"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "--patches-per-sample must be 1..4096, got 5000" in out.stderr, out.stderr
