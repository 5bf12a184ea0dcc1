"""SliceGPT's statistics and rotations (Ashkboos et al. 2024, §3.3 Eq. 6–7): per residual-stream
point p the (uncentred) covariance sum C_p = Σ_tokens x xᵀ, its eigenvectors Q_p sorted by
decreasing eigenvalue, and the slice B_p = Q_p[:, :k]. Federated: each client sends its C_p
(float64) once; the server sums them, Σ_k C_p^(k), which IS the pooled sum over all clients' tokens
(a sum of sums), so the eigenvectors are the pooled ones.

One-shot (the federated port): every C_p is taken on the DENSE model in one round. The reference
SliceGPT is sequential: C_p is taken on the model already rotated and sliced at points < p
(`sequential_bases`, 2L + 1 passes over the data), which a federation would pay with one round per
point; it is the centralized reference.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from fedprune_app.llm.layers import decoder_layers
from fedprune_app.llm.models import model_device
from fedprune_app.methods.slicegpt.shapes import BASIS_PREFIX  # noqa: F401 (re-exported)
from fedprune_app.methods.slicegpt.sliced import identity_bases, num_points, set_point, slice_model

COVARIANCE_PREFIX = "slicegpt-cov."  # a round-1 reply: float64 (d, d) per point p = 0..2L


def point_inputs(model: nn.Module) -> list[nn.Module]:
    """The module whose first input is the residual stream at point p, for p = 0..2L: layer l's
    input norm (2l), its post-attention norm (2l+1), the final norm (2L). Works on the dense and on
    the sliced model alike."""
    out: list[nn.Module] = []
    for layer in decoder_layers(model):
        out += [layer.input_layernorm, layer.post_attention_layernorm]
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return out + [base.model.norm]


class _Stop(Exception):
    """Raised by the last hook a pass needs: the rest of the forward is skipped."""


@torch.no_grad()
def covariance_sums(
    model: nn.Module, batches: Iterable[dict[str, Tensor]], points: Sequence[int] | None = None
) -> tuple[dict[int, Tensor], int]:
    """({p: Σ x xᵀ (float64, d_p × d_p) over every non-padding token}, token count) at `points`
    (default all), of `model` as it is (adapters off). A pass stops after the last point it
    needs."""
    modules = point_inputs(model)
    points = list(range(len(modules))) if points is None else list(points)
    sums: dict[int, Tensor] = {}
    keep: list[Tensor] = []
    last = max(points)

    def hook(p: int) -> Any:
        def record(_module: nn.Module, args: tuple[Tensor, ...]) -> None:
            x = args[0].reshape(-1, args[0].shape[-1])[keep[0]].to(torch.float64)
            sums[p] = sums[p] + x.T @ x if p in sums else x.T @ x
            if p == last:
                raise _Stop

        return record

    handles = [modules[p].register_forward_pre_hook(hook(p)) for p in points]
    device, tokens = model_device(model), 0
    try:
        context = model.disable_adapter() if hasattr(model, "disable_adapter") else torch.no_grad()
        with context:
            for batch in batches:
                mask = batch["attention_mask"].to(device)
                keep[:] = [mask.reshape(-1).bool()]
                tokens += int(mask.sum())
                try:
                    model(
                        input_ids=batch["input_ids"].to(device),
                        attention_mask=mask,
                        use_cache=False,
                    )
                except _Stop:
                    pass
    finally:
        for h in handles:
            h.remove()
    return {p: sums[p].cpu() for p in points}, tokens


def sum_covariances(parts: Sequence[dict[int, Tensor]]) -> dict[int, Tensor]:
    """Σ_k C_p^(k) per point (float64): the federated sum, equal to the covariance sum of the pooled
    tokens."""
    return {p: torch.stack([part[p].to(torch.float64) for part in parts]).sum(0) for p in parts[0]}


def principal_basis(cov: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(eigenvalues descending, Q[:, :k]) of the symmetric covariance `cov` in float64
    (torch.linalg.eigh)."""
    cov = cov.to(torch.float64)
    values, vectors = torch.linalg.eigh((cov + cov.T) / 2)
    order = torch.argsort(values, descending=True)
    return values[order], vectors[:, order[:k]].contiguous()


def one_shot_bases(covariances: dict[int, Tensor], k: int) -> list[Tensor]:
    """B_p = Q_p[:, :k] for every point from covariances of the dense model (the federated one-shot
    port)."""
    return [principal_basis(covariances[p], k)[1] for p in sorted(covariances)]


def sequential_bases(
    dense: nn.Module, batches: list[dict[str, Tensor]], k: int
) -> tuple[list[Tensor], nn.Module]:
    """The reference SliceGPT's order (§3.4): for p = 0..2L, C_p on the model sliced at points < p
    (points ≥ p still the identity, so the stream at p is in the dense basis), then
    B_p = Q_p[:, :k]. Returns the bases and the sliced model. 2L + 1 passes over `batches` (each
    stopped at p)."""
    config = dense.config
    bases = identity_bases(config, model_device(dense))
    model = slice_model(dense, bases)
    for p in range(num_points(config)):
        cov, _ = covariance_sums(model, batches, [p])
        bases[p] = principal_basis(cov[p], k)[1].to(model_device(dense))
        set_point(model, dense, bases, p)
    return bases, model.eval()
