"""Experiment grids: cells from the presets, resume by run directory, the FedSpaLLM tables and their
claims."""

from __future__ import annotations

import json
import math
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from experiments.grids import finished_run, model_parameters
from experiments.grids.fedspallm import GRID
from fedprune_app.core.config import RunConfig
from fedprune_app.methods.fedspallm.config import FedSpaLLMConfig
from fedprune_app.methods.fedspallm.masks import target_count
from fedprune_cli.launch import merged_config

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("wiki", "nyt")


def fake_run(
    out: Path,
    tag: str,
    sparsity: float,
    fed: float,
    standalone: float,
    random: float,
    exact: bool = True,
    status: str = "completed",
) -> Path:
    """A run directory as a FedSpaLLM run leaves it (only the files the tables read)."""
    run = out / f"20260101-000000-fedspallm-{tag}"
    (run / "model").mkdir(parents=True)
    server = {"0": {f"ppl `{s}`": 20.0 for s in SOURCES}, "1": {f"ppl `{s}`": fed for s in SOURCES}}
    refs = {
        "random": dict.fromkeys(SOURCES, random),
        "standalone": {**dict.fromkeys(SOURCES, standalone), "clients": 4},
        "centralized": dict.fromkeys(SOURCES, fed * 0.9),
    }
    (run / "summary.json").write_text(
        json.dumps({"status": status, "server": server, "references": refs})
    )
    size = 100
    zeros = target_count(sparsity, size) - (0 if exact else 1)
    (run / "sparsity.json").write_text(
        json.dumps(
            {
                "size": 2 * size,
                "matrices": {
                    "a": {"zeros": target_count(sparsity, size), "size": size},
                    "b": {"zeros": zeros, "size": size},
                },
            }
        )
    )
    rows = [
        {"phase": "train", "status": "accepted", "bytes-down": 4e6, "bytes-up": 5e6}
        for _ in range(4)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.json").write_text(
        json.dumps({"method": "fedspallm", "model-name": "embedded", "eval-ppl-tokens": 2048})
    )
    return run


def args(only: str = "table1", sparsity: str = "0.5,0.6,0.7", seeds: str = "0") -> Namespace:
    return Namespace(only=only, sparsity=sparsity, seeds=seeds)


def windows(ppl: float, text: list[int], noise: float, n: int = 64) -> dict[str, list]:
    """Per-window scores (`window-nll`, `window-tokens`) of n windows of 100 tokens whose perplexity
    is about ppl: each window's NLL per token is log(ppl) plus the text's difficulty (drawn from the
    seed `text`, so models scored on the same text are correlated, as real models are) plus the
    model's own noise."""
    base = np.random.default_rng(text).normal(0.0, 0.5, size=n)
    own = np.random.default_rng(int(ppl * 1000) % 2**32).normal(0.0, noise, size=n)
    return {
        "window-nll": list(100 * (math.log(ppl) + base - base.mean() + own - own.mean())),
        "window-tokens": [100] * n,
    }


def window_run(
    out: Path,
    tag: str,
    sparsity: float,
    fed: float,
    standalone: list[float],
    noise: float = 0.01,
    text_seed: int = 0,
) -> Path:
    """`fake_run` plus the metrics rows of a run that records every window: the server's (dense,
    then global) and the references' (random, centralized, one standalone per client), all on the
    same texts (`text_seed`)."""
    run = fake_run(out, tag, sparsity, fed, sum(standalone) / len(standalone), 1e6)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for source in SOURCES:
        text = [text_seed, SOURCES.index(source)]

        def scored(ppl: float, text: list[int] = text) -> dict[str, list]:
            return windows(ppl, text, noise)

        rows += [
            {"phase": "server-evaluate", "round": 0, "data": source, "ppl": 20.0, **scored(20.0)},
            {"phase": "server-evaluate", "round": 1, "data": source, "ppl": fed, **scored(fed)},
            {"phase": "reference", "model": "random", "data": source, "ppl": 1e6, **scored(1e6)},
        ]
        rows += [
            {
                "phase": "reference",
                "model": "standalone",
                "client": k,
                "data": source,
                "ppl": p,
                **scored(p),
            }
            for k, p in enumerate(standalone)
        ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_cells_use_valid_presets_and_unique_tags() -> None:
    cells = GRID.cells(args(only="", sparsity="0.5,0.8"))
    assert [c.tag for c in cells] == [
        "table1-s50",
        "table1-s80",
        "table2-s50",
        "table2-s80",
        "table3-s50",
        "table3-s80",
        "paper-s50",
        "paper-s80",
        "comm-sampled",
    ]
    assert [c.supernodes for c in cells] == [4, 4, 8, 8, 16, 16, 4, 4, 4]
    for cell in (
        cells
    ):  # every cell's merged config validates; the table presets wait for all their clients
        cfg = RunConfig.from_flower(merged_config(ROOT, list(cell.run_config)))
        assert (
            cfg.method == "fedspallm"
            and cfg.section(FedSpaLLMConfig).sparsity == cell.settings["sparsity"]
        )
        if (
            cell.group != "comm"
        ):  # the claims' cells: ≥ 32,768 tokens per domain, every window recorded
            assert (
                cfg.min_nodes == cell.supernodes
                and cfg.section(FedSpaLLMConfig).fedspallm_resources == "1.0"
            )
            assert cfg.eval_ppl_tokens >= 32768


def test_seed_replicates_are_cells_of_their_own_that_the_tables_pool() -> None:
    cells = GRID.cells(Namespace(only="paper", sparsity="0.5", seeds="0,1,2"))
    assert [c.tag for c in cells] == ["paper-s50", "paper-s50-seed1", "paper-s50-seed2"]
    assert [c.settings.get("replicate-of") for c in cells] == [None, "paper-s50", "paper-s50"]
    configs = [RunConfig.from_flower(merged_config(ROOT, list(c.run_config))) for c in cells]
    assert [cfg.seed for cfg in configs] == [0, 1, 2]
    # a replicate leaves out the random reference (no pooled claim reads it), everything else as its
    # cell
    refs = [cfg.section(FedSpaLLMConfig).fedspallm_references for cfg in configs]
    assert refs == [
        "random,standalone,centralized",
        "standalone,centralized",
        "standalone,centralized",
    ]
    assert {cfg.section(FedSpaLLMConfig).sparsity for cfg in configs} == {0.5}
    with pytest.raises(SystemExit, match="--seeds must include 0"):
        GRID.cells(Namespace(only="paper", sparsity="0.5", seeds="1,2"))


def test_finished_run_ignores_failed_and_other_tags(tmp_path: Path) -> None:
    fake_run(tmp_path, "table1-s50", 0.5, 30, 31, 1e5, status="failed")
    assert finished_run(tmp_path, "fedspallm", "table1-s50") is None
    fake_run(tmp_path, "table1-s500", 0.5, 30, 31, 1e5)
    assert finished_run(tmp_path, "fedspallm", "table1-s50") is None
    done = fake_run(tmp_path / "b", "table1-s50", 0.5, 30, 31, 1e5)
    assert finished_run(tmp_path / "b", "fedspallm", "table1-s50") == done


def test_tables_mark_claims_held(tmp_path: Path) -> None:
    cells = GRID.cells(args())
    runs = {
        c.tag: fake_run(tmp_path, c.tag, c.settings["sparsity"], fed, std, 1e6)
        for c, (fed, std) in zip(cells, [(30, 31), (40, 44), (60, 80)], strict=False)
    }
    text = GRID.render(cells, runs)
    assert (
        "| 60% | standalone (mean of 4) | 44.00 | 44.00 |" in text
        and "| 50% | random | 1.00e+06 |" in text
    )
    claims = text.split("## Claims")[1].split("## Communication")[0]
    # the two perplexity comparisons hold at their point estimates but carry no interval: unresolved
    assert (
        claims.count("**held**") == 2
        and claims.count("**unresolved**") == 2
        and "not held" not in claims
    )
    assert "6/6 (setting, domain) pairs at the point estimates on 2,048 tokens per domain" in claims
    assert "6/6 matrices over 3 runs" in claims


def test_tables_mark_claims_not_held(tmp_path: Path) -> None:
    cells = GRID.cells(args())
    specs = [
        (30, 29, True),
        (40, 44, True),
        (60, 62, False),
    ]  # fed above standalone at 50%; gap shrinks at 70%
    runs = {
        c.tag: fake_run(tmp_path, c.tag, c.settings["sparsity"], fed, std, 50 * fed, exact)
        for c, (fed, std, exact) in zip(cells, specs, strict=True)
    }
    claims = GRID.render(cells, runs).split("## Claims")[1].split("## Communication")[0]
    lines = [line for line in claims.splitlines() if line.startswith("- ")]
    assert ["**unresolved**" in line for line in lines] == [True, True, False, False], lines
    assert all("**not held**" in line for line in lines[2:]), lines
    assert "table1 50%: FedSpaLLM above standalone on wiki, nyt" in claims
    assert "5/6 matrices" in claims


@pytest.mark.parametrize("missing", ["table1-s60"])
def test_missing_cells_are_reported_not_invented(tmp_path: Path, missing: str) -> None:
    cells = GRID.cells(args(only="table1,comm"))
    runs = {
        c.tag: fake_run(tmp_path, c.tag, c.settings["sparsity"], 30, 31, 1e5)
        for c in cells
        if c.tag != missing
    }
    text = GRID.render(cells, runs)
    assert "| 60% | *not run* |" in text and f"- `{missing}`: not run" in text
    name = runs[
        "table1-s50"
    ].name  # runs sit next to tables.md: linked by a relative path, not the machine's
    assert f"- `table1-s50`: [`{name}`]({name}/)" in text and str(tmp_path) not in text
    whole = (
        4 * model_parameters("embedded") / 1e6
    )  # the model's fp32 size from its config: no weights needed
    assert f"| layer sampling (r_i = 0.5) | 4.0 | 5.0 | {whole:.1f} | 0.0 |" in text and whole > 500


def test_a_table_with_no_finished_cell_still_renders_as_a_table(tmp_path: Path) -> None:
    cells = GRID.cells(args(only="table1,table2", sparsity="0.5"))
    runs = {"table1-s50": fake_run(tmp_path, "table1-s50", 0.5, 30, 31, 1e5)}
    table2 = GRID.render(cells, runs).split("## Table 2: 8 clients")[1].split("## ")[0]
    assert table2.split() == [
        "|",
        "sparsity",
        "|",
        "model",
        "|",
        "|---|---|",
        "|",
        "50%",
        "|",
        "*not",
        "run*",
        "|",
    ]


def test_archive_keeps_the_small_records_and_renders_the_same_tables(tmp_path: Path) -> None:
    """archive_runs copies what the tables read (not model files, not a record above the size cap);
    the archive alone renders the same tables."""
    from experiments.grids import ARCHIVE_MAX_BYTES, archive_runs

    cells = GRID.cells(args(sparsity="0.5"))
    run = fake_run(tmp_path / "runs", "table1-s50", 0.5, fed=30.0, standalone=35.0, random=1e6)
    (run / "masks.npz").write_bytes(b"0" * (ARCHIVE_MAX_BYTES + 1))
    (done,) = archive_runs({"table1-s50": run}, tmp_path / "archive")
    assert sorted(p.name for p in done.iterdir()) == [
        "config.json",
        "metrics.jsonl",
        "sparsity.json",
        "summary.json",
    ]
    assert done.name == run.name
    from_run = GRID.render(cells, {"table1-s50": run})
    from_archive = GRID.render(
        cells, {"table1-s50": finished_run(tmp_path / "archive", "fedspallm", "table1-s50")}
    )
    assert from_archive.replace(str(done), str(run)) == from_run


def test_every_archived_record_is_committed() -> None:
    """.gitignore keeps a run's model files out of docs/runs/ but must let every `ARCHIVED` record
    in: a record it ignores is missing from a clone, and the tables rendered there silently lose
    what it holds."""
    import shutil
    import subprocess

    from experiments.grids import ARCHIVED

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    paths = [f"docs/runs/grid/run/{name}" for name in (*ARCHIVED, "adapter.safetensors")]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    assert ignored == ["docs/runs/grid/run/adapter.safetensors"]


def test_replicates_are_named_by_seed_and_pooled_only_with_their_cell() -> None:
    from experiments.grids import Cell, replicate, replicate_tags, seeds_of

    cell = Cell("g", "p50-c-a", ("conf/x.toml", "a=1 b=2"), 4, {"budget": 0.5})
    assert replicate(cell, 0) is cell
    copy = replicate(cell, 3)
    assert (copy.tag, copy.run_config, copy.settings) == (
        "p50-c-a-seed3",
        ("conf/x.toml", "a=1 b=2 seed=3"),
        {"budget": 0.5, "replicate-of": "p50-c-a", "seed": 3},
    )
    tags = [
        "p50-c-a-seed10",
        "p50-c-a",
        "p50-c-a-seed2",
        "p50-c-a-2",
        "p50-c-a-seedx",
        "p50-c-noa-seed1",
    ]
    assert replicate_tags(tags, "p50-c-a") == {
        0: "p50-c-a",
        2: "p50-c-a-seed2",
        10: "p50-c-a-seed10",
    }
    assert replicate_tags(["p50-c-a-seed1"], "p50-c-a") == {}
    assert seeds_of(Namespace(seeds="2,0")) == [2, 0] and seeds_of(Namespace()) == [0]
    with pytest.raises(SystemExit, match="--seeds must include 0"):
        seeds_of(Namespace(seeds="1"))


@pytest.mark.parametrize(
    ("name", "folder"),
    [("sftp", "sftp"), ("fedspallm", "fedspallm"), ("fedtpa", "fedtpa"), ("fedtpa", "fedtpa-15")],
)
def test_committed_tables_are_their_archived_records_rendered(name: str, folder: str) -> None:
    """docs/runs/<grid>/tables.md is what the grid renders from the records archived beside it (the
    default cells, as `fedprune grid <grid> --render-only --out docs/runs/<grid> --archive none`
    writes it; the figures' section, which also draws the PNGs, follows the tables; with every seed
    replicate archived there, `--seeds`): a figure edited by hand, a record changed
    or lost, or a renderer changed without re-rendering fails here. fedtpa-15: the grid at the
    paper's 15 rounds, archived apart from the 4-round records (`--archive docs/runs/fedtpa-15`)."""
    from experiments.grids import collect_runs
    from experiments.grids.__main__ import GRIDS

    grid, out = GRIDS[name], ROOT / "docs" / "runs" / folder
    seeds = ",".join(
        map(
            str,
            sorted(
                {0}
                | {
                    int(p.name.rsplit("-seed", 1)[1])
                    for p in out.glob("*-seed*")
                    if p.name.rsplit("-seed", 1)[1].isdigit()
                }
            ),
        )
    )
    args = Namespace(
        only="", sparsity="0.5,0.6,0.7,0.8", seeds=seeds, alphas="0.5,1,inf", tags="", run_config=""
    )
    cells = grid.cells(args)
    rendered = grid.render(cells, collect_runs(grid, cells, out))
    committed = (out / "tables.md").read_text()
    assert committed.startswith(rendered), (
        f"re-render with: fedprune grid {name} --render-only --out "
        f"docs/runs/{folder} --archive none --seeds {seeds}"
    )


def test_grid_modules_import_each_other_without_cycles() -> None:
    """experiments/grids/<m>/: tables and figures each read the records and neither imports the
    other; no module of the grids imports one that imports it back (lazily inside a function
    included)."""
    import ast

    root = Path(__file__).resolve().parents[2]
    modules = {
        ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (root / "experiments" / "grids").rglob("*.py")
    }
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
        return any(
            n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph[start]
        )

    cycles = sorted(m for m in graph if reaches(m, m, set()))
    assert not cycles, cycles
    for grid in ("sftp", "fedtpa"):
        tables, figures = f"experiments.grids.{grid}.tables", f"experiments.grids.{grid}.figures"
        assert not reaches(tables, figures, set()) and not reaches(figures, tables, set())
        assert f"experiments.grids.{grid}.records" in graph[tables] & graph[figures]


def test_a_verdict_follows_its_interval() -> None:
    """held only when the claim holds over the whole 95% interval of Δ, not held when nowhere on it,
    unresolved when the interval straddles the margin or is missing; one not-held pair decides, a
    missing cell leaves it unchecked."""
    from experiments.grids import UNRESOLVED, decide, judge

    def gt(a: float, b: float) -> bool:
        return a > b

    def within_one(a: float, b: float) -> bool:
        return a >= b - 1.0

    assert (
        decide(gt, 52, 50, (0.5, 3.5, 100)) is True
        and decide(gt, 48, 50, (-3.5, -0.5, 100)) is False
    )
    assert decide(gt, 52, 50, (-0.5, 4.5, 100)) == UNRESOLVED
    assert decide(within_one, 49.5, 50, (-0.9, 0.1, 100)) is True
    assert decide(within_one, 49.5, 50, (-2.0, 1.0, 100)) == UNRESOLVED
    assert decide(within_one, 47, 50, (-4.0, -2.0, 100)) is False
    held, text = judge(
        [("a vs b", 52, 50, gt, (0.5, 3.5, 100)), ("c vs d", 52, 50, gt, (-0.5, 4.5, 100))]
    )
    assert held == UNRESOLVED and text == (
        "a vs b: 52.00 vs 50.00 (Δ +2.00 [0.50, 3.50], n = 100); "
        "c vs d: 52.00 vs 50.00 (Δ +2.00 [-0.50, 4.50], n = 100) ?"
    )
    assert judge([("a", 52, 50, gt)])[0] == UNRESOLVED  # a point comparison decides nothing
    assert (
        judge([("a", 52, 50, gt, (-0.5, 4.5, 9)), ("b", 40, 50, gt, (-12.0, -8.0, 9))])[0] is False
    )
    assert judge([("a", 52, 50, gt, (0.5, 3.5, 9)), ("b", None, 50, gt, None)])[0] is None
    assert judge([("a", 52, 50, gt, (0.5, 3.5, 9)), ("b", 53, 50, gt, (1.0, 5.0, 9))])[0] is True


def claim_lines(text: str) -> list[str]:
    return [
        line
        for line in text.split("## Claims")[1].split("## Communication")[0].splitlines()
        if line.startswith("- ")
    ]


def test_windowed_runs_decide_the_perplexity_claims_by_paired_intervals(tmp_path: Path) -> None:
    """With every window recorded the two perplexity claims are judged on paired intervals: a global
    model clearly below every standalone one and a gap that grows read held; the evidence names Δ,
    its interval and n."""
    cells = GRID.cells(args(sparsity="0.5,0.6"))
    runs = {
        "table1-s50": window_run(tmp_path, "table1-s50", 0.5, 30.0, [32.0, 33.0, 31.5, 32.5]),
        "table1-s60": window_run(tmp_path, "table1-s60", 0.6, 40.0, [48.0, 47.0, 49.0, 46.0]),
    }
    le, gap = claim_lines(GRID.render(cells, runs))[:2]
    assert (
        "**held**" in le
        and "table1 50% `wiki`: 30.00 vs 32.25 (Δ -2.25 [" in le
        and "n = 64)" in le
    )
    assert "**held**" in gap and "table1 60% vs 50%:" in gap


def test_a_difference_inside_the_noise_reads_unresolved_and_a_reversal_not_held(
    tmp_path: Path,
) -> None:
    cells = GRID.cells(args(sparsity="0.5,0.6"))
    noisy = {
        "table1-s50": window_run(
            tmp_path / "a", "table1-s50", 0.5, 30.0, [30.1, 30.2, 29.9, 30.0], noise=0.3
        ),
        "table1-s60": window_run(
            tmp_path / "a", "table1-s60", 0.6, 40.0, [40.2, 39.9, 40.1, 40.0], noise=0.3
        ),
    }
    le, gap = claim_lines(GRID.render(cells, noisy))[:2]
    assert "**unresolved**" in le and "**unresolved**" in gap
    worse = {
        "table1-s50": window_run(tmp_path / "b", "table1-s50", 0.5, 34.0, [30.0, 31.0, 30.5, 29.5]),
        "table1-s60": window_run(tmp_path / "b", "table1-s60", 0.6, 40.0, [48.0, 47.0, 49.0, 46.0]),
    }
    assert "**not held**" in claim_lines(GRID.render(cells, worse))[0]


def test_the_global_vs_standalone_interval_is_a_brute_force_paired_bootstrap(
    tmp_path: Path,
) -> None:
    """One run: Δ's interval is the percentile interval of ppl(global) − mean_k ppl(standalone_k),
    recomputed here from the recorded windows with the same resampled indices."""
    from experiments.grids.fedspallm.paired import ITERS, _stream, global_vs_standalone

    run = window_run(tmp_path, "table1-s50", 0.5, 30.0, [32.0, 31.0], noise=0.2)
    label, a, b, _, (lo, hi, n) = global_vs_standalone([run], "nyt", "x")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    fed = next(r for r in rows if r.get("round") == 1 and r["data"] == "nyt")
    std = [r for r in rows if r.get("model") == "standalone" and r["data"] == "nyt"]

    def ppl(row: dict, idx: np.ndarray) -> float:
        return math.exp(sum(row["window-nll"][i] for i in idx) / (100 * len(idx)))

    idx = np.random.default_rng(_stream(0, "nyt")).integers(0, 64, size=(ITERS, 64))
    diffs = [ppl(fed, i) - (ppl(std[0], i) + ppl(std[1], i)) / 2 for i in idx[:ITERS]]
    assert (lo, hi) == pytest.approx(tuple(np.percentile(diffs, [2.5, 97.5])), rel=1e-9)
    assert (a, b, n) == (
        pytest.approx(ppl(fed, np.arange(64))),
        pytest.approx((ppl(std[0], np.arange(64)) + ppl(std[1], np.arange(64))) / 2),
        64,
    )


def test_a_windowed_reversal_decides_beside_runs_without_windows(tmp_path: Path) -> None:
    """Re-run cells record windows while older ones of the same protocol do not: a windowed pair
    that refutes the claim makes it not held (one measured reversal refutes "at every sparsity"),
    naming its interval; windowed pairs that agree with the claim leave it unresolved, since the
    older runs decide nothing."""
    cells = GRID.cells(args(sparsity="0.5,0.6,0.7"))
    old = {
        "table1-s50": fake_run(tmp_path / "old", "table1-s50", 0.5, 30.0, 31.0, 1e6),
        "table1-s60": fake_run(tmp_path / "old", "table1-s60", 0.6, 40.0, 44.0, 1e6),
    }
    reversed_ = {
        **old,
        "table1-s70": window_run(tmp_path / "a", "table1-s70", 0.7, 70.0, [60.0, 61.0, 59.0, 60.0]),
    }
    le, gap = claim_lines(GRID.render(cells, reversed_))[:2]
    assert (
        "**not held**" in le
        and "decided by the runs that recorded their windows: table1 70% `wiki`: 70.00 vs "
        "60.00 (Δ +10.00 ["
        in le
        and "✗" in le
    )
    assert (
        "every run: 4/6 (setting, domain) pairs at the point estimates on 2,048 / 6,400 "
        "tokens per domain)" in le
    )
    assert (
        "**unresolved**" in gap and "decided by" not in gap
    )  # 60 -> 70% pairs a run without windows
    agreeing = {
        **old,
        "table1-s70": window_run(tmp_path / "b", "table1-s70", 0.7, 50.0, [60.0, 61.0, 59.0, 60.0]),
    }
    le = claim_lines(GRID.render(cells, agreeing))[0]
    assert "**unresolved**" in le and "decided by" not in le
    gap_reversal = {
        "table1-s50": fake_run(tmp_path / "c", "table1-s50", 0.5, 30.0, 31.0, 1e6),
        "table1-s60": window_run(tmp_path / "c", "table1-s60", 0.6, 30.0, [40.0, 40.0, 40.0, 40.0]),
        "table1-s70": window_run(tmp_path / "c", "table1-s70", 0.7, 50.0, [51.0, 51.0, 51.0, 51.0]),
    }
    gap = claim_lines(GRID.render(cells, gap_reversal))[1]
    assert "**not held**" in gap and "table1 70% vs 60%:" in gap and "✗" in gap


def test_replicates_pool_into_the_claim_and_count_their_windows(tmp_path: Path) -> None:
    cells = GRID.cells(args(sparsity="0.5", seeds="0,1"))
    runs = {
        "table1-s50": window_run(tmp_path, "table1-s50", 0.5, 30.0, [32.0, 33.0]),
        "table1-s50-seed1": window_run(
            tmp_path, "table1-s50-seed1", 0.5, 31.0, [33.0, 34.0], text_seed=1
        ),
    }
    text = GRID.render(cells, runs)
    assert "n = 128)" in claim_lines(text)[0] and "30.50 vs 33.00" in claim_lines(text)[0]
    assert text.count("| 50% | fedspallm |") == 1  # the tables show seed 0 only


def test_each_protocol_is_judged_apart(tmp_path: Path) -> None:
    """Tables 1–3 (each client on its own domain) and the paper's protocol get their own verdicts: a
    reversal under one does not decide the other."""
    cells = GRID.cells(args(only="table1,paper", sparsity="0.5"))
    runs = {
        "table1-s50": window_run(tmp_path, "table1-s50", 0.5, 34.0, [30.0, 31.0, 30.5, 29.5]),
        "paper-s50": window_run(tmp_path, "paper-s50", 0.5, 30.0, [32.0, 33.0, 31.5, 32.5]),
    }
    text = GRID.render(cells, runs)
    app, app_gap, paper = claim_lines(text)[:3]
    assert "**not checked** (cells missing) (fewer than two finished sparsities)" in app_gap
    assert (
        app.startswith("- Under this app's protocol")
        and "**not held**" in app
        and "paper" not in app
    )
    assert (
        paper.startswith("- Under the paper's protocol")
        and "**held**" in paper
        and "paper 50% `wiki`" in paper
    )
    assert "## The paper's protocol: 4 clients calibrate on IID shares" in text


def test_a_claim_at_every_sparsity_is_not_checked_while_a_sparsity_has_not_run(
    tmp_path: Path,
) -> None:
    cells = GRID.cells(args(only="paper", sparsity="0.5,0.6"))
    runs = {"paper-s50": window_run(tmp_path, "paper-s50", 0.5, 30.0, [32.0, 33.0, 31.5, 32.5])}
    le = claim_lines(GRID.render(cells, runs))[0]
    assert "**not checked**" in le and "paper 50% `wiki`: 30.00 vs 32.25 (Δ -2.25 [" in le
    assert "missing: paper 60%" in le


def test_the_gap_claim_is_not_checked_while_a_sparsity_of_its_group_has_not_run(
    tmp_path: Path,
) -> None:
    """Two finished sparsities give a paired gap comparison, but the claim spans the group's every
    sparsity: with 70% not run it reads not checked and names what is missing beside what was
    measured."""
    cells = GRID.cells(args(only="paper", sparsity="0.5,0.6,0.7"))
    runs = {
        "paper-s50": window_run(tmp_path, "paper-s50", 0.5, 30.0, [32.0, 33.0, 31.5, 32.5]),
        "paper-s60": window_run(tmp_path, "paper-s60", 0.6, 40.0, [48.0, 47.0, 49.0, 46.0]),
    }
    gap = claim_lines(GRID.render(cells, runs))[1]
    assert "**not checked**" in gap and "paper 60% vs 50%:" in gap and "missing: paper 70%" in gap
    cells = GRID.cells(args(only="paper", sparsity="0.5,0.6"))
    assert "**held**" in claim_lines(GRID.render(cells, runs))[1]


def test_mask_agreement_is_rendered_from_the_runs_that_recorded_it(tmp_path: Path) -> None:
    from experiments.grids import Cell
    from experiments.grids.fedspallm.tables import mask_agreement

    old = fake_run(tmp_path, "paper-s80", 0.8, 100.0, 110.0, 1e6)
    new = fake_run(tmp_path, "paper-s80-seed1", 0.8, 100.0, 110.0, 1e6)
    with (new / "metrics.jsonl").open("a") as f:
        for row in (
            {
                "round": 1,
                "phase": "server-aggregate",
                "global-kept-by": {"4": [0.0, 0.1, 0.2, 0.3, 0.4]},
            },
            {"phase": "fedspallm-mask-agreement", "global-vs-centralized": 0.625},
        ):
            f.write(json.dumps(row) + "\n")
    cells = [Cell("paper", "paper-s80", (), 4), Cell("paper", "paper-s80-seed1", (), 4)]
    runs = {"paper-s80": old, "paper-s80-seed1": new}
    lines = mask_agreement(cells, runs)
    assert [line for line in lines if line.startswith("| `")] == [
        "| `paper-s80-seed1` | 4 clients: 10.0 / 20.0 / 30.0 / 40.0 | 62.5% |"
    ]
    assert mask_agreement(cells[:1], {"paper-s80": old}) == []  # older records: no section at all


def test_seed_replicates_show_each_seeds_figures_side_by_side(tmp_path: Path) -> None:
    """One row per (cell, text): each seed's dense, global, standalone mean and centralized
    perplexity in seed order, and global − standalone in % of standalone; a replicate without a
    reference shows '–'; no section while no cell has a finished replicate."""
    from experiments.grids.fedspallm.tables import seed_replicates

    cells = GRID.cells(args(only="paper", sparsity="0.8", seeds="0,1,2"))
    runs = {"paper-s80": fake_run(tmp_path / "a", "paper-s80", 0.8, 110.0, 100.0, 1e6)}
    assert seed_replicates(cells, runs) == []
    runs["paper-s80-seed2"] = fake_run(tmp_path / "c", "paper-s80-seed2", 0.8, 90.0, 120.0, 1e6)
    summary = json.loads((runs["paper-s80-seed2"] / "summary.json").read_text())
    del summary["references"]["centralized"]
    (runs["paper-s80-seed2"] / "summary.json").write_text(json.dumps(summary))
    rows = [line for line in seed_replicates(cells, runs) if line.startswith("| `")]
    assert rows == [
        f"| `paper-s80` | `{x}` | 0 / 2 | 20.00 / 20.00 | 110.00 / 90.00 | 100.00 / 120.00 | "
        f"99.00 / – | +10.0 / -25.0 |"
        for x in SOURCES
    ]
    assert "## Seed replicates" in GRID.render(cells, runs)
