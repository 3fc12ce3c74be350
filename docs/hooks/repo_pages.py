"""MkDocs hook: pages of the site that are files at the top of the repository.

README.md is the site's front page, DESIGN.md the contributors' design page
and CHANGELOG.md the changelog, each kept in one place only. Their docs/
pages are stubs; this hook puts the file's text in their place and turns
links written for the repository (``docs/concepts/promises.md``, or
``CHANGELOG.md`` for one of these files) into links from the page. A relative link to anything outside docs/ is reported (and
so fails ``mkdocs build --strict``): the site has no such page.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.repo_pages")

PAGES = {
    "index.md": "README.md",
    "contributing/design.md": "DESIGN.md",
    "changelog.md": "CHANGELOG.md",
}
PAGE_OF = {source: page for page, source in PAGES.items()}

# [text](target) and [text]: target, outside code spans is good enough here:
# these files keep paths that are not links in backticks.
LINK = re.compile(r"(\]\()([^)\s]+)(\))|(^\[[^\]]+\]:\s*)(\S+)()", re.M)


def _relink(text: str, page: str, source: str) -> str:
    here = posixpath.dirname(page)

    def fix(m: re.Match) -> str:
        head, target, tail = (m.group(1), m.group(2), m.group(3)) if m.group(1) else (m.group(4), m.group(5), m.group(6))
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#", target):  # a URL, or an anchor in the page itself
            return m.group(0)
        path, _, anchor = target.partition("#")
        if path in PAGE_OF:  # another of these files: its page
            path = "docs/" + PAGE_OF[path]
        if not path.startswith("docs/"):
            log.warning("%s links to %r, which is not a page of the site (write it as `code`, or link a page "
                        "under docs/)", source, target)
            return m.group(0)
        rel = posixpath.relpath(path[len("docs/"):], here or ".")
        return f"{head}{rel}{'#' + anchor if anchor else ''}{tail}"

    return LINK.sub(fix, text)


def on_page_markdown(markdown: str, page, config, files) -> str:
    source = PAGES.get(page.file.src_uri)
    if source is None:
        return markdown
    root = Path(config["config_file_path"]).parent
    return _relink((root / source).read_text(encoding="utf-8"), page.file.src_uri, source)
