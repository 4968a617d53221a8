#!/usr/bin/env python3
"""Regenerate the generated sections of README.md.

    python tools/update_readme.py build/patchstore            # rewrite README.md
    python tools/update_readme.py build/patchstore --check    # exit 1 if anything is stale

Sections (between <!-- NAME:begin --> and <!-- NAME:end --> markers):
  snippet:frames       tests/python/readme_snippet_frames.py      (run by the test suite)
  snippet:batchloader  tests/python/readme_snippet_batchloader.py (run by the test suite)
  snippet:volumes      tests/python/readme_snippet_volumes.py     (run by the test suite)
  bench                bench/compare/results/RESULTS.md plus bench/results/*.md
  cli-reference        `patchstore ... --help` for every subcommand
"""
import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = [[], ["ingest", "images"], ["ingest", "hdf5"], ["info"], ["ls"], ["verify"], ["upgrade"], ["export"],
            ["montage"], ["bench"], ["copy"]]


def read(rel):
    path = os.path.join(ROOT, rel)
    return open(path, encoding="utf-8").read() if os.path.exists(path) else None


def snippet(rel):
    text = read(rel)
    if text is None:
        return f"_(missing: {rel})_\n"
    return f"```python\n{text.rstrip()}\n```\n"


def bench():
    parts = []
    for rel in ["bench/compare/results/RESULTS.md"] + sorted(
            os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "bench/results/*.md"))):
        text = read(rel)
        if text:
            parts.append(f"<!-- from {rel} -->\n{text.rstrip()}\n")
    return "\n".join(parts) if parts else "_(no results recorded yet: run `bash bench/compare/run.sh`)_\n"


def cli_reference(cli):
    parts = []
    for cmd in COMMANDS:
        out = subprocess.run([cli, *cmd, "--help"], capture_output=True, text=True, check=True).stdout
        out = out.replace(cli, "patchstore")
        parts.append(f"#### `{' '.join(['patchstore', *cmd])}`\n\n```text\n{out.rstrip()}\n```\n")
    return "\n".join(parts)


def replace(text, name, body):
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin not in text or end not in text:
        sys.exit(f"README.md: markers for '{name}' not found")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}{end}{tail}"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    cli = os.path.abspath(sys.argv[1])
    check = "--check" in sys.argv[2:]
    readme = os.path.join(ROOT, "README.md")
    text = read("README.md")
    new = text
    new = replace(new, "snippet:frames", snippet("tests/python/readme_snippet_frames.py"))
    new = replace(new, "snippet:batchloader", snippet("tests/python/readme_snippet_batchloader.py"))
    new = replace(new, "snippet:volumes", snippet("tests/python/readme_snippet_volumes.py"))
    new = replace(new, "bench", bench())
    new = replace(new, "cli-reference", cli_reference(cli))
    if check:
        if new != text:
            sys.exit("README.md is stale: run  python tools/update_readme.py build/patchstore")
        print("README.md generated sections are up to date")
        return
    open(readme, "w", encoding="utf-8").write(new)
    print("README.md updated")


if __name__ == "__main__":
    main()
