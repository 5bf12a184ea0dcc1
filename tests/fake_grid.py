"""Stand-ins for Flower's Grid: `FakeGrid`, where a strategy only asks which nodes are connected
(no messages are sent), and `AnsweringGrid`, whose nodes answer each message at once with what
`answer(message)` builds (hand-made replies, no ClientApp)."""

from __future__ import annotations

from collections.abc import Iterable
from uuid import uuid4

from flwr.app import Message


class FakeGrid:
    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)


class AnsweringGrid(FakeGrid):
    """Each pushed message gets a fresh id (as Flower's grids do) and the reply `answer` makes;
    `pull_messages` hands the replies out."""

    def __init__(self, nodes: list[int]) -> None:
        super().__init__(nodes)
        self.replies: dict[str, Message] = {}

    def answer(self, msg: Message) -> Message:
        raise NotImplementedError

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid4())
            ids.append(msg.metadata.message_id)
            self.replies[msg.metadata.message_id] = self.answer(msg)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        return [self.replies.pop(i) for i in message_ids if i in self.replies]

    def send_and_receive(self, messages: Iterable[Message], timeout: float = 0) -> list[Message]:
        return self.pull_messages(self.push_messages(messages))
