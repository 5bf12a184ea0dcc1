"""A stand-in for Flower's Grid where a strategy only asks which nodes are connected (no messages
are sent)."""

from __future__ import annotations


class FakeGrid:
    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)
