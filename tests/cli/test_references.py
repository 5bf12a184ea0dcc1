"""`fedprune run --references`: the floor / SFT-P / ceiling table from three runs' metrics.jsonl (no
Flower)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fedprune_cli.main import main
from fedprune_cli.references import (
    accuracy_interval,
    compare,
    floor_overrides,
    render,
    single_budget,
)


def _run(path: Path, rows: list[dict]) -> Path:
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _eval(rnd: int, client: int, ppl: float, acc: float, **extra: object) -> dict:
    return {
        "phase": "evaluate",
        "round": rnd,
        "client": client,
        "ppl": ppl,
        "acc": acc,
        "num-examples": 30,
        "status": "ok",
        "data": f"task-{client}",
        **extra,
    }


@pytest.fixture()
def runs(tmp_path: Path) -> dict[str, Path]:
    sftp = _run(
        tmp_path / "sftp",
        [
            _eval(0, 0, 100.0, 0.5),
            _eval(0, 1, 50.0, 0.4),
            _eval(2, 0, 90.0, 0.5, **{"kept-ratio-prunable": 0.81, "keep-target": 0.8}),
            _eval(2, 1, 60.0, 0.2, **{"kept-ratio-prunable": 0.79, "keep-target": 0.8}),
            {
                "phase": "evaluate",
                "round": 2,
                "client": 1,
                "status": "failed",
            },  # a failed reply is not a score
            {"phase": "compiled", "model": "dense", "prefill-speedup": 1.0},
            {
                "phase": "compiled",
                "model": "client 0",
                "prefill-speedup": 1.15,
                "prefill-ceiling": 1.2,
            },
            {
                "phase": "compiled",
                "model": "client 1",
                "prefill-speedup": 1.1,
                "prefill-ceiling": 1.21,
            },
        ],
    )
    ceiling = _run(
        tmp_path / "ceiling",
        [
            _eval(0, 0, 100.0, 0.5),
            _eval(0, 1, 50.0, 0.4),
            _eval(2, 0, 75.0, 0.6),
            _eval(2, 1, 40.0, 0.5),
        ],
    )
    floor = _run(
        tmp_path / "floor",
        [
            _eval(0, 0, 100.0, 0.5),
            _eval(0, 1, 50.0, 0.4),
            _eval(1, 0, 400.0, 0.3, **{"kept-ratio-prunable": 0.8}),
            _eval(1, 1, 300.0, 0.3, **{"kept-ratio-prunable": 0.8}),
        ],
    )
    return {"sftp": sftp, "ceiling": ceiling, "floor": floor}


def test_each_column_comes_from_the_right_run_and_round(runs: dict[str, Path]) -> None:
    rows = compare(runs["sftp"], runs["ceiling"], runs["floor"])
    assert [r["client"] for r in rows] == [0, 1]
    r0, r1 = rows
    assert (r0["ppl-untouched"], r0["ppl-floor"], r0["ppl-sftp"], r0["ppl-ceiling"]) == (
        100.0,
        400.0,
        90.0,
        75.0,
    )
    assert (r1["acc-untouched"], r1["acc-floor"], r1["acc-sftp"], r1["acc-ceiling"]) == (
        0.4,
        0.3,
        0.2,
        0.5,
    )
    assert r0["ratio-to-ceiling"] == pytest.approx(90 / 75) and r1[
        "ratio-to-ceiling"
    ] == pytest.approx(60 / 40)
    assert (r0["kept"], r1["kept"], r0["floor-kept"]) == (0.81, 0.79, 0.8)
    assert (r0["prefill-speedup"], r0["prefill-ceiling"]) == (1.15, 1.2)


def test_accuracy_interval_is_the_binomial_normal_approximation() -> None:
    lo, hi = accuracy_interval(0.4, 30)
    half = 1.96 * math.sqrt(0.4 * 0.6 / 30)
    assert (lo, hi) == pytest.approx((0.4 - half, 0.4 + half))
    assert accuracy_interval(1.0, 30) == (1.0, 1.0)


def test_the_table_counts_the_clients_that_meet_the_goal(runs: dict[str, Path]) -> None:
    rows = compare(runs["sftp"], runs["ceiling"], runs["floor"])
    text = render(rows, runs)
    assert "at or below the untouched answer perplexity: 1 of 2" in text  # 90 <= 100, 60 > 50
    # client 1's accuracy 0.2 is below 0.4's lower bound (0.225); client 0's 0.5 is not
    assert "accuracy not below the untouched model's interval: 1 of 2" in text
    assert "| 0 | task-0 | 0.810 (0.80) | 100.00 | 400.00 | 90.00 | 75.00 | 1.20× |" in text


def test_render_only_rewrites_the_record(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "run",
                "--references",
                "--render",
                str(runs["sftp"]),
                str(runs["ceiling"]),
                str(runs["floor"]),
            ]
        )
        == 0
    )
    record = json.loads((runs["sftp"] / "references.json").read_text())
    assert [r["client"] for r in record["rows"]] == [0, 1]
    assert (runs["sftp"] / "references.md").read_text() in capsys.readouterr().out


def test_a_non_sftp_preset_is_refused_before_any_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--references", "--run-config", "conf/fedit.toml"]) == 2
    assert "'method' = 'sftp'" in capsys.readouterr().err


def test_the_floor_is_llmpruners_cut_at_the_one_budget(capsys: pytest.CaptureFixture[str]) -> None:
    """The floor runs LLM-Pruner's round 1 at SFT-P's p; mixed budgets have no one floor and are
    refused."""
    from fedprune_cli.launch import APP_DIR, merged_config

    floor = floor_overrides(single_budget({"keep-ratios": "0.8,0.8"}))
    config = merged_config(APP_DIR, ["conf/sftp.toml", floor])
    assert (config["method"], config["llmpruner-keep-ratio"], config["num-server-rounds"]) == (
        "llmpruner",
        0.8,
        1,
    )
    assert config["eval-untouched"] is False and config["server-eval-data"] == ""
    assert (
        main(
            [
                "run",
                "--references",
                "--run-config",
                "conf/sftp.toml",
                "--run-config",
                "keep-ratios='0.8,0.8,0.5,0.5'",
            ]
        )
        == 2
    )
    assert "single keep ratio" in capsys.readouterr().err


def test_the_floor_run_is_not_warned_about_being_what_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The floor is LLM-Pruner's post hoc cut on purpose (one round): `fedprune run --references`
    neither prints the one-round warning before the start nor asks the floor's launch to; the SFT-P
    run keeps its own warnings; the three runs go in order."""
    from fedprune_cli import launch, references

    calls: list[tuple[str, bool]] = []

    def fake_launch(
        run_configs: list[str], federation: str, timeout: float = 0, advise: bool = True
    ) -> launch.Launched:
        name = (
            "floor"
            if any("post-hoc" in c for c in run_configs)
            else ("ceiling" if any("ceiling" in c for c in run_configs) else "sftp")
        )
        calls.append((name, advise))
        return launch.Launched(0, tmp_path / name, 0, "finished:completed")

    monkeypatch.setattr(launch, "launch", fake_launch)
    monkeypatch.setattr(references, "write", lambda dirs, seconds=None: "the table")
    assert main(["run", "--references", "--run-config", "conf/sftp.toml"]) == 0
    assert calls == [("sftp", True), ("ceiling", False), ("floor", False)]
    assert "num-server-rounds = 1" not in capsys.readouterr().err
