"""FedSpaLLM's tests; its conformance settings (tests/conformance)."""

from __future__ import annotations

import numpy as np
from flwr.app import MessageType, RecordDict

from fedprune_app.core.protocol import numpy_state, to_record
from fedprune_app.methods.fedspallm.masks import MASK_SUFFIX
from tests.conformance import Conformance


def mask_mismatch(content: RecordDict) -> RecordDict:
    """A mask that says 'pruned' where the weight is not zero."""
    arrays = {k: v.copy() for k, v in numpy_state(content.array_records["arrays"]).items()}
    key = next(k for k in arrays if k.endswith(MASK_SUFFIX))
    weight = arrays[key[: -len(MASK_SUFFIX)]].reshape(-1)
    position = np.flatnonzero(arrays[key].reshape(-1) & (weight != 0))[0]
    arrays[key].reshape(-1)[position] = False
    out = RecordDict()
    for name, record in content.items():
        out[name] = to_record(arrays) if name == "arrays" else record
    return out


CONFORMANCE = Conformance(
    settings={"client-data": "squad_shifts:nyt,squad_shifts:reddit,squad_shifts:amazon_reviews,squad_shifts:squaddev",
              "calib-segments": 2, "calib-seq-len": 32, "fedspallm-resources": "0.5"},
    privacy_settings={"fedspallm-references": "standalone"},
    evaluated_by=f"{MessageType.EVALUATE}.reference",  # the server scores the global model; clients their own
    tampers={"mask does not match weights": (mask_mismatch, r"weights at pruned positions are not zero")},
)
