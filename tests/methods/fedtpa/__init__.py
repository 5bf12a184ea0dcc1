"""FedTPA's tests; its conformance settings (tests/conformance)."""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import MessageType, RecordDict

from fedprune_app.core.protocol import numpy_state, to_record
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


def huge_layer_scores(content: RecordDict) -> RecordDict:
    """Every layer score at 1e308: finite, but two of them sum to inf, and LCWA's weights h/Σh of
    that layer become 0 (the layer silently zeroed)."""
    out = RecordDict()
    for name, record in content.items():
        if name == "fedtpa":
            extra = numpy_state(record)
            extra["layer-scores"] = np.full_like(extra["layer-scores"], 1e308)
            out[name] = to_record(extra)
        else:
            out[name] = record
    return out


CONFORMANCE = Conformance(
    settings={"local-steps": 3, "fedtpa-warmup-steps": 1, "fedtpa-feature-examples": 4},
    replies={MessageType.QUERY: {"features"}, MessageType.TRAIN: {"fedtpa"}},
    privacy_checks=(one_feature_vector_per_client,),
    tampers={"huge layer scores": (huge_layer_scores, r"layer-scores must be .* in \[0, 1e\+30\]")},
)
