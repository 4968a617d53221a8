"""One source per option: the sampler's options live in the C++ table, ingest options are reachable from Python.

Sampling options (PatchSampler, BatchLoader, PatchDataset, montage, the CLI
flag set of montage, export --boxes and bench): their names, flags, docs and defaults come from one C++ table
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
    # The volume loaders' options are the slice table's (checked below, SLICE_FUNCTIONS).
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


@pytest.mark.parametrize("command", [("montage",), ("export",), ("bench",)])
def test_cli_flag_set_is_the_table_with_the_cpp_defaults(cli, command):
    # bench takes the table's flags for image stores (its gathers are a PatchSampler's with them); export
    # draws --boxes of every sample, so it has no --ids.
    if cli is None:
        pytest.skip("the patchstore program is not built")
    shown = _help_defaults(cli, *command)
    text = subprocess.run([cli, *command, "--help"], capture_output=True, text=True, timeout=60).stdout
    for python, flag, doc, _member in SAMPLER_ROWS:
        if not flag or (command == ("export",) and python == "ids"):
            continue
        assert flag in shown, (command, flag)
        want = CLI_SPELLING.get(python, str(CPP_DEFAULTS[python]))
        assert shown[flag] == want, (command, flag, shown[flag], want)
        assert " ".join(doc.split())[:40] in " ".join(text.split()), (command, flag)  # the table's doc
    # The window size's default is in its help text, from C++ too.
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


def test_sampler_config_is_checked_when_made(frameset):
    # The C++ check (SamplerOptions::Validate) runs in the constructor: a bad value fails where it is
    # written, in the words every loader and the CLI use, not when a loader later takes the config.
    with pytest.raises(ValueError, match=r"^patchstore.SamplerConfig: patch_size \(--patch\) must be P or \(h, w\)"):
        patchstore.SamplerConfig(patch_size=-3)
    with pytest.raises(ValueError, match=r"^patchstore.SamplerConfig: positive_fraction needs require=<mask field>"):
        patchstore.SamplerConfig(positive_fraction=0.5)
    with pytest.raises(ValueError, match=r"^patchstore.SamplerConfig: rot90 \(--rot90\) needs a square window"):
        patchstore.SamplerConfig(patch_size=(32, 64), rot90=True)
    ok = patchstore.SamplerConfig(patch_size=(32, 64), require="mask", positive_fraction=0.5, ids=["a", 1])
    assert dataclasses.replace(ok, flip=True).flip
    with pytest.raises(ValueError, match=r"^patchstore.SamplerConfig: patch_size"):
        dataclasses.replace(ok, patch_size=0)
    # A loader's keywords still name the loader.
    with pytest.raises(ValueError, match=r"^patchstore.PatchSampler: patch_size \(--patch\) must be P"):
        patchstore.PatchSampler(frameset.store, ["rgb"], patch_size=-3)


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


# ---------------------------------------------------------------------------------------------------------------
# Slice options (SliceDataset, the volume montage, montage and bench on volume stores): one table in C++ too
# (PATCHSTORE_SLICE_OPTIONS and the SliceOptions member defaults, reader/slice_sampler.h).

from patchstore._slice_options import slice_defaults  # noqa: E402

SLICE_ROWS = _C.SLICE_OPTIONS
SLICE_NAMES = [row[0] for row in SLICE_ROWS]
SLICE_DEFAULTS = slice_defaults()
# The functions that take slice options: (file, function).
SLICE_FUNCTIONS = {("slice_dataset.py", "__init__"), ("_export_api.py", "volume_montage")}


def _restated_slice_defaults(path):
    """(function, parameter, default) of every slice-option parameter of SLICE_FUNCTIONS in `path` with a default
    other than a sentinel, and every SliceConfig stub field with a value."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (path.name, node.name) in SLICE_FUNCTIONS:
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults))
            pairs += [(p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            for param, default in pairs:
                if param.arg in SLICE_NAMES and not (isinstance(default, ast.Name) and default.id in SENTINELS):
                    found.append((node.name, param.arg, ast.unparse(default)))
        elif isinstance(node, ast.ClassDef) and node.name == "SliceConfig":
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    v = item.value
                    if v is not None and not (isinstance(v, ast.Constant) and v.value is Ellipsis):
                        found.append(("SliceConfig", item.target.id, ast.unparse(v)))
    return found


def test_no_python_source_or_stub_restates_a_slice_default(tmp_path):
    restated = {str(f.relative_to(PACKAGE)): r for f in _sources() if (r := _restated_slice_defaults(f))}
    assert not restated, (f"slice option defaults written outside the C++ table (reader/slice_sampler.h): "
                          f"{restated}; take them from SliceConfig (leave the argument unset)")
    # The check can fail.
    bad = tmp_path / "slice_dataset.py"
    bad.write_text("def __init__(self, path, fields, context=0, crop=UNSET, *, seed=UNSET, min_valid=1.0):\n"
                   "    pass\nclass SliceConfig:\n    rot90: bool = False\n")
    assert _restated_slice_defaults(bad) == [("__init__", "context", "0"), ("__init__", "min_valid", "1.0"),
                                             ("SliceConfig", "rot90", "False")]


def test_slice_config_has_every_option_with_the_cpp_default():
    fields = {f.name: f.default for f in dataclasses.fields(patchstore.SliceConfig)}
    assert list(fields) == SLICE_NAMES
    assert fields == SLICE_DEFAULTS
    # The C++ defaults themselves, as documented (a change here changes what every SliceDataset serves).
    assert SLICE_DEFAULTS == dict(context=0, crop=None, flip=False, rot90=False, seed=0, require=None, min_valid=1.0,
                                  positive_fraction=None, ids=None, clamp=None, clamp_warn=0.01, output="float32",
                                  num_threads=1)
    stub = ast.parse((PACKAGE / "_config.pyi").read_text())
    cls = next(n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "SliceConfig")
    assert [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)] == SLICE_NAMES
    assert all(row[2] and f"{row[0]} (default " in patchstore.SliceConfig.__doc__ for row in SLICE_ROWS)


# The CLI's spelling of a slice default: not shown for flags and lists; --context shows "0".
SLICE_CLI_SPELLING = {"positive_fraction": "-1", "min_valid": "1", "flip": None, "rot90": None, "require": None,
                      "ids": None, "crop": None}


@pytest.mark.parametrize("command", [("montage",), ("bench",)])
def test_slice_flags_are_the_table_with_the_cpp_defaults(cli, command):
    if cli is None:
        pytest.skip("the patchstore program is not built")
    shown = _help_defaults(cli, *command)
    text = subprocess.run([cli, *command, "--help"], capture_output=True, text=True, timeout=60).stdout
    for python, flag, doc, _member in SLICE_ROWS:
        if not flag:
            continue
        assert flag in shown, (command, flag)
        want = SLICE_CLI_SPELLING.get(python, str(SLICE_DEFAULTS[python]))
        assert shown[flag] == want, (command, flag, shown[flag], want)
        assert " ".join(doc.split())[:40] in " ".join(text.split()), (command, flag)  # the table's doc


# One value per slice option, none of them the default, that work together (a new option must be added here).
SLICE_CHANGED = dict(context={"MR": 1}, crop=(8, 8), flip="independent", rot90=True, seed=7, require="MASK",
                     min_valid=2.0, positive_fraction=0.5, ids=["p2", "p1"], clamp={"CT": (-1.0, 1.0)},
                     clamp_warn=None, output="stored", num_threads=2)


@pytest.fixture(scope="module")
def volumes(tmp_path_factory):
    import h5py
    base = tmp_path_factory.mktemp("parity_volumes")
    rng = np.random.default_rng(3)
    with h5py.File(base / "v.h5", "w") as f:
        for pid in ("p1", "p2"):
            for g in ("MR", "CT", "MASK"):
                a = rng.integers(0, 3, (4, 12, 12)) if g == "MASK" else rng.integers(-100, 100, (4, 12, 12))
                f.create_dataset(f"{g}/{pid}", data=a.astype(np.uint8 if g == "MASK" else np.int16))
    store = str(base / "v.ps")
    patchstore.ingest_hdf5(base / "v.h5", store, slice_axis=0, masks=["MASK"], durable=False, progress=False)
    return store


def test_slice_dataset_takes_every_option_with_the_cpp_default(volumes):
    from patchstore.torch import SliceDataset
    assert set(SLICE_CHANGED) == set(SLICE_NAMES)
    assert all(SLICE_CHANGED[k] != SLICE_DEFAULTS[k] for k in SLICE_CHANGED)
    ds = SliceDataset(volumes, ("MR", "CT"))
    assert {k: getattr(ds.config, k) for k in SLICE_NAMES} == SLICE_DEFAULTS
    by_keyword = SliceDataset(volumes, ("MR", "CT"), **SLICE_CHANGED)
    by_config = SliceDataset(volumes, ("MR", "CT"), config=patchstore.SliceConfig(**SLICE_CHANGED))
    assert by_keyword.options == by_config.options
    o = by_keyword.options
    assert (o["context"], o["crop"], o["flip"], o["rot90"], o["seed"]) == ({"MR": 1, "CT": 0}, (8, 8),
                                                                           "independent", True, 7)
    assert (o["require"], o["min_valid"], o["positive_fraction"], o["ids"]) == ("MASK", 2.0, 0.5, ["p2", "p1"])
    assert (o["clamp"], o["clamp_warn"], o["num_threads"], by_keyword.output) == ({"CT": (-1.0, 1.0)}, None, 2,
                                                                                    "stored")
    # Positional, as before the table: context, crop, flip, rot90, seed after fields.
    assert SliceDataset(volumes, ("MR",), 1, 8, True, False, 3).options == SliceDataset(
        volumes, ("MR",), context=1, crop=8, flip=True, seed=3).options


def test_slice_values_are_checked_once_in_cpp_with_the_users_spelling(volumes, cli, tmp_path):
    from patchstore.torch import SliceDataset
    cases = [(dict(min_valid=0), "min_valid (--min-valid) must be positive (voxels >= 1, or a fraction of the "
                                 "window < 1), got 0"),
             (dict(require="MASK", positive_fraction=2), "positive_fraction (--positive-fraction) must be in [0, 1] "
                                                         "(None, CLI -1: off), got 2"),
             (dict(crop=(8, 6), rot90=True), "rot90 (--rot90) needs a square crop (odd turns swap height and "
                                             "width), got 8x6"),
             (dict(clamp=(1, 0)), "clamp for every field needs lo <= hi, got (1, 0)")]
    for options, message in cases:
        with pytest.raises(ValueError) as e:
            SliceDataset(volumes, ("MR",), **options)
        assert str(e.value) == f"SliceDataset: {message}"
        native = _C.SliceOptions(fields=["MR"])
        for k, v in options.items():
            setattr(native, k, v)
        with pytest.raises(ValueError) as e:
            native.validate()
        assert str(e.value) == message
    if cli is not None:
        r = subprocess.run([cli, "montage", volumes, str(tmp_path / "m.png"), "--require", "MASK",
                            "--positive-fraction", "2"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and cases[1][1] in r.stderr, r.stderr
