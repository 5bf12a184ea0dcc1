"""What the server sees: every reply of a whole run of each method (tiny model, LocalGrid, no Ray)
is checked.

- replies hold only the records each method declares (tests/conformance COMMON_REPLIES + the
  method's own, in tests/methods/<m>/__init__.py; also the threat-model table in
  docs/reliability.md);
- no reply holds raw text (no string of a reply contains, or is contained in, any of the clients'
  examples) or token ids (every array is float or bool, every metric a number or a list of floats,
  e.g. FedSpaLLM's per-window scores of public text: a list of ints could carry token ids; a method
  whose arrays travel encoded, e.g. FedSpaLLM's bit-packed masks and bfloat16 bits, is checked on
  what its `Conformance.decode` makes of them);
- each method's own checks (SFT-P: the client embedding e_k never leaves `context.state`; FedTPA:
  the mean feature vector is the only data statistic beyond losses and counts, sent once).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from flwr.app import MessageType

from fedprune_app.core import registry
from fedprune_app.llm.data import client_data
from tests.conformance import conformance_of
from tests.local_grid import LocalGrid, method_config, run_server

PARTITIONS = 4


def _strings(records: Any) -> list[str]:
    return [v for record in records.values() for v in record.values() if isinstance(v, str)]


def _example_texts(cfg: Any) -> list[str]:
    """Every text field of every client's examples (not `source`: the public name of the data
    set)."""
    texts = []
    for pid in range(PARTITIONS):
        data = client_data(cfg, pid, PARTITIONS)
        for example in data.train + data.val + data.test:
            texts += [
                v
                for k, v in example.items()
                if k != "source" and isinstance(v, str) and len(v) >= 12
            ]
    return texts


def check_privacy(method: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    """A whole run of `method`: every reply holds only the records the method declares, no raw text,
    no token ids, and passes the method's own checks (tests/methods/<m>/__init__.py)."""
    spec = conformance_of(method)
    cfg = method_config(
        tiny_model_dir,
        tmp_path,
        method,
        num_server_rounds=2,
        fraction_train=1.0,
        **spec.privacy_settings,
    )
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
        assert set(content.keys()) <= spec.allowed_records(kind), (kind, set(content.keys()))
        for s in _strings(content.config_records):
            assert len(s) < 200 and not any(s in t or t in s for t in texts), (kind, s)
        # numbers, or lists of float scores (never ints)
        for name, record in content.metric_records.items():
            assert all(
                isinstance(v, int | float)
                or (isinstance(v, list) and all(type(x) is float for x in v))
                for v in record.values()
            ), (kind, name, dict(record))
        for name, record in content.array_records.items():
            arrays = {key: array.numpy() for key, array in record.items()}
            if spec.decode is not None:  # encoded arrays are checked as the server decodes them
                assert all(a.dtype.kind in "fbu" for a in arrays.values()), (kind, name)
                arrays = spec.decode(cfg, name, arrays)
            for key, array in arrays.items():
                assert array.dtype.kind in "fb", (kind, name, key, array.dtype)
    assert {MessageType.QUERY, MessageType.TRAIN, spec.evaluated_by} <= kinds
    for check in spec.privacy_checks:
        check(grid)


@pytest.mark.parametrize("method", registry.names())
def test_replies_hold_no_raw_data(
    method: str, tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    check_privacy(method, tiny_model_dir, tmp_path)
