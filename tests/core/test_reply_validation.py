"""The checks every reply passes before anything reads it (`core/replies.py`, `FederatedStrategy.
common_problem`): an Array's real bytes against what it declares, metric names against the row's own
fields, identity replies typed and bounded, reference replies that cannot end the run. Each case is
one an audit sent by hand and that raised or slipped into an aggregate before."""

from __future__ import annotations

import io
import math
import re
from typing import Any
from uuid import uuid4

import numpy as np
import pytest
from flwr.app import Array, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from fedprune_app.core.config import RunConfig
from fedprune_app.core.lora import LoRAStrategy
from fedprune_app.core.protocol import to_record
from fedprune_app.core.replies import (
    array_problem,
    identity_problem,
    metrics_problem,
    record_problem,
)
from tests.fake_grid import AnsweringGrid


def _npy(value: np.ndarray, pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, value, allow_pickle=pickle)
    return buffer.getvalue()


def _array(data: bytes, shape: tuple[int, ...], dtype: str = "float32") -> Array:
    return Array(dtype=dtype, shape=shape, stype="numpy.ndarray", data=data)


# --- arrays ---------------------------------------------------------------------------------------


def test_a_real_array_passes_and_its_decoded_values_are_what_it_declares() -> None:
    value = np.arange(12, dtype=np.float32).reshape(4, 3)
    assert array_problem("w", Array(value)) is None
    assert array_problem("m", Array(np.ones((2, 5), bool))) is None
    assert array_problem("e", Array(np.zeros((0, 3), np.int64))) is None


@pytest.mark.parametrize(
    ("array", "reason"),
    [
        # (1,) declared (4, 3): Flower decodes the one element, which broadcasts in an average
        (
            _array(_npy(np.zeros(1, np.float32)), (4, 3)),
            r"declares \(4, 3\) float32 but holds \(1,\)",
        ),
        # the same bytes count, another dtype declared
        (
            _array(_npy(np.zeros(6, np.float64)), (12,)),
            r"declares \(12,\) float32 but holds \(6,\)",
        ),
        (_array(_npy(np.zeros((4, 3), np.float32))[:-5], (4, 3)), r"carries 43 bytes.* needs 48"),
        (_array(_npy(np.zeros((4, 3), np.float32)) + b"\0" * 8, (4, 3)), r"carries 56 bytes"),
        (_array(_npy(np.array([1.0, "a"], object), pickle=True), (2,)), r"holds object values"),
        (_array(_npy(np.zeros(2, np.complex64)), (2,), "complex64"), r"holds complex64 values"),
        (_array(b"\x93NUMPY\x01\x00" + b"\xff" * 30, (2,)), r"not a \.npy buffer"),
        (_array(b"hello", (2,)), r"not a \.npy buffer"),
        (
            _array(_npy(np.zeros(2, np.float32)), (2,), "no-such-dtype"),
            r"unreadable shape or dtype",
        ),
        (
            Array(dtype="float32", shape=(2,), stype="torch.Tensor", data=b"\0" * 8),
            r"serialized as 'torch.Tensor'",
        ),
    ],
)
def test_an_array_that_is_not_what_it_declares_is_named_with_why(array: Array, reason: str) -> None:
    problem = array_problem("layer.w", array)
    assert problem is not None and problem.startswith("array layer.w")
    assert re.search(reason, problem), problem


def test_record_problem_names_the_record_and_the_array() -> None:
    from flwr.app import ArrayRecord

    content = RecordDict(
        {
            "arrays": ArrayRecord({"ok": Array(np.zeros(3, np.float32))}),
            "masks": ArrayRecord({"bad": _array(b"\x93NUMPY", (1,))}),
        }
    )
    assert "array masks/bad" in (record_problem(content) or "")


# --- metrics --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["round", "phase", "node", "client", "status", "problem", "time"])
def test_a_metric_named_like_a_row_field_is_refused(name: str) -> None:
    assert (
        metrics_problem({name: 1.0}) == f"reply metric {name!r} would overwrite the row's own field"
    )


def test_metric_names_and_sizes_are_bounded_and_nan_is_allowed() -> None:
    assert metrics_problem({"train-loss": math.nan, "ppl/text:wikipedia": 3.0}) is None
    assert "visible characters" in (metrics_problem({"two words": 1}) or "")
    assert "visible characters" in (metrics_problem({"x" * 201: 1}) or "")
    assert "text of 5000 characters" in (metrics_problem({"note": "a" * 5000}) or "")


@pytest.mark.parametrize(
    ("metrics", "reason"),
    [
        ({"partition-id": 0, "resources": 2.5, "num-partitions": 4}, None),
        ({"partition-id": 0}, None),
        ({"partition-id": 0, "resources": [0.5]}, "'resources' must be a finite number"),
        ({"partition-id": 0, "resources": math.inf}, "'resources' must be a finite number"),
        ({"partition-id": 0, "resources": math.nan}, "'resources' must be a finite number"),
        ({"partition-id": 0, "resources": -1.0}, r"'resources' must be in \[0, 1e\+06\]"),
        ({"partition-id": [0]}, r"'partition-id' must be an int in \[0, 1000000\)"),
        ({"partition-id": 10**12}, r"'partition-id' must be an int in \[0, 1000000\)"),
        ({"partition-id": 3, "num-partitions": 3}, r"'num-partitions' must be in \[4,"),
        ({"partition-id": 0, "num-partitions": 4.0}, "'num-partitions' must be an int"),
    ],
)
def test_identity_replies_are_typed_and_bounded(
    metrics: dict[str, Any], reason: str | None
) -> None:
    problem = identity_problem(metrics)
    if reason is None:
        assert problem is None
    else:
        assert problem is not None and re.search(reason, problem), problem


# --- through the strategy -------------------------------------------------------------------------


class QueryGrid(AnsweringGrid):
    """Nodes that answer every message with the metrics (or the whole content) given for them."""

    def __init__(self, answers: dict[int, Any]) -> None:
        super().__init__(list(answers))
        self.answers = answers

    def answer(self, msg: Message) -> Message:
        given = self.answers[msg.metadata.dst_node_id]
        content = (
            given if isinstance(given, RecordDict) else RecordDict({"metrics": MetricRecord(given)})
        )
        return Message(content, reply_to=msg)


def _strategy(rows: list[dict[str, Any]]) -> LoRAStrategy:
    strategy = LoRAStrategy(RunConfig.from_flower({"method": "fedit"}), recorder=rows.append)
    strategy.timeout = 5.0
    return strategy


def test_identify_skips_each_malformed_identity_and_keeps_the_good_ones(flower_ids: None) -> None:
    config = RecordDict({"bad": ConfigRecord({"partition-id": b"\xff"})})
    grid = QueryGrid(
        {
            1: {"partition-id": 0, "resources": 4.0},
            2: {"partition-id": 1, "resources": [0.5]},  # raised at float() before
            3: {"partition-id": 2, "resources": math.inf},  # FedSpaLLM's quota overflowed
            4: {"partition-id": [3]},  # broke the partition sort
            5: {"partition-id": 0},  # node 1's
            6: config,  # bytes that are not UTF-8
            7: {"partition-id": 5, "num-partitions": 8},
        }
    )
    strategy = _strategy([])
    strategy.identify(grid)
    assert strategy.node_partition == {1: 0, 7: 5}
    assert strategy.node_resources == {1: 4.0, 7: 0.0}
    assert strategy.num_partitions == 8
    assert sorted(strategy.connected(grid), key=strategy.partition_order)  # sorts


def test_reference_replies_that_cannot_be_read_are_rejected_not_raised(flower_ids: None) -> None:
    rows: list[dict[str, Any]] = []
    good = {"partition-id": 0, "ppl/text:wikipedia": 12.5, "seconds": 1.0}
    grid = QueryGrid(
        {
            1: good,
            2: {
                "partition-id": 1,
                "ppl/text:wikipedia": 3.0,
                "window-tokens/text:wikipedia": [1.5],
                "window-nll/text:wikipedia": [1.0],
            },
            3: {"partition-id": 2, "phase": 1.0, "ppl/text:wikipedia": 3.0},
            4: {"partition-id": 0, "ppl/text:wikipedia": 3.0},  # node 1's partition
        }
    )
    strategy = _strategy(rows)
    strategy.node_partition = {1: 0, 2: 1, 3: 2, 4: 3}
    strategy.score_client_references(grid, ["standalone"], timeout=5)
    by_node = {r["node"]: r for r in rows}
    assert by_node[1]["ppl"] == 12.5 and by_node[1]["client"] == 0
    assert by_node[2]["status"] == "rejected" and "tokens" not in by_node[2]
    assert by_node[3]["status"] == "rejected" and by_node[3]["phase"] == "reference"
    assert "overwrite" in by_node[3]["problem"]
    assert by_node[4]["status"] == "rejected" and "node 4 declared 3" in by_node[4]["problem"]
    assert all(r["phase"] == "reference" for r in rows)


def test_a_train_reply_whose_check_raises_is_rejected_and_the_round_goes_on(
    flower_ids: None,
) -> None:
    """A method's reply check that raises on a malformed reply rejects that reply only."""
    rows: list[dict[str, Any]] = []
    strategy = _strategy(rows)
    state = {"a.lora_A.weight": np.ones((2, 3), np.float32)}
    msgs = []
    for node in (1, 2):
        strategy.sent[node] = {"a.lora_A.weight": ((2, 3), "float32")}
        strategy.node_partition[node] = node - 1
        out = Message(
            RecordDict({"config": ConfigRecord({})}),
            message_type=MessageType.TRAIN,
            dst_node_id=node,
        )
        out.metadata.__dict__["_message_id"] = str(uuid4())
        reply = RecordDict(
            {
                "arrays": to_record(state),
                "metrics": MetricRecord({"num-examples": 4, "partition-id": node - 1}),
            }
        )
        msgs.append(Message(reply, reply_to=out))

    def explode(server_round: int, node_id: int, reply: RecordDict, phase: str) -> str | None:
        if node_id == 1:
            raise KeyError("missing mask name")
        return None

    strategy.accept_reply = explode  # type: ignore[method-assign]
    accepted = strategy.collect_train(1, msgs)
    assert len(accepted) == 1
    (bad,) = [r for r in rows if r["status"] == "rejected"]
    assert bad["node"] == 1 and "could not be checked (KeyError" in bad["problem"]
