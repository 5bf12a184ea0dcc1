"""Experiment grids: cells from the presets, resume by run directory, the FedSpaLLM tables and their claims."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest

from fedprune_app.core.config import RunConfig
from fedprune_app.methods.fedspallm.config import FedSpaLLMConfig
from fedprune_app.methods.fedspallm.masks import target_count
from tools.grids import finished_run, model_parameters
from tools.grids.fedspallm import GRID
from tools.launch import merged_config

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("wiki", "nyt")


def fake_run(out: Path, tag: str, sparsity: float, fed: float, standalone: float, random: float,
             exact: bool = True, status: str = "completed") -> Path:
    """A run directory as a FedSpaLLM run leaves it (only the files the tables read)."""
    run = out / f"20260101-000000-fedspallm-{tag}"
    (run / "model").mkdir(parents=True)
    server = {"0": {f"ppl `{s}`": 20.0 for s in SOURCES}, "1": {f"ppl `{s}`": fed for s in SOURCES}}
    refs = {"random": dict.fromkeys(SOURCES, random),
            "standalone": {**dict.fromkeys(SOURCES, standalone), "clients": 4},
            "centralized": dict.fromkeys(SOURCES, fed * 0.9)}
    (run / "summary.json").write_text(json.dumps({"status": status, "server": server, "references": refs}))
    size = 100
    zeros = target_count(sparsity, size) - (0 if exact else 1)
    (run / "sparsity.json").write_text(json.dumps({"size": 2 * size, "matrices": {
        "a": {"zeros": target_count(sparsity, size), "size": size}, "b": {"zeros": zeros, "size": size}}}))
    rows = [{"phase": "train", "status": "accepted", "bytes-down": 4e6, "bytes-up": 5e6} for _ in range(4)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.json").write_text(json.dumps({"method": "fedspallm", "model-name": "embedded",
                                                 "eval-ppl-tokens": 2048}))
    return run


def args(only: str = "table1", sparsity: str = "0.5,0.6,0.7") -> Namespace:
    return Namespace(only=only, sparsity=sparsity)


def test_cells_use_valid_presets_and_unique_tags() -> None:
    cells = GRID.cells(args(only="", sparsity="0.5,0.8"))
    assert [c.tag for c in cells] == ["table1-s50", "table1-s80", "table2-s50", "table2-s80", "table3-s50",
                                      "table3-s80", "comm-sampled"]
    assert [c.supernodes for c in cells] == [4, 4, 8, 8, 16, 16, 4]
    for cell in cells:  # every cell's merged config validates; the table presets wait for all their clients
        cfg = RunConfig.from_flower(merged_config(ROOT, list(cell.run_config)))
        assert cfg.method == "fedspallm" and cfg.section(FedSpaLLMConfig).sparsity == cell.settings["sparsity"]
        if cell.group.startswith("table"):
            assert cfg.min_nodes == cell.supernodes and cfg.section(FedSpaLLMConfig).fedspallm_resources == "1.0"


def test_finished_run_ignores_failed_and_other_tags(tmp_path: Path) -> None:
    fake_run(tmp_path, "table1-s50", 0.5, 30, 31, 1e5, status="failed")
    assert finished_run(tmp_path, "fedspallm", "table1-s50") is None
    fake_run(tmp_path, "table1-s500", 0.5, 30, 31, 1e5)
    assert finished_run(tmp_path, "fedspallm", "table1-s50") is None
    done = fake_run(tmp_path / "b", "table1-s50", 0.5, 30, 31, 1e5)
    assert finished_run(tmp_path / "b", "fedspallm", "table1-s50") == done


def test_tables_mark_claims_held(tmp_path: Path) -> None:
    cells = GRID.cells(args())
    runs = {c.tag: fake_run(tmp_path, c.tag, c.settings["sparsity"], fed, std, 1e6)
            for c, (fed, std) in zip(cells, [(30, 31), (40, 44), (60, 80)], strict=False)}
    text = GRID.render(cells, runs)
    assert "| 60% | standalone (mean of 4) | 44.00 | 44.00 |" in text and "| 50% | random | 1.00e+06 |" in text
    claims = text.split("## Claims")[1].split("## Communication")[0]
    # the two perplexity comparisons hold at their point estimates but carry no interval: unresolved
    assert claims.count("**held**") == 2 and claims.count("**unresolved**") == 2 and "not held" not in claims
    assert "6/6 (setting, domain) pairs at the point estimates on 2,048 tokens per domain" in claims
    assert "6/6 matrices over 3 runs" in claims


def test_tables_mark_claims_not_held(tmp_path: Path) -> None:
    cells = GRID.cells(args())
    specs = [(30, 29, True), (40, 44, True), (60, 62, False)]  # fed above standalone at 50%; gap shrinks at 70%
    runs = {c.tag: fake_run(tmp_path, c.tag, c.settings["sparsity"], fed, std, 50 * fed, exact)
            for c, (fed, std, exact) in zip(cells, specs, strict=True)}
    claims = GRID.render(cells, runs).split("## Claims")[1].split("## Communication")[0]
    lines = [line for line in claims.splitlines() if line.startswith("- ")]
    assert ["**unresolved**" in line for line in lines] == [True, True, False, False], lines
    assert all("**not held**" in line for line in lines[2:]), lines
    assert "table1 50%: FedSpaLLM above standalone on wiki, nyt" in claims
    assert "5/6 matrices" in claims


@pytest.mark.parametrize("missing", ["table1-s60"])
def test_missing_cells_are_reported_not_invented(tmp_path: Path, missing: str) -> None:
    cells = GRID.cells(args(only="table1,comm"))
    runs = {c.tag: fake_run(tmp_path, c.tag, c.settings["sparsity"], 30, 31, 1e5) for c in cells if c.tag != missing}
    text = GRID.render(cells, runs)
    assert "| 60% | *not run* |" in text and f"- `{missing}`: not run" in text
    name = runs["table1-s50"].name  # runs sit next to tables.md: linked by a relative path, not the machine's
    assert f"- `table1-s50`: [`{name}`]({name}/)" in text and str(tmp_path) not in text
    whole = 4 * model_parameters("embedded") / 1e6  # the model's fp32 size from its config: no weights needed
    assert f"| layer sampling (r_i = 0.5) | 4.0 | 5.0 | {whole:.1f} | 0.0 |" in text and whole > 500


def test_a_table_with_no_finished_cell_still_renders_as_a_table(tmp_path: Path) -> None:
    cells = GRID.cells(args(only="table1,table2", sparsity="0.5"))
    runs = {"table1-s50": fake_run(tmp_path, "table1-s50", 0.5, 30, 31, 1e5)}
    table2 = GRID.render(cells, runs).split("## Table 2: 8 clients")[1].split("## ")[0]
    assert table2.split() == ["|", "sparsity", "|", "model", "|", "|---|---|", "|", "50%", "|", "*not", "run*", "|"]


def test_archive_keeps_the_small_records_and_renders_the_same_tables(tmp_path: Path) -> None:
    """archive_runs copies what the tables read (not model files, not a record above the size cap); the archive
    alone renders the same tables."""
    from tools.grids import ARCHIVE_MAX_BYTES, archive_runs

    cells = GRID.cells(args(sparsity="0.5"))
    run = fake_run(tmp_path / "runs", "table1-s50", 0.5, fed=30.0, standalone=35.0, random=1e6)
    (run / "masks.npz").write_bytes(b"0" * (ARCHIVE_MAX_BYTES + 1))
    (done,) = archive_runs({"table1-s50": run}, tmp_path / "archive")
    assert sorted(p.name for p in done.iterdir()) == ["config.json", "metrics.jsonl", "sparsity.json", "summary.json"]
    assert done.name == run.name
    from_run = GRID.render(cells, {"table1-s50": run})
    from_archive = GRID.render(cells, {"table1-s50": finished_run(tmp_path / "archive", "fedspallm", "table1-s50")})
    assert from_archive.replace(str(done), str(run)) == from_run


def test_every_archived_record_is_committed() -> None:
    """.gitignore keeps a run's model files out of docs/runs/ but must let every `ARCHIVED` record in: a record it
    ignores is missing from a clone, and the tables rendered there silently lose what it holds."""
    import shutil
    import subprocess

    from tools.grids import ARCHIVED

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    paths = [f"docs/runs/grid/run/{name}" for name in (*ARCHIVED, "adapter.safetensors")]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    assert ignored == ["docs/runs/grid/run/adapter.safetensors"]


def test_grid_modules_import_each_other_without_cycles() -> None:
    """tools/grids/<m>/: tables and figures each read the records and neither imports the other; no module of the
    grids imports one that imports it back (lazily inside a function included)."""
    import ast

    root = Path(__file__).resolve().parents[2]
    modules = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
               for p in (root / "tools" / "grids").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
        graph[name] = {m for m in imported if m in modules and m != name}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph[start])

    cycles = sorted(m for m in graph if reaches(m, m, set()))
    assert not cycles, cycles
    for grid in ("sftp", "fedtpa"):
        tables, figures = f"tools.grids.{grid}.tables", f"tools.grids.{grid}.figures"
        assert not reaches(tables, figures, set()) and not reaches(figures, tables, set())
        assert f"tools.grids.{grid}.records" in graph[tables] & graph[figures]


def test_a_verdict_follows_its_interval() -> None:
    """held only when the claim holds over the whole 95% interval of Δ, not held when nowhere on it, unresolved when
    the interval straddles the margin or is missing; one not-held pair decides, a missing cell leaves it unchecked."""
    from tools.grids import UNRESOLVED, decide, judge

    def gt(a: float, b: float) -> bool:
        return a > b

    def within_one(a: float, b: float) -> bool:
        return a >= b - 1.0

    assert decide(gt, 52, 50, (0.5, 3.5, 100)) is True and decide(gt, 48, 50, (-3.5, -0.5, 100)) is False
    assert decide(gt, 52, 50, (-0.5, 4.5, 100)) == UNRESOLVED
    assert decide(within_one, 49.5, 50, (-0.9, 0.1, 100)) is True
    assert decide(within_one, 49.5, 50, (-2.0, 1.0, 100)) == UNRESOLVED
    assert decide(within_one, 47, 50, (-4.0, -2.0, 100)) is False
    held, text = judge([("a vs b", 52, 50, gt, (0.5, 3.5, 100)), ("c vs d", 52, 50, gt, (-0.5, 4.5, 100))])
    assert held == UNRESOLVED and text == ("a vs b: 52.00 vs 50.00 (Δ +2.00 [0.50, 3.50], n = 100); "
                                           "c vs d: 52.00 vs 50.00 (Δ +2.00 [-0.50, 4.50], n = 100) ?")
    assert judge([("a", 52, 50, gt)])[0] == UNRESOLVED  # a point comparison decides nothing
    assert judge([("a", 52, 50, gt, (-0.5, 4.5, 9)), ("b", 40, 50, gt, (-12.0, -8.0, 9))])[0] is False
    assert judge([("a", 52, 50, gt, (0.5, 3.5, 9)), ("b", None, 50, gt, None)])[0] is None
    assert judge([("a", 52, 50, gt, (0.5, 3.5, 9)), ("b", 53, 50, gt, (1.0, 5.0, 9))])[0] is True
