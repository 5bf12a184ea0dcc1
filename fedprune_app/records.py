"""Flower record helpers both sides use."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord


def to_record(state: Mapping[str, np.ndarray]) -> ArrayRecord:
    """{name: ndarray} as an ArrayRecord (any dtype, bool masks included)."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in state.items()})
