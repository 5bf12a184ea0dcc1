"""FedTPA's tests; its conformance settings (tests/conformance)."""

from __future__ import annotations

from typing import Any

from flwr.app import MessageType

from tests.conformance import Conformance


def one_feature_vector_per_client(grid: Any) -> None:
    """The mean feature vector λ_i (Eq. 3) is the only data statistic: sent once per client, before
    round 1, as one vector; train replies carry the pruning log and layer scores only beyond the
    adapters."""
    queries = [
        (m, r) for m, r in grid.exchanges if r.content.array_records.get("features") is not None
    ]
    assert len(queries) == len(grid.contexts)  # once per client, before round 1
    for _, reply in queries:
        assert set(reply.content.array_records["features"]) == {"lambda"}
        assert (
            reply.content.array_records["features"]["lambda"].numpy().ndim == 1
        )  # a mean: one vector
    for msg, reply in grid.exchanges:
        if msg.metadata.message_type == MessageType.TRAIN:
            assert set(reply.content.array_records["fedtpa"]) == {"pruning-log", "layer-scores"}


CONFORMANCE = Conformance(
    settings={"local-steps": 3, "fedtpa-warmup-steps": 1, "fedtpa-feature-examples": 4},
    replies={MessageType.QUERY: {"features"}, MessageType.TRAIN: {"fedtpa"}},
    privacy_checks=(one_feature_vector_per_client,),
)
