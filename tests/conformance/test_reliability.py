"""Whole runs in one process (server_app.main on a LocalGrid, tiny model): determinism, faults,
resume."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from fedprune_app.core import registry
from fedprune_app.core.config import ConfigError
from fedprune_app.core.strategy import RoundFailed
from tests.conftest import small_config
from tests.local_grid import LocalGrid, method_config, run_server

TIMING = ("seconds", "started-at", "time")


def comparable(obj: Any) -> Any:
    """A summary without wall-clock fields (they differ between any two runs)."""
    if isinstance(obj, dict):
        return {k: comparable(v) for k, v in obj.items() if not any(t in k for t in TIMING)}
    if isinstance(obj, list):
        return [comparable(v) for v in obj]
    return obj


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_same_seed_same_summary_whatever_the_node_ids(
    tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    """Two runs with one seed, on nodes with different random ids (as two simulations get): the same
    sampled partitions, the same updates, the same summary.json."""
    cfg = method_config(tiny_model_dir, tmp_path, "fedit")
    a, err_a = run_server(cfg, LocalGrid(cfg, 4, seed=1))
    b, err_b = run_server(cfg, LocalGrid(cfg, 4, seed=2))
    assert err_a is None and err_b is None
    assert comparable(summary(a)) == comparable(summary(b))
    trained = [[r["client"] for r in rows(d) if r["phase"] == "train"] for d in (a, b)]
    assert trained[0] == trained[1] and len(trained[0]) == 6  # 2 of 4 partitions per round


def test_the_same_clients_evaluate_every_round_and_evaluation_leaves_training_sampling_alone(
    tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    """fraction-evaluate 0.5 of 4: one panel of 2 partitions in every evaluated round (a per-client
    table compares the same clients); the partitions that train are those of a run without federated
    evaluation."""
    cfg = method_config(tiny_model_dir, tmp_path, "fedit")
    grid = LocalGrid(cfg, 4, seed=1)
    run, err = run_server(cfg, grid)
    assert err is None, err
    panels: dict[int, set[int]] = {}
    for msg, _reply in grid.exchanges:
        if msg.metadata.message_type == "evaluate":
            rnd = int(msg.content.config_records["config"]["server-round"])
            panels.setdefault(rnd, set()).add(
                grid.contexts[msg.metadata.dst_node_id].node_config["partition-id"]
            )
    assert {0, 3} <= set(panels) and len({frozenset(p) for p in panels.values()}) == 1
    assert len(panels[0]) == 2
    quiet_cfg = cfg.replace(fraction_evaluate=0.0, output_dir=str(tmp_path / "quiet"))
    quiet, err = run_server(quiet_cfg, LocalGrid(quiet_cfg, 4, seed=1))
    assert err is None, err
    trained = [[r["client"] for r in rows(d) if r["phase"] == "train"] for d in (run, quiet)]
    assert trained[0] == trained[1]


def check_resume(method: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    """Killed while round 2 trains, resumed from the round-1 checkpoint on fresh nodes (new ids,
    empty context.state): the final summary equals the uninterrupted run's (clients' private state
    restored on device)."""
    state_dirs = {p: {"state-dir": str(tmp_path / f"device-{p}")} for p in range(4)}
    cfg = method_config(tiny_model_dir, tmp_path, method, num_server_rounds=2)
    whole, err = run_server(cfg, LocalGrid(cfg, 4, seed=1, node_configs=state_dirs))
    assert err is None, err
    cut, err = run_server(
        cfg, LocalGrid(cfg, 4, seed=2, node_configs=state_dirs, interrupt_round=2)
    )
    assert isinstance(err, KeyboardInterrupt) and summary(cut)["status"] == "failed"
    resumed_cfg = cfg.replace(resume_from=str(cut))
    resumed, err = run_server(resumed_cfg, LocalGrid(cfg, 4, seed=3, node_configs=state_dirs))
    assert err is None, err
    assert comparable(summary(resumed)) == comparable(summary(whole))
    assert [r["phase"] for r in rows(resumed)] == [r["phase"] for r in rows(whole)]


@pytest.mark.parametrize("method", registry.names())
def test_interrupted_and_resumed_run_gives_the_uninterrupted_summary(
    method: str, tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    check_resume(method, tiny_model_dir, tmp_path)


def test_resume_checks_the_config_before_any_work(tiny_model_dir: Path, tmp_path: Path) -> None:
    from fedprune_app.core.checkpoint import load_checkpoint

    cfg = small_config(tiny_model_dir, output_dir=str(tmp_path))
    with pytest.raises(
        ConfigError,
        match="'resume-from' must be a run directory holding checkpoint/state.safetensors",
    ):
        load_checkpoint(cfg.replace(resume_from=str(tmp_path / "nope")))


def test_resume_refuses_a_changed_config_and_a_finished_run(
    tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    from fedprune_app.core.checkpoint import load_checkpoint

    cfg = small_config(tiny_model_dir, output_dir=str(tmp_path / "runs"), num_server_rounds=1)
    done, err = run_server(cfg, LocalGrid(cfg, 2, seed=0))
    assert err is None and (done / "checkpoint" / "state.safetensors").is_file()
    with pytest.raises(ConfigError, match=r"differs .* 'learning-rate' \(0.0005 -> 0.01\)"):
        load_checkpoint(cfg.replace(resume_from=str(done), learning_rate=0.01))
    with pytest.raises(ConfigError, match="already completed round 1 of num-server-rounds = 1"):
        load_checkpoint(cfg.replace(resume_from=str(done)))
    more = load_checkpoint(cfg.replace(resume_from=str(done / "checkpoint"), num_server_rounds=2))
    assert more.round == 1 and re.fullmatch(rf"{re.escape(done.name)}-[0-9a-f]{{8}}", more.run_key)


def test_a_failing_client_is_counted_and_the_run_completes(
    tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    cfg = small_config(
        tiny_model_dir, output_dir=str(tmp_path / "runs"), num_server_rounds=2, min_replies=2
    )
    grid = LocalGrid(cfg, 3, seed=0)
    broken = grid.get_node_ids()[1]
    grid.failing = {broken}
    lines: list[logging.LogRecord] = []
    catcher = logging.Handler()
    catcher.emit = lines.append  # type: ignore[method-assign]
    logging.getLogger("flwr").addHandler(catcher)
    try:
        run, err = run_server(cfg, grid)
    finally:
        logging.getLogger("flwr").removeHandler(catcher)
    out = summary(run)
    assert err is None and out["status"] == "completed"
    # its train replies (rounds 1, 2) and evaluations (round 0 and the last) are counted, with its
    # node id
    assert out["failures"] == 4 and {d["node"] for d in out["dropped-replies"]} == {broken}
    assert {r["phase"] for r in out["dropped-replies"]} == {"train", "evaluate"}
    # it never said its partition id: its row is marked by node; the ServerApp's last line says so
    client = f"node {broken}"
    assert [row["client"] for row in out["clients"] if row["status"] != "ok"] == [client]
    assert (
        f"| {client} ⚠ stale: never scored, failed in round 0, 1, 2 |"
        in (run / "results.md").read_text()
    )
    assert lines[-1].getMessage() == (
        f"[fedprune] the run completed, but 4 client replies were left out (failed or rejected): "
        f"client {client} (failed); see results.md and summary.json's dropped-replies"
    )


def test_a_disconnected_client_is_counted_as_failed_with_its_node_id(
    tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    cfg = small_config(
        tiny_model_dir,
        output_dir=str(tmp_path / "runs"),
        num_server_rounds=1,
        round_timeout=5.0,
        fraction_evaluate=0.5,
    )
    grid = LocalGrid(cfg, 3, seed=0)
    gone = grid.get_node_ids()[2]
    grid.silent = {gone}
    run, err = run_server(cfg, grid)
    out = summary(run)
    assert err is None and out["status"] == "completed"
    silent = [r for r in rows(run) if r.get("status") == "failed"]
    assert (
        silent and {r["node"] for r in silent} == {gone} and "train" in {r["phase"] for r in silent}
    )
    assert all("no reply within round-timeout = 5 s" in r["problem"] for r in silent)
    assert out["failures"] == len(silent)


def test_below_min_replies_the_round_is_retried_then_the_run_stops(
    tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    cfg = small_config(
        tiny_model_dir,
        output_dir=str(tmp_path / "runs"),
        num_server_rounds=2,
        min_replies=2,
        round_retries=2,
    )
    grid = LocalGrid(cfg, 3, seed=0)
    grid.failing = set(grid.get_node_ids()[:2])
    run, err = run_server(cfg, grid)
    assert isinstance(
        err, RoundFailed
    ) and "fewer than min-replies = 2 usable train replies in 3 attempt" in str(err)
    out = summary(run)
    assert out["status"] == "failed" and "min-replies" in out["error"]
    retries = [r for r in rows(run) if r["phase"] == "round-retry"]
    assert [(r["round"], r["attempt"], r["usable"]) for r in retries] == [
        (1, 1, 1),
        (1, 2, 1),
        (1, 3, 1),
    ]
    assert not (run / "checkpoint").exists()  # no round completed: nothing was aggregated


def test_min_replies_above_the_sample_size_is_a_clear_error(
    tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    cfg = small_config(
        tiny_model_dir,
        output_dir=str(tmp_path / "runs"),
        num_server_rounds=1,
        min_replies=3,
        fraction_train=0.5,
    )
    _, err = run_server(cfg, LocalGrid(cfg, 4, seed=0))
    assert isinstance(
        err, RoundFailed
    ) and "'min-replies' = 3 but a round samples only 2 of 4" in str(err)
