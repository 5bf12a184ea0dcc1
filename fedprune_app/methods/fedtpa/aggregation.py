"""FedTPA's server math: ITPA's cosine distances and initial keep ratios (Eq. 3–5), DAPR's next keep
ratio (Eq. 9), zero-padding a pruned adapter back to r_g by its log (§III-E) and LCWA (Eq. 8)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedprune_app.core.replies import weighted_average
from fedprune_app.llm.lora import LORA_A, LORA_B


def cosine_distances(features: np.ndarray, sizes: Sequence[float]) -> np.ndarray:
    """Eq. 3–4: λ_g = Σ n_i λ_i / Σ n_i (weighted by data size), d_i = 1 − cos(λ_i, λ_g)."""
    feats = np.asarray(features, dtype=np.float64)
    w = np.asarray(sizes, dtype=np.float64)
    global_feature = (w[:, None] * feats).sum(axis=0) / w.sum()
    cos = feats @ global_feature / (np.linalg.norm(feats, axis=1) * np.linalg.norm(global_feature))
    return 1.0 - cos


def initial_betas(distances: np.ndarray, beta_min: float) -> np.ndarray:
    """Eq. 5: β_i¹ = (1 − β_m)(d_i − d_min)/(d_max − d_min) + β_m, so the farthest client keeps
    every dimension and the closest keeps β_m. When all distances are equal (e.g. one client)
    nothing tells the clients apart: every β is 1 (the farthest client's value)."""
    d = np.asarray(distances, dtype=np.float64)
    spread = d.max() - d.min()
    if not spread > 1e-12:
        return np.ones_like(d)
    return (1.0 - beta_min) * (d - d.min()) / spread + beta_min


def next_beta(
    beta: float,
    train_loss: float,
    prev_train_loss: float,
    val_loss: float,
    prev_val_loss: float,
    delta: float,
) -> float:
    """Eq. 9: (1+δ)β if the training loss rose; (1−δ)β if it did not but the validation loss rose
    (overfitting); else β. Clipped to (0, 1] (δ < 1 keeps it positive). A NaN loss (no previous
    round, no validation data) never triggers its branch."""
    if train_loss > prev_train_loss:
        beta = (1.0 + delta) * beta
    elif train_loss <= prev_train_loss and val_loss > prev_val_loss:
        beta = (1.0 - delta) * beta
    return min(1.0, beta)


def zero_pad(
    a_kept: np.ndarray, b_kept: np.ndarray, keep: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """§III-E: an adapter layer's kept dimensions (A: k×l, B: d×k) back at their positions of the
    rank-r_g layer (r_g = len(keep)); pruned dimensions are zero."""
    a = np.zeros((keep.size, a_kept.shape[1]), dtype=a_kept.dtype)
    b = np.zeros((b_kept.shape[0], keep.size), dtype=b_kept.dtype)
    a[keep], b[:, keep] = a_kept, b_kept
    return a, b


def lcwa(
    states: Sequence[dict[str, np.ndarray]],
    layer_scores: np.ndarray,
    layers: Sequence[str],
    fallback: Sequence[float],
) -> dict[str, np.ndarray]:
    """Eq. 8: per adapter layer j, M_g^j = Σ_i h̃_i^j M_i^j with h̃_i^j = h_i^j / Σ_k h_k^j (the
    zero-padded adapters of all clients, A and B alike). As the paper zero-pads before averaging, a
    dimension a client pruned enters as 0 with that client's layer weight. A layer whose scores sum
    to 0 (e.g. pruned by every client) falls back to the `fallback` weights (num-examples)."""
    scores = np.asarray(layer_scores, dtype=np.float64)
    out: dict[str, np.ndarray] = {}
    for j, layer in enumerate(layers):
        w = scores[:, j] if scores[:, j].sum() > 0 else np.asarray(fallback, dtype=np.float64)
        for key in (layer + LORA_A, layer + LORA_B):
            out[key] = weighted_average([{key: s[key]} for s in states], list(w))[key]
    return out
