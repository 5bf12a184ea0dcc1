"""Local training: one step loop (`train_steps`), by default plain AdamW on the trainable (LoRA)
parameters and the model's own loss; a method brings its own optimiser and loss per step
(`Optimisation`, `StepLoss`)."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedprune_app.llm.data import Example, collate, pack, training_batches
from fedprune_app.llm.models import model_device
from fedprune_app.llm.settings import TrainSettings

log = logging.getLogger(__name__)


StepLoss = Callable[[nn.Module, dict[str, Any], int], tuple[torch.Tensor, dict[str, torch.Tensor]]]
"""(model, batch on the model's device, step t) -> (the loss to minimise, other per-step values to
report)."""


@dataclass
class Optimisation:
    """A method's own optimiser for `train_steps`: `params` are clipped together (in this order),
    `schedule(t)` sets the learning rates before step t, and `lr_key` is the run-config key a
    non-finite loss asks to lower."""

    optimizer: torch.optim.Optimizer
    params: list[torch.Tensor]
    lr_key: str
    schedule: Callable[[int], None] | None = None


@dataclass
class TrainReport:
    """What a local training run did: per-step losses (and a `StepLoss`'s other values) and wall
    time."""

    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    values: dict[str, list[float]] = field(default_factory=dict)

    @property
    def mean_loss(self) -> float:
        return sum(self.losses) / len(self.losses) if self.losses else math.nan


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """A collated or packed batch with every tensor on `device` (a no-op for tensors already there);
    flags such as `use_cache` pass unchanged."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def packs_exactly(model: nn.Module, pad_id: int | None, tol: float = 1e-4) -> bool:
    """Whether `model` gives a packed batch (`data.pack`) the padded batch's loss, on a probe of
    three token sequences of different lengths (so a model whose attention ignores the restarting
    position ids, and lets one example see another, scores differently). Eval mode and no grad for
    the probe; the mode is restored. Cached on the model (the answer depends on its code, not its
    weights)."""
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
            padded = model(
                **to_device(collate(probe, pad_id if pad_id is not None else 0), device)
            ).loss
            packed = model(**to_device(pack(probe), device)).loss
        worst = abs(float(padded) - float(packed))
        ok, reason = worst <= tol, f"packed loss differs from the padded one by {worst:.2e}"
    except Exception as exc:  # noqa: BLE001 (any failure means: train padded)
        ok, reason = False, f"{type(exc).__name__}: {exc}"
    finally:
        model.train(was_training)
    if not ok:
        log.warning(
            "pack-sequences: %s cannot train on packed rows (%s); training on padded rows",
            type(model).__name__,
            reason,
        )
    model._fedprune_packs_exactly = ok  # type: ignore[assignment]
    return ok


def packed_training(model: nn.Module, tokenizer: Any, cfg: TrainSettings) -> bool:
    """`pack-sequences` and the model passes `packs_exactly`."""
    return bool(cfg.pack_sequences) and packs_exactly(model, tokenizer.pad_token_id)


MIXED_PRECISION = {"no": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def onednn_allows_amx(cap: str | None = None) -> bool:
    """False where ONEDNN_MAX_CPU_ISA (`cap`) keeps oneDNN off AMX (e.g. 'AVX2',
    'AVX512_CORE_BF16'), as `fedprune bench profile --isa` does to stand in for an older CPU."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA", "") if cap is None else cap).strip().upper()
    return cap in ("", "ALL", "DEFAULT") or "AMX" in cap


def native_bf16(device: torch.device) -> bool:
    """Whether bf16 matrix products on `device` are faster than float32: a CPU with AMX (oneDNN's
    AMX kernels, unless ONEDNN_MAX_CPU_ISA caps them: `onednn_allows_amx`), a CUDA GPU that supports
    bf16 (Ampere and later). AVX512_BF16 without AMX is not enough: oneDNN's kernels for it took
    1.5x float32's time per SFT-P step (docs/bench/precision-avx512-bf16-cap.json)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        return bool(torch.cpu._is_amx_tile_supported()) and onednn_allows_amx()
    return False


def autocast_dtype(mode: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of `mixed-precision` `mode` on `device`: 'auto' is bf16 where the device
    computes it faster than float32 (`native_bf16`), none elsewhere."""
    if mode == "auto":
        return torch.bfloat16 if native_bf16(device) else None
    return MIXED_PRECISION[mode]


@contextlib.contextmanager
def mixed_precision(model: nn.Module, mode: str) -> Iterator[None]:
    """`torch.autocast` on the model's device for a training step's forward: matrix products in
    `mode`'s dtype ('bf16', 'fp16'; 'auto': `autocast_dtype`), the weights, their gradients and the
    optimizer state in the model's own dtype (as `accelerate`'s `mixed_precision`); 'no' runs
    everything in the model's dtype."""
    dtype = autocast_dtype(mode, model_device(model))
    if dtype is None:
        yield
        return
    with torch.autocast(model_device(model).type, dtype=dtype):
        yield


@contextlib.contextmanager
def frozen_weights_as(model: nn.Module, mode: str) -> Iterator[None]:
    """The frozen weights of `model`'s `nn.Linear` layers held in `mode`'s dtype for the block and
    restored on exit. Autocast casts a weight that requires no grad again at every call (its cast
    cache keeps only trainable leaves); casting the frozen base weights once gives the matrix
    products the same operands, so the same results, without a cast per layer and step. A weight
    that another module shares (tied embeddings: a lookup autocast does not cast) is left as it
    is. Costs a copy of those weights in `mode`'s dtype while the block runs; 'no' does nothing."""
    dtype = autocast_dtype(mode, model_device(model))
    if dtype is None:
        yield
        return
    shared = {
        id(p)
        for m in model.modules()
        if not isinstance(m, nn.Linear)
        for p in m.parameters(recurse=False)
    }
    held: list[tuple[nn.Parameter, torch.Tensor]] = []
    for m in model.modules():
        w = getattr(m, "weight", None) if isinstance(m, nn.Linear) else None
        if (
            isinstance(w, nn.Parameter)
            and not w.requires_grad
            and w.is_floating_point()
            and w.dtype != dtype
            and id(w) not in shared  # tied to another module, or held already
        ):
            shared.add(id(w))
            held.append((w, w.data))
            w.data = w.data.to(dtype)
    try:
        yield
    finally:
        for w, original in held:
            w.data = original


def optimizer_step(
    loss: torch.Tensor,
    params: Sequence[torch.Tensor],
    opt: torch.optim.Optimizer,
    max_grad_norm: float,
    lr_key: str,
) -> None:
    """One step: refuse a non-finite loss (naming the learning-rate key to lower), backward, clip
    the gradient norm when `max_grad_norm` > 0, step, clear the gradients."""
    if not torch.isfinite(loss):
        raise FloatingPointError(f"training loss became {loss.item()} (lower {lr_key}?)")
    loss.backward()
    if max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    opt.step()
    opt.zero_grad(set_to_none=True)


def model_loss(
    model: nn.Module, batch: dict[str, Any], t: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The default `StepLoss`: the model's own (causal LM) loss on the batch."""
    return model(**batch).loss, {}


def train_steps(
    model: nn.Module,
    tokenizer: Any,
    examples: Sequence[Example],
    cfg: TrainSettings,
    seed: int,
    steps: int | None = None,
    *,
    optimisation: Optimisation | None = None,
    step_loss: StepLoss = model_loss,
    targets: str = "answer",
) -> TrainReport:
    """`steps` (default `local-steps`) optimiser steps on `step_loss` over batches of `examples`
    (`targets`: which tokens carry labels, `training_batches`).

    Without `optimisation`: a fresh AdamW (`learning-rate`, `weight-decay`) on the parameters that
    require grad, each call, as a federated client does each round (the optimizer state is not
    federated).
    Batches go to the model's device, packed in one row each under `pack-sequences`
    (`packed_training`); each step's forward runs under `mixed-precision` (`mixed_precision`), the
    frozen linear weights cast once for the whole loop (`frozen_weights_as`).
    The model trains in train mode, with the global RNG (dropout) seeded by
    `seed`, and is left in eval mode.
    """
    if optimisation is None:
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no trainable parameters (did you add LoRA adapters?)")
        adamw = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        optimisation = Optimisation(adamw, params, "learning-rate")
    report = TrainReport()
    start = time.perf_counter()
    device = model_device(model)
    model.train()
    torch.manual_seed(seed)
    packed = packed_training(model, tokenizer, cfg)  # probes the model: before its weights change
    try:
        with frozen_weights_as(model, cfg.mixed_precision):
            for t, batch in enumerate(
                training_batches(
                    examples,
                    tokenizer,
                    cfg.batch_size,
                    int(steps or cfg.local_steps),
                    cfg.seq_len,
                    seed,
                    targets=targets,
                    packed=packed,
                )
            ):
                if optimisation.schedule is not None:
                    optimisation.schedule(t)
                with mixed_precision(model, cfg.mixed_precision):
                    loss, values = step_loss(model, to_device(batch, device), t)
                optimizer_step(
                    loss,
                    optimisation.params,
                    optimisation.optimizer,
                    cfg.max_grad_norm,
                    optimisation.lr_key,
                )
                report.losses.append(loss.item())
                for name, value in values.items():
                    report.values.setdefault(name, []).append(value.item())
    finally:
        model.eval()
    report.seconds = time.perf_counter() - start
    return report
