"""FedSpaLLM's tests; its conformance settings (tests/conformance)."""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import MessageType, RecordDict

from fedprune_app.core.encoding import decode_sparse
from fedprune_app.core.protocol import numpy_state, to_record
from fedprune_app.methods.fedspallm.config import FedSpaLLMConfig
from fedprune_app.methods.fedspallm.masks import MASK_SUFFIX
from tests.conformance import Conformance


def _with_arrays(content: RecordDict, arrays: dict[str, np.ndarray]) -> RecordDict:
    out = RecordDict()
    for name, record in content.items():
        out[name] = to_record(arrays) if name == "arrays" else record
    return out


def mask_mismatch(content: RecordDict) -> RecordDict:
    """A packed mask that keeps one weight fewer than the kept values it comes with."""
    arrays = {k: v.copy() for k, v in numpy_state(content.array_records["arrays"]).items()}
    packed = arrays[next(k for k in arrays if k.endswith(MASK_SUFFIX))]
    byte = np.flatnonzero(packed)[0]
    packed[byte] &= packed[byte] - 1  # clear its lowest set bit
    return _with_arrays(content, arrays)


def dense_mask(content: RecordDict) -> RecordDict:
    """A reply that pruned nothing: one matrix with every weight kept (its mask all ones, a value
    for each; the tiny model's matrices have a multiple of 8 weights, so the packed mask's bits are
    the matrix)."""
    arrays = {k: v.copy() for k, v in numpy_state(content.array_records["arrays"]).items()}
    mask_key = next(k for k in arrays if k.endswith(MASK_SUFFIX))
    weight_key = mask_key.removesuffix(MASK_SUFFIX)
    arrays[mask_key] = np.full_like(arrays[mask_key], 0xFF)
    arrays[weight_key] = np.ones(arrays[mask_key].size * 8, dtype=arrays[weight_key].dtype)
    return _with_arrays(content, arrays)


def unpacked_masks(content: RecordDict) -> RecordDict:
    """The format before bit-packed masks: every mask as bool (of the kept values' length)."""
    arrays = numpy_state(content.array_records["arrays"])
    return _with_arrays(
        content,
        {
            k: np.unpackbits(v).astype(bool) if k.endswith(MASK_SUFFIX) else v
            for k, v in arrays.items()
        },
    )


def decode(cfg: Any, name: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A train reply's `arrays` as the server decodes them: kept values (float32) and bool masks."""
    from fedprune_app.llm.layers import prunable_weights

    if name != "arrays":
        return arrays
    dense = prunable_weights(cfg)[0]
    shapes = {k: dense[k].shape for k in arrays if not k.endswith(MASK_SUFFIX)}
    decoded = decode_sparse(arrays, shapes, cfg.section(FedSpaLLMConfig).payload_dtype)
    return {
        k: v
        for key, (values, mask) in decoded.items()
        for k, v in ((key, values), (key + MASK_SUFFIX, mask))
    }


CONFORMANCE = Conformance(
    settings={
        "client-data": "text:wikipedia,text:fiction,text:papers,text:howto",
        "calib-segments": 2,
        "calib-seq-len": 32,
        "fedspallm-resources": "0.5",
    },
    # the privacy run sends bfloat16 (uint16 bits on the wire) so the decoding of every encoding is
    # checked
    privacy_settings={"fedspallm-references": "standalone", "payload-dtype": "bfloat16"},
    # the server scores the global model; clients their own
    evaluated_by=f"{MessageType.EVALUATE}.reference",
    tampers={
        "mask does not match the kept values": (
            mask_mismatch,
            r"keeps \d+ weights, so the kept values",
        ),
        "unpacked bool masks": (unpacked_masks, r"unpacked bool mask .*update the client"),
        "a mask that pruned nothing": (
            dense_mask,
            r"keeps 1.000 of its weights, more than the 0.500",
        ),
    },
    decode=decode,
)
