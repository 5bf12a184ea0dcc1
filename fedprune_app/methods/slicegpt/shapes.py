"""What a checkpoint of a slicegpt run holds, from the model's config.json and the bases the
checkpoint records (no torch).

A checkpoint is written after a round, so after round 1, which set the bases: float32 (d, k_p) per
residual-stream point p = 0..2L in the global arrays (`BASIS_PREFIX`) and in the strategy state
(`bases/<name>`). The LoRA is the sliced model's (`sliced.slice_model`): per layer l, q, k and v
read k_2l coordinates, o writes and gate and up read k_2l+1, down writes k_2l+2.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedprune_app.core.config import RunConfig
from fedprune_app.llm.shapes import DECODER_PREFIX, Spec, linear_shapes, lora_spec

BASIS_PREFIX = "slicegpt-basis."  # the global arrays from round 1 on: float32 (d, k) per point
STATE_TABLE = "bases"  # the strategy state's copy of the bases, under the same names


def checkpoint_spec(
    cfg: RunConfig, config: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
) -> Spec | None:
    """The 2L + 1 bases (d rows each, as wide as the checkpoint's own, 1..d), the state's copy,
    then the LoRA of the model sliced to those widths; None where the model's layout is not known
    from config.json (`llm.shapes.linear_shapes`) or the output layer carries LoRA."""
    shapes = linear_shapes(config)
    if shapes is None:
        return None
    layers, d = int(config["num_hidden_layers"]), int(config["hidden_size"])
    names = [f"{BASIS_PREFIX}{p}" for p in range(2 * layers + 1)]
    recorded = [basis_width(arrays.get(name), d) for name in names]
    usual = Counter(k for k in recorded if k is not None).most_common(1)
    fallback = usual[0][0] if usual else d
    widths = [fallback if k is None else k for k in recorded]
    spec: Spec = {name: ((d, k), "float32") for name, k in zip(names, widths, strict=True)}
    spec |= {f"{STATE_TABLE}/{name}": shape for name, shape in spec.items()}
    adapters = lora_spec(cfg, config, linear=sliced_shapes(shapes, widths))
    return None if adapters is None else spec | adapters


def basis_width(basis: Any, d: int) -> int | None:
    """The width k of a recorded basis, within 1..d (orthonormal columns in d dimensions); None
    when it is not a 2-D array (its own key or shape is what differs: the spec expects the width
    most other bases have, the one round 1 gives them all)."""
    if not isinstance(basis, np.ndarray) or basis.ndim != 2:
        return None
    return min(max(int(basis.shape[1]), 1), d)


def sliced_shapes(
    shapes: Mapping[str, tuple[int, int]], widths: list[int]
) -> dict[str, tuple[int, int]]:
    """`shapes` (the dense model's linear layers) with each layer's readers and writers of the
    residual stream at the widths of its points, and the LM head reading the last point."""
    out = dict(shapes)
    for i in range((len(widths) - 1) // 2):
        at, k_in, k_mid, k_out = f"{DECODER_PREFIX}{i}.", *widths[2 * i : 2 * i + 3]
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
            out[at + name] = (shapes[at + name][0], k_in)
        for name in ("mlp.gate_proj", "mlp.up_proj"):
            out[at + name] = (shapes[at + name][0], k_mid)
        out[at + "self_attn.o_proj"] = (k_mid, shapes[at + "self_attn.o_proj"][1])
        out[at + "mlp.down_proj"] = (k_out, shapes[at + "mlp.down_proj"][1])
    out["lm_head"] = (shapes["lm_head"][0], widths[-1])
    return out
