"""slicegpt's tests; its conformance settings (tests/conformance)."""

from __future__ import annotations

import numpy as np
from flwr.app import MetricRecord, RecordDict

from fedprune_app.core.protocol import numpy_state, to_record
from fedprune_app.methods.slicegpt.pca import COVARIANCE_PREFIX
from tests.conformance import Conformance


def _with_arrays(content: RecordDict, arrays: dict[str, np.ndarray]) -> RecordDict:
    out = RecordDict()
    for name, record in content.items():
        out[name] = to_record(arrays) if name == "arrays" else record
    return out


def asymmetric_covariance(content: RecordDict) -> RecordDict:
    """A round-1 reply whose first covariance sum is not symmetric (a later reply is returned
    unchanged)."""
    arrays = {k: v.copy() for k, v in numpy_state(content.array_records["arrays"]).items()}
    key = f"{COVARIANCE_PREFIX}0"
    if key in arrays:
        arrays[key][0, 1] += 1.0 + abs(arrays[key][0, 1])
    return _with_arrays(content, arrays)


def nan_calibration_tokens(content: RecordDict) -> RecordDict:
    """A round-1 reply whose token count is NaN (NaN <= 0 is false: it passed before)."""
    out = RecordDict()
    for name, record in content.items():
        if name == "metrics" and "calibration-tokens" in record:
            out[name] = MetricRecord({**dict(record), "calibration-tokens": float("nan")})
        else:
            out[name] = record
    return out


CONFORMANCE = Conformance(
    settings={"slicegpt-keep-ratio": 0.5, "slicegpt-batches": 2, "slicegpt-speed-prefill": 0},
    tampers={
        "asymmetric covariance": (asymmetric_covariance, r"not symmetric"),
        "NaN calibration tokens": (nan_calibration_tokens, r"positive 'calibration-tokens'"),
    },
)
