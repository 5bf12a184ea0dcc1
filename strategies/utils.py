"""Pure helpers of the server side: averaging, reply checks, sizes. Plain NumPy; tests call them directly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from fedprune_app.records import to_record as to_record  # re-exported for the strategies


def weighted_average(states: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]) -> dict[str, np.ndarray]:
    """FedAvg: Σ_i w_i x_i / Σ_i w_i per tensor, accumulated in float64 and returned in each tensor's dtype."""
    if not states or len(states) != len(weights):
        raise ValueError("weighted_average needs one weight per state and at least one state")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError(f"weights must sum to a positive number, got {total}")
    out = {}
    for key, first in states[0].items():
        acc = np.zeros(first.shape, dtype=np.float64)
        for state, w in zip(states, weights, strict=True):
            acc += state[key].astype(np.float64) * (w / total)
        out[key] = acc.astype(first.dtype)
    return out


def numpy_state(record: ArrayRecord) -> dict[str, np.ndarray]:
    """An ArrayRecord as {name: ndarray}."""
    return {k: v.numpy() for k, v in record.items()}


def record_bytes(content: RecordDict | ArrayRecord) -> int:
    """Bytes of tensor data in a record (shape x itemsize; serialization headers not counted)."""
    records = content.array_records.values() if isinstance(content, RecordDict) else [content]
    return int(sum(np.prod(arr.shape, dtype=np.int64) * np.dtype(arr.dtype).itemsize
                   for rec in records for arr in rec.values()))


def check_arrays(received: ArrayRecord, expected: Mapping[str, tuple[tuple[int, ...], str]]) -> str | None:
    """Why a reply's arrays cannot be aggregated (missing/extra/mis-shaped/non-finite), or None if they can."""
    missing = sorted(set(expected) - set(received))
    if missing:
        return f"missing {len(missing)} arrays, e.g. {missing[0]}"
    extra = sorted(set(received) - set(expected))
    if extra:
        return f"{len(extra)} unexpected arrays, e.g. {extra[0]}"
    for key, (shape, _dtype) in expected.items():
        arr = received[key].numpy()
        if tuple(arr.shape) != tuple(shape):
            return f"array {key} has shape {tuple(arr.shape)}, expected {tuple(shape)}"
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            return f"array {key} holds non-finite values"
    return None


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
