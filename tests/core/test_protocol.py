"""The record helpers both sides use: the one partition-id rule (node config and replies)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fedprune_app.core.protocol import parse_partition_id
from strategies.fedtpa import FedTPAStrategy


@pytest.mark.parametrize(
    ("value", "num", "text", "expected"),
    [
        (0, None, False, 0),
        (7, None, False, 7),
        (3, 4, False, 3),
        (np.int64(2), 4, False, 2),
        ("3", 4, True, 3),
        (" 1 ", 2, True, 1),  # Flower's Ray proxy passes node-config values as strings
    ],
)
def test_a_partition_id_is_a_non_negative_int_below_the_count(
    value: Any, num: int | None, text: bool, expected: int
) -> None:
    got = parse_partition_id(value, num, text=text)
    assert got == expected and type(got) is int


@pytest.mark.parametrize(
    ("value", "num", "text", "allowed"),
    [
        (-1, None, False, r"an int in \[0, 1000000\)"),
        (None, None, False, r"an int in \[0, 1000000\)"),
        (True, None, False, r"an int in \[0, 1000000\)"),
        (1.0, None, False, r"an int in \[0, 1000000\)"),
        (10**12, None, False, r"an int in \[0, 1000000\)"),  # unbounded ids keyed server state
        ("1", None, False, r"an int in \[0, 1000000\)"),  # a reply's id is a number, never text
        (4, 4, False, r"an int in \[0, 4\)"),
        (-1, 2, True, r"an int in \[0, 2\)"),
        (True, 2, True, r"an int in \[0, 2\)"),
        ("1.5", 4, True, r"an int in \[0, 4\)"),
        ("first", 4, True, r"an int in \[0, 4\)"),
        ("9", 4, True, r"an int in \[0, 4\)"),
    ],
)
def test_anything_else_is_refused_saying_what_is_allowed(
    value: Any, num: int | None, text: bool, allowed: str
) -> None:
    with pytest.raises(ValueError, match=rf"'partition-id' must be {allowed}, got {value!r}"):
        parse_partition_id(value, num, text=text)


def test_a_strategy_refuses_a_reply_by_that_rule() -> None:
    assert (
        FedTPAStrategy.metrics_problem({"partition-id": 2, "num-examples": 5}, losses=False) is None
    )
    for bad in (True, -1, "2", None, 2.0):
        problem = FedTPAStrategy.metrics_problem(
            {"partition-id": bad, "num-examples": 5}, losses=False
        )
        allowed = "an int in [0, 1000000)"
        assert problem == f"reply metric 'partition-id' must be {allowed}, got {bad!r}", bad
