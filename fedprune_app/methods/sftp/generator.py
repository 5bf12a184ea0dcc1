"""SFT-P's mask side (§3.2–3.3): ReinMax binary gates (Eq. 12) and the client-conditioned mask
generator h_Θ (Eq. 10–11), tensor functions that tests call without Flower or a model. The objective
(Eq. 13–14) is in `objective`, the schedules in `schedules`, the routed model in `models`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedprune_app.core.config import RunConfig
from fedprune_app.methods.sftp.config import SFTPConfig
from fedprune_app.methods.sftp.shapes import GENERATOR_PREFIX as GENERATOR_PREFIX  # its home
from fedprune_app.structural.held import force_open
from fedprune_app.structural.routing import (
    MASK_NAMES,
    LayerMasks,
    coordinate_costs,
    fill_budget,
    kept_parameters,
    prunable_parameters,
)

# --- gates (Eq. 12) -------------------------------------------------------------------------------


class _ReinMaxBinary(torch.autograd.Function):
    """B ~ Bernoulli(σ(a)) forward; ReinMax's closed-form surrogate for the logits [a, 0], channel
    0, backward."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, tau: float, generator: torch.Generator | None) -> Tensor:
        # drawn on the generator's device (a seeded CPU generator gives the same gates on any model
        # device)
        probs = torch.sigmoid(a)
        b = torch.bernoulli(
            probs if generator is None else probs.to(generator.device), generator=generator
        ).to(a.device)
        ctx.save_for_backward(a, b)
        ctx.tau = tau
        return b

    @staticmethod
    def backward(ctx: Any, grad_b: Tensor) -> tuple[Tensor, None, None]:
        a, b = ctx.saved_tensors
        pi0 = torch.sigmoid(a)  # softmax([a, 0])[0]
        pi1 = 0.5 * (torch.sigmoid(a / ctx.tau) + b)  # ½(softmax([a, 0]/τ) + D)[0]
        return grad_b * (2 * pi1 * (1 - pi1) - 0.5 * pi0 * (1 - pi0)), None, None


def reinmax_binary(
    s: Tensor, tau: float, c: float, generator: torch.Generator | None = None
) -> Tensor:
    """Eq. 12: hard gates g ∈ {0,1} with g ~ Bernoulli(π0), π0 = σ(s + c); ReinMax gradient (Liu et
    al. 2023).

    ReinMax on the two-class logits θ = [s + c, 0] keeping channel 0, with D the one-hot sample, π0
    = softmax(θ), π1 = ½(softmax(θ/τ) + D) and upstream gradient G = ∂L/∂g, gives (its two
    components are ±, so the reference's mean subtraction is a no-op) ∂L/∂s = G · [2 π1(1 − π1) − ½
    π0(1 − π0)], with π1 = ½(σ((s+c)/τ) + g).

    τ: the reference implementation (microsoft/ReinMax) refuses τ < 1, while SFT-P (Table 4) uses τ
    = 0.4. We accept any τ > 0 and default to the paper's 0.4. What τ changes here: averaged over
    the sample, the surrogate equals the true derivative σ'(s + c) exactly when τ = 1
    (E_g[2π1(1−π1)] = 3/2·π0(1−π0)); with τ < 1 the sharper σ((s+c)/τ) shrinks it at saturated gates
    (at s + c = 3, τ = 0.4: mean 0.0016 instead of 0.045, and of the wrong sign whenever g = 1),
    i.e. slower, noisier movement away from the all-ones start. It keeps the right sign in
    expectation, and the paper reports its budgets reached with it, so we follow the paper (what τ
    does to the budget's trajectory: docs/notes/2026-11-sftp-investigations.md).
    """
    if not tau > 0:
        raise ValueError(f"ReinMax temperature tau must be > 0, got {tau}")
    return _ReinMaxBinary.apply(s + c, float(tau), generator)


def deterministic_mask(s: Tensor, c: float) -> Tensor:
    """1[σ(s + c) > 0.5] (in s's dtype, no gradient): the mask used for evaluation and
    compilation."""
    return (torch.sigmoid(s.detach() + c) > 0.5).to(s.dtype)


def deployed_gates(
    s: Tensor,
    c: float,
    held: Tensor | None,
    config: Any,
    keep_ratio: float | None,
    rule: str = "budget",
) -> Tensor:
    """The hard gates a client deploys (evaluation, the masks the server compiles), (layers, 4, d)
    0/1.

    'threshold': 1[π > 0.5], π = σ(s + c), with the held gates at 1. 'budget' (default; the paper is
    silent on the deployment rule): the gates in descending π that fit p · T_total (`fill_budget`,
    held gates first), so the compiled model's kept ratio is p to one bus coordinate's cost whatever
    rounding 1[π > 0.5] would add; the gates it drops or adds are those whose π is nearest to the
    threshold. `keep_ratio` None = 'threshold'.
    """
    if rule == "threshold" or keep_ratio is None:
        return force_open(deterministic_mask(s, c), held)
    if rule != "budget":
        raise ValueError(f"deployed mask rule must be 'budget' or 'threshold', got {rule!r}")
    pi = torch.sigmoid(s.detach().float() + c).cpu().numpy()
    scores = {name: pi[:, i] for i, name in enumerate(MASK_NAMES)}
    forced = None
    if held is not None:
        row = held.detach().cpu().numpy() > 0.5
        forced = {name: np.broadcast_to(row, pi[:, i].shape) for i, name in enumerate(MASK_NAMES)}
    kept = fill_budget(
        scores, coordinate_costs(config), keep_ratio * prunable_parameters(config), forced
    )
    gates = np.stack([kept[name] for name in MASK_NAMES], axis=1)
    return torch.from_numpy(gates).to(s.device, s.dtype)


def mask_rounding(s: Tensor, c: float, config: Any) -> dict[str, float]:
    """How far the deployed mask is from what training's budget penalty saw: the kept ratio
    T/T_total of the prunable projections under the deterministic mask 1[π > 0.5] and in expectation
    over the sampled gates g ~ Bernoulli(π), π = σ(s + c) (T is linear in each gate, so E[T(g)] =
    T(π)), and the share of gates with 0.1 < π < 0.9 (not yet saturated). s: logits (layers, 4,
    d)."""
    total, pi = prunable_parameters(config), torch.sigmoid(s.detach().float() + c)
    return {
        "deterministic": float(kept_parameters(config, layer_masks(deterministic_mask(s, c))))
        / total,
        "expected": float(kept_parameters(config, layer_masks(pi))) / total,
        "unsaturated": float(((pi > 0.1) & (pi < 0.9)).float().mean()),
    }


# --- the generator (Eq. 10–11) --------------------------------------------------------------------


class MaskGenerator(nn.Module):
    """h_Θ: (e_k, l) ↦ logits s_{k,l}^{m,in/out} ∈ R^d for the 4 masks (MASK_NAMES) of every layer
    l.

    A 2-layer MLP (hidden `hidden`, GELU; Table 4) over [e_k ; u_l], where u_l is a learned layer
    embedding of e_k's dimension (part of Θ, so it is federated); the output layer has 4·d units,
    one head per mask. Without client conditioning (NOC) the generator ignores e_k and reads a fixed
    zero vector instead, so every client gets the same masks. The output layer starts at N(0, 0.01²)
    weights and zero bias: the logits start near 0 and, with the gate bias c > 0, every initial
    deterministic mask is all ones.
    """

    def __init__(
        self,
        num_layers: int,
        hidden_size: int,
        embed_dim: int = 16,
        hidden: int = 32,
        conditioning: bool = True,
    ) -> None:
        super().__init__()
        self.num_layers, self.hidden_size, self.embed_dim = num_layers, hidden_size, embed_dim
        self.conditioning = conditioning
        self.layer_embedding = nn.Embedding(num_layers, embed_dim)
        self.fc1 = nn.Linear(2 * embed_dim, hidden)
        self.fc2 = nn.Linear(hidden, len(MASK_NAMES) * hidden_size)
        nn.init.normal_(self.fc2.weight, std=0.01)
        nn.init.zeros_(self.fc2.bias)
        self.register_buffer("shared_input", torch.zeros(embed_dim), persistent=False)

    def forward(self, embedding: Tensor | None = None) -> Tensor:
        """Logits of shape (layers, 4, hidden_size); `embedding` is e_k (ignored and optional under
        NOC)."""
        if self.conditioning and embedding is None:
            raise ValueError("a client-conditioned generator needs the client embedding e_k")
        e = embedding if self.conditioning else self.shared_input
        x = torch.cat(
            [e.expand(self.num_layers, self.embed_dim), self.layer_embedding.weight], dim=-1
        )
        out = self.fc2(nn.functional.gelu(self.fc1(x)))
        return out.view(self.num_layers, len(MASK_NAMES), self.hidden_size)

    def config(self) -> dict[str, Any]:
        return {
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "embed_dim": self.embed_dim,
            "hidden": self.fc1.out_features,
            "conditioning": self.conditioning,
        }


def initial_embedding(cfg: RunConfig, seed: int) -> Tensor:
    """A client's e_k^(0) ~ N(0, std² I) (Alg. 1, Init: "each client k initializes e_k^(0)"; std =
    `sftp-embed-init-std`, 1 by default), drawn on the CPU from `seed`. At 0, +C starts with NOC's
    logits and e_k grows from the client's own gradient (an ablation knob: docs/methods/sftp.md, "+C
    cuts to the budget sooner")."""
    sftp_cfg = cfg.section(SFTPConfig)
    draw = torch.randn(sftp_cfg.sftp_embed_dim, generator=torch.Generator().manual_seed(seed))
    return sftp_cfg.sftp_embed_init_std * draw


def generator_for(
    cfg: RunConfig, model_config: Any, seed: int | None = None, device: torch.device | str = "cpu"
) -> MaskGenerator:
    """The generator for a model config and the `sftp-*` keys (initialised on the CPU from `seed` if
    given, so the same seed gives the same Θ on any device), then moved to `device` (the routed
    model's)."""
    sftp_cfg = cfg.section(SFTPConfig)
    with torch.random.fork_rng():
        if seed is not None:
            torch.manual_seed(seed)
        generator = MaskGenerator(
            int(model_config.num_hidden_layers),
            int(model_config.hidden_size),
            sftp_cfg.sftp_embed_dim,
            sftp_cfg.sftp_generator_hidden,
            sftp_cfg.sftp_conditioning,
        )
    return generator.to(device)


def get_generator_state(generator: MaskGenerator) -> dict[str, Tensor]:
    """Θ as float32 CPU tensors, named `mask-generator.<param>`."""
    return {
        GENERATOR_PREFIX + k: v.detach().to("cpu", torch.float32).clone()
        for k, v in generator.state_dict().items()
    }


def set_generator_state(generator: MaskGenerator, state: Mapping[str, Tensor]) -> None:
    """Load Θ from a mapping that holds every `mask-generator.*` tensor (other entries are
    ignored)."""
    own = generator.state_dict()
    theta = {
        k[len(GENERATOR_PREFIX) :]: torch.as_tensor(v)
        for k, v in state.items()
        if k.startswith(GENERATOR_PREFIX)
    }
    missing = sorted(set(own) - set(theta))
    if missing:
        raise KeyError(f"generator state lacks {missing}")
    for k, v in theta.items():
        if k not in own or tuple(v.shape) != tuple(own[k].shape):
            raise ValueError(
                f"generator tensor {k} has shape {tuple(v.shape)}, expected "
                f"{tuple(own[k].shape) if k in own else 'no such tensor'}"
            )
    generator.load_state_dict(theta)


def layer_masks(gates: Tensor) -> list[LayerMasks]:
    """(layers, 4, d) gates -> one {mask name: (d,) tensor} per decoder layer (what `masked`
    takes)."""
    return [
        {name: gates[layer, i] for i, name in enumerate(MASK_NAMES)}
        for layer in range(gates.shape[0])
    ]


def sampled_masks(
    s: Tensor, tau: float, c: float, held: Tensor | None, generator: torch.Generator | None = None
) -> list[LayerMasks]:
    """The masks of one training step: ReinMax gates of the scores s (Eq. 12), the held gates at 1
    (`force_open`), one LayerMasks per decoder layer."""
    return layer_masks(force_open(reinmax_binary(s, tau, c, generator), held))


def stacked_masks(masks: list[LayerMasks]) -> dict[str, Tensor]:
    """The inverse view for storage: {mask name: (layers, d)}."""
    return {name: torch.stack([m[name] for m in masks]) for name in MASK_NAMES}
