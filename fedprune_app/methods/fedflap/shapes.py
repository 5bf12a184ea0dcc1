"""What a checkpoint of a fedflap run holds, from the config alone (no torch).

A checkpoint is written after a round, so after round 1, which cut the global masks: bool
(layers, d) per mask name in the global arrays and in the strategy state (`masks/<name>`), beside
the averaged importance (`importance/<name>`, float32, same shape). Rounds 2..R train the LoRA of
the routed model, which keeps every dense shape: the masks route the bus, they slice no matrix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedprune_app.core.config import RunConfig
from fedprune_app.llm.shapes import Spec, lora_spec
from fedprune_app.structural.shapes import MASK_NAMES, bus_shape

# the global masks in the arrays the server sends: bool (layers, d) per mask name
MASK_PREFIX = "fedflap-mask."
# the strategy state's tables of (layers, d) arrays per mask name, and their dtype
STATE_TABLES = (("masks", "bool"), ("importance", "float32"))


def structure_spec(config: Mapping[str, Any]) -> Spec | None:
    """The masks in the global arrays, then the strategy state's tables; None where the model's
    layers and hidden size are not known from its config.json."""
    shape = bus_shape(config)
    if shape is None:
        return None
    spec: Spec = {MASK_PREFIX + name: (shape, "bool") for name in MASK_NAMES}
    for table, dtype in STATE_TABLES:
        spec |= {f"{table}/{name}": (shape, dtype) for name in MASK_NAMES}
    return spec


def checkpoint_spec(cfg: RunConfig, config: Mapping[str, Any]) -> Spec | None:
    """`structure_spec`, then the LoRA of the dense model (`llm.shapes.lora_spec`); None where
    either is."""
    structure, adapters = structure_spec(config), lora_spec(cfg, config)
    return None if structure is None or adapters is None else structure | adapters
