#!/usr/bin/env python3
"""Regenerate the generated sections of README.md and docs/cli.md.

    python tools/update_readme.py build/patchstore            # rewrite both files
    python tools/update_readme.py build/patchstore --check    # exit 1 if anything is stale

Sections (between <!-- NAME:begin --> and <!-- NAME:end --> markers):
  README.md
    snippet:batchloader      tests/python/readme_snippet_batchloader.py      (run by the test suite)
    snippet:frames           tests/python/readme_snippet_frames.py           (run by the test suite)
    snippet:volumes          tests/python/readme_snippet_volumes.py          (run by the test suite)
    snippet:volumes_workers  tests/python/readme_snippet_volumes_workers.py  (run by the test suite)
  docs/cli.md
    cli-reference            `patchstore ... --help` for every subcommand
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = [[], ["ingest", "images"], ["ingest", "hdf5"], ["ingest", "volumes"], ["info"], ["ls"], ["verify"],
            ["upgrade"], ["export"], ["montage"], ["bench"], ["copy"]]


def read(rel):
    path = os.path.join(ROOT, rel)
    return open(path, encoding="utf-8").read() if os.path.exists(path) else None


def snippet(rel):
    text = read(rel)
    if text is None:
        return f"_(missing: {rel})_\n"
    return f"```python\n{text.rstrip()}\n```\n"


def cli_reference(cli):
    parts = []
    for cmd in COMMANDS:
        out = subprocess.run([cli, *cmd, "--help"], capture_output=True, text=True, check=True).stdout
        out = out.replace(cli, "patchstore")
        parts.append(f"## `{' '.join(['patchstore', *cmd])}`\n\n```text\n{out.rstrip()}\n```\n")
    return "\n".join(parts)


def replace(text, name, body):
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin not in text or end not in text:
        sys.exit(f"markers for '{name}' not found")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}{end}{tail}"


SNIPPETS = ["batchloader", "frames", "volumes", "volumes_workers"]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    cli = os.path.abspath(sys.argv[1])
    check = "--check" in sys.argv[2:]
    readme = read("README.md")
    new_readme = readme
    for name in SNIPPETS:
        new_readme = replace(new_readme, f"snippet:{name}", snippet(f"tests/python/readme_snippet_{name}.py"))
    cli_md = read("docs/cli.md")
    new_cli_md = replace(cli_md, "cli-reference", cli_reference(cli))
    stale = [rel for rel, old, new in (("README.md", readme, new_readme), ("docs/cli.md", cli_md, new_cli_md))
             if old != new]
    if check:
        if stale:
            sys.exit(f"{', '.join(stale)} stale: run  python tools/update_readme.py build/patchstore")
        print("README.md and docs/cli.md generated sections are up to date")
        return
    for rel, new in (("README.md", new_readme), ("docs/cli.md", new_cli_md)):
        open(os.path.join(ROOT, rel), "w", encoding="utf-8").write(new)
    print("README.md and docs/cli.md updated" + (f" ({', '.join(stale)} changed)" if stale else ""))


if __name__ == "__main__":
    main()
