"""Pure helpers of the server side: averaging, reply checks, sizes. Plain NumPy; tests call them
directly.

The checks every reply passes before anything reads it (`FederatedStrategy.accept_train`,
`aggregate_evaluate`, `identify`): each Array's real bytes against the shape and dtype it declares
(`record_problem`: Flower never compares them, and `spec_of` reads the declaration), metric names
that cannot overwrite a row's own fields and stay bounded (`metrics_problem`), identity numbers
typed and bounded (`identity_problem`). A strategy's own `reply_problem` runs after them."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord

from fedprune_app.core.protocol import parse_partition_id, spec_of
from fedprune_app.core.protocol import to_record as to_record
from fedprune_app.llm.settings import MAX_PARTITIONS

# a client's reported example count; far above any real one, far below a takeover
MAX_NUM_EXAMPLES = 2**31
MAX_ABS_VALUE = 1e30  # |x| of any float a reply carries: a sum of replies stays finite in float32
# what the server writes in a reply's row itself: a client metric of that name is refused
ROW_FIELDS = frozenset(
    {"time", "round", "phase", "node", "client", "status", "problem", "bytes-up", "bytes-down"}
)
MAX_METRIC_NAME, MAX_TEXT, MAX_ITEMS = 200, 4096, 1 << 20  # metric name, string, list lengths
MAX_RESOURCES = 1e6  # node-config `resources` (e.g. GPU memory in GB)
ARRAY_KINDS = "biuf"  # bool, signed and unsigned ints, floats: what fedprune's arrays are
_NPY_HEADERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


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


# --- every reply, before anything reads it --------------------------------------------------------


def array_problem(key: str, array: Any) -> str | None:
    """Why a Flower `Array` is not the array it declares, or None: not NumPy's .npy serialization,
    a header that does not parse, object / structured / complex values, a data length other than
    its header's shape × itemsize (truncated or padded), or a header shape or dtype other than the
    declared `shape` / `dtype` (what `spec_of` and every later check read)."""
    if getattr(array, "stype", None) != "numpy.ndarray":
        return f"array {key} is serialized as {getattr(array, 'stype', None)!r}, not numpy.ndarray"
    data = array.data
    buffer = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(buffer)
        if (read := _NPY_HEADERS.get(version)) is None:
            return f"array {key} is not a .npy buffer this server reads (format {version})"
        shape, _fortran, dtype = read(buffer)
    except (ValueError, OSError, SyntaxError, TypeError) as err:
        return f"array {key} is not a .npy buffer ({str(err)[:120]})"
    if dtype.hasobject or dtype.fields is not None or dtype.kind not in ARRAY_KINDS:
        return f"array {key} holds {dtype} values, expected bool, int or float"
    needed, held = math.prod(shape) * dtype.itemsize, len(data) - buffer.tell()
    if held != needed:
        return (
            f"array {key} carries {held} bytes, its header's {tuple(shape)} {dtype} needs {needed}"
        )
    try:
        declared = (tuple(int(n) for n in array.shape), np.dtype(array.dtype))
    except (TypeError, ValueError):
        return f"array {key} declares an unreadable shape or dtype ({array.dtype!r})"
    if declared != (tuple(shape), dtype):
        return f"array {key} declares {declared[0]} {declared[1]} but holds {tuple(shape)} {dtype}"
    return None


def record_problem(content: Any) -> str | None:
    """`array_problem` over every Array of every ArrayRecord of a reply's content, or None."""
    for name, record in content.array_records.items():
        for key in record.keys():
            if (problem := array_problem(f"{name}/{key}", record[key])) is not None:
                return problem
    return None


def metrics_problem(metrics: Mapping[str, Any]) -> str | None:
    """Why a reply's metrics cannot go into its row, or None: a name the row writes itself
    (`ROW_FIELDS`: a client cannot rewrite `phase` or `round`), a name with blanks or control
    characters or above MAX_METRIC_NAME, a string above MAX_TEXT, a list above MAX_ITEMS
    entries. NaN is allowed (a client's "not measured")."""
    for name, value in metrics.items():
        if name in ROW_FIELDS:
            return f"reply metric {name!r} would overwrite the row's own field"
        if not (0 < len(name) <= MAX_METRIC_NAME and name.isprintable() and " " not in name):
            return f"reply metric name {name[:40]!r} is not 1-{MAX_METRIC_NAME} visible characters"
        if isinstance(value, str) and len(value) > MAX_TEXT:
            return f"reply metric {name!r} is a text of {len(value)} characters, above {MAX_TEXT}"
        if isinstance(value, list) and len(value) > MAX_ITEMS:
            return f"reply metric {name!r} is a list of {len(value)} entries, above {MAX_ITEMS}"
    return None


def number_problem(
    name: str, value: Any, low: float, high: float, integer: bool = False
) -> str | None:
    """Why a reply's number `name` is unusable (not an int / a number, a bool, NaN, infinite, or
    outside [low, high]), or None."""
    kinds, what = (int, "an int") if integer else (int | float, "a finite number")
    if not isinstance(value, kinds) or isinstance(value, bool) or not math.isfinite(value):
        return f"reply metric {name!r} must be {what}, got {value!r}"
    if not low <= value <= high:
        return f"reply metric {name!r} must be in [{low:g}, {high:g}], got {value!r}"
    return None


def identity_problem(metrics: Mapping[str, Any]) -> str | None:
    """Why an identity reply cannot be believed: `partition-id` (`parse_partition_id`),
    `resources` (a finite number in [0, MAX_RESOURCES]), `num-partitions` (an int above the id,
    at most MAX_PARTITIONS), or None."""

    try:
        pid = parse_partition_id(metrics.get("partition-id"))
    except ValueError as err:
        return f"reply metric {err}"
    if "resources" in metrics:
        if problem := number_problem("resources", metrics["resources"], 0.0, MAX_RESOURCES):
            return problem
    if "num-partitions" in metrics:
        return number_problem(
            "num-partitions", metrics["num-partitions"], pid + 1, MAX_PARTITIONS, integer=True
        )
    return None
