"""The docs' links resolve: every relative link and #anchor in README.md, docs/*.md and
bench/README.md points at a file of the repository and, with an anchor, at a heading of that
file, so a moved section or renamed heading breaks `make check`, not a reader's click. Every
page of docs/ is linked from the README, so none is orphaned.

Anchors are GitHub's: the heading lower-cased, punctuation other than `-` and `_` dropped,
spaces made `-`, and a repeated heading suffixed `-1`, `-2`. Links inside code (fenced blocks
and inline spans) are text, not links. Web links (http, https, mailto) are not fetched.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.conftest import REPO

PAGES = sorted([REPO / "README.md", REPO / "bench" / "README.md",
                *(REPO / "docs").glob("*.md")])
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+).*?\1")
HEADING = re.compile(r"#{1,6}\s+(.*?)\s*#*\s*$")
WEB = ("http://", "https://", "mailto:")


def outside_fences(path: Path) -> list[tuple[int, str]]:
    """The numbered lines of a Markdown file that are not in a fenced code block."""
    lines, fence = [], ""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        marker = re.match(r"\s*(```+|~~~+)", line)
        if marker and not fence:
            fence = marker.group(1)
        elif marker and marker.group(1).startswith(fence):
            fence = ""
        elif not fence:
            lines.append((number, line))
    return lines


def prose(path: Path) -> list[tuple[int, str]]:
    """The lines outside fenced code, with inline code spans blanked."""
    return [(number, INLINE_CODE.sub("", line)) for number, line in outside_fences(path)]


def slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The #anchors GitHub gives a file's headings."""
    repeats: dict[str, int] = {}
    found = set()
    for _, line in outside_fences(path):
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(1))
            repeats[base] = repeats.get(base, -1) + 1
            found.add(f"{base}-{repeats[base]}" if repeats[base] else base)
    return found


def broken_links(page: Path) -> list[str]:
    """One line per link of `page` that does not resolve: where it is and why."""
    problems = []
    for number, line in prose(page):
        for target in LINK.findall(line):
            if target.startswith(WEB):
                continue
            where = f"{page.relative_to(REPO)}:{number}: {target}"
            file_part, _, anchor = unquote(target).partition("#")
            resolved = (page.parent / file_part).resolve() if file_part else page
            if REPO not in resolved.parents and resolved != REPO:
                problems.append(f"{where}: outside the repository")
            elif not resolved.exists():
                problems.append(f"{where}: no such file")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                problems.append(f"{where}: no heading with anchor #{anchor} in "
                                f"{resolved.relative_to(REPO)}")
            elif anchor and resolved.suffix != ".md":
                problems.append(f"{where}: an anchor into a file that is not Markdown")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_every_docs_page_is_linked_from_the_readme() -> None:
    readme = REPO / "README.md"
    linked = {(readme.parent / unquote(target).partition("#")[0]).resolve()
              for _, line in prose(readme) for target in LINK.findall(line)}
    assert sorted(str(page.relative_to(REPO)) for page in (REPO / "docs").glob("*.md")
                  if page.resolve() not in linked) == []


def test_the_checker_finds_a_broken_link_and_a_broken_anchor(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """The checker itself: a page with good and bad links, in a repository of its own."""
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# The cache store: `jaxwarm cache`\n"
                                                "## Twice\n## Twice\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/other.md#the-cache-store-jaxwarm-cache) [second](docs/other.md#twice-1)\n"
        "![img](docs/other.md) [web](https://example.com/x#y) `[code](nowhere.md)`\n"
        "[gone](docs/missing.md) [bad anchor](docs/other.md#the-cache)\n"
        "[self](#nothing-here) [up](../outside.md)\n"
        "```\n[in a fence](nowhere.md)\n```\n")
    assert broken_links(page) == [
        "README.md:3: docs/missing.md: no such file",
        "README.md:3: docs/other.md#the-cache: no heading with anchor #the-cache in "
        "docs/other.md",
        "README.md:4: #nothing-here: no heading with anchor #nothing-here in README.md",
        "README.md:4: ../outside.md: outside the repository"]
