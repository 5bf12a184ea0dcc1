"""SFT-P's per-client budgets and schedules: p_k of `keep-ratios`, the budget target's warm-up
(Eq. 13's p over the local steps) and the LoRA learning rate's cosine annealing (Table 4)."""

from __future__ import annotations

import math

from fedprune_app.core.config import RunConfig, per_client, split_list
from fedprune_app.methods.sftp.config import SFTPConfig
from fedprune_app.structural.config import BusConfig


def keep_ratio_of(cfg: RunConfig, partition_id: int, num_partitions: int) -> float:
    """p of client `partition_id` from `keep-ratios` (one value for all clients or one per
    client)."""
    ratios = cfg.section(BusConfig).keep_ratios
    return per_client(ratios, num_partitions, float, "keep-ratios")[partition_id]


def highest_keep_ratio(cfg: RunConfig) -> float | None:
    """p_max of `keep-ratios` when the warm-up keeps the budgets' gaps
    (`sftp-budget-warmup-start` 'gap'), else None (each client's ramp starts at 1)."""
    if cfg.section(SFTPConfig).sftp_budget_warmup_start != "gap":
        return None
    return max(float(v) for v in split_list(cfg.section(BusConfig).keep_ratios))


def cosine_lr(base: float, step: int, total: int) -> float:
    """Cosine annealing from `base` to 0 over `total` steps (Table 4's LoRA schedule)."""
    return base * 0.5 * (1 + math.cos(math.pi * min(step, total) / max(1, total)))


def ramped_keep_ratio(
    keep_ratio: float, step: int, warmup: int, highest: float | None = None
) -> float:
    """The budget target p_t of Eq. 13 at global local step `step` (0-based, (round−1)·E + t): with
    r_t = min(1, (t+1)/W), p + (1 − p_max)·(1 − r_t) over the first W = `warmup` steps
    (`sftp-budget-warmup-steps`), then p; W = 0 is the paper's constant p. p_max = `highest` (the
    largest client budget, `sftp-budget-warmup-start` 'gap') shifts every client's target by the
    same amount, so mixed budgets keep their gaps from the first step; p_max = p (the default,
    'one') is the ramp 1 − (1 − p)·r_t from 1. Not in the paper: the target's linear warm-up of
    Sheared-LLaMA's pruning stage (Xia et al., 2024), so that the gates close as fast as the LM loss
    can choose which, instead of all at once in the first steps."""
    if warmup <= 0:
        return keep_ratio
    top = keep_ratio if highest is None else highest
    if top < keep_ratio:
        raise ValueError(f"the highest budget ({top}) is below this client's ({keep_ratio})")
    ramp = min(1.0, (step + 1) / warmup)
    # = p + (1 − p_max)(1 − r_t)
    return 1.0 - (1.0 - keep_ratio) * ramp - (top - keep_ratio) * (1.0 - ramp)
