"""README.md and docs/*.md: every local link and image resolves, anchors included.

The README was split into docs/ (issue 20); a moved section or renamed heading must not leave a
dead link behind. Pure text: no torch, no network (http(s) and mailto links are not followed).
"""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
README_MAX_LINES = 250  # one screenful for a newcomer; the rest belongs in docs/

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
# [text](target) and ![alt](target); an optional "title" after the target is dropped.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
EXTERNAL = ("http://", "https://", "mailto:")


def prose(text: str) -> str:
    """The text with fenced blocks and code spans removed: links inside code are examples."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lower case, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in ``path``; repeated headings get -1, -2... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def local_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text(encoding="utf-8"))) if not t.startswith(EXTERNAL)]


def dead(path: Path, target: str) -> str | None:
    """Why ``target`` (as written in ``path``) does not resolve, or None when it does."""
    file_part, _, anchor = unquote(target).partition("#")
    dest = (path.parent / file_part).resolve() if file_part else path
    if not dest.exists():
        return f"{target}: no such file {shown(dest)}"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"{target}: no heading with anchor #{anchor} in {shown(dest)}"
    return None


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_local_link_and_image_resolves(path: Path) -> None:
    problems = [p for p in (dead(path, t) for t in local_links(path)) if p]
    assert not problems, f"{shown(path)}:\n" + "\n".join(problems)


def test_the_parser_sees_links_images_and_anchors(tmp_path: Path) -> None:
    """The checker itself: it must find what it claims to check, and skip code."""
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(b"")
    page = tmp_path / "page.md"
    page.write_text("# Will it fit? — the `hardware` calculator\n\n## On the page (\"Will it fit?\")\n"
                    "![pic](img/a.png) [self](#on-the-page-will-it-fit) [gone](missing.md) "
                    "[bad anchor](#nowhere) `[code](skipped.md)` [web](https://example.com)\n"
                    "```\n[fenced](skipped-too.md)\n```\n", encoding="utf-8")
    assert anchors(page) == {"will-it-fit--the-hardware-calculator", "on-the-page-will-it-fit"}
    assert local_links(page) == ["img/a.png", "#on-the-page-will-it-fit", "missing.md", "#nowhere"]
    assert [t for t in local_links(page) if dead(page, t)] == ["missing.md", "#nowhere"]


def test_every_doc_is_reachable_from_the_readme() -> None:
    readme = {(ROOT / t.partition("#")[0]).resolve() for t in local_links(ROOT / "README.md")}
    orphans = [p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in readme]
    assert not orphans, f"docs not linked from README.md: {orphans}"


def test_readme_fits_on_a_screen_and_shows_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "make run" in text and "make test" in text
