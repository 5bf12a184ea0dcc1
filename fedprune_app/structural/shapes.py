"""The masked bus's array names and shapes from a model's config.json alone (no torch, no
transformers): what the launcher compares a checkpoint with before Flower starts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# the four masks of a decoder layer over the bus, in order; the same as
# `hf.configuration_fedprune_routed_llama.MASK_NAMES` (self-contained Hugging Face code, whose
# import loads transformers)
MASK_NAMES = ("attn-in", "attn-out", "ffn-in", "ffn-out")


def bus_shape(config: Mapping[str, Any]) -> tuple[int, int] | None:
    """(layers, d): the shape of one mask name's masks of every decoder layer; None when the
    config.json does not give both as ints."""
    layers, d = config.get("num_hidden_layers"), config.get("hidden_size")
    if not isinstance(layers, int) or not isinstance(d, int):
        return None
    return layers, d
