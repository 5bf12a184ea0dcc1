"""FLAP's bias compensation on the routed (masked) form, as a measurement: what it would change if
fedflap could deploy it (why the compiled form cannot carry it: docs/methods/llmpruner.md).

FLAP (An et al. 2024, §3.3) replaces a removed input channel j of a linear map W by its calibration
mean, i.e. adds W[:, j]·E[X_j] to the map's bias. On SFT-P's residual bus, per layer:

- **out-lanes** (attn-out, ffn-out): a removed coordinate j of what o_proj / down_proj write is
  replaced by the mean write E[Y_j]: update' = update ⊙ g_out + E[Y] ⊙ (1 − g_out), merged with an
  all-open out-mask;
- **in-lanes** (attn-in, ffn-in): q/k/v (gate/up) read the routed input Norm(x ⊙ g_in) (zeros off
  the lane) plus E[X] ⊙ (1 − g_in), X the dense RMSNorm output: exactly the bias W·(E[X] ⊙
  (1 − g_in)). The kept coordinates keep the routed form's RMS over the active lane (FLAP assumes
  them unchanged: the mismatch the docs describe).

Means from `importance.bus_moments` on the dense model (FLAP's one pass over the calibration data).
`compensated` applies either or both with hooks on a model carrying `routing.install_routing`;
nothing is stored in the model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from fedprune_app.llm.layers import decoder_layers
from fedprune_app.methods.fedflap.importance import Moments
from fedprune_app.structural.routing import MASK_NAMES, LayerMasks, masked

LANES = ("in", "out")


def lane_means(moments: Sequence[dict[str, Moments]]) -> list[dict[str, Tensor]]:
    """Per layer and mask, the calibration mean (float32) of what the lane reads (in) or writes
    (out)."""
    return [{name: m[name].mean().float() for name in MASK_NAMES} for m in moments]


def pooled_means(per_client: Sequence[Sequence[dict[str, Moments]]]) -> list[dict[str, Tensor]]:
    """The means over every client's calibration tokens: Σ_k s_k / Σ_k n_k per layer and mask (what
    a server gets from the clients' sums and token counts)."""
    pooled = []
    for layer in zip(*per_client, strict=True):
        pooled.append(
            {
                name: (
                    sum(torch.as_tensor(m[name].s, dtype=torch.float64) for m in layer)
                    / max(sum(m[name].n for m in layer), 1)
                ).float()
                for name in MASK_NAMES
            }
        )
    return pooled


@contextmanager
def compensated(
    model: nn.Module,
    masks: Sequence[LayerMasks],
    means: Sequence[dict[str, Tensor]],
    lanes: Sequence[str] = LANES,
) -> Iterator[nn.Module]:
    """`model` (routed) with `masks` set and FLAP's compensation on `lanes` (module docstring); the
    previous masks
    back and hooks removed on exit. `lanes` = () is the plain masked form."""
    unknown = set(lanes) - set(LANES)
    if unknown:
        raise ValueError(f"compensation lanes must be among {LANES}, got {sorted(unknown)}")
    handles = []
    routed_by = []
    for layer, g, mu in zip(decoder_layers(model), masks, means, strict=True):
        g_set = dict(g)
        for m, module in (("attn", layer.self_attn), ("ffn", layer.mlp)):
            if "out" in lanes:
                g_out, fill = g[f"{m}-out"], mu[f"{m}-out"] * (1 - g[f"{m}-out"].float())
                g_set[f"{m}-out"] = torch.ones_like(g_out)
                handles.append(module.register_forward_hook(_out_hook(g_out, fill)))
            if "in" in lanes:
                fill = mu[f"{m}-in"] * (1 - g[f"{m}-in"].float())
                reads = (
                    (module.q_proj, module.k_proj, module.v_proj)
                    if m == "attn"
                    else (module.gate_proj, module.up_proj)
                )
                handles += [r.register_forward_pre_hook(_in_hook(fill)) for r in reads]
        routed_by.append(g_set)
    try:
        with masked(model, routed_by):
            yield model
    finally:
        for h in handles:
            h.remove()


def _out_hook(g_out: Tensor, fill: Tensor) -> Callable[..., Any]:
    def hook(_module: nn.Module, _inputs: tuple, output: Tensor | tuple) -> Tensor | tuple:
        update = output[0] if isinstance(output, tuple) else output
        update = update * g_out.to(update) + fill.to(update)
        return (update, *output[1:]) if isinstance(output, tuple) else update

    return hook


def _in_hook(fill: Tensor) -> Callable[..., Any]:
    def hook(_module: nn.Module, inputs: tuple) -> tuple:
        return (inputs[0] + fill.to(inputs[0]), *inputs[1:])

    return hook
