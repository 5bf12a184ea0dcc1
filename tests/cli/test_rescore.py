"""`fedprune rescore`: which runs it scores again, the flags it passes on, what it skips; and the
question digest of fedprune_cli/rescore_accuracy.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedprune_app.llm.data import mc_example
from fedprune_cli import rescore_accuracy
from fedprune_cli.main import main
from fedprune_cli.rescore_accuracy import question_digest


def run_cli(
    monkeypatch: pytest.MonkeyPatch, runs: list[Path], *argv: str
) -> list[tuple[str, dict[str, Any]]]:
    """`fedprune rescore accuracy RUN... ARGV` with the scoring replaced; the (run, options) of each
    call."""
    calls: list[tuple[str, dict[str, Any]]] = []

    def rescore(run: Path, examples: int, batch_size: int, **options: Any) -> dict[str, Any]:
        calls.append((run.name, options))
        models = {"final": {}} | ({"dense": {}} if options.get("dense") else {})
        return {"per-source": examples, "models": models}

    monkeypatch.setattr(rescore_accuracy, "rescore", rescore)
    monkeypatch.setattr(rescore_accuracy, "skip_reason", lambda run: None)
    monkeypatch.setattr(rescore_accuracy, "report", lambda run, record: None)
    assert main(["rescore", "accuracy", *map(str, runs), *argv]) == 0
    return calls


def test_a_flag_reaches_rescore_and_rescores_a_record_that_lacks_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    assert run_cli(monkeypatch, [run], "--examples", "5") == [("run", {"dense": False})]
    assert json.loads((run / "rescore.json").read_text())["models"] == {"final": {}}
    assert run_cli(monkeypatch, [run], "--examples", "5") == []  # same examples: kept
    assert run_cli(monkeypatch, [run], "--examples", "5", "--dense") == [
        ("run", {"dense": True})
    ]  # lacks dense
    assert "dense" in json.loads((run / "rescore.json").read_text())["models"]
    assert run_cli(monkeypatch, [run], "--examples", "5", "--dense") == []
    assert run_cli(monkeypatch, [run], "--examples", "6") == [
        ("run", {"dense": False})
    ]  # other examples


def test_question_digest_tells_question_sets_apart() -> None:
    rows = [mc_example("t", f"question {i}?", ["a", "b"], i % 2) for i in range(4)]
    assert question_digest(rows) == question_digest([dict(r) for r in rows])
    assert question_digest(rows) != question_digest(rows[::-1])  # the order pairs the answers
    assert question_digest(rows) != question_digest(
        [*rows[:3], mc_example("t", "question 9?", ["a", "b"], 1)]
    )


def test_skip_reason_names_what_is_missing_for_every_kind_of_run(tmp_path: Path) -> None:
    """A LoRA run is scored from adapter/, FlexLoRA from client-adapters/, FedSpaLLM from
    model/, the structural methods from compiled/; a directory without config.json is not a run."""
    assert "config.json" in rescore_accuracy.skip_reason(tmp_path)
    for method, artefact in [
        ("fedit", "adapter"),
        ("flexlora", "client-adapters"),
        ("fedspallm", "model"),
        ("sftp", "compiled"),
        ("slicegpt", "compiled"),
    ]:
        run = tmp_path / method
        run.mkdir()
        (run / "config.json").write_text(json.dumps({"method": method}))
        assert f"no {artefact}/" in rescore_accuracy.skip_reason(run)
        (run / artefact).mkdir()
        assert rescore_accuracy.skip_reason(run) is None
