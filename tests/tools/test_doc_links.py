"""Every relative link in README.md and docs/ reaches a file that exists and, where it names a section
(`page.md#section`), a heading of that page, by GitHub's anchor rule (lower case, punctuation dropped, spaces to
hyphens, `-1`, `-2` … for repeated headings). Moving text between pages or renaming a heading breaks links
silently otherwise."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#\s]*)(#[^)\s]*)?\)")
HEADING = re.compile(r"#{1,6}\s+(.*)")


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of every heading of `page` (headings inside fenced code blocks are not headings)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(pages: list[Path]) -> list[str]:
    """'page: target' for each relative link whose file or heading does not exist."""
    broken = []
    for page in pages:
        for match in LINK.finditer(page.read_text()):
            target, anchor = match.group(1), match.group(2)
            if target.startswith(("http:", "https:", "mailto:")):
                continue
            path = (page.parent / target) if target else page
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and path.suffix == ".md" and anchor[1:] not in anchors(path):
                broken.append(f"{page.relative_to(ROOT)}: {target}{anchor}")
    return broken


def test_slug_follows_githubs_rule() -> None:
    assert slug("`make run`: the preset on 4 SuperNodes") == "make-run-the-preset-on-4-supernodes"
    assert slug("The paper's protocol, 50–80% (2026-11-25/26)") == "the-papers-protocol-5080-2026-11-2526"


def test_a_missing_file_or_heading_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Top\n## Same\n## Same\n```\n# not a heading\n```\n")
    (tmp_path / "b.md").write_text("[ok](a.md#same-1) [ok](#here) [no](a.md#same-2) [no](c.md) [no](a.md#not-a-heading)"
                                   " [web](https://x.org/y.md#z)\n# Here\n")
    assert broken_links([tmp_path / "b.md"]) == ["b.md: a.md#same-2", "b.md: c.md", "b.md: a.md#not-a-heading"]


def test_every_relative_link_in_the_docs_resolves() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert broken_links(pages) == []
