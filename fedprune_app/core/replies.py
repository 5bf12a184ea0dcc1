"""Pure helpers of the server side: averaging, reply checks, sizes. Plain NumPy; tests call them directly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from flwr.app import ArrayRecord

from fedprune_app.core.protocol import to_record as to_record


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




