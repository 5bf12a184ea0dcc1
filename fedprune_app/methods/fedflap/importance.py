"""fedflap's client math: per-coordinate moments of the residual bus on the dense model, FLAP-style
importance scores, their average over clients and the global cut of bus lanes at the budget."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedprune_app.core.config import ConfigError, RunConfig, split_list
from fedprune_app.core.replies import weighted_average
from fedprune_app.llm.layers import decoder_layers
from fedprune_app.llm.models import model_device
from fedprune_app.methods.fedflap.shapes import MASK_PREFIX
from fedprune_app.structural.config import BusConfig
from fedprune_app.structural.models import ROUTED_MODELS
from fedprune_app.structural.routing import (
    MASK_NAMES,
    LayerMasks,
    fill_budget,
    masked,
    per_layer_masks,
)

IMPORTANCE_PREFIX = "importance."  # a round-1 reply: float32 (layers, d) per mask name


def fedflap_model_for(cfg: RunConfig) -> tuple[nn.Module, Any]:
    """The process's cached routed backbone + LoRA (lora-* keys) and tokenizer; callers load the
    adapters and
    route it by masks in a `masked` block."""
    return ROUTED_MODELS.routed(cfg, adapters=True)


def _base_weight(module: nn.Module) -> Tensor:
    """The frozen weight of a (possibly peft-wrapped) linear layer."""
    return getattr(module, "base_layer", module).weight


class Moments:
    """Running count, sum and sum of squares per coordinate (float64) of the rows of (tokens, d)
    matrices."""

    def __init__(self) -> None:
        self.n, self.s, self.s2 = 0, 0.0, 0.0

    def add(self, x: Tensor) -> None:
        x = x.detach().to("cpu", torch.float64)
        self.n += x.shape[0]
        self.s = self.s + x.sum(0)
        self.s2 = self.s2 + x.pow(2).sum(0)

    def mean(self) -> Tensor:
        """The per-coordinate mean (zeros with no rows)."""
        return torch.as_tensor(self.s, dtype=torch.float64) / max(self.n, 1)

    def variance(self) -> Tensor:
        """The sample variance (n − 1 in the denominator; 0 with fewer than 2 rows)."""
        if self.n < 2:
            return torch.zeros_like(torch.as_tensor(self.s2, dtype=torch.float64))
        return ((self.s2 - self.s.pow(2) / self.n) / (self.n - 1)).clamp_min(0.0)


@torch.no_grad()
def bus_moments(model: nn.Module, batches: list[dict[str, Tensor]]) -> list[dict[str, Moments]]:
    """Per layer and mask, the moments (float64, every non-padding token of `batches`) of what that
    lane reads or writes in the dense model (masks off, adapters off): attn-in / ffn-in the
    input / post-attention RMSNorm's output (γ ⊙ x̂, what q/k/v and gate/up read),
    attn-out / ffn-out the o_proj / down_proj output (the write)."""
    layers = decoder_layers(model)
    moments = [{name: Moments() for name in MASK_NAMES} for _ in layers]
    keep: list[Tensor] = []  # the current batch's non-padding positions (tokens,)
    sources = {
        "attn-in": lambda lay: lay.input_layernorm,
        "ffn-in": lambda lay: lay.post_attention_layernorm,
        "attn-out": lambda lay: lay.self_attn.o_proj,
        "ffn-out": lambda lay: lay.mlp.down_proj,
    }

    def hook(stats: Moments) -> Any:
        def record(_module: nn.Module, _inputs: Any, output: Tensor) -> None:
            stats.add(output.reshape(-1, output.shape[-1])[keep[0]])

        return record

    handles = [
        sources[name](layer).register_forward_hook(hook(moments[i][name]))
        for i, layer in enumerate(layers)
        for name in MASK_NAMES
    ]
    device = model_device(model)
    try:
        context = model.disable_adapter() if hasattr(model, "disable_adapter") else torch.no_grad()
        with context, masked(model, None):
            for batch in batches:
                keep[:] = [batch["attention_mask"].reshape(-1).bool().to(device)]
                model(
                    input_ids=batch["input_ids"].to(device),
                    attention_mask=batch["attention_mask"].to(device),
                )
    finally:
        for h in handles:
            h.remove()
    return moments


def importance_scores(model: nn.Module, batches: list[dict[str, Tensor]]) -> dict[str, np.ndarray]:
    """FLAP's fluctuation metric (An et al. 2024, "Fluctuation-based Adaptive Structured Pruning")
    carried over to SFT-P's bus coordinates; returns {mask: (layers, d)}.

    FLAP scores input channel j of a linear map W by S_j = Var_n(X_{n,j}) · ‖W_{:,j}‖²: the expected
    squared change of W·X when channel j is replaced by its mean (their bias compensation). On the
    residual bus, per layer:

    - attn-in: X = the input RMSNorm's output (γ ⊙ x̂, what q/k/v read), S_j = Var(X_j) · Σ_{q,k,v}
      ‖W_{:,j}‖²;
    - ffn-in: X = the post-attention RMSNorm's output, S_j = Var(X_j) · Σ_{gate,up} ‖W_{:,j}‖²;
    - attn-out / ffn-out: Y = the o_proj / down_proj output, S_j = Var(Y_j): the same quantity
      (expected squared change of what the submodule writes to the bus when coordinate j of its
      write is replaced by its mean). No extra ‖W_{j,:}‖² factor: Y_j = W_{j,:}·h already carries
      the row's scale, so it would count it twice.

    Statistics from `bus_moments`. Not modelled: removing an input coordinate also changes the RMS
    over the active lane (routing.route), and SFT-P's masked/compiled forms have no compensation
    bias (FLAP adds one), so a removed coordinate's mean is not restored: this baseline is FLAP's
    score and standardised global cut without its bias compensation (`fedflap.compensation` measures
    what the compensation would change).
    """
    moments = bus_moments(model, batches)
    out: dict[str, list[Tensor]] = {name: [] for name in MASK_NAMES}
    for i, layer in enumerate(decoder_layers(model)):
        attn, mlp = layer.self_attn, layer.mlp
        cols = {
            "attn-in": [attn.q_proj, attn.k_proj, attn.v_proj],
            "ffn-in": [mlp.gate_proj, mlp.up_proj],
        }
        for name in MASK_NAMES:
            var = moments[i][name].variance()
            if name in cols:
                var = var * sum(
                    _base_weight(m).detach().double().cpu().pow(2).sum(0) for m in cols[name]
                )
            out[name].append(var)
    return {name: torch.stack(v).numpy().astype(np.float32) for name, v in out.items()}


def masks_from_arrays(arrays: dict[str, Tensor], device: torch.device) -> list[LayerMasks] | None:
    """The global masks in a message's arrays as `masked` takes them (float 0/1 on `device`),
    None when absent."""
    if MASK_PREFIX + MASK_NAMES[0] not in arrays:
        return None
    return per_layer_masks(
        {name: arrays[MASK_PREFIX + name].to(device, torch.float32) for name in MASK_NAMES}
    )


def average_importance(
    states: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]
) -> dict[str, np.ndarray]:
    """Σ_k n_k S_k / Σ_k n_k per array (float64): FedAvg of the clients' importance scores."""
    return {
        k: v.astype(np.float64)
        for k, v in weighted_average(
            [{k: v.astype(np.float64) for k, v in s.items()} for s in states], weights
        ).items()
    }


def standardise(scores: np.ndarray) -> np.ndarray:
    """Per row (one row = one layer of one mask): (S − mean) / std, FLAP's per-layer standardisation
    that makes scores of different layers and structures comparable in one global ranking; a
    constant row gives zeros."""
    scores = np.asarray(scores, dtype=np.float64)
    std = scores.std(axis=-1, keepdims=True)
    return np.divide(
        scores - scores.mean(axis=-1, keepdims=True), std, out=np.zeros_like(scores), where=std > 0
    )


def cut_masks(
    scores: Mapping[str, np.ndarray],
    costs: Mapping[str, int],
    target: float,
    held: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """One global mask {name: bool (layers, d)} at a parameter budget `target` (=
    p · prunable_parameters).

    Every (layer, mask) first keeps its best coordinate (no empty lane: the submodule stays in the
    model) and every `held` bus coordinate ((d,) bool: `hold-open`, the massive activations);
    then `fill_budget` keeps the rest of the global ranking while the cost stays ≤ target. So the
    kept set is the top of the global ranking and the cost is within one coordinate's cost below the
    target (above it only when the forced coordinates alone exceed it).
    """
    forced = {}
    for n, v in scores.items():
        rows = np.asarray(v).reshape(-1, np.asarray(v).shape[-1])
        f = np.zeros(rows.shape, dtype=bool)
        f[np.arange(rows.shape[0]), np.argmax(rows, axis=1)] = True  # first maximum per row
        if held is not None:
            f |= np.asarray(held, bool)[None, :]
        forced[n] = f.reshape(np.asarray(v).shape)
    return fill_budget(scores, costs, target, forced)


def single_keep_ratio(cfg: RunConfig) -> float:
    """The one budget p of `keep-ratios` (several equal values are accepted); ConfigError
    otherwise."""
    values = {float(v) for v in split_list(cfg.section(BusConfig).keep_ratios)}
    if len(values) != 1:
        raise ConfigError(
            "method 'fedflap' cuts one global mask: run-config key 'keep-ratios' must hold a "
            f"single keep ratio, got {cfg.section(BusConfig).keep_ratios!r}"
        )
    return values.pop()
