"""FedSpaLLM's server math: ℓ0-norm aggregation of pruned weights (Eq. 5), mask expansion to the
target sparsity (Eq. 6–7) and layer sampling with k_i ∝ r_i (Eq. 8)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from fedprune_app.methods.fedspallm.masks import target_count


class L0Sum:
    """Eq. 5 folded in one client at a time: Σ M_i⊙W_i (float64) and Σ M_i (uint16, up to 65,535
    clients) of one weight matrix: 10 bytes per weight however many clients reply, where holding the
    replies costs 5 bytes (fp32 weight + bool mask) per weight per client, twice over once numpy
    copies are taken. Float64 sums of float32 weights are exact unless the clients' values at one
    position span more than ~2^25 in magnitude, so the arrival order of the replies does not change
    the float32 result in practice (a test permutes it)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.total = np.zeros(shape, dtype=np.float64)
        self.kept = np.zeros(shape, dtype=np.uint16)
        self.clients = 0

    def add(self, weight: np.ndarray, mask: np.ndarray) -> None:
        self.total += np.where(mask, weight.astype(np.float64), 0.0)
        self.kept += mask
        self.clients += 1

    def add_kept(self, values: np.ndarray, mask: np.ndarray) -> None:
        """`add` from a reply's wire form (core.encoding): the kept values W[M] in row-major order
        and M. The same float64 additions at the kept positions (adding 0.0 elsewhere changes
        nothing), so the sums are bit-identical to `add(unpack_kept(values, mask), mask)` without
        building the dense matrix."""
        self.total[mask] += values.astype(np.float64)
        self.kept += mask
        self.clients += 1

    def merged(self, dtype: np.dtype | type = np.float32) -> tuple[np.ndarray, np.ndarray]:
        """(W_g = Σ M_i⊙W_i / Σ M_i, 0 where every client pruned; C = #clients that pruned, Eq.
        6)."""
        merged = np.divide(
            self.total, self.kept, out=np.zeros_like(self.total), where=self.kept > 0
        )
        return merged.astype(dtype), self.clients - self.kept.astype(np.int64)


def l0_aggregate(
    weights: Sequence[np.ndarray], masks: Sequence[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 5: W_g = Σ M_i⊙W_i / Σ M_i (0 where every client pruned), and C = #clients that pruned
    (Eq. 6)."""
    acc = L0Sum(weights[0].shape)
    for w, m in zip(weights, masks, strict=True):
        acc.add(w, m)
    return acc.merged(weights[0].dtype)


def expand_masks(
    merged: np.ndarray,
    pruned_count: np.ndarray,
    n_clients: int,
    sparsity: float,
    prunen: int = 0,
    prunem: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 6–7: prune where every client pruned, then k = ⌈s·d⌉ − #{C_j = N} more positions, the
    largest C_j first. Ties in C_j are broken by the smaller |aggregated weight| (the choice a
    magnitude pruner would make; the paper leaves it open). With n:m the same order is applied
    within every group of m per row. If clients agreed on more than ⌈s·d⌉ positions, nothing is
    restored (they are zero in every client). Returns (weights with the pruned positions zeroed,
    kept mask)."""
    # order key: most-agreed first, then smallest magnitude
    magnitude = np.abs(merged.astype(np.float64))
    scale = magnitude.max() + 1.0
    priority = (
        pruned_count.astype(np.float64) * scale + (scale - magnitude) / scale
    )  # larger = prune first
    if prunen:
        rows, cols = merged.shape
        usable = cols - cols % prunem
        groups = priority[:, :usable].reshape(rows, -1, prunem)
        order = np.argsort(-groups, axis=-1, kind="stable")[..., :prunen]
        prune = np.zeros_like(groups, dtype=bool)
        np.put_along_axis(prune, order, True, axis=-1)
        pruned = np.zeros(merged.shape, dtype=bool)
        pruned[:, :usable] = prune.reshape(rows, usable)
        pruned |= pruned_count == n_clients
    else:
        pruned = pruned_count == n_clients
        k = target_count(sparsity, merged.size) - int(pruned.sum())
        if k > 0:
            candidates = np.flatnonzero(~pruned)
            chosen = candidates[np.argsort(-priority.flat[candidates], kind="stable")[:k]]
            pruned.flat[chosen] = True
    return np.where(pruned, 0, merged).astype(merged.dtype), ~pruned


def kept_by(kept: np.ndarray, global_mask: np.ndarray, n_clients: int) -> np.ndarray:
    """Agreement behind one expanded mask: counts[j] = how many positions the global mask keeps that
    exactly j of the `n_clients` sampling clients kept (j = 0..N; j = 0 never occurs, Eq. 6 prunes
    those first). Where every kept weight was kept by all N, Eq. 5 averages N values compensated for
    the same position set; the smaller j, the more the global mask is one no client's pruner
    compensated for."""
    return np.bincount(kept[global_mask].astype(np.int64), minlength=n_clients + 1)


def random_prune(weight: np.ndarray, sparsity: float, rng: np.random.Generator) -> np.ndarray:
    """The `random` baseline: exactly ⌈s·d⌉ positions, drawn uniformly, set to zero."""
    out = weight.copy()
    out.flat[rng.permutation(weight.size)[: target_count(sparsity, weight.size)]] = 0
    return out


def layer_quota(num_layers: int, resources: Sequence[float]) -> list[int]:
    """k_i = max(1, round(r_i·L)) with r_i ∈ (0, 1] the share of layers client i can prune per
    round."""
    return [min(num_layers, max(1, round(r * num_layers))) for r in resources]


def sample_layers(num_layers: int, quotas: Sequence[int], rng: random.Random) -> list[list[int]]:
    """Eq. 8 with coverage: a random permutation of the layers is dealt to the clients' slots
    (client i has k_i slots, shuffled), so every layer goes to some client; each client's remaining
    slots are filled with random layers it does not hold yet. Every layer has the same chance of
    being sampled by a client (Theorem 4.2's condition) and |L_i| = k_i exactly. Needs Σ k_i ≥ L."""
    if sum(quotas) < num_layers:
        raise ValueError(
            f"layer quotas {list(quotas)} sum to {sum(quotas)} < {num_layers} layers: some layer "
            "would go unsampled; raise 'fedspallm-resources'"
        )
    slots = [i for i, k in enumerate(quotas) for _ in range(k)]
    rng.shuffle(slots)
    layers = list(range(num_layers))
    rng.shuffle(layers)
    chosen: list[set[int]] = [set() for _ in quotas]
    for layer, client in zip(layers, slots, strict=False):
        chosen[client].add(layer)
    for client, k in enumerate(quotas):
        rest = [layer for layer in range(num_layers) if layer not in chosen[client]]
        chosen[client] |= set(rng.sample(rest, k - len(chosen[client])))
    return [sorted(c) for c in chosen]


def layer_of(param_name: str, layer_prefix: str) -> int:
    """Decoder-layer index of a parameter name like 'model.layers.12.mlp.up_proj.weight'."""
    return int(param_name[len(layer_prefix) :].split(".", 1)[0])
