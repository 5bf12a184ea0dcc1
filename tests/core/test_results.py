"""The run directory: summary, results.md and plots from the logged rows (every phase, references
too), and the broken-model flags."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedprune_app.core.config import RunConfig
from fedprune_app.report.plots import plot_series
from fedprune_app.report.run import ReportedRun as RunDirectory
from fedprune_app.report.tables import broken_models, short_name

DOC = "see docs/methods/sftp.md#known-limits"
WIKIHOW = "bigbench:goal_step_wikihow/step_inference"


def _run(tmp_path: Path, **keys: Any) -> RunDirectory:
    return RunDirectory.create(RunConfig.from_flower({"output-dir": str(tmp_path), **keys}))


def _eval(client: int, rnd: int, data: str, **scores: float) -> dict[str, Any]:
    """A client's evaluate row; `acc_chance=` etc. stand for the `acc-chance` keys."""
    return {
        "round": rnd,
        "phase": "evaluate",
        "client": client,
        "data": data,
        "status": "ok",
        **{k.replace("_", "-") if k != "acc_norm" else k: v for k, v in scores.items()},
    }


def test_finish_writes_everything_from_the_rows(tmp_path: Path) -> None:
    run = _run(tmp_path, method="fedit", **{"run-tag": "t"})
    assert run.path.name.endswith("-fedit-t") and (run.path / "config.json").is_file()
    for rnd, acc in ((0, 0.25), (2, 0.75)):
        run.log(_eval(0, rnd, "src", acc=acc, ppl=9.0 - rnd))
    run.log(
        {
            "round": 0,
            "phase": "evaluate",
            "client": None,
            "status": "failed",
            "node": 5,
            "problem": "boom",
        }
    )
    run.log(
        {
            "round": 1,
            "phase": "train",
            "client": 0,
            "train-loss": 1.5,
            "status": "accepted",
            "node": 4,
        }
    )
    for rnd in (0, 2):
        run.log({"round": rnd, "phase": "server-evaluate", "data": "wiki", "ppl": 20.0 + rnd})
    run.log({"phase": "reference", "model": "random", "data": "wiki", "ppl": 1e6})
    for client, ppl in ((0, 30.0), (1, 50.0)):  # built by each client: one row each, mean reported
        run.log(
            {
                "phase": "reference",
                "model": "standalone",
                "client": client,
                "data": "wiki",
                "ppl": ppl,
            }
        )
    run.log(
        {
            "phase": "reference",
            "model": "standalone",
            "node": 9,
            "status": "failed",
            "problem": "oom",
        }
    )
    summary = run.finish("completed")
    assert summary["status"] == "completed" and summary["clients"][0]["acc/untouched"] == 0.25
    assert summary["clients"][0]["acc/tuned"] == 0.75 and len(summary["dropped-replies"]) == 2
    assert summary["references"] == {
        "random": {"wiki": 1e6},
        "standalone": {"wiki": 40.0, "clients": 2},
    }
    assert summary["warnings"] == []
    written = json.loads((run.path / "summary.json").read_text())
    assert written["server"]["2"] == {"ppl `wiki`": 22.0}
    text = (run.path / "results.md").read_text()
    # rows that carry no n: no interval
    assert "| 0 | `src` | accuracy | – | 0.250 | – | 0.750 | – |" in text
    assert "|  |  | perplexity | – | 9.000 | – | 7.000 | – |" in text
    assert "Per client (2 clients), each on its own test split" in text  # node 5 never said its id
    assert (
        "| node 5 ⚠ stale: never scored, failed in round 0 | – | – | – | – | – | failed | – |"
        in text
    )
    assert "Broken models" not in text and "2 client replies failed" in text
    assert "| random | 1000000.00 | – |" in text
    assert "| standalone (mean of 2 clients) | 40.00 | – |" in text
    plots = {p.name for p in (run.path / "plots").glob("*.png")}
    assert plots >= {"evaluate-acc.png", "train-loss.png", "server-evaluate-ppl.png"}
    assert len((run.path / "metrics.jsonl").read_text().splitlines()) == 10


def test_a_server_evaluated_run_claims_no_clients(tmp_path: Path) -> None:
    """FedSpaLLM evaluates only on the server: results.md must not speak of '0 clients' or
    per-client scores."""
    run = _run(tmp_path, method="fedspallm")
    for rnd in (0, 1):
        run.log({"round": rnd, "phase": "server-evaluate", "data": "wiki", "ppl": 20.0 + rnd})
    run.finish("completed")
    text = (run.path / "results.md").read_text()
    assert text.startswith(f"# fedspallm: {run.cfg.num_server_rounds} rounds, model `")
    assert "0 clients" not in text and "Per client" not in text
    assert "No federated (client-side) evaluation" in text and "| 1 | 21.00 | – |" in text


def test_every_score_has_its_n_and_interval_and_every_term_its_definition(tmp_path: Path) -> None:
    run = _run(tmp_path, method="fedit", **{"num-server-rounds": 1})
    for rnd, acc in ((0, 0.5), (1, 0.625)):
        run.log(
            _eval(
                1,
                rnd,
                WIKIHOW,
                acc=acc,
                acc_n=8.0,
                acc_chance=0.25,
                ppl=9.0,
                ppl_n=8.0,
                ppl_lo=7.0,
                ppl_hi=12.0,
            )
        )
        run.log(
            {
                "round": rnd,
                "phase": "server-evaluate",
                "data": "squad_shifts:squaddev",
                "ppl": 30.0,
                "ppl-tokens": 1023.0,
                "ppl-lo": 25.0,
                "ppl-hi": 36.0,
                "window-nll": [1.0] * 4,
                "window-tokens": [256, 256, 256, 255],
            }
        )
    run.finish("completed")
    text = (run.path / "results.md").read_text()
    assert text.startswith("# fedit: 1 round, model `")
    assert "Every score has its sample size n and its 95% interval" in text.splitlines()[2]
    assert (
        "| client | data | score | n | untouched | 95% interval | fedit (round 1) | 95% interval |"
    ) in text
    # the Wilson intervals of 4/8 and 5/8; the perplexity's bootstrap interval as logged
    assert (
        f"| 1 | `{WIKIHOW}` | accuracy (chance 0.250) | 8 | 0.500 | [0.215, 0.785] | 0.625 | "
        "[0.306, 0.863] |"
    ) in text
    assert "|  |  | perplexity | 8 | 9.000 | [7.000, 12.00] | 9.000 | [7.000, 12.00] |" in text
    assert (
        "| round | ppl `squad_shifts:squaddev` (n = 4 windows, 1023 tokens) | 95% interval |"
    ) in text
    assert "| 1 | 30.00 | [25.00, 36.00] |" in text
    for term in (
        "- untouched: the base model before any training (round 0).",
        "- fedit (round 1): ",
        "- accuracy: the share of test questions",
        "- chance: the accuracy of guessing",
        "- perplexity: exp(mean negative log-likelihood",
        "- n: test examples scored",
        "- 95% interval: ",
        "- round 0: the untouched base model",
    ):
        assert term in text, term


def test_broken_models_flag_perplexity_above_twice_the_untouched_and_accuracy_below_chance() -> (
    None
):
    """One line per broken model; 'more than 2x' is strict (exactly 2x is no flag) and 'below
    chance' means the accuracy's whole 95% Wilson interval: 0.300 of 30 at chance 1/3 is noise,
    0.050 of 60 is not; an accuracy without its n decides nothing."""
    third = {"acc_chance": 1 / 3, "acc_n": 30.0}
    records = [
        _eval(0, 0, "bigbench:social_iqa", ppl=10.0, acc=0.5, **third),
        _eval(0, 3, "bigbench:social_iqa", ppl=20.0, acc=1 / 3, **third),  # 2x, at chance
        _eval(1, 0, WIKIHOW, ppl=10.0, acc=0.5, acc_chance=0.25),
        _eval(1, 3, WIKIHOW, ppl=20.1, acc=0.26, acc_chance=0.25),
        _eval(2, 0, "bigbench:logical_deduction/three_objects", ppl=37.2, acc=0.5, **third),
        _eval(2, 3, "bigbench:logical_deduction/three_objects", ppl=1.5e10, acc=0.3, **third),
        _eval(3, 0, "/data/mine.jsonl", ppl=10.0, acc=0.5, acc_chance=0.5),
        _eval(3, 3, "/data/mine.jsonl", ppl=5.0, acc=0.05, acc_n=60.0, acc_chance=0.5),
        _eval(5, 0, "/data/mine.jsonl", ppl=10.0, acc=0.5, acc_chance=0.5),
        _eval(5, 3, "/data/mine.jsonl", ppl=5.0, acc=0.05, acc_chance=0.5),  # no n: no verdict
        _eval(4, 0, "bigbench:social_iqa", ppl=1.0),  # scored untouched only: nothing to judge
        {"round": 3, "phase": "evaluate", "client": None, "status": "failed", "problem": "oom"},
        {"round": 0, "phase": "server-evaluate", "data": "squad_shifts:squaddev", "ppl": 30.0},
        {"round": 3, "phase": "server-evaluate", "data": "squad_shifts:squaddev", "ppl": 61.0},
        {"round": 0, "phase": "server-evaluate", "data": "ppl:wikitext2", "ppl": 30.0},
        {"round": 3, "phase": "server-evaluate", "data": "ppl:wikitext2", "ppl": 59.0},
        {"phase": "compiled", "model": "dense", "ppl/squad_shifts:squaddev": 30.0},
        {"phase": "compiled", "model": "client 0", "ppl/squad_shifts:squaddev": 60.0},
        {"phase": "compiled", "model": "client 1", "ppl/squad_shifts:squaddev": float("nan")},
    ]
    broken = "— this model is broken; " + DOC
    assert broken_models(records, "sftp") == [
        "⚠ client 1 (goal_step_wikihow): test perplexity 20.1 is 2.01× the untouched model's 10 "
        + broken,
        "⚠ client 2 (logical_deduction): test perplexity 1.5e10 is 4e8× the untouched model's "
        "37.2 " + broken,
        "⚠ client 3 (mine): accuracy 0.050 [0.017, 0.137] (n = 60) is below chance 0.500 " + broken,
        "⚠ the global model after round 3: perplexity of the server's text `squaddev` 61 is "
        "2.03× the untouched model's 30 " + broken,
    ]
    # a threshold of 3x keeps only what is above it
    assert [f.split(":")[0] for f in broken_models(records, "sftp", ratio=3.0)] == [
        "⚠ client 2 (logical_deduction)",
        "⚠ client 3 (mine)",
    ]
    # compiled models are judged on the server's text only where no client judged its own model
    compiled = [r for r in records if r.get("phase") == "compiled"]
    # client 0 at exactly 2x is no flag
    assert broken_models(compiled, "sftp") == [
        "⚠ compiled model `client 1`: perplexity of the server's text `squaddev` is nan (the "
        "untouched model's 30) " + broken
    ]


def test_a_labelled_server_model_is_not_judged_and_a_healthy_run_has_no_flag(
    tmp_path: Path,
) -> None:
    """A server row whose strategy says it scored no one's model (`model`) is left to the compiled
    rows."""
    labelled = [
        {"round": r, "phase": "server-evaluate", "data": "d", "ppl": p, "model": "no client's"}
        for r, p in ((0, 10.0), (2, 1e6))
    ]
    assert broken_models(labelled, "sftp") == []
    run = _run(tmp_path, method="fedit")
    run.log(_eval(0, 0, "src", ppl=10.0, acc=0.4, acc_chance=0.25))
    run.log(_eval(0, 1, "src", ppl=12.0, acc=0.3, acc_chance=0.25))
    assert run.finish("completed")["warnings"] == []
    assert "Broken models" not in (run.path / "results.md").read_text()


def test_flags_reach_results_md_and_summary(tmp_path: Path) -> None:
    run = _run(tmp_path, method="sftp")
    run.log(_eval(2, 0, "bigbench:social_iqa", ppl=37.2))
    run.log(_eval(2, 1, "bigbench:social_iqa", ppl=1.5e10))
    summary = run.finish("completed")
    line = (
        "⚠ client 2 (social_iqa): test perplexity 1.5e10 is 4e8× the untouched model's 37.2 — "
        f"this model is broken; {DOC}"
    )
    assert summary["warnings"] == [line]
    assert json.loads((run.path / "summary.json").read_text())["warnings"] == [line]
    text = (run.path / "results.md").read_text()
    assert f"\n- {line}\n" in text and text.index(line) < text.index("| client | data |")


def test_short_names_of_data_sources() -> None:
    assert short_name(WIKIHOW) == "goal_step_wikihow" and short_name("ppl:wikitext2") == "wikitext2"
    assert short_name("squad_shifts:squaddev") == "squaddev"
    assert short_name("/tmp/x/good.jsonl") == "good" and short_name("jsonl:/a/b.jsonl") == "b"


def test_plots_have_titles_named_series_and_bars_for_a_single_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-round score (train loss) is drawn as one bar per client on an axis from 0, not one dot
    per client on an axis around the round number; every plot has a title and a y-axis unit."""
    from matplotlib.figure import Figure

    drawn: dict[str, dict[str, Any]] = {}
    real = Figure.savefig

    def record(fig: Figure, path: Any, **kwargs: Any) -> None:
        ax = fig.axes[0]
        drawn[Path(path).stem] = {
            "title": ax.get_title(),
            "ylabel": ax.get_ylabel(),
            "bars": len(ax.patches),
            "ylim": ax.get_ylim(),
            "ticks": [t.get_text() for t in ax.get_xticklabels()],
        }
        real(fig, path, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    records = [
        _eval(0, 0, "bigbench:social_iqa", acc=0.5, acc_n=8.0, acc_chance=1 / 3),
        _eval(0, 1, "bigbench:social_iqa", acc=0.625, acc_n=8.0, acc_chance=1 / 3),
        _eval(1, 0, WIKIHOW, acc=0.25, acc_n=8.0),
        _eval(1, 1, WIKIHOW, acc=0.25, acc_n=8.0),
        {
            "round": 1,
            "phase": "train",
            "client": 0,
            "data": "bigbench:social_iqa",
            "train-loss": 5.76,
            "status": "accepted",
        },
        {
            "round": 1,
            "phase": "train",
            "client": 1,
            "data": WIKIHOW,
            "train-loss": 4.23,
            "status": "accepted",
        },
    ]
    series = plot_series(records)
    assert set(series["evaluate-acc"]) == {"client 0 (social_iqa)", "client 1 (goal_step_wikihow)"}
    run = _run(tmp_path, method="fedit")
    for r in records:
        run.log(r)
    run.finish("completed")
    loss = drawn["train-loss"]
    assert loss["bars"] == 2 and loss["ylim"][0] == 0 and loss["ylim"][1] > 5.76
    assert loss["ticks"] == ["client 0 (social_iqa)", "client 1 (goal_step_wikihow)"]
    assert loss["title"].startswith("Training loss") and "nats" in loss["ylabel"]
    acc = drawn["evaluate-acc"]
    assert acc["bars"] == 0 and acc["ylim"] == (0.0, 1.0) and acc["ticks"] == ["0", "1"]
    assert "accuracy" in acc["title"].lower() and "share" in acc["ylabel"]


class NotedReport:
    """A strategy's results hooks (`server_columns`, `results_sections`) as a test double."""

    def server_columns(self) -> dict[str, tuple[str, str]]:
        return {"share": ("kept share", "kept share: what the scored model keeps")}

    def results_sections(self, records: list[dict[str, Any]]) -> str:
        deployed = [str(r["model"]) for r in records if r.get("phase") == "deployed"]
        return "\nDeployed: " + ", ".join(deployed) + "\n"


def test_method_columns_and_sections_come_from_the_strategy_hooks_alone(tmp_path: Path) -> None:
    """The run directory knows no method's fields: a server row's extra numbers become a column (and
    a summary.json entry) only when the strategy declares them, and a method's own section of
    results.md is what its `results_sections` returns."""
    rows = [
        {
            "round": r,
            "phase": "server-evaluate",
            "data": "wiki",
            "ppl": 20.0 + r,
            "share": 1.0 - r / 4,
            "model": "a label",
        }
        for r in (0, 2)
    ]
    rows += [{"phase": "deployed", "model": m} for m in ("a", "b")]
    plain, noted = _run(tmp_path, method="fedit"), _run(tmp_path, method="fedit")
    for run in (plain, noted):
        for row in rows:
            run.log(row)
    assert plain.finish("completed")["server"]["2"] == {"ppl `wiki`": 22.0}
    text = (plain.path / "results.md").read_text()
    assert "kept share" not in text and "Deployed" not in text and "| round | ppl `wiki`" in text
    assert noted.finish("completed", report=NotedReport())["server"]["2"] == {
        "ppl `wiki`": 22.0,
        "kept share": 0.5,
    }
    text = (noted.path / "results.md").read_text()
    assert "| round | kept share | ppl `wiki`" in text and "| 2 | 0.500 | 22.00 |" in text
    assert "- kept share: what the scored model keeps." in text
    assert text.rstrip().endswith("Deployed: a, b")


def test_a_client_that_failed_is_marked_and_its_untouched_scores_are_never_shown_as_tuned(
    tmp_path: Path,
) -> None:
    """Client 1's train replies of rounds 1 and 2 and its last evaluation failed: its row says so
    and its tuned cells say 'failed' (not its round-0 scores); client 2, rejected in round 1 but
    scored in round 2, keeps its scores and is marked; client 3 never scored; the means say over
    how many clients they are."""
    run = _run(tmp_path, method="fedit")
    for client in (0, 1, 2):
        run.log(_eval(client, 0, f"src{client}", acc=0.25))
    run.log(_eval(0, 2, "src0", acc=0.75))
    run.log(_eval(2, 2, "src2", acc=0.5))
    for rnd in (1, 2):
        run.log(
            {
                "round": rnd,
                "phase": "train",
                "client": 1,
                "node": 7,
                "status": "failed",
                "problem": "actor died",
            }
        )
    run.log({"round": 2, "phase": "evaluate", "client": 1, "node": 7, "status": "failed"})
    run.log({"round": 1, "phase": "train", "client": 2, "node": 8, "status": "rejected"})
    run.log({"round": 0, "phase": "evaluate", "client": 3, "node": 9, "status": "failed"})
    summary = run.finish("completed")
    states = {row["client"]: (row["status"], row["failed-rounds"]) for row in summary["clients"]}
    assert states == {0: ("ok", []), 1: ("stale", [1, 2]), 2: ("failed", [1]), 3: ("failed", [0])}
    stale = next(row for row in summary["clients"] if row["client"] == 1)
    assert stale["acc/untouched"] == 0.25 and stale["acc/tuned"] is None
    text = (run.path / "results.md").read_text()
    assert (
        "| 1 ⚠ stale: no score after round 0, failed in round 1, 2 | `src1` | accuracy | – | "
        "0.250 | – | failed | – |" in text
    )
    assert "| 2 ⚠ failed in round 1 | `src2` | accuracy | – | 0.250 | – | 0.500 | – |" in text
    assert "| 3 ⚠ stale: never scored, failed in round 0 | – | – | – | – | – | failed | – |" in text
    assert "| mean of 4 clients |  | accuracy |  | 0.250 (3 of 4) |  | 0.625 (2 of 4) |  |" in text
