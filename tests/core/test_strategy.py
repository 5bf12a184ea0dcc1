"""The server side without Ray: hand-built replies into the template strategy and the LoRA
base's FedAvg."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Error, Message, MessageType, MetricRecord, RecordDict

from fedprune_app.core.config import RunConfig
from fedprune_app.core.lora import LoRAStrategy
from fedprune_app.core.protocol import spec_of
from fedprune_app.core.replies import check_arrays, to_record, weighted_average
from fedprune_app.core.strategy import FederatedStrategy, RoundFailed, error_line
from tests.fake_grid import FakeGrid


def _state(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "a.lora_A.weight": rng.normal(size=(4, 8)).astype(np.float32),
        "a.lora_B.weight": rng.normal(size=(8, 4)).astype(np.float32),
    }


def _reply(to: Message, state: dict[str, np.ndarray] | None, n: int, pid: int) -> Message:
    content = RecordDict(
        {"metrics": MetricRecord({"num-examples": n, "partition-id": pid, "train-loss": 1.0 + pid})}
    )
    if state is not None:
        content["arrays"] = to_record(state)
    return Message(content=content, reply_to=to)


def _strategy(rows: list[dict[str, Any]]) -> FederatedStrategy:
    return LoRAStrategy(RunConfig.from_flower({"seed": 0}), recorder=rows.append)


def test_weighted_average_matches_brute_force() -> None:
    rng = np.random.default_rng(0)
    states, weights = [_state(rng) for _ in range(3)], [10.0, 30.0, 60.0]
    avg = weighted_average(states, weights)
    for key in states[0]:
        brute = (
            sum(w * s[key].astype(np.float64) for s, w in zip(states, weights, strict=True)) / 100.0
        )
        np.testing.assert_allclose(avg[key], brute, rtol=1e-6)
        assert avg[key].dtype == np.float32


def _train_round(strategy: FederatedStrategy, nodes: list[int]) -> list[Message]:
    initial = to_record(_state(np.random.default_rng(99)))
    return list(strategy.configure_train(1, initial, ConfigRecord({"lr": 0.1}), FakeGrid(nodes)))


def test_fedavg_over_hand_built_replies(flower_ids: None) -> None:
    rows: list[dict[str, Any]] = []
    strategy = _strategy(rows)
    sent = _train_round(strategy, [11, 22, 33])
    assert [m.metadata.dst_node_id for m in sent] == [11, 22, 33]
    assert all(m.metadata.message_type == MessageType.TRAIN for m in sent)
    assert sent[0].content.config_records["config"]["server-round"] == 1
    rng = np.random.default_rng(1)
    states, sizes = [_state(rng) for _ in sent], [5, 15, 80]
    replies = [
        _reply(m, s, n, i) for i, (m, s, n) in enumerate(zip(sent, states, sizes, strict=True))
    ]
    assert [r.metadata.src_node_id for r in replies] == [m.metadata.dst_node_id for m in sent]
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert arrays is not None and metrics is not None
    for key in states[0]:
        brute = sum(n * s[key] for s, n in zip(states, sizes, strict=True)) / sum(sizes)
        np.testing.assert_allclose(arrays[key].numpy(), brute, rtol=1e-5)
    assert metrics["train-loss"] == pytest.approx((5 * 1 + 15 * 2 + 80 * 3) / 100)
    assert [r["client"] for r in rows] == [0, 1, 2] and all(r["status"] == "accepted" for r in rows)
    assert rows[0]["bytes-up"] == rows[0]["bytes-down"] == (32 + 32) * 4


def test_aggregation_does_not_depend_on_arrival_order(flower_ids: None) -> None:
    """Replies are aggregated in partition order, so the same seed gives the same global bits
    (determinism)."""
    results = []
    for order in ([0, 1, 2], [2, 0, 1]):
        strategy = _strategy([])
        sent = _train_round(strategy, [11, 22, 33])
        # float sums depend on their order: (1e17 + 1) - 1e17 = 0 but (-1e17 + 1e17) + 1 = 1
        states = [
            {k: np.full_like(v, value) for k, v in _state(np.random.default_rng(5)).items()}
            for value in (1e17, 1.0, -1e17)
        ]
        replies = [_reply(sent[i], states[i], 7, i) for i in order]
        arrays, _ = strategy.aggregate_train(1, replies)
        results.append({k: v.numpy().tobytes() for k, v in arrays.items()})
    assert results[0] == results[1]


def test_failed_and_malformed_replies_are_dropped(flower_ids: None) -> None:
    rows: list[dict[str, Any]] = []
    strategy = _strategy(rows)
    sent = _train_round(strategy, [1, 2, 3, 4, 5])
    rng = np.random.default_rng(2)
    good = _state(rng)
    nan = _state(rng)
    nan["a.lora_A.weight"][0, 0] = np.nan
    wrong = {**_state(rng), "a.lora_B.weight": np.zeros((3, 3), np.float32)}
    replies = [
        _reply(sent[0], good, 10, 0),
        Message(Error(code=1, reason="ClientApp raised"), reply_to=sent[1]),
        _reply(sent[2], nan, 10, 2),
        _reply(sent[3], wrong, 10, 3),
        _reply(sent[4], None, 10, 4),
    ]
    assert [r.metadata.src_node_id for r in replies] == [m.metadata.dst_node_id for m in sent]
    arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays is not None
    for key in good:  # only the one good reply counts
        np.testing.assert_allclose(arrays[key].numpy(), good[key])
    status = {r["node"]: (r["status"], r.get("problem", "")) for r in rows}
    assert status[1][0] == "accepted"
    assert status[2] == ("rejected", "client error: ClientApp raised")
    assert (
        "non-finite" in status[3][1]
        and "shape (3, 3)" in status[4][1]
        and "no 'arrays'" in status[5][1]
    )


def test_no_usable_reply_keeps_the_global_state(flower_ids: None) -> None:
    strategy = _strategy([])
    sent = _train_round(strategy, [7])
    reply = Message(Error(code=1, reason="boom"), reply_to=sent[0])
    assert strategy.aggregate_train(1, [reply]) == (None, None)


def test_sampling_is_seeded_and_respects_the_fraction() -> None:
    cfg = RunConfig.from_flower({"fraction-train": 0.5, "seed": 4})
    a, b = LoRAStrategy(cfg), LoRAStrategy(cfg)
    grid = FakeGrid(list(range(10)))
    assert [a.sample(grid, 0.5) for _ in range(3)] == [b.sample(grid, 0.5) for _ in range(3)]
    assert len(a.sample(grid, 0.5)) == 5 and len(a.sample(grid, 0.01)) == 1


def test_round_zero_evaluation_follows_eval_untouched(flower_ids: None) -> None:
    """Round 0 (the untouched model) is evaluated unless `eval-untouched` is false; the last round
    always."""
    arrays, grid = to_record(_state(np.random.default_rng(0))), FakeGrid([1, 2])
    for untouched, sent in ((True, 2), (False, 0)):
        strategy = LoRAStrategy(
            RunConfig.from_flower({"seed": 0, "num-server-rounds": 3, "eval-untouched": untouched})
        )
        assert len(list(strategy.configure_evaluate(0, arrays, ConfigRecord(), grid))) == sent
        assert len(list(strategy.configure_evaluate(1, arrays, ConfigRecord(), grid))) == 0
        assert len(list(strategy.configure_evaluate(3, arrays, ConfigRecord(), grid))) == 2


def test_evaluate_replies_are_logged_per_client(flower_ids: None) -> None:
    rows: list[dict[str, Any]] = []
    strategy = _strategy(rows)
    sent = list(
        strategy.configure_evaluate(
            0, to_record(_state(np.random.default_rng(0))), ConfigRecord(), FakeGrid([1, 2])
        )
    )
    replies = [
        Message(
            RecordDict(
                {
                    "metrics": MetricRecord(
                        {"acc": 0.5 + 0.25 * i, "num-examples": 10 * (i + 1), "partition-id": i}
                    ),
                    "info": ConfigRecord({"data": f"src{i}"}),
                }
            ),
            reply_to=m,
        )
        for i, m in enumerate(sent)
    ]
    metrics = strategy.aggregate_evaluate(0, replies)
    assert metrics is not None and metrics["acc"] == pytest.approx((0.5 * 10 + 0.75 * 20) / 30)
    assert [(r["client"], r["data"], r["round"]) for r in rows] == [(0, "src0", 0), (1, "src1", 0)]


def test_check_arrays_accepts_a_matching_record() -> None:
    state = _state(np.random.default_rng(5))
    assert check_arrays(to_record(state), spec_of(to_record(state))) is None


class OneAtATimeGrid(FakeGrid):
    """Replies become available one per pull (as clients finish one after another)."""

    def __init__(self, nodes: list[int], events: list[str]) -> None:
        super().__init__(nodes)
        self.events, self.ready = events, []

    def push_messages(self, messages: list[Message]) -> list[str]:
        ids = []
        for i, msg in enumerate(messages):
            msg.metadata.__dict__["_message_id"] = f"m{i}"
            ids.append(msg.metadata.message_id)
            self.ready.append(_reply(msg, _state(np.random.default_rng(i)), 10, i))
        return ids

    def pull_messages(self, message_ids: list[str]) -> list[Message]:
        self.events.append("pull")
        return [self.ready.pop(0)] if self.ready else []


def test_train_replies_are_accepted_as_they_arrive_not_after_the_round(flower_ids: None) -> None:
    """`accept_reply` sees each reply before the next pull, so a strategy can fold large replies
    in and drop them."""
    events: list[str] = []

    class Recording(LoRAStrategy):
        def accept_reply(
            self, server_round: int, node_id: int, reply: RecordDict, phase: str
        ) -> str | None:
            events.append("accept")
            return super().accept_reply(server_round, node_id, reply, phase)

    strategy = Recording(RunConfig.from_flower({"seed": 0}))
    strategy.timeout = 5.0
    initial = to_record(_state(np.random.default_rng(99)))
    arrays, _ = strategy.train_round(
        1, OneAtATimeGrid([11, 22, 33], events), initial, ConfigRecord()
    )
    assert arrays is not None and events == ["pull", "accept"] * 3


# --- a round in which every client fails ----------------------------------------------------------

CLIENT_ERROR = "run-config key 'client-data': JSONL file /nonexistent.jsonl does not exist"


def ray_reason(pid: int, message: str = CLIENT_ERROR) -> str:
    """An error reply's reason as Flower's Ray simulation writes it: a traceback that differs per
    actor, then the ClientApp's exception message."""
    return (
        "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'ray::ClientAppActor.run() "
        f"(pid={pid}, ip=192.0.2.2, actor_id={pid:032x})\n"
        '  File "flwr/simulation/ray_transport/ray_actor.py", line 65, in run\n'
        "    raise ClientAppException(str(ex)) from ex\n"
        "flwr.clientapp.client_app.ClientAppException: \n"
        f"Exception ClientAppException occurred. Message: {message}'>"
    )


class ErrorGrid(FakeGrid):
    """Every train message is answered at once by
    `answer(node) -> Message content or an error reason`."""

    def __init__(self, nodes: list[int], reason: Any) -> None:
        super().__init__(nodes)
        self.reason, self.ready, self.sent = reason, {}, 0

    def push_messages(self, messages: list[Message]) -> list[str]:
        ids = []
        for msg in messages:
            self.sent += 1
            msg.metadata.__dict__["_message_id"] = f"m{self.sent}"
            ids.append(msg.metadata.message_id)
            reason = self.reason(msg.metadata.dst_node_id, self.sent)
            self.ready[msg.metadata.message_id] = (
                Message(Error(code=0, reason=reason), reply_to=msg)
                if isinstance(reason, str)
                else _reply(
                    msg,
                    _state(np.random.default_rng(0)),
                    10,
                    self.nodes.index(msg.metadata.dst_node_id),
                )
            )
        return ids

    def pull_messages(self, message_ids: list[str]) -> list[Message]:
        return [self.ready.pop(i) for i in message_ids if i in self.ready]


def _failing_round(grid: ErrorGrid, **config: Any) -> tuple[RoundFailed, list[dict[str, Any]]]:
    rows: list[dict[str, Any]] = []
    cfg = RunConfig.from_flower({"seed": 0, **{k.replace("_", "-"): v for k, v in config.items()}})
    strategy = LoRAStrategy(cfg, recorder=rows.append)
    strategy.timeout = 5.0
    with pytest.raises(RoundFailed) as err:
        strategy.train_round(1, grid, to_record(_state(np.random.default_rng(99))), ConfigRecord())
    return err.value, rows


def test_every_client_failing_with_one_error_ends_the_run_with_that_error(flower_ids: None) -> None:
    """The run's error is the clients' own (the ConfigError naming the key), not a count of failed
    replies."""
    err, rows = _failing_round(
        ErrorGrid([11, 22, 33], lambda node, i: ray_reason(1000 + i)), round_retries=1
    )
    assert str(err) == (
        f"round 1: every client failed with the same error (6 train replies in 2 attempt(s)): "
        f"{CLIENT_ERROR}"
    )
    assert [r["status"] for r in rows if r["phase"] == "train"] == ["rejected"] * 6


def test_different_errors_keep_the_count_and_name_the_most_common(flower_ids: None) -> None:
    def reason(node: int, i: int) -> str:
        return ray_reason(i, "CUDA out of memory" if node == 33 else CLIENT_ERROR)

    err, _ = _failing_round(ErrorGrid([11, 22, 33], reason), round_retries=0)
    assert str(err).startswith(
        "round 1: fewer than min-replies = 1 usable train replies in 1 attempt(s)"
    )
    assert str(err).endswith(f"the most common problem (2 of 3 unusable replies): {CLIENT_ERROR}")


def test_one_error_beside_usable_replies_is_not_every_client_failing(flower_ids: None) -> None:
    """Two usable replies and min-replies = 3: the round fails, but not because every client
    failed."""
    err, _ = _failing_round(
        ErrorGrid([11, 22, 33], lambda node, i: ray_reason(i) if node == 33 else None),
        round_retries=0,
        min_replies=3,
    )
    assert "fewer than min-replies = 3" in str(
        err
    ) and f"(1 of 1 unusable replies): {CLIENT_ERROR}" in str(err)


@pytest.mark.parametrize(
    "reason, line",
    [
        (ray_reason(7), CLIENT_ERROR),
        # Flower's deployment runtime
        (
            "<class 'fedprune_app.core.config.ConfigError'>:<'run-config key 'x' must be 1'>",
            "ConfigError: run-config key 'x' must be 1",
        ),
        (
            "ConfigError(\"run-config key 'x' must be 1\")",
            "ConfigError(\"run-config key 'x' must be 1\")",
        ),
        (
            'Traceback (most recent call last):\n  File "a.py"\n\x1b[91mValueError: boom\x1b[0m\n',
            "ValueError: boom",
        ),
        ("", "(no error text)"),
    ],
)
def test_error_line_is_the_exception_message(reason: str, line: str) -> None:
    assert error_line(reason) == line
