"""FedTPA's local adapter pruning (§III-D): contribution EMA, dimension scores, global top-k
pruning, the log.

Pure functions over tensors (tests call them directly), plus the two pieces that touch a peft model:
`ContributionTracker` (Eq. 6 on every warm-up step through gradient hooks) and `pruned_adapters`
(the reconfigured, smaller adapters the client fine-tunes).

LoRA scaling with heterogeneous ranks: a pruned layer keeps peft's scaling α/r_g of the global
adapter, whatever its remaining rank r_i^j. The kept dimensions therefore contribute exactly what
they contributed before pruning, ΔW_i^j = (α/r_g)·B[:, keep]·A[keep], and zero-padding back to r_g
on the server (`strategies.fedtpa.zero_pad`) restores the same ΔW. (Re-scaling by α/r_i^j would
silently multiply each layer's update by r_g/r_i^j.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from fedprune_app.llm.lora import keep_count, natural_key

ADAPTER = "default"


# --- pure functions -------------------------------------------------------------------------------


def update_contribution(
    ema: torch.Tensor, weight: torch.Tensor, grad: torch.Tensor, decay: float
) -> torch.Tensor:
    """Eq. 6, in place: h ← η·h + (1 − η)·|w·∂L/∂w| (element-wise); returns `ema`."""
    return ema.mul_(decay).add_(
        (weight.detach() * grad.detach()).abs().to(ema.dtype), alpha=1.0 - decay
    )


def dimension_scores(h_a: torch.Tensor, h_b: torch.Tensor) -> torch.Tensor:
    """§III-D2: the score of dimension k of one adapter layer = the mean contribution over its
    parameters, row k of A (r×l) and column k of B (d×r) together: (Σ_j h_A[k, j] + Σ_i
    h_B[i, k]) / (l + d)."""
    return (h_a.sum(dim=1) + h_b.sum(dim=0)) / (h_a.shape[1] + h_b.shape[0])


def prune_log(scores: torch.Tensor, beta: float) -> torch.Tensor:
    """§III-D2: sort all N·r_g dimension scores (N layers × r_g) together, keep the top ⌊β·N·r_g⌋.

    Returns the pruning log, a bool N×r_g matrix (True = kept). Ties go to the earlier layer and
    dimension (stable sort), so a client with all-zero scores keeps the leading dimensions.
    """
    n_layers, rank = scores.shape
    k = keep_count(beta, n_layers, rank)
    order = torch.sort(scores.flatten().double(), descending=True, stable=True).indices[:k]
    log = torch.zeros(n_layers * rank, dtype=torch.bool)
    log[order] = True
    return log.view(n_layers, rank)


def layer_contributions(scores: torch.Tensor, log: torch.Tensor) -> torch.Tensor:
    """Eq. 7: per adapter layer, the mean score of its retained dimensions (0 for a layer pruned
    entirely)."""
    kept = log.sum(dim=1)
    total = torch.where(log, scores, torch.zeros_like(scores)).sum(dim=1)
    return torch.where(kept > 0, total / kept.clamp(min=1), torch.zeros_like(total))


def slice_adapter(
    a: torch.Tensor, b: torch.Tensor, keep: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept dimensions of one adapter layer: rows of A (r×l) and columns of B (d×r) where `keep`
    is True."""
    return a[keep], b[:, keep]


# --- the peft model -------------------------------------------------------------------------------


def lora_modules(model: nn.Module) -> dict[str, nn.Module]:
    """{adapter-layer name: peft LoraLayer} in model order; the names are those of
    `get_adapter_state` keys."""
    from peft.tuners.lora import LoraLayer

    found = {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, LoraLayer) and ADAPTER in m.lora_A
    }
    return {name: found[name] for name in sorted(found, key=natural_key)}


class ContributionTracker:
    """Eq. 6 during the warm-up: a gradient hook per LoRA weight updates its EMA of |w·∂L/∂w| on
    each backward.

    The hooks see the raw gradient of the step's loss (before clipping and before the optimizer
    step), with w the weight that produced it. `ema` maps '<layer>.lora_A' / '<layer>.lora_B' to
    tensors of the weights' shapes; it starts from `initial` (the client's EMA of the previous
    round, kept in context.state) or zeros, on the weight's device.
    """

    def __init__(
        self,
        modules: dict[str, nn.Module],
        decay: float,
        initial: dict[str, torch.Tensor] | None = None,
    ) -> None:
        self.modules, self.decay = modules, decay
        self.ema: dict[str, torch.Tensor] = {}
        for name, m in modules.items():
            for part in ("lora_A", "lora_B"):
                w = getattr(m, part)[ADAPTER].weight
                prev = (initial or {}).get(f"{name}.{part}")
                ok = prev is not None and tuple(prev.shape) == tuple(w.shape)
                self.ema[f"{name}.{part}"] = (
                    prev.to(w.device, torch.float32, copy=True)
                    if ok
                    else torch.zeros(w.shape, device=w.device)
                )
        self.handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> ContributionTracker:
        for name, m in self.modules.items():
            for part in ("lora_A", "lora_B"):
                w = getattr(m, part)[ADAPTER].weight
                ema = self.ema[f"{name}.{part}"]
                self.handles.append(w.register_hook(self._hook(w, ema)))
        return self

    def _hook(self, weight: torch.Tensor, ema: torch.Tensor):  # -> Callable[[Tensor], None]
        def hook(grad: torch.Tensor) -> None:
            update_contribution(ema, weight, grad, self.decay)

        return hook

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def scores(self) -> torch.Tensor:
        """The N×r_g matrix of dimension scores (§III-D2) of the tracked layers, in their order."""
        return torch.stack(
            [
                dimension_scores(self.ema[f"{n}.lora_A"], self.ema[f"{n}.lora_B"])
                for n in self.modules
            ]
        )


def _linear(weight: torch.Tensor) -> nn.Linear:
    """A bias-free Linear holding `weight` (out×in) as a fresh trainable parameter, no init pass."""
    layer = nn.Linear(1, 1, bias=False, device="meta")  # (a zero-size init would warn)
    layer.in_features, layer.out_features = weight.shape[1], weight.shape[0]
    layer.weight = nn.Parameter(weight.detach().clone())
    return layer


@contextmanager
def pruned_adapters(modules: Sequence[nn.Module], log: torch.Tensor) -> Iterator[None]:
    """§III-D2–3: inside the block, adapter layer j has only its kept dimensions (A: k_j×l, B:
    d×k_j, k_j = log[j].sum(), possibly 0) as new trainable parameters; peft's scaling stays α/r_g
    (see the module docstring).

    On exit the trained kept dimensions are written back into the full r_g adapters, the pruned ones
    set to zero, and the original modules restored, so the (cached) model is again a rank-r_g model
    equal to the pruned one.
    """
    saved = []
    for module, keep in zip(modules, log, strict=True):
        old_a, old_b = module.lora_A[ADAPTER], module.lora_B[ADAPTER]
        keep = keep.to(old_a.weight.device)  # the log may live on the CPU, the adapters on a GPU
        new_a, new_b = slice_adapter(old_a.weight, old_b.weight, keep)
        module.lora_A[ADAPTER], module.lora_B[ADAPTER] = _linear(new_a), _linear(new_b)
        saved.append((module, old_a, old_b, keep))
    try:
        yield
    finally:
        with torch.no_grad():
            for module, old_a, old_b, keep in saved:
                old_a.weight.zero_()
                old_b.weight.zero_()
                old_a.weight[keep] = module.lora_A[ADAPTER].weight
                old_b.weight[:, keep] = module.lora_B[ADAPTER].weight
                module.lora_A[ADAPTER], module.lora_B[ADAPTER] = old_a, old_b
