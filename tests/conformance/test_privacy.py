"""What the server sees: every reply of a whole run of each method (tiny model, LocalGrid, no Ray) is checked.

- replies hold only the records each method declares (SEEN below, also the README's threat-model table);
- no reply holds raw text (no string of a reply contains, or is contained in, any of the clients' examples) or
  token ids (every array is float or bool, every metric a number);
- SFT-P's client embedding e_k stays in `context.state`: no reply array holds its values;
- FedTPA's mean feature vector is the only data statistic beyond losses and counts, sent once (query reply).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import MessageType

from fedprune_app.llm.data import client_data
from tests.local_grid import METHOD_CONFIGS, LocalGrid, method_config, run_server

# message type -> the records a reply may hold, per method (the rest of the guarantee is in the asserts)
COMMON = {MessageType.QUERY: {"metrics"}, MessageType.TRAIN: {"arrays", "metrics", "info"},
          MessageType.EVALUATE: {"metrics", "info"}, f"{MessageType.EVALUATE}.reference": {"metrics", "info"}}
SEEN: dict[str, dict[str, set[str]]] = {
    "fedit": COMMON,
    "fedflap": COMMON,
    "flexlora": COMMON,
    "fedspallm": COMMON,
    "fedtpa": {**COMMON, MessageType.QUERY: {"metrics", "features"},
               MessageType.TRAIN: {"arrays", "metrics", "info", "fedtpa"}},
    "sftp": {**COMMON, MessageType.EVALUATE: {"metrics", "info", "masks"}},
}
PARTITIONS = 4


def _strings(records: Any) -> list[str]:
    return [v for record in records.values() for v in record.values() if isinstance(v, str)]


def _example_texts(cfg: Any) -> list[str]:
    """Every text field of every client's examples (not `source`: the public name of the data set)."""
    texts = []
    for pid in range(PARTITIONS):
        data = client_data(cfg, pid, PARTITIONS)
        for example in data.train + data.val + data.test:
            texts += [v for k, v in example.items() if k != "source" and isinstance(v, str) and len(v) >= 12]
    return texts


@pytest.mark.parametrize("method", sorted(METHOD_CONFIGS))
def test_replies_hold_no_raw_data(method: str, tiny_model_dir: Path, tmp_path: Path, flower_ids: None) -> None:
    extra = {"fedspallm-references": "standalone"} if method == "fedspallm" else {}
    cfg = method_config(tiny_model_dir, tmp_path, method, num_server_rounds=2, fraction_train=1.0, **extra)
    grid = LocalGrid(cfg, PARTITIONS, seed=0)
    _, err = run_server(cfg, grid)
    assert err is None, err
    texts = _example_texts(cfg)
    kinds = set()
    for msg, reply in grid.exchanges:
        assert not reply.has_error(), reply.error.reason
        kind = msg.metadata.message_type
        kinds.add(kind)
        content = reply.content
        assert set(content.keys()) <= SEEN[method][kind], (kind, set(content.keys()))
        for s in _strings(content.config_records):
            assert len(s) < 200 and not any(s in t or t in s for t in texts), (kind, s)
        for name, record in content.metric_records.items():
            assert all(isinstance(v, int | float) for v in record.values()), (kind, name, dict(record))
        for name, record in content.array_records.items():
            for key, array in record.items():
                assert array.numpy().dtype.kind in "fb", (kind, name, key, array.numpy().dtype)
    # FedSpaLLM is evaluated by the server only; its clients score their own standalone model instead
    assert {MessageType.QUERY, MessageType.TRAIN} <= kinds
    assert (f"{MessageType.EVALUATE}.reference" if method == "fedspallm" else MessageType.EVALUATE) in kinds
    if method == "sftp":
        _embedding_never_sent(grid)
    if method == "fedtpa":
        _one_feature_vector_per_client(grid)


def _embedding_never_sent(grid: LocalGrid) -> None:
    from clients.sftp import EMBEDDING_RECORD

    embeddings = [ctx.state.array_records[EMBEDDING_RECORD]["embedding"].numpy() for ctx in grid.contexts.values()]
    assert len(embeddings) == PARTITIONS
    for _, reply in grid.exchanges:
        for record in reply.content.array_records.values():
            for array in record.values():
                values = array.numpy().astype(np.float64).reshape(-1)
                for e in embeddings:
                    flat = e.astype(np.float64).reshape(-1)
                    # no reply array holds e_k, not even as a contiguous run of its values
                    windows = np.lib.stride_tricks.sliding_window_view(values, flat.size) if values.size >= flat.size \
                        else np.empty((0, flat.size))
                    assert not np.isclose(windows, flat, rtol=0, atol=0).all(axis=1).any()


def _one_feature_vector_per_client(grid: LocalGrid) -> None:
    queries = [(m, r) for m, r in grid.exchanges if r.content.array_records.get("features") is not None]
    assert len(queries) == PARTITIONS  # once per client, before round 1
    for _, reply in queries:
        assert set(reply.content.array_records["features"]) == {"lambda"}
        assert reply.content.array_records["features"]["lambda"].numpy().ndim == 1  # a mean: one vector
    for msg, reply in grid.exchanges:
        if msg.metadata.message_type == MessageType.TRAIN:
            assert set(reply.content.array_records["fedtpa"]) == {"pruning-log", "layer-scores"}
