"""The reply checks every strategy runs before a reply touches the aggregate: num-examples and array
values."""

from __future__ import annotations

import numpy as np
import pytest

from fedprune_app.core.replies import (
    MAX_ABS_VALUE,
    MAX_NUM_EXAMPLES,
    check_arrays,
    examples_problem,
    to_record,
)


@pytest.mark.parametrize(
    "n",
    [
        None,
        "12",
        True,
        0,
        -3,
        float("nan"),
        float("inf"),
        -float("inf"),
        MAX_NUM_EXAMPLES + 1,
        1e30,
    ],
)
def test_num_examples_that_cannot_weight_an_average_are_refused(n: object) -> None:
    assert examples_problem({} if n is None else {"num-examples": n}) is not None


@pytest.mark.parametrize("n", [1, 12, 0.5, float(MAX_NUM_EXAMPLES)])
def test_num_examples_in_range_pass(n: float) -> None:
    assert examples_problem({"num-examples": n}) is None


def test_arrays_of_another_dtype_or_with_huge_values_are_refused() -> None:
    sent = {"a": ((2, 2), "float32"), "mask": ((4,), "bool")}
    good = {"a": np.ones((2, 2), np.float32), "mask": np.ones(4, bool)}
    assert check_arrays(to_record(good), sent) is None
    assert (
        check_arrays(to_record({**good, "a": good["a"].astype(np.int32)}), sent)
        == "array a is int32, expected float32"
    )
    assert (
        check_arrays(to_record({**good, "a": good["a"].astype(np.float64)}), sent)
        == "array a is float64, expected float32"
    )
    large = good["a"].copy()
    large[0, 0] = MAX_ABS_VALUE / 2  # large but allowed
    assert check_arrays(to_record({**good, "a": large}), sent) is None
    huge = good["a"].copy()
    huge[1, 1] = -3e38
    assert (
        check_arrays(to_record({**good, "a": huge}), sent)
        == "array a holds values up to 3e+38, above 1e+30"
    )
    inf = good["a"].copy()
    inf[0, 1] = np.inf
    assert check_arrays(to_record({**good, "a": inf}), sent) == "array a holds non-finite values"
