"""Bus coordinates held open in every mask (`hold-open`; not in the SFT-P paper): the residual
bus's massive activations (Sun et al., 2024), or every coordinate for the dense-with-the-same-recipe
ceiling."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from torch import Tensor, nn

from fedprune_app.core.config import RunConfig
from fedprune_app.llm.models import model_device
from fedprune_app.structural.config import BusConfig
from fedprune_app.structural.models import ROUTED_MODELS
from fedprune_app.structural.routing import masked

PROBE_TEXT = (
    "The committee met on Tuesday to discuss the budget. After a long debate, they "
    "agreed to fund the new library, the park and two bus lines. Question: What did the "
    "committee fund? Answer: a library, a park and two bus lines."
)


def massive_coordinates(model: nn.Module, tokenizer: Any, factor: float) -> list[int]:
    """Residual-bus coordinates whose mean |h| (over every decoder layer's output and the tokens of
    PROBE_TEXT) exceeds `factor` × the median coordinate's: the "massive activations" of Sun et al.
    (2024), few, fixed per model and input-agnostic. Scored on the backbone (adapters disabled,
    masks off) so every process agrees."""
    ids = tokenizer(PROBE_TEXT, return_tensors="pt").to(model_device(model))
    off = model.disable_adapter() if hasattr(model, "disable_adapter") else nullcontext()
    with torch.no_grad(), masked(model, None), off:
        states = model(**ids, output_hidden_states=True).hidden_states[1:]
    magnitude = torch.stack([h[0].float().abs().mean(0) for h in states]).mean(0)
    return sorted(int(i) for i in torch.nonzero(magnitude > factor * magnitude.median()).flatten())


def held_coordinates(cfg: RunConfig, model: nn.Module, tokenizer: Any) -> Tensor | None:
    """`hold-open` as a (d,) 0/1 vector of the gates fixed at 1 in every mask (None = none
    held): the massive coordinates (computed once per model name, `ROUTED_MODELS.massive`), or all
    of them."""
    bus = cfg.section(BusConfig)
    d = int(model.config.hidden_size)
    if bus.hold_open == "none":
        return None
    held = torch.ones(d)
    if bus.hold_open == "massive":
        held = torch.zeros(d)
        key = (cfg.model_name, bus.massive_factor, d)
        coordinates = ROUTED_MODELS.massive(
            key, lambda: massive_coordinates(model, tokenizer, bus.massive_factor)
        )
        held[coordinates] = 1.0
    return held


def force_open(gates: Tensor, held: Tensor | None) -> Tensor:
    """g·(1 − h) + h: the held gates read 1 (and pass no gradient to their logits); the others are
    unchanged. `gates` (layers, 4, d), `held` (d,) or None."""
    if held is None:
        return gates
    held = held.to(gates.device, gates.dtype)
    return gates * (1 - held) + held
