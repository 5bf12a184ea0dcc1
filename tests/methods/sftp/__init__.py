"""SFT-P's tests; its conformance settings (tests/conformance)."""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import MessageType

from tests.conformance import Conformance


def embedding_never_sent(grid: Any) -> None:
    """The client embedding e_k stays in `context.state`: no reply array holds it, not even as a
    contiguous run of its values."""
    from clients.sftp import EMBEDDING_RECORD

    embeddings = [
        ctx.state.array_records[EMBEDDING_RECORD]["embedding"].numpy()
        for ctx in grid.contexts.values()
    ]
    assert len(embeddings) == len(grid.contexts)
    for _, reply in grid.exchanges:
        for record in reply.content.array_records.values():
            for array in record.values():
                values = array.numpy().astype(np.float64).reshape(-1)
                for e in embeddings:
                    flat = e.astype(np.float64).reshape(-1)
                    windows = (
                        np.lib.stride_tricks.sliding_window_view(values, flat.size)
                        if values.size >= flat.size
                        else np.empty((0, flat.size))
                    )
                    assert not np.isclose(windows, flat, rtol=0, atol=0).all(axis=1).any()


CONFORMANCE = Conformance(
    settings={"keep-ratios": "0.5", "local-steps": 2},
    replies={MessageType.EVALUATE: {"masks"}},
    privacy_checks=(embedding_never_sent,),
)
