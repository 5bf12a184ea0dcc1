"""`server-eval-every`: which rounds the ServerApp scores the global model after (round 0 and the
last always)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from flwr.app import ArrayRecord

import fedprune_app.server_app as server_app
from fedprune_app.core.config import RunConfig


class Recorder:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def log(self, row: dict[str, Any]) -> None:
        self.rows.append(row)


class Strategy:
    global_model_notes: dict[str, Any] = {}

    def global_model(self, arrays: ArrayRecord) -> tuple[None, None]:
        return None, None


@pytest.mark.parametrize(
    "every, scored", [(1, [0, 1, 2, 3, 4, 5]), (2, [0, 2, 4, 5]), (0, [0, 5]), (7, [0, 5])]
)
def test_the_server_scores_round_0_the_last_round_and_every_kth(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, every: int, scored: list[int]
) -> None:
    monkeypatch.setattr(server_app, "held_out_text", lambda source, cfg: "text")
    monkeypatch.setattr(
        server_app,
        "held_out_metrics",
        lambda model, tokenizer, text, cfg: {"ppl": 2.0, "ppl-tokens": 4},
    )
    cfg = RunConfig.from_flower({"num-server-rounds": 5, "server-eval-every": every})
    run = Recorder()
    evaluate = server_app.server_evaluation(cfg, Strategy(), run)  # type: ignore[arg-type]
    returned = [r for r in range(6) if evaluate(r, ArrayRecord()) is not None]
    assert returned == scored == [row["round"] for row in run.rows]
