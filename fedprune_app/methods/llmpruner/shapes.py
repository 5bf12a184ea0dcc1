"""What a checkpoint of an llmpruner run holds, from the model's config.json and the structure the
checkpoint records (no torch).

A checkpoint is written after a round, so after round 1, which cut the global structure: bool
(layers, kv heads) and (layers, intermediate) in the global arrays (`KEEP_PREFIX`) and in the
strategy state (`keep/<name>`), beside the group scores (`scores/<name>`, float64). The LoRA is
the pruned model's: per layer, q and o as wide as the kept kv groups' query heads, k and v as
their kv heads, gate, up and down as the kept channels (`structure.shrink_`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fedprune_app.core.config import RunConfig
from fedprune_app.llm.shapes import DECODER_PREFIX, Spec, linear_shapes, lora_spec

# the global structure in the server's arrays: bool (layers, kv) and (layers, inter)
KEEP_PREFIX = "llmpruner-keep."
# the strategy state's tables of the same two shapes, and their dtype
STATE_TABLES = (("keep", "bool"), ("scores", "float64"))


def checkpoint_spec(
    cfg: RunConfig, config: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
) -> Spec | None:
    """The structure's arrays (fixed by config.json), then the state's tables, then the LoRA of
    the model pruned to the structure in `arrays` (the checkpoint's global arrays); None where
    the model's layout is not known from config.json (`llm.shapes.linear_shapes`) or the output
    layer carries LoRA."""
    shapes = linear_shapes(config)
    if shapes is None:
        return None
    layers = int(config["num_hidden_layers"])
    kv = int(config.get("num_key_value_heads") or config["num_attention_heads"])
    widths = {"heads": kv, "channels": shapes[f"{DECODER_PREFIX}0.mlp.gate_proj"][0]}
    spec: Spec = {KEEP_PREFIX + k: ((layers, n), "bool") for k, n in widths.items()}
    for table, dtype in STATE_TABLES:
        spec |= {f"{table}/{k}": ((layers, n), dtype) for k, n in widths.items()}
    kept = {k: kept_per_layer(arrays.get(KEEP_PREFIX + k), layers, n) for k, n in widths.items()}
    adapters = lora_spec(cfg, config, linear=pruned_shapes(shapes, kv, kept))
    return None if adapters is None else spec | adapters


def kept_per_layer(keep: Any, layers: int, width: int) -> list[int]:
    """How many structures each layer keeps: the true entries per row of `keep`; all `width`
    when `keep` is not a (layers, width) array (the structure's own shape is what differs)."""
    if not isinstance(keep, np.ndarray) or keep.shape != (layers, width):
        return [width] * layers
    return [int(n) for n in np.count_nonzero(keep, axis=1)]


def pruned_shapes(
    shapes: Mapping[str, tuple[int, int]], kv: int, kept: Mapping[str, list[int]]
) -> dict[str, tuple[int, int]]:
    """`shapes` (the dense model's linear layers) with each decoder layer's projections cut to the
    kept kv groups (`kept["heads"]`) and MLP channels (`kept["channels"]`)."""
    out = dict(shapes)
    for i, (groups, channels) in enumerate(zip(kept["heads"], kept["channels"], strict=True)):
        at = f"{DECODER_PREFIX}{i}."
        q_rows, d = shapes[at + "self_attn.q_proj"]
        kv_rows = shapes[at + "self_attn.k_proj"][0]
        q, k = groups * (q_rows // kv), groups * (kv_rows // kv)
        out |= {
            at + "self_attn.q_proj": (q, d),
            at + "self_attn.k_proj": (k, d),
            at + "self_attn.v_proj": (k, d),
            at + "self_attn.o_proj": (d, q),
            at + "mlp.gate_proj": (channels, d),
            at + "mlp.up_proj": (channels, d),
            at + "mlp.down_proj": (d, channels),
        }
    return out
