"""TensorBoard events of a run: the tags of each kind of metrics row, and every numeric value of
metrics.jsonl read back from <run>/tensorboard with TensorBoard's own EventAccumulator (a hand-fed
run directory and a whole run)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedprune_app.core.config import RunConfig
from fedprune_app.report.board import board_scalars
from fedprune_app.report.run import ReportedRun as RunDirectory
from tests.local_grid import LocalGrid, method_config, run_server

IDENTITY = {"time", "round", "phase", "node", "client", "partition-id"}


def _events(run: Path) -> dict[tuple[str, int], list[float]]:
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    out: dict[tuple[str, int], list[float]] = {}
    for tag in acc.Tags()["scalars"]:
        for event in acc.Scalars(tag):
            out.setdefault((tag, event.step), []).append(event.value)
    return out


def _same(a: float, b: float) -> bool:
    """Event values are float32: compare against the metrics.jsonl value rounded the same way."""
    expected = float(np.float32(b))
    return (math.isnan(a) and math.isnan(expected)) or a == expected


def _check_against_jsonl(run: Path, final_round: int) -> int:
    """Every numeric field of every usable metrics.jsonl row is one event with its value; nothing
    else is."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    events = _events(run)
    expected: Counter[tuple[str, int]] = Counter()
    checked = 0
    for row in rows:
        values = {k: v for k, v in row.items() if k not in IDENTITY and isinstance(v, int | float)}
        scalars = board_scalars(row, final_round)
        if row.get("status") in ("failed", "rejected"):
            assert scalars == []
            continue
        assert sorted(tag.split("/")[1] for tag, *_ in scalars) == sorted(values)
        for tag, step, value, _ in scalars:
            key = tag.split("/")[1]
            assert step == row.get("round", final_round)
            assert value == values[key] or (math.isnan(value) and math.isnan(values[key]))
            assert any(_same(got, values[key]) for got in events[(tag, step)]), (tag, step)
            expected[(tag, step)] += 1
            checked += 1
    assert {key: len(v) for key, v in events.items()} == dict(expected)
    return checked


def test_tags_name_the_phase_the_key_and_what_the_row_is_about() -> None:
    train = {
        "time": 1.5,
        "round": 2,
        "phase": "train",
        "node": 99,
        "client": 1,
        "train-loss": 0.5,
        "bytes-up": 10,
        "data": "bbh/task a",
        "status": "accepted",
    }
    assert sorted(board_scalars(train, 5)) == [
        ("train/bytes-up/client-1", 2, 10.0, 1.5),
        ("train/train-loss/client-1", 2, 0.5, 1.5),
    ]
    server = {
        "round": 0,
        "phase": "server-evaluate",
        "data": "jsonl:/tmp/x y.jsonl",
        "ppl": 12.0,
        "model": "a long label of what was scored",
        "kept-ratio-prunable": 0.5,
    }
    assert sorted(t for t, *_ in board_scalars(server, 5)) == [
        "server-evaluate/kept-ratio-prunable/jsonl:_tmp_x-y.jsonl",
        "server-evaluate/ppl/jsonl:_tmp_x-y.jsonl",
    ]
    reference = {
        "phase": "reference",
        "model": "standalone",
        "data": "wikitext",
        "client": 2,
        "ppl": 30.0,
    }
    assert board_scalars(reference, 5) == [
        ("reference/ppl/standalone/wikitext/client-2", 5, 30.0, 0.0)
    ]
    compiled = {"phase": "compiled", "model": "client 0", "params": 1e6}
    assert board_scalars(compiled, 4) == [("compiled/params/client-0", 4, 1e6, 0.0)]
    assert board_scalars({**train, "status": "rejected", "problem": "NaN"}, 5) == []


def test_the_events_hold_the_values_of_metrics_jsonl(tmp_path: Path) -> None:
    cfg = RunConfig.from_flower({"num-server-rounds": 3})
    run = RunDirectory(tmp_path, cfg)
    rng = np.random.default_rng(0)
    earlier: list[dict[str, Any]] = [
        {
            "time": 0.1,
            "round": 1,
            "phase": "train",
            "node": 5,
            "client": 0,
            "train-loss": 2.25,
            "bytes-down": 123_456_789,
        }
    ]
    run.extend(earlier)  # a resumed run starts with the interrupted run's rows
    for r in (2, 3):
        for client in (0, 1):
            run.log(
                {
                    "round": r,
                    "phase": "train",
                    "node": 5 + client,
                    "client": client,
                    "status": "accepted",
                    "train-loss": float(rng.random()),
                    "num-examples": 16,
                    "val-loss": math.nan,
                }
            )
            run.log(
                {
                    "round": r,
                    "phase": "evaluate",
                    "node": 5 + client,
                    "client": client,
                    "status": "ok",
                    "acc": float(rng.random()),
                    "ppl": float(rng.random() * 100),
                    "data": "arith",
                }
            )
        run.log({"round": r, "phase": "server-evaluate", "data": "wiki", "ppl": 17.125 + r})
    run.log(
        {
            "round": 3,
            "phase": "train",
            "node": 9,
            "client": 2,
            "status": "rejected",
            "train-loss": 1e9,
        }
    )
    run.log({"phase": "reference", "model": "random", "data": "wiki", "ppl": 900.5})
    run.finish("completed")
    assert _check_against_jsonl(tmp_path, final_round=3) == 1 * 2 + 2 * 2 * (3 + 2) + 2 * 1 + 1


def test_a_whole_run_writes_its_metrics_as_tensorboard_events(
    tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    """A 2-round FedIT run on the tiny model (train, federated and server evaluation rows)."""
    cfg = method_config(tiny_model_dir, tmp_path, "fedit", num_server_rounds=2)
    run, err = run_server(cfg, LocalGrid(cfg, 2, seed=0))
    assert err is None
    assert _check_against_jsonl(run, final_round=2) > 10
    phases = {tag.split("/")[0] for tag, _ in _events(run)}
    assert {"train", "evaluate", "server-evaluate"} <= phases
