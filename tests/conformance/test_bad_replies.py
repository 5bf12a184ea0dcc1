"""Every method's strategy against tampered copies of real client replies (tiny model, no Ray): each
bad reply is rejected with a logged reason and counted, nothing raises out of the strategy, and the
global state is exactly what the good replies make it. The tampers include what an audit sent by
hand: arrays whose bytes are not the shape they declare, truncated and object buffers, foreign,
huge and list-valued partition ids, metrics named like the row's own fields, text where numbers
belong, bytes that are not UTF-8; for train and for evaluate replies."""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

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

    def raw(c: RecordDict, forge: Callable[[Array], Array]) -> RecordDict:
        """The reply, its first float array replaced by `forge(array)` (Flower checks nothing)."""
        out = _copy(c)
        record = c.array_records["arrays"]
        key = _first_float(numpy_state(record))
        out["arrays"] = ArrayRecord({k: forge(v) if k == key else v for k, v in record.items()})
        return out

    def npy(value: np.ndarray, **header: Any) -> bytes:
        buffer = io.BytesIO()
        np.save(buffer, value, allow_pickle=bool(header.get("pickle")))
        return buffer.getvalue()

    def lying(a: Array) -> Array:  # one element, declared as the full shape: it would broadcast
        one = np.zeros(1, np.dtype(a.dtype))
        return Array(dtype=a.dtype, shape=tuple(a.shape), stype=a.stype, data=npy(one))

    def truncated(a: Array) -> Array:
        return Array(dtype=a.dtype, shape=tuple(a.shape), stype=a.stype, data=a.data[:-7])

    def objects(a: Array) -> Array:
        values = np.empty(a.shape, dtype=object)
        values.fill(1.0)
        return Array(dtype=a.dtype, shape=tuple(a.shape), stype=a.stype, data=npy(values, pickle=1))

    def garbage(a: Array) -> Array:
        return Array(
            dtype=a.dtype, shape=tuple(a.shape), stype=a.stype, data=b"\x93NUMPY" + b"?" * 64
        )

    def metric(name: str, value: Any) -> Tamper:
        return lambda c: _copy(c, metrics={**dict(c.metric_records["metrics"]), name: value})

    def foreign(c: RecordDict) -> RecordDict:  # another connected node's partition
        pid = int(c.metric_records["metrics"]["partition-id"])
        return metric("partition-id", (pid + 1) % 4)(c)

    def text_examples(c: RecordDict) -> RecordDict:
        out = _copy(c)
        out["text"] = ConfigRecord({"num-examples": "10"})
        return out

    def text_phase(c: RecordDict) -> RecordDict:  # made `finish` raise KeyError before
        out = _copy(c)
        out["text"] = ConfigRecord({"phase": "server-evaluate"})
        return out

    def not_utf8(c: RecordDict) -> RecordDict:
        out = _copy(c)
        out["text"] = ConfigRecord({"note": b"\xff\xfe"})
        return out

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
        **_forged(raw, lying, truncated, objects, garbage),
        "foreign partition id": (foreign, r"partition-id \d, but node \d+ declared \d"),
        "huge partition id": (metric("partition-id", 10**12), r"'partition-id' must be an int in"),
        "list partition id": (metric("partition-id", [0]), r"'partition-id' must be an int in"),
        "phase overwritten": (metric("phase", 3.0), r"metric 'phase' would overwrite"),
        "round overwritten": (metric("round", 99), r"metric 'round' would overwrite"),
        "phase server-evaluate": (text_phase, r"metric 'phase' would overwrite"),
        "text examples": (text_examples, r"positive 'num-examples'"),
        "bytes not UTF-8": (not_utf8, r"metrics cannot be read"),
    }


def _forged(raw: Any, *forges: Callable[[Array], Array]) -> dict[str, tuple[Tamper, str]]:
    """The forged-buffer tampers, each with the reason its Array gets."""
    reasons = {
        "lying": r"declares \(.*\) \w+ but holds \(1,\)",
        "truncated": r"carries \d+ bytes, its header's .* needs \d+",
        "objects": r"holds object values",
        "garbage": r"is not a \.npy buffer",
    }
    return {
        f"{f.__name__} buffer": ((lambda c, f=f: raw(c, f)), reasons[f.__name__]) for f in forges
    }


def _ready(
    method: str, tiny_model_dir: Path, tmp_path: Path
) -> tuple[FederatedStrategy, LocalGrid, Any]:
    """A method's strategy on 4 tiny clients, identified and prepared: (strategy, grid, the initial
    arrays)."""
    cfg = method_config(tiny_model_dir, tmp_path, method, fraction_train=1.0)
    grid = LocalGrid(cfg, 4, seed=0)
    strategy = registry.strategy_class(method)(cfg)
    initial = strategy.initial_arrays()
    strategy.identify(grid)
    strategy.prepare(grid, 60)
    return strategy, grid, initial


def _real_round(
    method: str, tiny_model_dir: Path, tmp_path: Path
) -> tuple[FederatedStrategy, list[Message], list[Message]]:
    strategy, grid, initial = _ready(method, tiny_model_dir, tmp_path)
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


def _evaluate_tampers() -> dict[str, tuple[Tamper, str]]:
    """The train tampers that apply to an evaluate reply (its metrics; its arrays where it has
    any, e.g. SFT-P's final masks)."""
    generic = _generic_tampers()
    names = [
        "zero examples",
        "negative examples",
        "NaN examples",
        "infinite examples",
        "foreign partition id",
        "huge partition id",
        "list partition id",
        "phase overwritten",
        "round overwritten",
        "phase server-evaluate",
        "text examples",
        "bytes not UTF-8",
    ]
    return {name: generic[name] for name in names}


def _masks_forged(content: RecordDict) -> RecordDict:
    """An evaluate reply whose every array (any record) declares one shape and holds one value."""
    out = RecordDict()
    for name, record in content.items():
        if isinstance(record, ArrayRecord):
            out[name] = ArrayRecord(
                {
                    k: Array(
                        dtype=v.dtype,
                        shape=tuple(v.shape),
                        stype=v.stype,
                        data=_npy(np.zeros(1, np.dtype(v.dtype))),
                    )
                    for k, v in record.items()
                }
            )
        else:
            out[name] = record
    return out


def _array_dropped(content: RecordDict) -> RecordDict:
    """An evaluate reply whose array records each lack their first array (e.g. a mask name)."""
    out = RecordDict()
    for name, record in content.items():
        if isinstance(record, ArrayRecord):
            keys = list(record.keys())
            out[name] = ArrayRecord({k: record[k] for k in keys[1:]})
        else:
            out[name] = record
    return out


def _npy(value: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, value)
    return buffer.getvalue()


def check_bad_evaluate_replies(method: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    """Each tampered copy of the last round's evaluate replies is rejected with its reason, raises
    nothing and leaves the strategy's state (e.g. the final masks it keeps) as it was."""
    strategy, grid, initial = _ready(method, tiny_model_dir, tmp_path)
    last = strategy.cfg.num_server_rounds
    sent = list(strategy.configure_evaluate(last, initial, ConfigRecord(), grid))
    if not sent:
        pytest.skip(f"{method} has no federated evaluation (its reference replies: test_strategy)")
    replies = list(grid.send_and_receive(sent))
    assert not any(r.has_error() for r in replies)
    rows: list[dict[str, Any]] = []
    strategy.record = rows.append
    before = _state(strategy)
    tampers = _evaluate_tampers()
    if any(isinstance(r, ArrayRecord) for r in replies[0].content.values()):
        tampers["lying arrays"] = (_masks_forged, r"declares \(.*\) \w+ but holds \(1,\)")
        tampers["an array missing"] = (_array_dropped, r"missing 1 arrays")
    for name, (tamper, reason) in tampers.items():
        bad = [Message(tamper(r.content), reply_to=m) for m, r in zip(sent, replies, strict=True)]
        assert strategy.aggregate_evaluate(last, bad) is None, name
        assert _same(_state(strategy), before), f"{name} changed the strategy state"
        assert all(
            r["status"] == "rejected" and re.search(reason, r["problem"]) for r in rows[-len(bad) :]
        ), (name, rows[-1].get("problem"))
        assert all(r["phase"] == "evaluate" and r["round"] == last for r in rows[-len(bad) :])
    assert strategy.aggregate_evaluate(last, replies) is not None  # the real ones still count


@pytest.mark.parametrize("method", registry.names())
def test_bad_evaluate_replies_are_rejected_and_change_nothing(
    method: str, tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    check_bad_evaluate_replies(method, tiny_model_dir, tmp_path)
