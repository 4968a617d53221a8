"""The manual, the --help texts and the public headers state advice, not history.

Dates, commit ids, "the seed user" and "that afternoon"-style anecdotes belong in
bench/results/ (measurements, with their date and machine) or in git history, never
in README.md, CHANGELOG.md, docs/, store/FORMAT.md, a `patchstore ... --help` text,
a header of store/, reader/, ingest/ (or include/) or the Python package (its
docstrings are the API pages). Each finding names the file
(or the command) and the line.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Iterable, List, Tuple

import pytest

ROOT = Path(os.environ.get("PATCHSTORE_SOURCE_DIR") or Path(__file__).resolve().parents[2])

# The subcommands whose --help tools/update_readme.py puts into docs/cli.md.
COMMANDS = [[], ["ingest", "images"], ["ingest", "hdf5"], ["info"], ["ls"], ["verify"], ["upgrade"],
            ["export"], ["montage"], ["bench"], ["copy"]]

RULES: List[Tuple[str, "re.Pattern[str]"]] = [
    ("a date", re.compile(r"\b20\d\d-\d\d-\d\d\b")),
    # 7-40 hex digits with at least one digit and one letter, not part of a longer word or of 0x...
    ("a commit-hash-like hex word",
     re.compile(r"(?<![0-9A-Za-z_])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![0-9A-Za-z_])")),
    ('"seed" as a person or a project', re.compile(r"(?i)\bseed[- ]users?\b|\bseed's\b|\bthe seed\b")),
    ("an anecdote", re.compile(r"(?i)\b(?:that|this) (?:afternoon|morning|evening|night)\b|\byesterday\b"
                               r"|\bthe day before\b|\blater that day\b|\bthis VM\b|\bon this machine\b"
                               r"|\bthis machine's (?:disk|cpu|memory)\b")),
]
HEX = RULES[1][0]


def findings(name: str, text: str, markdown: bool = False) -> List[str]:
    """'NAME:LINE: <rule>: <match>' for every rule a line breaks. In Markdown, hex words inside
    fenced code blocks are examples (a checksum in a format listing), not prose, and are allowed."""
    out = []
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if markdown and line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        for rule, pattern in RULES:
            if rule == HEX and fenced:
                continue
            for m in pattern.finditer(line):
                out.append(f"{name}:{n}: {rule}: {m.group(0)!r} in {line.strip()[:120]!r}")
    return out


def manual_files() -> Iterable[Path]:
    yield ROOT / "README.md"
    yield ROOT / "CHANGELOG.md"
    yield ROOT / "store" / "FORMAT.md"  # included as the manual's FORMAT page
    yield from sorted((ROOT / "docs").rglob("*.md"))


def package_files() -> Iterable[Path]:
    """The Python package, whose docstrings become the manual's API pages."""
    yield from sorted((ROOT / "bindings" / "patchstore").rglob("*.py"))
    yield from sorted((ROOT / "bindings" / "patchstore").rglob("*.pyi"))


def header_files() -> Iterable[Path]:
    for room in ("store", "reader", "ingest", "include"):
        if (ROOT / room).is_dir():
            yield from sorted((ROOT / room).rglob("*.h"))


def test_rules_catch_what_they_should_and_nothing_else():
    bad = ("measured on 2026-12-04", "fixed in 43d6ac6", "see e86a1e5c0ffee1234", "the seed user's data",
           "The seed's layout", "seed users", "that afternoon it ran", "This VM is slow", "on this machine")
    for text in bad:
        assert findings("x", text), text
    good = ("seed=0", "dealt by `seed`", "(seed, epoch, i)", "xxh3_64(id bytes, seed 0)", "0x8000 and 0xdeadbeef1",
            "1000000 bytes", "deadbeef", "abcdef", "a 2026 x 1080 frame", "range:-1024,3000", "float16",
            "MADV_WILLNEED", "this machine's RAM")
    for text in good:
        assert not findings("x", text), text
    # Hex inside a fenced block of Markdown is an example; outside it is prose.
    assert not findings("x.md", "```\nchecksum=0123456789abcdef\n```\n", markdown=True)
    assert findings("x.md", "checksum 0123456789abcdef\n", markdown=True) == [
        "x.md:1: a commit-hash-like hex word: '0123456789abcdef' in 'checksum 0123456789abcdef'"]
    assert findings("x.md", "ok\n```\n2026-12-04\n```\n", markdown=True)[0].startswith("x.md:3: a date")


def test_manual_has_no_dates_hashes_or_anecdotes():
    files = list(manual_files())
    assert ROOT / "docs" / "index.md" in files and len(files) > 10, files
    found = []
    for path in files:
        found += findings(str(path.relative_to(ROOT)), path.read_text(encoding="utf-8"), markdown=True)
    assert not found, "\n".join(found)


def test_headers_have_no_dates_hashes_or_anecdotes():
    files = list(header_files())
    assert ROOT / "include" / "patchstore" / "reader" / "reader.h" in files and ROOT / "ingest" / "encoding.h" in files
    found = []
    for path in files:
        found += findings(str(path.relative_to(ROOT)), path.read_text(encoding="utf-8"))
    assert not found, "\n".join(found)


def test_python_docstrings_have_no_dates_hashes_or_anecdotes():
    files = list(package_files())
    assert ROOT / "bindings" / "patchstore" / "torch" / "batch_loader.py" in files
    found = []
    for path in files:
        found += findings(str(path.relative_to(ROOT)), path.read_text(encoding="utf-8"))
    assert not found, "\n".join(found)


def test_help_texts_have_no_dates_hashes_or_anecdotes(cli):
    if not cli:
        pytest.skip("the patchstore program was not found (set PATCHSTORE_CLI)")
    found = []
    for cmd in COMMANDS:
        out = subprocess.run([cli, *cmd, "--help"], capture_output=True, text=True, check=True).stdout
        assert "Usage:" in out, (cmd, out)
        found += findings(" ".join(["patchstore", *cmd, "--help"]), out)
    assert not found, "\n".join(found)


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, len(lines)


def test_readme_and_changelog_links_resolve():
    # mkdocs build --strict checks the links of docs/; these two files are not part of its build.
    broken = []
    for name in ("README.md", "CHANGELOG.md"):
        text = (ROOT / name).read_text(encoding="utf-8")
        for n, line in enumerate(text.splitlines(), 1):
            for m in re.finditer(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", line):
                target = m.group(1)
                if "://" not in target and not (ROOT / target).exists():
                    broken.append(f"{name}:{n}: {target}")
    assert not broken, "\n".join(broken)
