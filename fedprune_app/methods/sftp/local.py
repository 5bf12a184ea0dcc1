"""SFT-P's local round (Alg. 1's inner loop, §3.2–3.3), on the shared step loop
(`llm.training.train_steps`).

Reading order: `ClientState` (what a client carries between rounds), `RoundPlan` (what one round
asks), `optimisation` (AdamW over Θ, e_k and Φ, with its schedule), `local_round` (the steps on Eq.
13).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from fedprune_app.core.config import RunConfig
from fedprune_app.llm.data import Example
from fedprune_app.llm.training import Optimisation, TrainReport, train_steps
from fedprune_app.methods.sftp.config import SFTPConfig
from fedprune_app.methods.sftp.generator import MaskGenerator, sampled_masks
from fedprune_app.methods.sftp.objective import sftp_objective
from fedprune_app.methods.sftp.schedules import cosine_lr, highest_keep_ratio, ramped_keep_ratio
from fedprune_app.structural.held import held_coordinates
from fedprune_app.structural.routing import LayerMasks, kept_parameters, masked, prunable_parameters


@dataclass
class ClientState:
    """What an SFT-P client carries from round to round (its `context.state`; never sent).

    `embedding` is e_k (None under NOC), `moments` its AdamW state ({} before it first trained),
    `deployed` the (Θ_k, Φ_k) of its last local training (kept under `sftp-deploy-state = "local"`,
    else None). A local round trains `embedding` in place and replaces `moments`.
    """

    embedding: nn.Parameter | None
    moments: dict[str, Tensor] = field(default_factory=dict)
    deployed: dict[str, Any] | None = None


@dataclass(frozen=True)
class RoundPlan:
    """One round's local training: its number, seed, the client's budget p and, in a recovery round
    (`sftp-recovery-rounds`; not in Alg. 1), the client's deployed masks to train Φ on."""

    server_round: int
    seed: int
    keep_ratio: float
    fixed_masks: list[LayerMasks] | None = None

    @property
    def recovery(self) -> bool:
        return self.fixed_masks is not None


def optimisation(
    cfg: RunConfig, model: nn.Module, generator: MaskGenerator, state: ClientState, plan: RoundPlan
) -> Optimisation:
    """AdamW over Θ and e_k (lr `sftp-generator-lr`, constant; e_k's times `sftp-embed-lr-scale`
    with wd `sftp-embed-weight-decay`, Θ's wd `sftp-generator-weight-decay`) and Φ (lr
    `sftp-lora-lr` cosine-annealed over all rounds' steps, step (round−1)·E + t of R·E; wd
    `weight-decay`), e_k's moments restored. A recovery round steps Φ alone. Θ's and Φ's optimiser
    state is fresh each round."""
    sftp_cfg = cfg.section(SFTPConfig)
    lora = [p for p in model.parameters() if p.requires_grad]
    if plan.recovery and not lora:
        raise ValueError(
            "a recovery round (fixed masks) trains Φ only: it needs adapters (sftp-adapters)"
        )
    theta = list(generator.parameters())
    groups: list[dict[str, Any]] = [] if plan.recovery else [{"params": theta}]
    embedding = None if plan.recovery else state.embedding
    if embedding is not None:
        groups.append(
            {
                "params": [embedding],
                "lr": sftp_cfg.sftp_embed_lr_scale * sftp_cfg.sftp_generator_lr,
                "weight_decay": sftp_cfg.sftp_embed_weight_decay,
            }
        )
    if lora:
        groups.append(
            {"params": lora, "lr": sftp_cfg.sftp_lora_lr, "weight_decay": cfg.weight_decay}
        )
    opt = torch.optim.AdamW(
        groups, lr=sftp_cfg.sftp_generator_lr, weight_decay=sftp_cfg.sftp_generator_weight_decay
    )
    if embedding is not None and state.moments:
        opt.state[embedding] = {k: v.clone() for k, v in state.moments.items()}
    first = (plan.server_round - 1) * cfg.local_steps
    total = cfg.num_server_rounds * cfg.local_steps

    def schedule(t: int) -> None:
        if lora:
            groups[-1]["lr"] = cosine_lr(sftp_cfg.sftp_lora_lr, first + t, total)

    params = [p for g in groups for p in g["params"]]
    return Optimisation(opt, params, "sftp-generator-lr", schedule)


def local_round(
    cfg: RunConfig,
    model: nn.Module,
    tokenizer: Any,
    generator: MaskGenerator,
    state: ClientState,
    examples: Sequence[Example],
    plan: RoundPlan,
) -> TrainReport:
    """`local-steps` steps of Alg. 1 on the routed `model`; `report.losses` is L_k, `report.values`
    holds 'clm' and 'penalty' per step.

    Per step: g = ReinMax gates of h_Θ(e_k) (Eq. 10–12; the `hold-open` gates at 1), the CLM
    loss of the model routed by g, L_k = CLM + λ·R(T(g), p_t·T_total) (Eq. 13–14), p_t ramped over
    the first `sftp-budget-warmup-steps` global steps (`ramped_keep_ratio`; not in the paper,
    default off), one AdamW step on (Θ, e_k, Φ) clipped jointly to `max-grad-norm`. A recovery round
    runs its fixed masks and minimises the CLM loss alone (Θ and e_k do not move; the penalty of the
    fixed mask is reported, not trained).

    The gates draw from a CPU generator seeded by `plan.seed` (the same gates for a seed on any
    device), LoRA dropout from the global one seeded alike, so a client's round is the same whatever
    ran before it.
    """
    sftp_cfg = cfg.section(SFTPConfig)
    opt = optimisation(cfg, model, generator, state, plan)
    config, total = model.config, prunable_parameters(model.config)
    held = held_coordinates(cfg, model, tokenizer)
    highest = highest_keep_ratio(cfg)
    gate_rng = torch.Generator().manual_seed(plan.seed)
    first = (plan.server_round - 1) * cfg.local_steps

    def step_loss(
        model: nn.Module, batch: dict[str, Any], t: int
    ) -> tuple[Tensor, dict[str, Tensor]]:
        if plan.recovery:
            masks = plan.fixed_masks
        else:  # gates from float32 logits, whatever dtype `mixed-precision` runs h_Θ in
            masks = sampled_masks(
                generator(state.embedding).float(),
                sftp_cfg.sftp_gate_tau,
                sftp_cfg.sftp_gate_bias,
                held,
                gate_rng,
            )
        with masked(model, masks):
            clm = model(**batch).loss
        target = ramped_keep_ratio(
            plan.keep_ratio, first + t, sftp_cfg.sftp_budget_warmup_steps, highest
        )
        loss, penalty = sftp_objective(
            clm, kept_parameters(config, masks), target, total, sftp_cfg.sftp_lambda
        )
        return (clm if plan.recovery else loss), {"clm": clm, "penalty": penalty}

    generator.train()
    try:
        report = train_steps(
            model,
            tokenizer,
            examples,
            cfg,
            plan.seed,
            optimisation=opt,
            step_loss=step_loss,
            targets=sftp_cfg.sftp_loss_on,
        )
    finally:
        generator.eval()
    if state.embedding is not None and not plan.recovery:
        moments = opt.optimizer.state[state.embedding]
        state.moments = {k: v.detach().clone() for k, v in moments.items()}
    return report
