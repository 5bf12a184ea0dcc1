"""Progress lines: durations, the time-left estimates (against hand-computed sums on a fake clock),
the run loop's `[round r/N]` lines, FedSpaLLM's `layer i/N` lines and a grid's `cell i/N` lines."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

import fedprune_app.core.rounds as strategy_module
from experiments.grids import Cell, Grid, run_cells
from fedprune_app.core.config import RunConfig
from fedprune_app.core.lora import LoRAStrategy
from fedprune_app.core.progress import Countdown, RoundProgress, duration, layer_logger
from tests.conftest import small_config
from tests.local_grid import LocalGrid


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0.0 s"),
        (41.24, "41.2 s"),
        (59.9, "59.9 s"),
        (59.97, "1 min 00 s"),
        (125, "2 min 05 s"),
        (3599.4, "59 min 59 s"),
        (3600, "1 h 00 min"),
        (3 * 3600 + 125, "3 h 02 min"),
        (-3, "0.0 s"),
    ],
)
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_countdown_is_the_mean_step_times_the_steps_left() -> None:
    clock = FakeClock()
    countdown = Countdown(4, clock)
    clock.tick(5)
    assert countdown.left() is None and countdown.status() == "5.0 s elapsed"
    countdown.done(10)
    countdown.done(30)
    clock.tick(40)
    assert countdown.left() == pytest.approx((10 + 30) / 2 * 2)
    assert countdown.status() == "45.0 s elapsed, ~40.0 s left"
    countdown.done(20)
    countdown.done(20)
    assert countdown.left() == 0.0 and countdown.left_units == 0


def _simulate(
    total: int, evaluates: Any, train: dict[int, float], after: dict[int, float]
) -> tuple[list[str], RoundProgress, FakeClock]:
    clock = FakeClock()
    progress = RoundProgress(total, evaluates, clock)
    clock.tick(3)  # identify + prepare: elapsed, not a round
    progress.start_round()
    clock.tick(after[0])
    lines = [progress.round_done(0)]
    for r in range(1, total + 1):
        progress.start_round()
        clock.tick(train[r])
        progress.trained()
        clock.tick(after[r])
        lines.append(progress.round_done(r))
    return lines, progress, clock


def test_round_lines_estimate_from_train_time_and_the_evaluation_of_each_kind_of_round() -> None:
    """eval-every = 2 over 5 rounds: rounds 0, 2, 4, 5 evaluate. After round 1 (train 10 s, 2 s
    after), the four rounds left cost 4·10 + (round 2, 4, 5: round 0's 20 s) + (round 3: 2 s)."""
    evaluates = lambda r: r in (0, 2, 4, 5)  # noqa: E731
    train = {1: 10.0, 2: 14.0, 3: 12.0, 4: 8.0, 5: 11.0}
    after = {0: 20.0, 1: 2.0, 2: 16.0, 3: 4.0, 4: 18.0, 5: 17.0}
    lines, progress, clock = _simulate(5, evaluates, train, after)
    assert lines[0] == "[round 0/5] 20.0 s evaluating the untouched model, 23.0 s elapsed"
    left1 = 4 * 10 + 3 * 20 + 2
    assert lines[1] == f"[round 1/5] 12.0 s this round, 35.0 s elapsed, ~{duration(left1)} left"
    # after round 2: train mean 12; evaluating rounds (0, 2): mean 18; plain (1): 2 -> rounds 3
    # (plain), 4, 5
    assert lines[2] == (
        f"[round 2/5] 30.0 s this round, 1 min 05 s elapsed, ~{duration(3 * 12 + 2 + 2 * 18)} left"
    )
    assert (
        lines[5]
        == f"[round 5/5] 28.0 s this round, {duration(clock.now - 1000)} elapsed, the last round"
    )
    assert progress.left(5) == 0


def test_a_kind_without_samples_borrows_the_mean_of_the_other() -> None:
    """A resumed run (no round 0) with rounds 4..5 left, neither evaluating yet: the last round's
    evaluation is estimated from the plain rounds' after-train time."""
    clock = FakeClock()
    progress = RoundProgress(6, lambda r: r in (0, 6), clock)
    progress.start_round()
    clock.tick(10)
    progress.trained()
    clock.tick(4)
    assert progress.round_done(4).endswith(f"~{duration(2 * (10 + 4))} left")


def test_the_run_loop_logs_one_progress_line_per_round(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(
        strategy_module,
        "RoundProgress",
        lambda total, evaluates: RoundProgress(total, evaluates, clock),
    )
    strategy = LoRAStrategy(RunConfig.from_flower({"seed": 0, "eval-every": 0}))
    monkeypatch.setattr(strategy, "identify", lambda grid: None)
    # counted as elapsed
    monkeypatch.setattr(strategy, "prepare", lambda grid, timeout: clock.tick(5))
    monkeypatch.setattr(
        strategy, "train_round", lambda r, grid, arrays, config: (clock.tick(30), (None, None))[1]
    )
    monkeypatch.setattr(
        strategy, "evaluate_round", lambda r, *_: clock.tick(9 if strategy.evaluates(r) else 1)
    )
    with caplog.at_level(logging.INFO, logger="flwr"):
        strategy.start(grid=None, initial_arrays=ArrayRecord(), num_rounds=3)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[round")]
    assert lines == [
        "[round 0/3] 9.0 s evaluating the untouched model, 14.0 s elapsed",
        f"[round 1/3] 31.0 s this round, 45.0 s elapsed, ~{duration(30 + 1 + 30 + 9)} left",
        f"[round 2/3] 31.0 s this round, 1 min 16 s elapsed, ~{duration(30 + 9)} left",
        "[round 3/3] 39.0 s this round, 1 min 55 s elapsed, the last round",
    ]


def test_layer_logger_counts_the_sampled_layers(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("flwr")
    on_layer = layer_logger(log, "[fedspallm] client 1, round 2", [7, 3, 5], FakeClock())
    with caplog.at_level(logging.INFO, logger="flwr"):
        for layer, seconds in ((3, 4.0), (5, 6.0), (7, 5.0)):
            on_layer(layer, seconds)
    assert [r.getMessage() for r in caplog.records] == [
        "[fedspallm] client 1, round 2: layer 1/3 (decoder layer 3) in 4.0 s, ~8.0 s left",
        "[fedspallm] client 1, round 2: layer 2/3 (decoder layer 5) in 6.0 s, ~5.0 s left",
        "[fedspallm] client 1, round 2: layer 3/3 (decoder layer 7) in 5.0 s",
    ]


def test_a_fedspallm_client_logs_each_layer_it_prunes(
    tiny_model_dir: Path, tmp_path: Path, flower_ids: None, caplog: pytest.LogCaptureFixture
) -> None:
    text = tmp_path / "text.jsonl"
    text.write_text(
        "".join(
            json.dumps({"text": f"Paragraph {i}: the river runs past the old mill."}) + "\n"
            for i in range(40)
        )
    )
    cfg = small_config(
        tiny_model_dir,
        method="fedspallm",
        client_data=str(text),
        calib_segments=2,
        calib_seq_len=16,
        sparsity=0.5,
        server_eval_data=str(text),
        sparsegpt_blocksize=16,
    )
    grid = LocalGrid(cfg, 1, ids=[10])
    config = ConfigRecord({"server-round": 3, "layers": json.dumps([1, 0])})
    msg = Message(
        content=RecordDict({"arrays": ArrayRecord(), "config": config}),
        message_type=MessageType.TRAIN,
        dst_node_id=10,
    )
    with caplog.at_level(logging.INFO, logger="flwr"):
        reply = next(grid.send_and_receive([msg]))
    assert not reply.has_error()
    lines = [r.getMessage() for r in caplog.records if "[fedspallm]" in r.getMessage()]
    assert [line.split(" in ")[0] for line in lines] == [
        "[fedspallm] client 0, round 3: layer 1/2 (decoder layer 0)",
        "[fedspallm] client 0, round 3: layer 2/2 (decoder layer 1)",
    ]


def test_a_grid_prints_each_cell_with_the_time_elapsed_and_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Three cells, the second already finished: the estimate is over the two launched cells
    only."""
    clock = FakeClock()
    cells = [Cell("t", tag, (), 2) for tag in ("a", "b", "c")]
    grid = Grid("demo", "fedit", lambda _args: cells, lambda *_: "")

    def finish(tag: str) -> Path:
        run = tmp_path / f"20260101-00000{ord(tag) - 96}-fedit-{tag}"
        run.mkdir()
        (run / "summary.json").write_text(json.dumps({"status": "completed"}))
        return run

    finish("b")
    took = {"a": 600.0, "c": 900.0}

    def fake_launch(
        run_configs: list[str], federation: str, quiet: bool = False, timeout: float = 7200
    ) -> SimpleNamespace:
        tag = run_configs[-1].split('"')[1]
        clock.tick(took[tag])
        return SimpleNamespace(code=0, run_dir=finish(tag), status="completed")

    monkeypatch.setattr("fedprune_cli.launch.launch", fake_launch)
    runs = run_cells(grid, cells, tmp_path, clock=clock)
    assert set(runs) == {"a", "b", "c"}
    assert capsys.readouterr().out.splitlines() == [
        "[grid] demo cell 1/3: a (2 clients); 0.0 s elapsed",
        "[grid] demo cell 1/3: a done in 10 min 00 s; 10 min 00 s elapsed, ~10 min 00 s left (1 of "
        "2 cells to run)",
        "[grid] demo cell 2/3: b already done (20260101-000002-fedit-b)",
        "[grid] demo cell 3/3: c (2 clients); 10 min 00 s elapsed, ~10 min 00 s left",
        "[grid] demo cell 3/3: c done in 15 min 00 s; 25 min 00 s elapsed (0 of 2 cells to run)",
    ]


def test_a_cell_past_its_timeout_is_left_out_and_the_grid_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """`launch` raises TimeoutExpired for a cell that runs past --timeout: that cell is left out,
    the next one runs."""
    import subprocess

    cells = [Cell("t", tag, (), 2) for tag in ("slow", "fast")]
    grid = Grid("demo", "fedit", lambda _args: cells, lambda *_: "")
    limits = []

    def fake_launch(
        run_configs: list[str], federation: str, quiet: bool = False, timeout: float = 7200
    ) -> SimpleNamespace:
        limits.append(timeout)
        tag = run_configs[-1].split('"')[1]
        if tag == "slow":
            raise subprocess.TimeoutExpired(["flwr", "run"], timeout)
        run = tmp_path / "20260101-000001-fedit-fast"
        run.mkdir()
        (run / "summary.json").write_text(json.dumps({"status": "completed"}))
        return SimpleNamespace(code=0, run_dir=run, status="completed")

    monkeypatch.setattr("fedprune_cli.launch.launch", fake_launch)
    runs = run_cells(grid, cells, tmp_path, clock=FakeClock(), timeout=60)
    assert set(runs) == {"fast"} and limits == [60, 60]
    assert "slow stopped after --timeout 60 s, left out of the tables" in capsys.readouterr().out
