"""Whole DP runs (server_app.main on a LocalGrid, tiny model): FedIT and SFT-P clip on the client
(FlexLoRA's server clips ΔW), report ε per round as dp_accounting computes it, stop at the budget
with the last allowed round's models, and charge every release again on resume; two runs with the
same seed release different adapters (fresh noise)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conformance.test_reliability import rows, summary
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


def _evaluated(grid: LocalGrid, server_round: int) -> dict[str, np.ndarray]:
    """The arrays of the first evaluate message of `server_round` (the round's release)."""
    msgs = [m for m, _ in grid.exchanges] + ([grid.interrupted] if grid.interrupted else [])
    msg = next(
        m
        for m in msgs
        if m.metadata.message_type == "evaluate"
        and m.content.config_records["config"]["server-round"] == server_round
    )
    record = msg.content.array_records["arrays"]
    return {k: record[k].numpy() for k in record.keys()}


def test_a_resume_after_a_release_charges_it_and_its_repeat_with_fresh_noise(
    tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    """The server dies while round 3's model is being evaluated (released, not checkpointed). The
    resumed run re-runs round 3: its ledger holds 4 releases, ε is above the uninterrupted run's,
    and the repeated round's model differs from the first (fresh noise)."""
    cfg = method_config(tiny_model_dir, tmp_path, "fedit", **DP)
    whole, err = run_server(cfg, LocalGrid(cfg, 4, seed=1))
    assert err is None, err
    cut_grid = LocalGrid(cfg, 4, seed=2, interrupt_evaluate_round=3)
    cut, err = run_server(cfg, cut_grid)
    assert isinstance(err, KeyboardInterrupt)
    assert json.loads((cut / "privacy-ledger.json").read_text())["releases"] == 3
    grid = LocalGrid(cfg, 4, seed=3)
    resumed, err = run_server(cfg.replace(resume_from=str(cut)), grid)
    assert err is None, err
    done, once = summary(resumed)["privacy"], summary(whole)["privacy"]
    assert once["epsilon"] == pytest.approx(dp_accounting_epsilon(SIGMA, 3, DELTA), rel=1e-9)
    assert done["epsilon"] == pytest.approx(dp_accounting_epsilon(SIGMA, 4, DELTA), rel=1e-9)
    assert done["rounds-released"] == 4 and done["released-rounds"] == [1, 2, 3, 3]
    assert json.loads((resumed / "privacy-ledger.json").read_text())["releases"] == 4
    assert "stays charged" in (resumed / "results.md").read_text()
    first, again = _evaluated(cut_grid, 3), _evaluated(grid, 3)
    assert set(first) == set(again) and any(not np.array_equal(first[k], again[k]) for k in first)


@pytest.mark.parametrize("sigma", [SIGMA, 0.0])
def test_two_runs_with_the_same_seed_release_the_same_adapter_only_without_noise(
    sigma: float, tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    from safetensors.numpy import load_file

    cfg = method_config(tiny_model_dir, tmp_path, "fedit", **(DP | {"dp_noise_multiplier": sigma}))
    adapters = []
    for seed in (1, 2):
        run, err = run_server(cfg, LocalGrid(cfg, 4, seed=seed))
        assert err is None, err
        adapters.append(load_file(str(run / "adapter" / "adapter_model.safetensors")))
    same = all(np.array_equal(adapters[0][k], adapters[1][k]) for k in adapters[0])
    assert same == (sigma == 0.0)
