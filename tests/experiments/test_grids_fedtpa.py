"""FedTPA's grid: cells from the presets, Tables II–IV and claims from synthetic run directories,
figures, and the evaluation-once setting of the presets (no Ray)."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest

from experiments.grids.__main__ import main
from experiments.grids.fedtpa import GRID
from experiments.grids.fedtpa.cells import PRESETS
from experiments.grids.fedtpa.figures import FIG4, FIG5
from fedprune_app.core.config import RunConfig
from fedprune_app.methods.fedtpa.config import FedTPAConfig
from fedprune_cli.launch import merged_config

ROOT = Path(__file__).resolve().parents[2]
GOOD = {
    "fedit": 0.25,
    "flexlora": 0.27,
    "fedtpa": 0.30,
    "fedavg": 0.28,
    "no-itpa": 0.29,
    "no-dapr": 0.285,
}


def args(only: str = "", alphas: str = "0.5,1,inf") -> Namespace:
    return Namespace(only=only, alphas=alphas)


def fake_run(out: Path, cell, rouge: float, rounds: int = 2, final_eval: bool = True) -> Path:
    """A run directory as a FedIT / FlexLoRA / FedTPA run leaves it (only the files the grid reads):
    round 0 is evaluated by client 3, the last round by client 4 (one client evaluates; which one
    changes)."""
    method = cell.settings["method"]
    run = out / f"20260101-000000-{method}-{cell.tag}"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"method": method, "num-server-rounds": rounds}))
    (run / "summary.json").write_text(json.dumps({"status": "completed"}))
    rows = [
        {"round": 0, "phase": "evaluate", "client": 3, "status": "ok", "rouge-l": 0.05, "ppl": 9.0}
    ]
    for t in range(1, rounds + 1):
        for c in range(5):
            row = {
                "round": t,
                "phase": "train",
                "client": c,
                "status": "accepted",
                "bytes-up": 1000.0 * (c + 1),
                "bytes-down": 4000.0,
                "train-loss": 2.0 - 0.1 * t + 0.01 * c,
                "val-loss": 2.2 - 0.05 * t,
            }
            rows.append(row | ({"beta": 0.25 + 0.1 * c + 0.01 * t} if method == "fedtpa" else {}))
    rows.append({"round": 1, "phase": "train", "client": 0, "status": "rejected", "bytes-up": 9e9})
    if final_eval:
        rows.append(
            {"round": rounds, "phase": "evaluate", "client": 4, "status": "ok", "rouge-l": rouge}
        )
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def score(cell, table: dict[str, float]) -> float:
    return table[cell.settings["variant"] or cell.settings["method"]]


def runs_for(
    tmp: Path, cells, table: dict[str, float], skip: tuple[str, ...] = ()
) -> dict[str, Path]:
    return {c.tag: fake_run(tmp, c, score(c, table)) for c in cells if c.tag not in skip}


def claims_of(text: str) -> list[str]:
    return [
        line
        for line in text.split("## Claims")[1].split("\n## ")[0].splitlines()
        if line.startswith("- ")
    ]


def test_cells_use_valid_presets_once_each() -> None:
    cells = GRID.cells(args())
    tags = [c.tag for c in cells]
    assert (
        len(tags) == len(set(tags)) == 14
    )  # 9 Table II + 3 FedAvg + 2 ablations: no duplicate run
    assert tags[:3] == ["a0.5-fedit", "a0.5-flexlora", "a0.5-fedtpa"]
    assert {
        "a0.5-fedtpa-fedavg",
        "a0.5-fedtpa-no-itpa",
        "a0.5-fedtpa-no-dapr",
        "ainf-fedtpa-fedavg",
    } <= set(tags)
    assert next(c for c in cells if c.tag == "a0.5-fedtpa").settings["groups"] == (
        "table2",
        "table3",
        "table4",
        "comm",
    )
    for cell in (
        cells
    ):  # every cell's merged config validates, on the method's preset, 5 clients waited for
        cfg = RunConfig.from_flower(merged_config(ROOT, list(cell.run_config)))
        s = cell.settings
        assert cfg.method == s["method"] and cell.supernodes == cfg.min_nodes == 5
        assert cfg.partitioner == ("iid" if s["alpha"] == float("inf") else "dirichlet")
        if cfg.partitioner == "dirichlet":
            assert cfg.dirichlet_alpha == s["alpha"]
        tpa = cfg.section(FedTPAConfig)
        assert (tpa.fedtpa_lcwa, tpa.fedtpa_itpa, tpa.fedtpa_dapr) == (
            s["variant"] != "fedavg",
            s["variant"] != "no-itpa",
            s["variant"] != "no-dapr",
        )
        assert cfg.fraction_evaluate == 0.2


def test_only_selects_groups_with_the_cells_they_read() -> None:
    assert [c.tag for c in GRID.cells(args("table4"))] == [
        "a0.5-fedtpa",
        "a0.5-fedtpa-no-itpa",
        "a0.5-fedtpa-no-dapr",
        "a0.5-fedtpa-fedavg",
    ]
    assert [c.tag for c in GRID.cells(args("comm", "0.5"))] == [
        "a0.5-fedit",
        "a0.5-flexlora",
        "a0.5-fedtpa",
    ]
    assert [c.tag for c in GRID.cells(args("table3", "1"))] == ["a1-fedtpa", "a1-fedtpa-fedavg"]
    with pytest.raises(SystemExit, match="unknown group"):
        GRID.cells(args("table1"))


def test_presets_share_data_rounds_steps_and_evaluation() -> None:
    """The three presets differ only in their method keys: a fair comparison."""
    configs = {m: merged_config(ROOT, [p]) for m, p in PRESETS.items()}
    own = {"method", "flexlora-ranks", "fedtpa-warmup-steps", "fedtpa-feature-examples"}
    keys = set().union(*configs.values()) - own
    assert all(configs["fedtpa"].get(k) == configs[m].get(k) for m in PRESETS for k in keys)
    # the paper's 15 rounds, Rouge-L on >= 100 examples, and the curve every 5 rounds
    assert configs["fedtpa"]["num-server-rounds"] == 15 and configs["fedtpa"]["local-steps"] == 6
    assert configs["fedtpa"]["test-examples"] >= 100 and configs["fedtpa"]["eval-every"] == 5


def test_tables_and_claims_held(tmp_path: Path) -> None:
    cells = GRID.cells(args())
    text = GRID.render(cells, runs_for(tmp_path, cells, GOOD))
    assert (
        "| 0.5 | 25.00 | 27.00 | 30.00 | 5.00 |" in text
        and "| inf | 25.00 | 27.00 | 30.00 | 5.00 |" in text
    )
    assert "| 1 | 30.00 | 28.00 (-2.00) |" in text
    assert "| DAPR + LCWA (−ITPA) | 29.00 (-1.00) |" in text
    assert "| ITPA + DAPR (−LCWA, FedAvg) | 28.00 (-2.00) |" in text
    lines = claims_of(
        text
    )  # in-run Rouge-L has no per-example scores, so no interval: nothing is decided
    assert len(lines) == 3 and all("**unresolved**" in line for line in lines), lines
    assert "α=1 FedTPA vs FlexLoRA: 30.00 vs 27.00 (Δ +3.00, no interval) ?" in lines[0]
    # communication: the mean over accepted train replies (the rejected 9 GB row is not counted),
    # per client
    assert "| FedTPA | 0.5 | 3.0 | 1.0 · 2.0 · 3.0 · 4.0 · 5.0 | 4.0 |" in text


def test_curve_over_the_evaluated_rounds(tmp_path: Path) -> None:
    """Runs evaluated only at round 0 and their last get no curve section (Table II has both); a run
    evaluated every 5 of 15 rounds gets its row, each round's mean over the evaluating clients, and
    its last change."""
    cells = [c for c in GRID.cells(args(only="table2", alphas="0.5"))]
    runs = runs_for(tmp_path, cells, GOOD)
    assert "Rouge-L by evaluated round" not in GRID.render(cells, runs)
    tpa = next(c for c in cells if c.tag == "a0.5-fedtpa")
    run = fake_run(tmp_path / "curve", tpa, 0.30, rounds=15)
    with (run / "metrics.jsonl").open("a") as f:
        for t, values in ((5, (0.10, 0.20)), (10, (0.26,)), (10, (float("nan"),))):
            for v in values:
                f.write(
                    json.dumps(
                        {"round": t, "phase": "evaluate", "client": 4, "status": "ok", "rouge-l": v}
                    )
                    + "\n"
                )
        f.write(
            json.dumps(
                {"round": 10, "phase": "evaluate", "client": 2, "status": "failed", "rouge-l": 0.9}
            )
            + "\n"
        )
    text = GRID.render(cells, runs | {tpa.tag: run})
    section = text.split("## Rouge-L by evaluated round (in-run)")[1].split("\n## ")[0]
    assert "| cell | round 0 | round 2 | round 5 | round 10 | round 15 | last change |" in section
    assert "| a0.5-fedtpa | 5.00 | – | 15.00 | nan |" not in section
    assert "| a0.5-fedit | 5.00 | 25.00 | – | – | – | +20.00 |" in section
    assert "| a0.5-fedtpa | 5.00 | – | 15.00 | 26.00 | 30.00 | +4.00 |" in section, section


def rescore_constant(
    runs: dict[str, Path], cells, table: dict[str, float], examples: int = 40
) -> None:
    """rescore.json with every example of a cell scoring the cell's in-run score: every paired Δ is
    a constant shift, so its interval has zero width and decides the claim."""
    for c in cells:
        (runs[c.tag] / "rescore.json").write_text(
            json.dumps({"scores": [table[c.tag]] * examples, "examples": examples})
        )


def test_claims_not_held(tmp_path: Path) -> None:
    cells = GRID.cells(args())
    bad = GOOD | {"no-dapr": 0.31}
    acc = {c.tag: 0.20 if c.tag == "a1-fedtpa" else score(c, bad) for c in cells}
    runs = {c.tag: fake_run(tmp_path, c, acc[c.tag]) for c in cells}
    rescore_constant(runs, cells, acc)
    rescored = GRID.render(cells, runs).split("## Claims (re-scored)")[1].split("\n## ")[0]
    lines = [line for line in rescored.splitlines() if line.startswith("- ")]
    assert all("**not held**" in line for line in lines), lines
    assert "α=1 FedTPA vs FedIT: 20.00 vs 25.00 (Δ -5.00 [-5.00, -5.00], n = 40) ✗" in lines[0]
    assert "α=1 FedAvg vs LCWA: 28.00 vs 20.00 (Δ +8.00 [8.00, 8.00], n = 40) ✗" in lines[1]
    assert "−DAPR vs full: 31.00 vs 30.00 (Δ +1.00 [1.00, 1.00], n = 40) ✗" in lines[2]
    assert "−ITPA vs full: 29.00 vs 30.00 (Δ -1.00 [-1.00, -1.00], n = 40);" in lines[2]


def test_missing_cells_are_not_checked_never_invented(tmp_path: Path) -> None:
    cells = GRID.cells(args())
    runs = runs_for(tmp_path, cells, GOOD, skip=("a1-flexlora", "a0.5-fedtpa-no-itpa"))
    no_final = next(
        c for c in cells if c.tag == "ainf-fedtpa-fedavg"
    )  # ran, but its last round has no evaluation
    runs[no_final.tag] = fake_run(tmp_path / "b", no_final, 0.99, final_eval=False)
    text = GRID.render(cells, runs)
    assert "| 1 | 25.00 | – | 30.00 | 5.00 |" in text and "| inf | 30.00 | – |" in text
    assert "- `a1-flexlora`: not run" in text and "| FlexLoRA | 1 | *not run* | | |" in text
    lines = claims_of(text)
    assert all("**not checked**" in line for line in lines), lines
    assert "missing: α=1 FedTPA vs FlexLoRA" in lines[0] and "missing: −ITPA vs full" in lines[2]
    assert "99.00" not in text


def test_rescored_runs_get_their_own_tables_intervals_and_claims(tmp_path: Path) -> None:
    """rescore.json (fedprune_cli/rescore_rouge.py) adds re-scored tables: means of the per-example
    scores, bootstrap intervals, paired Δ intervals, and claims judged on those means (here FedIT
    wins at α = 1 only re-scored)."""
    cells = GRID.cells(args())
    runs = runs_for(tmp_path, cells, GOOD)
    text = GRID.render(cells, runs)
    assert "Re-scored" not in text and len(claims_of(text)) == 3
    for c in cells:
        base = score(c, GOOD) + (0.1 if c.tag == "a1-fedit" else 0.0)
        scores = [base + 0.05 * ((i % 5) - 2) for i in range(40)]  # mean = base
        (runs[c.tag] / "rescore.json").write_text(json.dumps({"scores": scores, "examples": 40}))
    text = GRID.render(cells, runs)
    assert "# Re-scored on 40 unused examples" in text
    rescored = text.split("# Re-scored")[1]
    assert "| 1 | 35.00 [" in rescored  # FedIT at α = 1: 0.25 + 0.1, with its interval
    # a paired Δ of a constant shift has a zero-width interval: FedAvg − LCWA = −0.02 on every
    # example
    assert "| 0.5 | 30.00 | 28.00 (-2.00 [-2.00, -2.00]) |" in rescored
    first, second = (
        claims_of(text),
        [
            line
            for line in rescored.split("## Claims (re-scored)")[1].splitlines()
            if line.startswith("- ")
        ],
    )
    assert "**unresolved**" in first[0] and "**not held**" in second[0]
    assert "α=1 FedTPA vs FedIT: 30.00 vs 35.00 (Δ -5.00 [-5.00, -5.00], n = 40) ✗" in second[0]
    assert "**held**" in second[1] and "**held**" in second[2]


def test_figures_are_drawn_next_to_the_tables(tmp_path: Path) -> None:
    cells = GRID.cells(args())
    runs = runs_for(tmp_path / "runs", cells, GOOD)
    section = GRID.figures(cells, runs, tmp_path / "out")
    for name in (FIG4, FIG5):
        assert (tmp_path / "out" / name).stat().st_size > 5000 and f"`{name}`" in section
    assert "β per client and round, α = 0.5:" in section and "| 4 | 0.660 | 0.670 |" in section
    empty = GRID.figures(cells, {}, tmp_path / "none")
    assert "Not drawn" in empty and not (tmp_path / "none" / FIG4).exists()


def test_command_renders_finished_runs_of_every_method(tmp_path: Path, capsys) -> None:
    """`--render-only` finds the FedIT / FlexLoRA cells under their own run-directory names;
    `--tags` and `--run-config` narrow and extend the cells."""
    cells = GRID.cells(args("table2", "0.5"))
    runs_for(tmp_path, cells, GOOD)
    archive = tmp_path / "archive"
    code = main(
        [
            "fedtpa",
            "--only",
            "table2",
            "--alphas",
            "0.5",
            "--out",
            str(tmp_path),
            "--render-only",
            "--archive",
            str(archive),
        ]
    )
    text = (tmp_path / "tables.md").read_text()
    assert (
        code == 0
        and "| 0.5 | 25.00 | 27.00 | 30.00 | 5.00 |" in text
        and (tmp_path / FIG5).is_file()
    )
    assert f"`{FIG4}`" in text
    # the archived records alone render the same table
    assert (
        main(
            [
                "fedtpa",
                "--only",
                "table2",
                "--alphas",
                "0.5",
                "--out",
                str(archive),
                "--render-only",
                "--archive",
                "none",
            ]
        )
        == 0
    )
    assert "| 0.5 | 25.00 | 27.00 | 30.00 | 5.00 |" in (archive / "tables.md").read_text()
    code = main(
        [
            "fedtpa",
            "--alphas",
            "0.5",
            "--tags",
            "a0.5-fedit",
            "--run-config",
            "model-name='x'",
            "--out",
            str(tmp_path / "one"),
            "--render-only",
            "--archive",
            "none",
        ]
    )
    assert code == 1 and "- `a0.5-fedit`: not run" in (tmp_path / "one" / "tables.md").read_text()
    with pytest.raises(SystemExit, match="no cell"):
        main(
            [
                "fedtpa",
                "--tags",
                "a9-fedit",
                "--out",
                str(tmp_path / "x"),
                "--render-only",
                "--archive",
                "none",
            ]
        )
    assert (
        main(
            [
                "fedspallm",
                "--only",
                "table1",
                "--sparsity",
                "0.5",
                "--out",
                str(tmp_path / "s"),
                "--render-only",
                "--archive",
                "none",
            ]
        )
        == 1
    )  # the FedSpaLLM grid is unchanged (nothing to render here)
    capsys.readouterr()


def test_presets_evaluate_the_shared_global_test_split_once(flower_ids: None) -> None:
    """Every client of the presets' data holds the same global test split, so one evaluating client
    (of 5) gives the run's Rouge-L: the presets' fraction-evaluate sends exactly one evaluate
    message per round."""
    from flwr.app import ArrayRecord, ConfigRecord

    from fedprune_app.core.strategy import FederatedStrategy
    from fedprune_app.llm.data import client_data

    cfg = RunConfig.from_flower(merged_config(ROOT, [PRESETS["fedtpa"]]))
    clients = [client_data(cfg, p, 5) for p in range(5)]
    assert all(c.test == clients[0].test and c.eval_source == "instructions" for c in clients)
    assert (
        len(clients[0].test) == 100 and len({len(c.train) for c in clients}) > 1
    )  # non-IID shares, one test set

    class Nodes:
        def get_node_ids(self) -> list[int]:
            return [11, 12, 13, 14, 15]

    strategy = FederatedStrategy(cfg)
    for server_round in (0, 5, 10, 15):  # eval-every = 5: the Rouge-L curve; no evaluation between
        assert (
            len(
                list(
                    strategy.configure_evaluate(
                        server_round, ArrayRecord(), ConfigRecord(), Nodes()
                    )
                )
            )
            == 1
        )
    assert not list(strategy.configure_evaluate(4, ArrayRecord(), ConfigRecord(), Nodes()))
