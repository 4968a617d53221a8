"""MkDocs hooks for the patchstore manual (mkdocs.yml `hooks:`).

The manual links to files of the repository outside docs/ (bench/results/*.md,
store/FORMAT.md, headers), so that the same Markdown reads correctly on a code
host and in a checkout. MkDocs would report such links as missing pages; this
hook checks that each target exists (a missing one is a warning, so
`mkdocs build --strict` fails) and points the built page at the file:
`repo_url`/blob/main/PATH when mkdocs.yml sets repo_url, else a path relative to
the built page that reaches the file when the site is built into `site/` at the
top of the checkout.
"""
from __future__ import annotations

import logging
import os
import posixpath
import re

log = logging.getLogger("mkdocs.plugins.patchstore")

_LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")
_SCHEME = "patchstore-repo:"


def _repo_root(config) -> str:
    return os.path.dirname(os.path.abspath(config["config_file_path"]))


def on_page_markdown(markdown, page, config, files):
    docs = os.path.abspath(config["docs_dir"])
    root = _repo_root(config)
    src_dir = os.path.dirname(os.path.join(docs, page.file.src_path))

    def fix(m):
        target = m.group(2)
        if "://" in target or target.startswith(("/", "mailto:", _SCHEME)):
            return m.group(0)
        path = os.path.normpath(os.path.join(src_dir, target))
        if path == docs or path.startswith(docs + os.sep):
            return m.group(0)  # a page of the manual: MkDocs checks it
        if not path.startswith(root + os.sep):
            log.warning("%s: link '%s' leaves the repository", page.file.src_path, target)
            return m.group(0)
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        if not os.path.exists(path):
            log.warning("%s: link '%s': %s does not exist", page.file.src_path, target, rel)
        return f"{m.group(1)}{_SCHEME}{rel}{m.group(3) or ''}{m.group(4)}"

    return _LINK.sub(fix, markdown)


def on_page_content(html, page, config, files):
    repo_url = (config.get("repo_url") or "").rstrip("/")
    # The built page's folder, relative to the site root (use_directory_urls: page/ -> page/index.html).
    page_dir = posixpath.dirname(page.file.dest_uri)
    up = posixpath.relpath(".", page_dir) if page_dir else "."

    def to(m):
        rel = m.group(1)
        if repo_url:
            return f'href="{repo_url}/blob/main/{rel}'
        return f'href="{posixpath.normpath(posixpath.join(up, "..", rel))}'

    return re.sub(r'href="' + re.escape(_SCHEME) + r'([^"#]*)', to, html)
