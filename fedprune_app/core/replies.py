"""Pure helpers of the server side: averaging, reply checks, sizes. Plain NumPy; tests call them
directly."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord

from fedprune_app.core.protocol import spec_of
from fedprune_app.core.protocol import to_record as to_record

# a client's reported example count; far above any real one, far below a takeover
MAX_NUM_EXAMPLES = 2**31
MAX_ABS_VALUE = 1e30  # |x| of any float a reply carries: a sum of replies stays finite in float32


def weighted_average(
    states: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]
) -> dict[str, np.ndarray]:
    """FedAvg: Σ_i w_i x_i / Σ_i w_i per tensor, accumulated in float64 and returned in each
    tensor's dtype."""
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


def examples_problem(metrics: Mapping[str, Any]) -> str | None:
    """Why a reply's `num-examples` cannot weight an average (missing, not a number, NaN, inf, ≤ 0
    or above MAX_NUM_EXAMPLES), or None."""
    n = metrics.get("num-examples")
    if not isinstance(n, int | float) or isinstance(n, bool) or not math.isfinite(n) or n <= 0:
        return f"reply lacks a positive 'num-examples' metric (got {n!r})"
    if n > MAX_NUM_EXAMPLES:
        return f"reply's 'num-examples' {n:g} is above {MAX_NUM_EXAMPLES}"
    return None


def values_problem(key: str, arr: np.ndarray, dtype: str | None = None) -> str | None:
    """Why an array cannot enter an aggregate: another dtype than `dtype`, or floats that are
    non-finite or above MAX_ABS_VALUE in magnitude; None when it can."""
    if dtype is not None and arr.dtype != np.dtype(dtype):
        return f"array {key} is {arr.dtype}, expected {dtype}"
    if arr.dtype.kind == "f" and arr.size:
        if not np.isfinite(arr).all():
            return f"array {key} holds non-finite values"
        peak = float(np.abs(arr).max())
        if peak > MAX_ABS_VALUE:
            return f"array {key} holds values up to {peak:.3g}, above {MAX_ABS_VALUE:g}"
    return None


def values_of_problem(
    received: ArrayRecord, expected: Mapping[str, tuple[tuple[int, ...], str]]
) -> str | None:
    """`values_problem` over every expected array of a reply, each against the dtype it was sent
    in."""
    for key, (_shape, dtype) in expected.items():
        if (problem := values_problem(key, received[key].numpy(), dtype or None)) is not None:
            return problem
    return None


Spec = Mapping[str, tuple[tuple[int, ...], str]]  # {name: (shape, dtype)}: `protocol.spec_of`


def spec_problem(found: Spec, expected: Spec) -> str | None:
    """The first way arrays of spec `found` differ from `expected` (missing keys, then extra keys,
    then each expected key's shape, then its dtype; an expected dtype '' is any), or None."""
    missing = sorted(set(expected) - set(found))
    if missing:
        shape, dtype = expected[missing[0]]
        return f"missing {len(missing)} arrays, e.g. {missing[0]} (expected {tuple(shape)} {dtype})"
    extra = sorted(set(found) - set(expected))
    if extra:
        return f"{len(extra)} unexpected arrays, e.g. {extra[0]} {tuple(found[extra[0]][0])}"
    for key, (shape, _dtype) in expected.items():
        if tuple(found[key][0]) != tuple(shape):
            return f"array {key} has shape {tuple(found[key][0])}, expected {tuple(shape)}"
    for key, (_shape, dtype) in expected.items():
        if dtype and np.dtype(found[key][1]) != np.dtype(dtype):
            return f"array {key} is {found[key][1]}, expected {dtype}"
    return None


def check_arrays(received: ArrayRecord, expected: Spec) -> str | None:
    """Why a reply's arrays cannot be aggregated (`spec_problem`: missing / extra / mis-shaped /
    another dtype than sent; then non-finite or huge values), or None if they can."""
    return spec_problem(spec_of(received), expected) or values_of_problem(received, expected)
