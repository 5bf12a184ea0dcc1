"""Every method's strategy against tampered copies of real client replies (tiny model, no Ray): each
bad reply is rejected with a logged reason and counted, and leaves the global state exactly as the
good replies make it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from fedprune_app.core import registry
from fedprune_app.core.protocol import numpy_state
from fedprune_app.core.replies import to_record
from fedprune_app.core.strategy import FederatedStrategy
from tests.conformance import Tamper, conformance_of
from tests.local_grid import LocalGrid, method_config


def _copy(
    content: RecordDict,
    arrays: dict[str, np.ndarray] | None = None,
    metrics: dict[str, Any] | None = None,
    drop: str | None = None,
) -> RecordDict:
    out = RecordDict()
    for name, record in content.items():
        if name == drop:
            continue
        if name == "arrays" and arrays is not None:
            out[name] = to_record(arrays)
        elif name == "metrics" and metrics is not None:
            out[name] = MetricRecord(metrics)
        else:
            out[name] = record
    return out


def _first_float(arrays: dict[str, np.ndarray]) -> str:
    return next(k for k, v in arrays.items() if v.dtype.kind == "f" and v.size > 1)


def _generic_tampers() -> dict[str, tuple[Tamper, str]]:
    """name -> (tamper, a regular expression the logged reason must match)."""

    def arrays(c: RecordDict) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in numpy_state(c.array_records["arrays"]).items()}

    def missing(c: RecordDict) -> RecordDict:
        a = arrays(c)
        a.pop(_first_float(a))
        return _copy(c, arrays=a)

    def extra(c: RecordDict) -> RecordDict:
        return _copy(c, arrays={**arrays(c), "bogus.weight": np.zeros((2, 2), np.float32)})

    def reshaped(c: RecordDict) -> RecordDict:
        a = arrays(c)
        key = _first_float(a)
        a[key] = np.zeros(tuple(s + 1 for s in a[key].shape), a[key].dtype)
        return _copy(c, arrays=a)

    def non_finite(c: RecordDict) -> RecordDict:
        a = arrays(c)
        key = _first_float(a)
        a[key].reshape(-1)[-1] = np.nan
        return _copy(c, arrays=a)

    def examples(n: float) -> Tamper:
        return lambda c: _copy(c, metrics={**dict(c.metric_records["metrics"]), "num-examples": n})

    # one array arrives as int32 (it turned the average into ints)
    def retyped(c: RecordDict) -> RecordDict:
        a = arrays(c)
        key = _first_float(a)
        a[key] = a[key].astype(np.int32)
        return _copy(c, arrays=a)

    def huge(c: RecordDict) -> RecordDict:  # finite, but a sum of two replies overflows float32
        a = arrays(c)
        key = _first_float(a)
        a[key].reshape(-1)[0] = 3e38
        return _copy(c, arrays=a)

    return {
        "missing array": (missing, r"missing \d+ arrays|holds (\d+) .*, expected the (?!\1)\d+"),
        "extra array": (extra, r"\d+ unexpected arrays|holds (\d+) .*, expected the (?!\1)\d+"),
        "wrong shape": (reshaped, r"shape"),
        "non-finite": (non_finite, r"non-finite"),
        "zero examples": (examples(0), r"positive 'num-examples'"),
        "negative examples": (examples(-5), r"positive 'num-examples'"),
        "NaN examples": (examples(float("nan")), r"positive 'num-examples'"),
        "infinite examples": (examples(float("inf")), r"positive 'num-examples'"),
        "huge examples": (examples(1e30), r"'num-examples' 1e\+30 is above"),
        "int32 array": (retyped, r"is int32, expected float(32|64)|travels as .*got int32"),
        "huge values": (huge, r"values up to 3e\+38, above 1e\+30"),
        "no arrays": (lambda c: _copy(c, drop="arrays"), r"no 'arrays'"),
    }


def _real_round(
    method: str, tiny_model_dir: Path, tmp_path: Path
) -> tuple[FederatedStrategy, list[Message], list[Message]]:
    cfg = method_config(tiny_model_dir, tmp_path, method, fraction_train=1.0)
    grid = LocalGrid(cfg, 4, seed=0)
    strategy = registry.strategy_class(method)(cfg)
    initial = strategy.initial_arrays()
    strategy.identify(grid)
    strategy.prepare(grid, 60)
    sent = list(strategy.configure_train(1, initial, ConfigRecord(), grid))
    replies = list(grid.send_and_receive(sent))
    assert not any(r.has_error() for r in replies)
    return strategy, sent, replies


def _state(strategy: FederatedStrategy) -> dict[str, Any]:
    return {k: v for k, v in strategy.state_dict().items() if "rng" not in k}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b, equal_nan=True)
    return a == b


def check_bad_replies(method: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    """Each tampered copy of a real round's replies is rejected with its reason and leaves the state
    alone; one bad reply among good ones aggregates to exactly what the good ones give."""
    strategy, sent, replies = _real_round(method, tiny_model_dir, tmp_path)
    rows: list[dict[str, Any]] = []
    strategy.record = rows.append
    before = _state(strategy)
    tampers = {**_generic_tampers(), **conformance_of(method).tampers}
    for name, (tamper, reason) in tampers.items():
        bad = [Message(tamper(r.content), reply_to=m) for m, r in zip(sent, replies, strict=True)]
        assert strategy.aggregate_train(1, bad) == (None, None), name
        assert _same(_state(strategy), before), f"{name} changed the strategy state"
        assert all(
            r["status"] == "rejected" and re.search(reason, r["problem"]) for r in rows[-len(bad) :]
        ), (name, rows[-1].get("problem"))
    # a round with one bad reply among good ones aggregates exactly what the good ones alone give
    good_only = _real_round(method, tiny_model_dir, tmp_path / "again")[0]
    expected, _ = good_only.aggregate_train(1, replies[1:])
    mixed = [Message(tampers["non-finite"][0](replies[0].content), reply_to=sent[0]), *replies[1:]]
    got, _ = strategy.aggregate_train(1, mixed)
    assert got is not None and expected is not None
    assert _same(numpy_state(got), numpy_state(expected)) and _same(
        _state(strategy), _state(good_only)
    )


@pytest.mark.parametrize("method", registry.names())
def test_bad_replies_are_rejected_and_leave_the_state_as_the_good_ones_make_it(
    method: str, tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    check_bad_replies(method, tiny_model_dir, tmp_path)
