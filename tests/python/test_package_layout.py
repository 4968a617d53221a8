"""The layout of the Python package: no import cycle, _store.py at the bottom, no module over 600 lines.

Reads the sources (ast), so every import counts, also ones inside functions
and under ``if TYPE_CHECKING:``: a lazy import that closes a cycle is still a
cycle for whoever reads or changes the code.
"""
import ast
import os
from pathlib import Path

import pytest

SOURCE = Path(os.environ.get("PATCHSTORE_SOURCE_DIR", Path(__file__).resolve().parents[2])) / "bindings" / "patchstore"
MAX_LINES = 600


def _modules():
    """{dotted name: path} of the package's .py files ("patchstore", "patchstore._store", "patchstore.torch", ...)."""
    out = {}
    for p in sorted(SOURCE.rglob("*.py")):
        parts = ("patchstore",) + p.relative_to(SOURCE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _is_package(name, modules):
    return modules[name].name == "__init__.py"


def _resolve(name, node, modules):
    """The package modules an import statement in module `name` loads (compiled modules and the
    outside world ignored)."""
    targets = []
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    else:
        if node.level:
            base = name.split(".") if _is_package(name, modules) else name.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            mod = ".".join(base + ([node.module] if node.module else []))
        else:
            mod = node.module or ""
        # `from pkg import x`: x is a submodule when there is a file for it, else a name of pkg;
        # the compiled modules (_patchstore, _ingest: .pyi stubs here) import nothing of the package.
        compiled = {f"patchstore.{p.stem}" for p in SOURCE.glob("*.pyi")}
        targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names
                   if f"{mod}.{a.name}" not in compiled]
    return {t for t in targets if t in modules and t != name}


def _graph():
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name] |= _resolve(name, node, modules)
    return graph


def _cycle(graph):
    """One import cycle as a list of modules, or None."""
    state = {}
    stack = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_graph_sees_the_package():
    g = _graph()
    # Spot checks that the parser resolves relative imports (else "acyclic" would prove nothing).
    assert {"patchstore._store", "patchstore._ingest_api", "patchstore._export_api", "patchstore._volumes",
            "patchstore._sampler"} <= g["patchstore"]
    assert "patchstore._store" in g["patchstore._volumes"]
    assert {"patchstore.torch._common", "patchstore._store"} <= g["patchstore.torch.slice_dataset"]
    assert "patchstore" in g["patchstore.__main__"]  # `from . import cli_path`


def test_package_import_graph_is_acyclic():
    g = _graph()
    # The package's __init__ imports its modules; a module importing the package itself would be a cycle.
    assert _cycle(g) is None, "import cycle: " + " -> ".join(_cycle(g))


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_store_imports_no_sibling():
    g = _graph()
    assert g["patchstore._store"] == set(), f"_store.py imports {sorted(g['patchstore._store'])}"
    # ... besides the compiled reader module (not a .py file, so not in the graph).
    tree = ast.parse((SOURCE / "_store.py").read_text())
    froms = {(n.level, n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
             for a in n.names if n.level}
    assert froms == {(1, None, "_patchstore")}


@pytest.mark.parametrize("name", sorted(_modules()))
def test_module_is_at_most_600_lines(name):
    n = len(_modules()[name].read_text().splitlines())
    assert n <= MAX_LINES, f"{_modules()[name]} has {n} lines (at most {MAX_LINES}): split it"


def test_private_reader_handle_is_not_called_across_modules():
    # One documented handle (patchstore._store.reader_of), no `._r()` helper.
    for path in _modules().values():
        assert "._r()" not in path.read_text(), f"{path} calls ._r(); use _store.reader_of(store)"


def test_no_sampling_code_in_python():
    """Every draw (windows, slices, epoch orders, shard assignment) comes from the C++ generator."""
    for name, path in _modules().items():
        text = path.read_text()
        for word in ("np.random", "PCG64", "random.Random", "import random"):
            assert word not in text, f"{name} uses {word}: sampling belongs in reader/ (reader/transform.h)"
