"""A Flower Grid whose nodes are ClientApp calls in this process: whole runs (`server_app.main`)
without Ray.

Nodes get random ids (as Flower's simulation draws them) unless `ids` is given; a node in `failing`
answers every message with an error reply (a crashed ClientApp); `interrupt_round` raises
KeyboardInterrupt when a train message of that round is sent (the server process killed mid-round),
`interrupt_evaluate_round` when an evaluate message of that round is (killed after the round's
release, before its checkpoint; the message is kept as `interrupted`);
a node in `silent` never answers (disconnected: no reply before the timeout); a partition in
`tamper` sends what its function makes of each reply (a misbehaving client); every message and reply
is kept for inspection.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

from flwr.app import Context, Error, Message, MessageType, RecordDict

from fedprune_app.client_app import app
from fedprune_app.core.config import RunConfig
from tests.conformance import conformance_of
from tests.conftest import small_config


class LocalGrid:
    def __init__(
        self,
        cfg: RunConfig,
        partitions: int,
        failing: Iterable[int] = (),
        ids: list[int] | None = None,
        node_configs: dict[int, dict[str, Any]] | None = None,
        seed: int | None = None,
        interrupt_round: int | None = None,
        interrupt_evaluate_round: int | None = None,
        tamper: dict[int, Callable[[Message, RecordDict], RecordDict]] | None = None,
    ) -> None:
        ids = ids or random.Random(seed).sample(range(1, 1 << 40), partitions)
        self.contexts = {
            ids[p]: Context(
                run_id=1,
                node_id=ids[p],
                state=RecordDict(),
                run_config=cfg.to_dict(),
                node_config={
                    "partition-id": p,
                    "num-partitions": partitions,
                    **(node_configs or {}).get(p, {}),
                },
            )
            for p in range(partitions)
        }
        self.failing = set(failing)
        self.silent: set[int] = set()
        self.interrupt_round = interrupt_round
        self.interrupt_evaluate_round = interrupt_evaluate_round
        self.interrupted: Message | None = None
        # partition id -> (message, reply content) -> what that misbehaving client sends instead
        self.tamper = tamper or {}
        # (message, reply) in the order they happened
        self.exchanges: list[tuple[Message, Message]] = []
        self.replies: dict[str, Message] = {}  # message id -> its reply, until pulled

    def get_node_ids(self) -> list[int]:
        return sorted(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """Answer every message at once (as Flower's InMemoryGrid, a fresh message id each);
        `pull_messages` hands the replies out."""
        ids = []
        for msg in messages:
            # what Flower's own grids do on push
            msg.metadata.__dict__["_message_id"] = str(uuid4())
            ids.append(msg.metadata.message_id)
            if (reply := self.answer(msg)) is not None:
                self.replies[msg.metadata.message_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        return [self.replies.pop(i) for i in message_ids if i in self.replies]

    def send_and_receive(
        self, messages: Iterable[Message], timeout: float | None = None
    ) -> Iterator[Message]:
        return iter(self.pull_messages(self.push_messages(messages)))

    def answer(self, msg: Message) -> Message | None:
        config = msg.content.config_records.get("config")
        if (
            msg.metadata.message_type == MessageType.TRAIN
            and config is not None
            and config.get("server-round") == self.interrupt_round
        ):
            raise KeyboardInterrupt(f"interrupted in round {self.interrupt_round}")
        if (
            msg.metadata.message_type == MessageType.EVALUATE
            and config is not None
            and config.get("server-round") == self.interrupt_evaluate_round
        ):
            self.interrupted = msg
            raise KeyboardInterrupt(f"interrupted evaluating round {self.interrupt_evaluate_round}")
        node = msg.metadata.dst_node_id
        if node in self.silent:
            return None
        if node in self.failing:
            reply = Message(Error(code=0, reason=f"node {node} crashed"), reply_to=msg)
        else:
            try:
                reply = app(msg, self.contexts[node])
            except Exception as err:  # Flower turns a raising ClientApp into an error reply
                reply = Message(Error(code=0, reason=repr(err)), reply_to=msg)
            partition = self.contexts[node].node_config["partition-id"]
            if partition in self.tamper and not reply.has_error():
                reply = Message(self.tamper[partition](msg, reply.content), reply_to=msg)
        self.exchanges.append((msg, reply))
        return reply


def run_server(cfg: RunConfig, grid: LocalGrid) -> tuple[Path, BaseException | None]:
    """`server_app.main` on this grid: the run directory it created and what it raised (None if
    nothing)."""
    from fedprune_app.core.rundir import resolve_output_dir
    from fedprune_app.server_app import main

    root = resolve_output_dir(cfg.output_dir)
    before = set(root.iterdir()) if root.exists() else set()
    context = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg.to_dict()
    )
    raised: BaseException | None = None
    try:
        main(grid, context)
    except BaseException as err:  # noqa: BLE001 - the test inspects it (KeyboardInterrupt included)
        raised = err
    created = sorted(set(root.iterdir()) - before)
    assert len(created) == 1, created
    return created[0], raised


def method_config(tiny_model_dir: Path, tmp_path: Path, method: str, **extra: Any) -> RunConfig:
    """A 3-round run of `method` (its settings from tests/methods/<m>/__init__.py) on the tiny model
    that a test can afford: half the clients train per round, half are evaluated (on 4 examples:
    lm-eval's forward through the 49k-token vocabulary is most of a run's time)."""
    settings = {
        "method": method,
        "output-dir": str(tmp_path / "runs"),
        "num-server-rounds": 3,
        "fraction-train": 0.5,
        "fraction-evaluate": 0.5,
        "test-examples": 4,
        **conformance_of(method).settings,
        **{k.replace("_", "-"): v for k, v in extra.items()},
    }
    return small_config(tiny_model_dir, **settings)
