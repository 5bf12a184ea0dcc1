"""Flower record helpers both sides use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

# the one rule, re-exported
from fedprune_app.core.config import parse_partition_id as parse_partition_id


def to_record(state: Mapping[str, np.ndarray]) -> ArrayRecord:
    """{name: ndarray} as an ArrayRecord (any dtype, bool masks included)."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in state.items()})


def numpy_state(record: ArrayRecord) -> dict[str, np.ndarray]:
    """An ArrayRecord as {name: ndarray}."""
    return {k: v.numpy() for k, v in record.items()}


def record_bytes(content: RecordDict | ArrayRecord) -> int:
    """Bytes of tensor data in a record (shape x itemsize; serialization headers not counted)."""
    records = content.array_records.values() if isinstance(content, RecordDict) else [content]
    return int(
        sum(
            np.prod(arr.shape, dtype=np.int64) * np.dtype(arr.dtype).itemsize
            for rec in records
            for arr in rec.values()
        )
    )


def spec_of(
    record: ArrayRecord | Mapping[str, np.ndarray],
) -> dict[str, tuple[tuple[int, ...], str]]:
    """{name: (shape, dtype)} of an ArrayRecord (or of named NumPy arrays): what a reply must
    match."""
    return {k: (tuple(v.shape), str(v.dtype)) for k, v in record.items()}


def flat_metrics(content: RecordDict) -> dict[str, Any]:
    """Every MetricRecord and ConfigRecord entry of a reply, flattened (lists kept)."""
    out: dict[str, Any] = {}
    for rec in list(content.metric_records.values()) + list(content.config_records.values()):
        for k, v in rec.items():
            out[k] = v.decode() if isinstance(v, bytes) else v
    return out
