"""Flower record helpers both sides use."""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Integral
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict


def to_record(state: Mapping[str, np.ndarray]) -> ArrayRecord:
    """{name: ndarray} as an ArrayRecord (any dtype, bool masks included)."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in state.items()})


def parse_partition_id(value: Any, num_partitions: int | None = None, *, text: bool = False) -> int:
    """A partition id, validated: an int, not a bool (with `text`, also an int written as a string, as Flower's
    Ray proxy passes node-config values), in [0, num_partitions), or >= 0 where the number of partitions is not
    known (a reply's `partition-id` metric, checked by the server). Raises ValueError saying what it accepts and
    what it got. The one rule for a node's config and for the replies."""
    allowed = "a non-negative int" if num_partitions is None else f"an int in [0, {num_partitions})"
    problem = ValueError(f"'partition-id' must be {allowed}, got {value!r}")
    if isinstance(value, Integral) and not isinstance(value, bool):
        pid = int(value)
    elif text and isinstance(value, str):
        try:
            pid = int(value.strip())
        except ValueError:
            raise problem from None
    else:
        raise problem
    if pid < 0 or (num_partitions is not None and pid >= num_partitions):
        raise problem
    return pid


def numpy_state(record: ArrayRecord) -> dict[str, np.ndarray]:
    """An ArrayRecord as {name: ndarray}."""
    return {k: v.numpy() for k, v in record.items()}


def record_bytes(content: RecordDict | ArrayRecord) -> int:
    """Bytes of tensor data in a record (shape x itemsize; serialization headers not counted)."""
    records = content.array_records.values() if isinstance(content, RecordDict) else [content]
    return int(sum(np.prod(arr.shape, dtype=np.int64) * np.dtype(arr.dtype).itemsize
                   for rec in records for arr in rec.values()))


def spec_of(record: ArrayRecord) -> dict[str, tuple[tuple[int, ...], str]]:
    """{name: (shape, dtype)} of an ArrayRecord: what a reply must match."""
    return {k: (tuple(v.shape), str(v.dtype)) for k, v in record.items()}


def flat_metrics(content: RecordDict) -> dict[str, Any]:
    """Every MetricRecord and ConfigRecord entry of a reply, flattened (lists kept)."""
    out: dict[str, Any] = {}
    for rec in list(content.metric_records.values()) + list(content.config_records.values()):
        for k, v in rec.items():
            out[k] = v.decode() if isinstance(v, bytes) else v
    return out
