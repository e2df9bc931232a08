"""The user's docs hold together: the index lists every page, and every link lands somewhere.

A relative link must name a file that exists and, with a ``#fragment``, a heading of that file (as
GitHub makes a heading's anchor), so a renamed page or section fails here rather than for a reader.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
INDEX = DOCS / "README.md"
PAGES = sorted([*DOCS.glob("*.md"), ROOT / "README.md", ROOT / "charts" / "dispatch-operator" / "README.md"])
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def links(page: Path) -> list[str]:
    return LINK.findall(CODE.sub("", page.read_text()))


@cache
def anchors(page: Path) -> frozenset[str]:
    """GitHub's anchors of ``page``'s headings: lower case, punctuation dropped, spaces as ``-``."""
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", CODE.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = 1
        candidate = slug
        while candidate in found:
            candidate = f"{slug}-{n}"
            n += 1
        found.add(candidate)
    return frozenset(found)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    for link in links(page):
        if re.match(r"[a-z]+:", link):
            continue  # https:, mailto:
        target, _, fragment = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), f"{page.relative_to(ROOT)} links to {link}, which does not exist"
        if fragment and path.suffix == ".md":
            assert fragment in anchors(path), (
                f"{page.relative_to(ROOT)} links to {link}: {path.name} has no heading #{fragment}"
            )


def test_the_index_lists_every_page() -> None:
    listed = {(DOCS / link.partition("#")[0]).resolve() for link in links(INDEX)}
    missing = [p.name for p in DOCS.glob("*.md") if p != INDEX and p.resolve() not in listed]
    assert not missing, f"docs/README.md does not list {missing}: put each where a reader needs it"


def test_the_index_leads_with_the_first_hour() -> None:
    text = INDEX.read_text()
    first_hour = text[
        text.index("## Your first hour") : text.index("\n## ", text.index("## Your first hour") + 1)
    ]
    order = [
        first_hour.index(page) for page in ("install.md", "quickstart.md", "semantics.md", "backends.md")
    ]
    assert order == sorted(order), "install, quick start, concepts, backends: in that order"
    assert text.index("## Your first hour") < text.index("## Working on dispatch")
