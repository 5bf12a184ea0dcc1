"""Pure helpers over LoRA adapter states that a method's server and clients share (plain NumPy).

An adapter state is peft's `{"<module>.lora_A.weight": (r, l), "<module>.lora_B.weight": (d, r)}`;
an *adapter layer* is one adapted module (`<module>`), so ΔW = (α/r)·B·A per layer (Hu et al. 2022,
Eq. 1). Both sides import these, so that the layer order of a per-layer record (e.g. a rank-pruning
log) and the keep count are defined once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

LORA_A, LORA_B = ".lora_A.weight", ".lora_B.weight"


def natural_key(name: str) -> list[int | str]:
    """Sort key that orders 'layers.2' before 'layers.10'."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def adapter_layers(keys: Iterable[str]) -> list[str]:
    """The adapter layers (module names with both a lora_A and a lora_B tensor) in model order.

    This order indexes the rows of any per-layer record over an adapter of N layers (e.g. an N×r_g
    rank-pruning log and N per-layer contribution scores).
    """
    keys = set(keys)
    names = {k[: -len(LORA_A)] for k in keys if k.endswith(LORA_A)}
    return sorted((n for n in names if n + LORA_B in keys), key=natural_key)


def keep_count(beta: float, num_layers: int, rank: int) -> int:
    """⌊β·N·r_g⌋, the rank dimensions a keep ratio β leaves of N adapter layers of rank r_g, at
    least 1 so a client always trains something; immune to float noise (0.3·60·16 is
    287.99999999999994 in binary)."""
    return max(1, math.floor(round(beta * num_layers * rank, 9)))


def lora_rank(state: dict[str, np.ndarray]) -> int:
    """The rank of a homogeneous adapter state (rows of its lora_A tensors); ValueError if they
    differ."""
    ranks = {int(v.shape[0]) for k, v in state.items() if k.endswith(LORA_A)}
    if len(ranks) != 1:
        raise ValueError(f"adapter state has lora_A ranks {sorted(ranks)}, expected one rank")
    return ranks.pop()


def truncate_factors(b: np.ndarray, a: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """The first `rank` dimensions of an adapter (B, A) at rank r_s, B rescaled so that the product
    keeps peft's scaling: (α/rank)·B'A' = (α/r_s)·B[:, :rank]·A[:rank]
    ⇒  B' = B[:, :rank]·rank/r_s.

    For SVD factors of ΔW (ordered by singular value) this is exactly the rank-`rank` truncated SVD
    of the same ΔW (Eckart–Young), so a server can send any client a truncation of one
    decomposition.
    """
    r_s = a.shape[0]
    if not 1 <= rank <= r_s:
        raise ValueError(f"cannot truncate a rank-{r_s} adapter to rank {rank}")
    return (b[:, :rank] * (rank / r_s)).astype(b.dtype), a[:rank].copy()


def factor_problem(
    layer: str, arrays: Any, sent: Mapping[str, tuple[tuple[int, ...], str]], rank: int
) -> str | None:
    """Why a reply's LoRA factors of `layer` are not A (rank × in) and B (out × rank) with the
    in/out sizes of what was sent (`sent`: {key: (shape, dtype)}), or are non-finite; None when they
    are fine."""
    a, b = arrays[layer + LORA_A].numpy(), arrays[layer + LORA_B].numpy()
    want_a, want_b = (rank, sent[layer + LORA_A][0][1]), (sent[layer + LORA_B][0][0], rank)
    if a.shape != want_a or b.shape != want_b:
        return (
            f"{layer}: adapter shapes {a.shape}/{b.shape}, expected {want_a}/{want_b} "
            f"for rank {rank}"
        )
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return f"{layer}: non-finite adapter values"
    return None
