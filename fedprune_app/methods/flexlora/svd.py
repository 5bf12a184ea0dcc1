"""FlexLoRA's server math: full ΔW = (α/r)·B·A per client, their weighted average, and the truncated
SVD that gives each client its rank back (B = U_r S_r / (α/r), A = V_rᵀ)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from fedprune_app.llm.lora import LORA_A, LORA_B, adapter_layers, lora_rank, truncate_factors


def lora_delta(b: np.ndarray, a: np.ndarray, alpha: float, rank: int) -> np.ndarray:
    """ΔW = (α/r)·B·A of one adapter layer (float64)."""
    return (alpha / rank) * (b.astype(np.float64) @ a.astype(np.float64))


def average_deltas(
    states: Sequence[dict[str, np.ndarray]],
    ranks: Sequence[int],
    weights: Sequence[float],
    layers: Sequence[str],
    alpha: float,
) -> dict[str, np.ndarray]:
    """ΔW^j = Σ_i p_i·(α/r_i)·B_i^j A_i^j with p_i = w_i / Σ w (FlexLoRA's data-size weighting)."""
    p = np.asarray(weights, dtype=np.float64) / float(sum(weights))
    return {
        layer: sum(
            pi * lora_delta(s[layer + LORA_B], s[layer + LORA_A], alpha, r)
            for s, r, pi in zip(states, ranks, p, strict=True)
        )
        for layer in layers
    }


def svd_factors(delta: np.ndarray, rank: int, alpha: float) -> tuple[np.ndarray, np.ndarray, float]:
    """The rank-r LoRA of ΔW: B = U_r S_r/(α/r) (d×r), A = V_rᵀ (r×l), and the share of ‖ΔW‖²_F it
    keeps.

    A rank above min(d, l) is zero-padded (B columns and A rows of zeros): ΔW has no further
    directions."""
    u, s, vt = np.linalg.svd(delta.astype(np.float64), full_matrices=False)
    k = min(rank, s.size)
    b = np.zeros((delta.shape[0], rank))
    a = np.zeros((rank, delta.shape[1]))
    b[:, :k] = u[:, :k] * s[:k] / (alpha / rank)
    a[:k] = vt[:k]
    total = float((s**2).sum())
    return (
        b.astype(np.float32),
        a.astype(np.float32),
        float((s[:k] ** 2).sum() / total) if total > 0 else 1.0,
    )


def fit_rank(state: dict[str, np.ndarray], rank: int, seed: int) -> dict[str, np.ndarray]:
    """The adapter `state` (any rank r_s) as a rank-`rank` adapter with the same ΔW where r_s ≥ rank
    allows it (then the best rank-`rank` approximation of SVD factors)."""
    r_s = lora_rank(state)
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, np.ndarray] = {}
    for layer in adapter_layers(state):
        b, a = state[layer + LORA_B], state[layer + LORA_A]
        if r_s >= rank:
            b, a = truncate_factors(b, a, rank)
        else:
            fresh = torch.empty(rank - r_s, a.shape[1])
            bound = 1.0 / math.sqrt(a.shape[1])  # kaiming_uniform_(a=√5), peft's LoRA-A init
            fresh.uniform_(-bound, bound, generator=gen)
            b = np.concatenate(
                [b * (rank / r_s), np.zeros((b.shape[0], rank - r_s), b.dtype)], axis=1
            )
            a = np.concatenate([a, fresh.numpy().astype(a.dtype)], axis=0)
        out[layer + LORA_B], out[layer + LORA_A] = b, a
    return out
