"""tools/rescore.py: the re-scoring command line (which runs it scores again, the flags it passes on) and the
question digest of tools/rescore_accuracy.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from fedprune_app.llm.data import mc_example
from tools.rescore import rescore_runs
from tools.rescore_accuracy import question_digest


def run_cli(monkeypatch: pytest.MonkeyPatch, runs: list[Path], *argv: str) -> list[tuple[str, dict[str, Any]]]:
    """rescore_runs with a `dense` flag on `runs`; returns the (run, options) of each rescore call."""
    calls: list[tuple[str, dict[str, Any]]] = []

    def rescore(run: Path, examples: int, batch_size: int, **options: Any) -> dict[str, Any]:
        calls.append((run.name, options))
        models = {"final": {}} | ({"dense": {}} if options.get("dense") else {})
        return {"per-source": examples, "models": models}

    monkeypatch.setattr(sys, "argv", ["rescore", *map(str, runs), *argv])
    rescore_runs("test", "examples", lambda run: None, rescore, lambda run, record: None,
                 flags={"dense": "also the base model"},
                 missing=lambda record, options: options["dense"] and "dense" not in record["models"])
    return calls


def test_a_flag_reaches_rescore_and_rescores_a_record_that_lacks_it(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    run.mkdir()
    assert run_cli(monkeypatch, [run], "--examples", "5") == [("run", {"dense": False})]
    assert json.loads((run / "rescore.json").read_text())["models"] == {"final": {}}
    assert run_cli(monkeypatch, [run], "--examples", "5") == []  # same examples: kept
    assert run_cli(monkeypatch, [run], "--examples", "5", "--dense") == [("run", {"dense": True})]  # lacks dense
    assert "dense" in json.loads((run / "rescore.json").read_text())["models"]
    assert run_cli(monkeypatch, [run], "--examples", "5", "--dense") == []
    assert run_cli(monkeypatch, [run], "--examples", "6") == [("run", {"dense": False})]  # other examples


def test_question_digest_tells_question_sets_apart() -> None:
    rows = [mc_example("t", f"question {i}?", ["a", "b"], i % 2) for i in range(4)]
    assert question_digest(rows) == question_digest([dict(r) for r in rows])
    assert question_digest(rows) != question_digest(rows[::-1])  # the order pairs the answers
    assert question_digest(rows) != question_digest([*rows[:3], mc_example("t", "question 9?", ["a", "b"], 1)])
