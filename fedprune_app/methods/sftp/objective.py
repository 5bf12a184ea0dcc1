"""SFT-P's objective (§3.3): the budget penalty (Eq. 14) and the local loss L_k (Eq. 13), and the
expected kept ratio that the penalty drives to p."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from fedprune_app.core.config import RunConfig
from fedprune_app.methods.sftp.config import SFTPConfig
from fedprune_app.methods.sftp.generator import MaskGenerator, layer_masks
from fedprune_app.structural.held import force_open, held_coordinates
from fedprune_app.structural.routing import kept_parameters, prunable_parameters


def budget_penalty(kept: Tensor, target: float | Tensor) -> Tensor:
    """Eq. 14: R(T, pT_total) = log(max(T, pT) / min(T, pT)), differentiable in T."""
    target = torch.as_tensor(target, dtype=kept.dtype, device=kept.device)
    return torch.log(torch.maximum(kept, target) / torch.minimum(kept, target))


def sftp_objective(
    clm_loss: Tensor, kept: Tensor, keep_ratio: float, total: int, lam: float
) -> tuple[Tensor, Tensor]:
    """Eq. 13: (L_k, R) with L_k = L_CLM + λ·R(T(g_k), p·T_total) and R the budget penalty of Eq. 14
    (returned too: the client reports it). The client's local training minimises exactly this
    L_k."""
    penalty = budget_penalty(kept, keep_ratio * total)
    return clm_loss + lam * penalty, penalty


def expected_kept(
    model: nn.Module,
    tokenizer: Any,
    generator: MaskGenerator,
    embedding: Tensor | None,
    cfg: RunConfig,
) -> float:
    """E[T(g)]/T_total under the sampled gates g ~ Bernoulli(π) (held gates at 1): T is linear in
    each gate, so this is T(π)/T_total, the kept ratio Eq. 14's penalty drives to p (Fig. 4b's
    curve)."""
    bias = cfg.section(SFTPConfig).sftp_gate_bias
    pi = torch.sigmoid(generator(embedding).detach().float() + bias)
    held = held_coordinates(cfg, model, tokenizer)
    kept = kept_parameters(model.config, layer_masks(force_open(pi, held)))
    return float(kept) / prunable_parameters(model.config)
