"""Unstructured pruners (SparseGPT, Wanda, magnitude) and the sequential layer loop.

Pure functions over tensors. The FedSpaLLM client runs them on its own calibration data; the server
runs them only for the simulation-only `centralized` reference (pooled data), which is why they live
in the shared machinery rather than under clients/. Conventions: a weight
matrix W is (out_features, in_features) as in `nn.Linear`; a mask is bool with True = weight kept.
Devices: the calibration ids go to the model's device, statistics and pruning run there in float32
(the Hessians included), and the masks the layer loop returns are on the CPU.
`n:m` sparsity (`prunen`, `prunem` > 0) prunes n of every m consecutive input weights of each row.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedprune_app.llm.layers import decoder_layers, linear_modules
from fedprune_app.llm.models import model_device
from fedprune_app.methods.fedspallm.config import FedSpaLLMConfig

PRUNERS = ("sparsegpt", "wanda", "magnitude")


def _lowest(
    scores: torch.Tensor, sparsity: float, prunen: int, prunem: int, per_row: bool
) -> torch.Tensor:
    """Bool mask (True = pruned) of the lowest scores: n of every m per row, per row, or over the
    whole block."""
    pruned = torch.zeros_like(scores, dtype=torch.bool)
    if prunen:
        cols = scores.shape[1] - scores.shape[1] % prunem
        groups = scores[:, :cols].reshape(scores.shape[0], -1, prunem)
        idx = torch.topk(groups, prunen, dim=-1, largest=False).indices
        pruned[:, :cols] = (
            torch.zeros_like(groups, dtype=torch.bool)
            .scatter_(-1, idx, True)
            .reshape(scores.shape[0], cols)
        )
        return pruned
    if per_row:
        k = int(round(scores.shape[1] * sparsity))
        if k:
            pruned.scatter_(1, torch.topk(scores, k, dim=1, largest=False).indices, True)
        return pruned
    k = int(round(scores.numel() * sparsity))
    if k:
        pruned.view(-1)[torch.topk(scores.flatten(), k, largest=False).indices] = True
    return pruned


def magnitude_prune(
    weight: torch.Tensor, sparsity: float, prunen: int = 0, prunem: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the largest |w| (over the whole matrix, or n:m per row)."""
    pruned = _lowest(weight.abs().float(), sparsity, prunen, prunem, per_row=False)
    return weight.masked_fill(pruned, 0), ~pruned


def wanda_prune(
    weight: torch.Tensor, sq_norms: torch.Tensor, sparsity: float, prunen: int = 0, prunem: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Wanda (Sun et al. 2023): score |W_ij|·‖X_j‖₂, prune the lowest within each output row; no
    update."""
    scores = weight.abs().float() * sq_norms.float().sqrt().unsqueeze(0)
    pruned = _lowest(scores, sparsity, prunen, prunem, per_row=True)
    return weight.masked_fill(pruned, 0), ~pruned


def sparsegpt_prune(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    sparsity: float,
    prunen: int = 0,
    prunem: int = 0,
    blocksize: int = 128,
    percdamp: float = 0.01,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SparseGPT (Frantar & Alistarh 2023, Alg. 1): OBS pruning with lazy block updates.

    H = 2XXᵀ/n is dampened by `percdamp`·mean(diag H); U = chol(H⁻¹) (upper). Within each block of
    `blocksize` columns the mask is chosen adaptively by w²/U_jj² (exactly round(sparsity·size)
    weights per block, or n:m per row); pruning column j spreads its error (w_j − q_j)/U_jj over the
    later columns of the block through row j of U, and the block's accumulated error updates all
    later columns at once. Returns (pruned weight in the input dtype, kept mask).
    """
    W = weight.detach().float().clone()
    H = hessian.detach().float().clone()
    rows, cols = W.shape
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    H.diagonal().add_(percdamp * torch.mean(torch.diag(H)))
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    pruned = torch.zeros((rows, cols), dtype=torch.bool, device=W.device)
    for i1 in range(0, cols, blocksize):
        i2 = min(i1 + blocksize, cols)
        W1, U1 = W[:, i1:i2].clone(), U[i1:i2, i1:i2]
        err = torch.zeros_like(W1)
        d = torch.diag(U1)
        mask1 = (
            torch.zeros_like(W1, dtype=torch.bool)
            if prunen
            else _lowest(W1**2 / d.unsqueeze(0) ** 2, sparsity, 0, 0, per_row=False)
        )
        for i in range(i2 - i1):
            if prunen and i % prunem == 0:
                block = W1[:, i : i + prunem] ** 2 / d[i : i + prunem].unsqueeze(0) ** 2
                mask1[:, i : i + prunem] = _lowest(block, 0.0, prunen, block.shape[1], per_row=True)
            w = W1[:, i]
            q = w.masked_fill(mask1[:, i], 0)
            e = (w - q) / d[i]
            W1[:, i:] -= e.unsqueeze(1) * U1[i, i:].unsqueeze(0)
            W1[:, i] = q
            err[:, i] = e
        W[:, i1:i2] = W1
        W[:, i2:] -= err @ U[i1:i2, i2:]
        pruned[:, i1:i2] = mask1
    W[pruned] = 0
    return W.to(weight.dtype), ~pruned


# --- the sequential layer loop --------------------------------------------------------------------


class _Captured(Exception):
    pass


@dataclass
class LayerInputs:
    """The positional and keyword arguments that each calibration batch brings to decoder layer
    0."""

    hidden: list[torch.Tensor] = field(default_factory=list)
    kwargs: list[dict[str, Any]] = field(default_factory=list)


@torch.no_grad()
def capture_layer0_inputs(model: nn.Module, batches: Sequence[torch.Tensor]) -> LayerInputs:
    """Run each batch of token ids up to decoder layer 0 and keep everything it receives: the hidden
    states and every keyword argument (rotary `position_embeddings`, attention mask, positions).
    Current transformers computes the rotary embeddings once in the model and passes them down;
    replaying them is what the reference SparseGPT loop misses (sparsegpt issue #45)."""
    layers = decoder_layers(model)
    captured = LayerInputs()

    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        hidden = args[0] if args else kwargs.pop("hidden_states")
        captured.hidden.append(hidden.detach())
        captured.kwargs.append({k: v for k, v in kwargs.items() if k != "hidden_states"})
        raise _Captured

    handle = layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    device = model_device(model)
    try:
        for ids in batches:
            try:
                model(input_ids=ids.to(device), use_cache=False)
            except _Captured:
                pass
    finally:
        handle.remove()
    return captured


def _layer_output(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


PruneFn = Callable[[str, nn.Linear, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class InputStats:
    """Running H = 2XXᵀ/n (if `hessian`) and Σx²/n of one linear layer's inputs (all calibration
    tokens, fp32), on `device` (the inputs' device)."""

    def __init__(
        self, features: int, hessian: bool = True, device: torch.device | str = "cpu"
    ) -> None:
        self.hessian = (
            torch.zeros(features, features, device=device)
            if hessian
            else torch.zeros(0, 0, device=device)
        )
        self.sq_norms = torch.zeros(features, device=device)
        self.count = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1]).float()
        n, t = self.count, x.shape[0]
        if self.hessian.numel():
            self.hessian.mul_(n / (n + t)).addmm_(x.T, x, alpha=2.0 / (n + t))
        self.sq_norms.mul_(n / (n + t)).add_((x**2).sum(0), alpha=1.0 / (n + t))
        self.count = n + t


def collect_input_stats(
    layer: nn.Module,
    linears: dict[str, nn.Linear],
    hidden: Sequence[torch.Tensor],
    kwargs: Sequence[dict[str, Any]],
    needs: str,
) -> dict[str, InputStats]:
    """Run the layer on every calibration batch with hooks on its linears. Linears fed the very same
    input tensor (q/k/v, gate/up) share one `InputStats`, so each Hessian is accumulated once."""
    stats: dict[str, InputStats] = {}
    # inputs seen in the current batch, kept alive so that no new tensor can reuse their id
    this_batch: list[tuple[torch.Tensor, InputStats]] = []

    def added_with(x: torch.Tensor) -> InputStats | None:
        return next((st for seen, st in this_batch if seen is x), None)

    def hook_for(name: str) -> Callable[[nn.Module, tuple, Any], None]:
        def hook(_module: nn.Module, args: tuple, _output: Any) -> None:
            x = args[0]
            if name not in stats:
                stats[name] = added_with(x) or InputStats(x.shape[-1], needs == "hessian", x.device)
            if added_with(x) is not stats[name]:
                stats[name].add(x)
                this_batch.append((x, stats[name]))

        return hook

    handles = [m.register_forward_hook(hook_for(name)) for name, m in linears.items()]
    try:
        for h, kw in zip(hidden, kwargs, strict=True):
            this_batch.clear()
            layer(h, **kw)
    finally:
        for handle in handles:
            handle.remove()
    return stats


@torch.no_grad()
def prune_sequentially(
    model: nn.Module,
    batches: Sequence[torch.Tensor],
    layer_ids: Sequence[int],
    prune: PruneFn,
    on_layer: Callable[[int, float], None] | None = None,
) -> dict[str, torch.Tensor]:
    """The SparseGPT layer loop: feed the calibration activations through the decoder layers in
    order; at each layer in `layer_ids`, collect every linear's `InputStats` (forward hooks), call
    `prune(name, linear, H, sq_norms) -> (new weight, kept mask)`, write the weight, and re-run the
    layer so the next layer sees the pruned layer's outputs. Returns {full parameter name: kept mask
    (CPU)}. Layers after the last sampled one are not run at all. A `prune` function may carry
    `needs`: "hessian" (default), "norms" (Σx² only, Wanda) or "nothing" (magnitude: no statistics
    pass).
    """
    needs = getattr(prune, "needs", "hessian")
    layers = decoder_layers(model)
    names = {id(module): name for name, module in model.named_modules()}
    inputs = capture_layer0_inputs(model, batches)
    hidden, kwargs = inputs.hidden, inputs.kwargs
    wanted = set(layer_ids)
    masks: dict[str, torch.Tensor] = {}
    for j, layer in enumerate(layers):
        if not wanted or j > max(wanted):
            break
        if j in wanted:
            start = time.perf_counter()
            linears = linear_modules(layer)
            stats = (
                collect_input_stats(layer, linears, hidden, kwargs, needs)
                if needs != "nothing"
                else {
                    name: InputStats(m.in_features, False, m.weight.device)
                    for name, m in linears.items()
                }
            )
            for name, linear in linears.items():
                new_weight, kept = prune(name, linear, stats[name].hessian, stats[name].sq_norms)
                linear.weight.data.copy_(new_weight.to(linear.weight.dtype))
                masks[f"{names[id(layer)]}.{name}.weight"] = kept.cpu()
            if on_layer is not None:
                on_layer(j, time.perf_counter() - start)
        hidden = [_layer_output(layer(h, **kw)) for h, kw in zip(hidden, kwargs, strict=True)]
    return masks


@dataclass
class Pruner:
    """A per-linear pruning function and the input statistics it needs (see
    `prune_sequentially`)."""

    fn: PruneFn
    needs: str = "hessian"

    def __call__(
        self, name: str, linear: nn.Linear, hessian: torch.Tensor, sq_norms: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.fn(name, linear, hessian, sq_norms)


def make_pruner(
    kind: str,
    sparsity: float,
    prunen: int = 0,
    prunem: int = 0,
    blocksize: int = 128,
    percdamp: float = 0.01,
) -> Pruner:
    """The per-linear pruning function of a pruner name (see PRUNERS)."""
    if kind == "sparsegpt":
        return Pruner(
            lambda _n, lin, H, _sq: sparsegpt_prune(
                lin.weight.data, H, sparsity, prunen, prunem, blocksize, percdamp
            ),
            "hessian",
        )
    if kind == "wanda":
        return Pruner(
            lambda _n, lin, _H, sq: wanda_prune(lin.weight.data, sq, sparsity, prunen, prunem),
            "norms",
        )
    if kind == "magnitude":
        return Pruner(
            lambda _n, lin, _H, _sq: magnitude_prune(lin.weight.data, sparsity, prunen, prunem),
            "nothing",
        )
    raise ValueError(f"pruner must be one of {', '.join(PRUNERS)}, got {kind!r}")


def pruner_for(cfg: Any) -> Pruner:
    """The pruner a run config asks for (`pruner`, `sparsity`, `prune-n`/`prune-m`, SparseGPT's
    block/damping)."""
    prune_cfg = cfg.section(FedSpaLLMConfig)
    return make_pruner(
        prune_cfg.pruner,
        prune_cfg.sparsity,
        prune_cfg.prune_n,
        prune_cfg.prune_m,
        prune_cfg.sparsegpt_blocksize,
        prune_cfg.sparsegpt_percdamp,
    )


def sparsity_of(mask: torch.Tensor) -> float:
    """Fraction of pruned entries of a kept-mask."""
    return 1.0 - float(mask.float().mean()) if mask.numel() else math.nan
