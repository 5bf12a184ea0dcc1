"""Local training: a plain AdamW loop over the trainable (LoRA) parameters, and the validation loss."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedprune_app.core.config import RunConfig
from fedprune_app.llm.data import Example, training_batches
from fedprune_app.llm.models import model_device


@dataclass
class TrainReport:
    """What a local training run did: per-step losses and wall time."""

    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def mean_loss(self) -> float:
        return sum(self.losses) / len(self.losses) if self.losses else math.nan


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """A collated batch with every tensor on `device` (a no-op for tensors already there)."""
    return {k: v.to(device) for k, v in batch.items()}


def optimizer_step(loss: torch.Tensor, params: Sequence[torch.Tensor], opt: torch.optim.Optimizer,
                   max_grad_norm: float, lr_key: str) -> None:
    """One step: refuse a non-finite loss (naming the learning-rate key to lower), backward, clip the gradient
    norm when `max_grad_norm` > 0, step, clear the gradients."""
    if not torch.isfinite(loss):
        raise FloatingPointError(f"training loss became {loss.item()} (lower {lr_key}?)")
    loss.backward()
    if max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    opt.step()
    opt.zero_grad(set_to_none=True)


def train_steps(model: nn.Module, tokenizer: Any, examples: Sequence[Example], cfg: RunConfig, seed: int,
                steps: int | None = None) -> TrainReport:
    """`steps` (default `local-steps`) AdamW steps on the parameters that require grad.

    A fresh optimizer each call, as FedIT does each round (the optimizer state is not federated). Batches go
    to the model's device.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters (did you add LoRA adapters?)")
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    report = TrainReport()
    start = time.perf_counter()
    device = model_device(model)
    model.train()
    torch.manual_seed(seed)
    for batch in training_batches(examples, tokenizer, cfg.batch_size, int(steps or cfg.local_steps),
                                  cfg.seq_len, seed):
        loss = model(**to_device(batch, device)).loss
        optimizer_step(loss, params, opt, cfg.max_grad_norm, "learning-rate")
        report.losses.append(loss.item())
    model.eval()
    report.seconds = time.perf_counter() - start
    return report
