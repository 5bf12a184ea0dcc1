"""Local training: a plain AdamW loop over the trainable (LoRA) parameters, and the validation loss."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedprune_app.llm.data import Example, collate, pack, training_batches
from fedprune_app.llm.models import model_device
from fedprune_app.llm.settings import TrainSettings

log = logging.getLogger(__name__)


@dataclass
class TrainReport:
    """What a local training run did: per-step losses and wall time."""

    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def mean_loss(self) -> float:
        return sum(self.losses) / len(self.losses) if self.losses else math.nan


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """A collated or packed batch with every tensor on `device` (a no-op for tensors already there); flags such as
    `use_cache` pass unchanged."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def packs_exactly(model: nn.Module, pad_id: int | None, tol: float = 1e-4) -> bool:
    """Whether `model` gives a packed batch (`data.pack`) the padded batch's loss, on a probe of three token
    sequences of different lengths (so a model whose attention ignores the restarting position ids, and lets one
    example see another, scores differently). Eval mode and no grad for the probe; the mode is restored. Cached
    on the model (the answer depends on its code, not its weights)."""
    cached = getattr(model, "_fedprune_packs_exactly", None)
    if cached is not None:
        return bool(cached)
    vocab = int(model.get_input_embeddings().weight.shape[0])
    ids = [(7 * i + 3) % max(vocab - 1, 2) + 1 for i in range(12)]
    probe = [(ids[:5], ids[:5]), (ids[5:7], ids[5:7]), (ids[3:12], ids[3:12])]
    device, was_training = model_device(model), model.training
    model.eval()
    try:
        with torch.no_grad():
            padded = model(**to_device(collate(probe, pad_id if pad_id is not None else 0), device)).loss
            packed = model(**to_device(pack(probe), device)).loss
        worst = abs(float(padded) - float(packed))
        ok, reason = worst <= tol, f"packed loss differs from the padded one by {worst:.2e}"
    except Exception as exc:  # noqa: BLE001 (any failure means: train padded)
        ok, reason = False, f"{type(exc).__name__}: {exc}"
    finally:
        model.train(was_training)
    if not ok:
        log.warning("pack-sequences: %s cannot train on packed rows (%s); training on padded rows",
                    type(model).__name__, reason)
    model._fedprune_packs_exactly = ok  # type: ignore[assignment]
    return ok


def packed_training(model: nn.Module, tokenizer: Any, cfg: TrainSettings) -> bool:
    """`pack-sequences` and the model passes `packs_exactly`."""
    return bool(cfg.pack_sequences) and packs_exactly(model, tokenizer.pad_token_id)


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


def train_steps(model: nn.Module, tokenizer: Any, examples: Sequence[Example], cfg: TrainSettings,
                seed: int, steps: int | None = None) -> TrainReport:
    """`steps` (default `local-steps`) AdamW steps on the parameters that require grad.

    A fresh optimizer each call, as FedIT does each round (the optimizer state is not federated). Batches go
    to the model's device, packed in one row each under `pack-sequences` (`packed_training`).
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
                                  cfg.seq_len, seed, packed=packed_training(model, tokenizer, cfg)):
        loss = model(**to_device(batch, device)).loss
        optimizer_step(loss, params, opt, cfg.max_grad_norm, "learning-rate")
        report.losses.append(loss.item())
    model.eval()
    report.seconds = time.perf_counter() - start
    return report
