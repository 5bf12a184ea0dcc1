"""Every relative link in README.md and docs/ reaches a file that exists and, where it names a
section (`page.md#section`), a heading of that page, by GitHub's anchor rule (lower case,
punctuation dropped, spaces to hyphens, `-1`, `-2` … for repeated headings). Moving text between
pages or renaming a heading breaks links silently otherwise."""

from __future__ import annotations

import json
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
    """The anchors of every heading of `page` (headings inside fenced code blocks are not
    headings)."""
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
    assert (
        slug("The paper's protocol, 50–80% (2026-11-25/26)")
        == "the-papers-protocol-5080-2026-11-2526"
    )


def test_a_missing_file_or_heading_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Top\n## Same\n## Same\n```\n# not a heading\n```\n")
    (tmp_path / "b.md").write_text(
        "[ok](a.md#same-1) [ok](#here) [no](a.md#same-2) [no](c.md) [no](a.md#not-a-heading)"
        " [web](https://x.org/y.md#z)\n# Here\n"
    )
    assert broken_links([tmp_path / "b.md"]) == [
        "b.md: a.md#same-2",
        "b.md: c.md",
        "b.md: a.md#not-a-heading",
    ]


def test_every_relative_link_in_the_docs_resolves() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert broken_links(pages) == []


# --- the commands the docs name exist -------------------------------------------------------------

FEDPRUNE = re.compile(
    r"(?:^|&&|;|\||\$\()\s*(?:\$\s+)?(?:\S*bin/)?fedprune\s+([a-z][\w-]*)((?:\s+[^\s|;&#`]+)*)"
)
PYTHON_M = re.compile(r"python(?:3(?:\.\d+)?)?\s+-m\s+([A-Za-z_][\w.]*)")
MAKE = re.compile(r"(?<![\w/.-])make\s+([a-z][\w-]*)")


def code_spans(text: str) -> list[str]:
    """The inline code spans and fenced code lines of a markdown text: where the docs write
    commands."""
    spans, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        spans += [line] if fenced else re.findall(r"`([^`]+)`", line)
    return spans


def module_exists(name: str) -> bool:
    """A module of this checkout (file or package) or an installed one; never imported."""
    import importlib.util

    parts = name.split(".")
    local = ROOT.joinpath(*parts)
    if (
        local.with_suffix(".py").is_file()
        or (local / "__init__.py").is_file()
        or (local / "__main__.py").is_file()
    ):
        return True
    if (ROOT / parts[0]).exists():  # a package of this checkout that lacks the module
        return False
    return importlib.util.find_spec(parts[0]) is not None


def unknown_commands(text: str) -> list[str]:
    """The `fedprune` sub-commands, options, benchmarks and grids, `python -m` modules and `make`
    targets that a text names and that do not exist."""
    import argparse

    from fedprune_cli.main import BENCHMARKS, GRIDS, parser

    top = parser()
    subparsers = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    bad = []
    for span in code_spans(text):
        for match in FEDPRUNE.finditer(span):
            command, rest = match.group(1), match.group(2).split()
            if command not in subparsers:
                bad.append(f"fedprune {command}")
                continue
            if command in ("bench", "grid"):
                if (
                    rest
                    and not rest[0].startswith(("-", "<"))
                    and rest[0] not in (BENCHMARKS if command == "bench" else GRIDS)
                ):
                    bad.append(f"fedprune {command} {rest[0]}")
                continue
            sub = subparsers[command]
            if command == "rescore" and rest and not rest[0].startswith(("-", "<")):
                kinds = next(
                    a for a in sub._actions if isinstance(a, argparse._SubParsersAction)
                ).choices
                if rest[0] not in kinds:
                    bad.append(f"fedprune rescore {rest[0]}")
                    continue
                sub = kinds[rest[0]]
            options = {s for a in sub._actions for s in a.option_strings}
            bad += [
                f"fedprune {command} {flag}"
                for flag in (t.split("=")[0] for t in rest)
                if flag.startswith("--") and flag not in options and flag != "--"
            ]
        bad += [f"python -m {m}" for m in PYTHON_M.findall(span) if not module_exists(m)]
        bad += [f"make {t}" for t in MAKE.findall(span) if t not in targets]
    return bad


def doc_pages() -> list[Path]:
    """The manuals and notes (the run and benchmark records under docs/runs and docs/bench are
    history)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [
        p
        for p in pages
        if not p.is_relative_to(ROOT / "docs" / "runs")
        and not p.is_relative_to(ROOT / "docs" / "bench")
    ]


def test_a_command_that_does_not_exist_is_reported() -> None:
    text = (
        "Run `fedprune run --run-config conf/smoke.toml --references` or `fedprune launch`,\n"
        "`pip show fedprune x`,\n"
        "`fedprune bench compiled --repeats 3`, `fedprune bench nosuch`, "
        "`fedprune grid fedspallm`,\n"
        "`fedprune rescore accuracy RUN --dense`, `fedprune rescore rouge RUN --dense`,\n"
        "`fedprune compare A B --no-such-flag`, `make test`, `make nosuch`,\n"
        "```\npython -m tools.launch\npython -m fedprune_cli.main --help\n"
        "python -m pytest -q\n```\n"
    )
    assert unknown_commands(text) == [
        "fedprune launch",
        "fedprune bench nosuch",
        "fedprune rescore --dense",
        "fedprune compare --no-such-flag",
        "make nosuch",
        "python -m tools.launch",
    ]


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_the_docs_name_exists(page: Path) -> None:
    assert unknown_commands(page.read_text()) == []


def test_every_method_has_a_manual_with_its_known_limits() -> None:
    """A run's broken-model flag points to docs/methods/<method>.md#known-limits: each registered
    method has that page and heading, and a page stays a manual (about 400 lines at most)."""
    from fedprune_app.core.registry import names

    for method in names():
        page = ROOT / "docs" / "methods" / f"{method}.md"
        assert page.is_file(), f"{method} has no manual"
        assert "known-limits" in anchors(page), f"{page.name} has no 'Known limits' section"
        assert len(page.read_text().splitlines()) <= 420, f"{page.name} is a log, not a manual"


def test_every_duration_the_docs_give_a_make_target_is_its_records() -> None:
    """docs/bench/durations.json is the one source of the `~N min` the docs repeat per make target:
    a line naming a target may give only that target's `about` (so README, running.md, testing.md
    and the method pages cannot disagree again), and `about` stays within 25% of what was
    measured."""
    record = json.loads((ROOT / "docs" / "bench" / "durations.json").read_text())
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    pages += sorted((ROOT / "docs" / "methods").glob("*.md"))
    wrong = []
    for row in record["rows"]:
        assert abs(row["about"] - row["minutes"]) <= 0.25 * row["minutes"], row["target"]
        assert (ROOT / row["source"]).exists(), row["source"]
        named = re.compile(rf"`?{re.escape(row['target'])}`?(?![-\w])")
        for page in pages:
            for number, line in enumerate(page.read_text().splitlines(), 1):
                if not named.search(line):
                    continue
                others = [
                    r
                    for r in record["rows"]
                    if r is not row and re.search(rf"`?{re.escape(r['target'])}`?(?![-\w])", line)
                ]
                if others:  # a line naming two targets: not attributable
                    continue
                for shown in re.findall(r"~(\d+(?:\.\d+)?) min", line):
                    if float(shown) != float(row["about"]):
                        wrong.append(f"{page.relative_to(ROOT)}:{number}: {row['target']} ~{shown}")
    assert wrong == [], wrong


def test_the_manuals_are_manuals_dated_only_through_links_and_short() -> None:
    """README, docs/*.md and the method pages name a date only as a link (to a record or a note):
    measurements and their stories live in docs/notes and the records; running.md and
    reliability.md stay under 300 lines."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    pages += sorted((ROOT / "docs" / "methods").glob("*.md"))
    dated = []
    for page in pages:
        text = re.sub(r"\[[^\]]*\]\([^)]*\)", "LINK", page.read_text())
        dated += [
            f"{page.relative_to(ROOT)}:{n}"
            for n, line in enumerate(text.splitlines(), 1)
            if re.search(r"\b20\d\d-\d\d-\d\d\b", line)
        ]
    assert dated == [], dated
    for name in ("running.md", "reliability.md"):
        assert len((ROOT / "docs" / name).read_text().splitlines()) < 300, name


def _smoke_record() -> dict[str, tuple[int, int]]:
    """docs/runs/smoke/README.md's current table: method → (wall seconds, models flagged)."""
    text = (ROOT / "docs" / "runs" / "smoke" / "README.md").read_text()
    table = text.split("| method | wall time |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| (\w+) \| (\d+) s \| \d+ \| (\d+) \|", table, re.M)
    return {m: (int(s), int(f)) for m, s, f in rows}


def test_the_smoke_times_the_docs_repeat_are_the_smoke_records() -> None:
    """README's method table and running.md's smoke paragraph give the wall times (and flags) of
    docs/runs/smoke/README.md's current table, and nothing else: re-running `make smoke-all`
    and updating its table without them fails here."""
    record = _smoke_record()
    assert len(record) == 8
    readme = (ROOT / "README.md").read_text()
    shown = dict(
        re.findall(r"^\| \[(\w+)\]\(docs/methods/.*\| (\d+ s(?:, flagged)?) \|$", readme, re.M)
    )
    assert set(shown) == set(record)
    for method, (seconds, flagged) in record.items():
        assert shown[method] == f"{seconds} s" + (", flagged" if flagged else ""), method
    running = (ROOT / "docs" / "running.md").read_text()
    (paragraph,) = [p for p in running.split("\n\n") if "runs/smoke/README.md" in p and " s " in p]
    quoted = {int(n) for pair in re.findall(r"(\d+)(?:–(\d+))? s\b", paragraph) for n in pair if n}
    assert quoted and quoted <= {s for s, _ in record.values()}, quoted
    table_line = next(line for line in running.splitlines() if line.startswith("| `make smoke` |"))
    assert not re.search(r"\d+ s \|", table_line), "running.md's make smoke time: use ~N min"


def test_the_readme_figures_of_make_run_are_their_records() -> None:
    """The README's shortened client table is its linked record's (every number in a row is one of
    the record's), and each interval of its goals paragraph is claims.md's."""
    readme = (ROOT / "README.md").read_text()
    (record_link,) = re.findall(r"\[record\]\((docs/runs/sftp-make-run/[^)]+results\.md)\)", readme)
    record_numbers = set(re.findall(r"\d+\.\d+", (ROOT / record_link).read_text()))
    rows = [line for line in readme.splitlines() if re.match(r"\| \d `\w+`", line)]
    assert len(rows) == 4
    for row in rows:
        missing = set(re.findall(r"\d+\.\d+", row)) - record_numbers
        assert missing == set(), (row[:30], missing)
    (goals,) = [p for p in readme.split("\n\n") if p.startswith("The goals, pooled")]
    claims = (ROOT / "docs" / "claims.md").read_text()
    intervals = re.findall(r"[−-]?\d+\.\d+ \[[^\]]+\]", goals)
    assert intervals and all(i in claims for i in intervals), intervals
    for share in re.findall(r"\d+ of \d+ models", goals):
        assert share in claims, share


def test_preset_headers_say_what_a_preset_does_not_what_a_run_found() -> None:
    """conf/*.toml comments carry no result: no 95% interval, no run record (a dated run
    directory) and no measured time or speed-up; those live in the records the docs link."""
    found = []
    for preset in sorted((ROOT / "conf").glob("*.toml")):
        for number, line in enumerate(preset.read_text().splitlines(), 1):
            comment = line.partition("#")[2]
            interval = r"\[[−-]?\d+(\.\d+)?, [−-]?\d+(\.\d+)?\]"
            if re.search(rf"{interval}|\d{{8}}-\d{{6}}|\d+(\.\d+)?x per|\bran \d+ min", comment):
                found.append(f"{preset.name}:{number}: {comment.strip()[:60]}")
    assert found == [], found


def test_every_page_a_preset_names_exists() -> None:
    """A `docs/...` path in a conf/*.toml comment is a file (and its `#section` a heading there)."""
    missing = []
    for preset in sorted((ROOT / "conf").glob("*.toml")):
        for path, anchor in re.findall(
            r"(docs/[\w./-]+?)(#[\w-]+)?(?=[\s,;:)]|$)", preset.read_text()
        ):
            target = ROOT / path.rstrip(".")
            if not target.exists() or (anchor and anchor[1:] not in anchors(target)):
                missing.append(f"{preset.name}: {path}{anchor}")
    assert missing == [], missing


def test_the_new_method_page_is_the_toy_method_and_it_is_short() -> None:
    """docs/new-method.md shows every file of the conformance toy exactly as the suites run it, and
    the toy stays under 150 lines."""
    page = (ROOT / "docs" / "new-method.md").read_text()
    toy = ROOT / "tests" / "conformance" / "toy_method"
    files = sorted(p for p in toy.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    shown = re.findall(r"### `([^`]+)`\n\n(?:[^\n]+\n)+\n```\w+\n(.*?)\n```", page, re.S)
    assert len(shown) == len(files)
    for where, text in shown:
        path = toy / where.removeprefix("fedprune_app/")
        assert path.read_text().rstrip() == text, where
    total = sum(len(p.read_text().splitlines()) for p in files)
    assert total < 150 and f"in {total} lines" in page
