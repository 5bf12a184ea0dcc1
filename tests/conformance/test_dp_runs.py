"""Whole DP runs (server_app.main on a LocalGrid, tiny model): FedIT and SFT-P clip on the client
(FlexLoRA's server clips ΔW), report ε per round as dp_accounting computes it, stop at the budget
with the last allowed round's models, and resume with the same ε."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conformance.test_reliability import comparable, rows, summary
from tests.dp_reference import dp_accounting_epsilon
from tests.local_grid import LocalGrid, method_config, run_server

C, SIGMA, DELTA = 1e-3, 0.8, 1e-4  # C far below a tiny model's update norm: every update is clipped
DP = {"dp_clipping_norm": C, "dp_noise_multiplier": SIGMA, "dp_delta": DELTA}


def _update_norm(sent: Any, reply: Any) -> float:
    a, b = sent.array_records["arrays"], reply.array_records["arrays"]
    return float(
        np.sqrt(
            sum(
                np.sum((b[k].numpy().astype(np.float64) - a[k].numpy().astype(np.float64)) ** 2)
                for k in b.keys()
                if b[k].numpy().dtype.kind == "f"
            )
        )
    )


@pytest.mark.parametrize("method", ["fedit", "sftp", "flexlora"])
def test_a_dp_run_clips_on_the_client_and_reports_epsilon_every_round(
    method: str, tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    cfg = method_config(tiny_model_dir, tmp_path, method, **DP)
    grid = LocalGrid(cfg, 4, seed=1)
    run, err = run_server(cfg, grid)
    assert err is None, err
    trains = [(m, r) for m, r in grid.exchanges if m.metadata.message_type == "train"]
    assert len(trains) == 6
    for msg, reply in trains:  # what left each client: an update of norm <= C, said to be clipped
        if method == "flexlora":  # factors at its own rank: its server clips ΔW
            assert "dp-clipped" not in reply.content.metric_records["metrics"]
            continue
        assert _update_norm(msg.content, reply.content) <= C * (1 + 1e-4)
        assert reply.content.metric_records["metrics"]["dp-clipped"] == 1
    released = [r for r in rows(run) if r["phase"] == "privacy" and r["status"] == "released"]
    assert [r["round"] for r in released] == [1, 2, 3]
    for r in released:
        assert r["dp-epsilon"] == pytest.approx(
            dp_accounting_epsilon(SIGMA, r["round"], DELTA), rel=1e-9
        )
        assert r["dp-sampled"] == 2 and r["dp-noise-std"] == pytest.approx(SIGMA * C / 2)
    done = summary(run)
    assert done["status"] == "completed" and done["privacy"]["rounds-released"] == 3
    assert done["privacy"]["epsilon"] == pytest.approx(released[-1]["dp-epsilon"])
    assert "## Differential privacy" in (run / "results.md").read_text()
    from tests.core.test_tensorboard import _events

    board = _events(run)
    for r in released:  # TensorBoard: ε per round
        assert board[("privacy/dp-epsilon", r["round"])] == [pytest.approx(r["dp-epsilon"])]


def test_the_budget_ends_the_run_with_the_last_allowed_rounds_models(
    tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    budget = (dp_accounting_epsilon(SIGMA, 2, DELTA) + dp_accounting_epsilon(SIGMA, 3, DELTA)) / 2
    cfg = method_config(tiny_model_dir, tmp_path, "fedit", **DP, dp_max_epsilon=budget)
    run, err = run_server(cfg, LocalGrid(cfg, 4, seed=1))
    assert err is None, err
    done, logged = summary(run), rows(run)
    assert done["status"] == "completed" and done["privacy"]["stopped-after-round"] == 2
    assert not [r for r in logged if r["phase"] == "train" and r["round"] == 3]
    # the final models, scored
    assert {r["round"] for r in logged if r["phase"] == "evaluate"} == {0, 2}
    assert "Round 3 was not started" in (run / "results.md").read_text()
    assert (run / "adapter").is_dir()


def test_an_interrupted_dp_run_resumes_with_the_same_epsilon_and_models(
    tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    cfg = method_config(tiny_model_dir, tmp_path, "fedit", **DP)
    whole, err = run_server(cfg, LocalGrid(cfg, 4, seed=1))
    assert err is None, err
    cut, err = run_server(cfg, LocalGrid(cfg, 4, seed=2, interrupt_round=3))
    assert isinstance(err, KeyboardInterrupt)
    resumed, err = run_server(cfg.replace(resume_from=str(cut)), LocalGrid(cfg, 4, seed=3))
    assert err is None, err
    assert comparable(summary(resumed)) == comparable(summary(whole))  # ε, scores: the same run

    def privacy(run: Path) -> list[dict[str, Any]]:
        return [comparable(r) for r in rows(run) if r["phase"] == "privacy"]

    assert privacy(resumed) == privacy(whole)
