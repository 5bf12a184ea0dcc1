"""Shared machinery for pruning methods: find the prunable matrices of any decoder-only model, put a
global sparse state into a model, save it, report its sparsity, and cut calibration segments."""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch import nn

from fedprune_app.llm.data import Example, pack_text
from fedprune_app.llm.models import load_base_model, load_tokenizer
from fedprune_app.llm.settings import ModelSettings


def _is_decoder_block(layer: nn.Module) -> bool:
    """A decoder block: it has `self_attn` and `mlp` (LLaMA family, also a compiled (structurally
    pruned) layer whose skipped submodules are None), or it holds nn.Linear layers (OPT's
    `self_attn` + `fc1`/`fc2`, ...)."""
    return (hasattr(layer, "self_attn") and hasattr(layer, "mlp")) or any(
        isinstance(m, nn.Linear) for m in layer.modules()
    )


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's stack of decoder layers, peft-wrapped or not: the longest ModuleList (the first
    of equal length) whose every element is a decoder block (`_is_decoder_block`):
    LLaMA/Qwen/Mistral `model.layers`, OPT `model.decoder.layers`, a compiled (structurally pruned)
    model's layers (a fully skipped one included)."""
    best: nn.ModuleList | None = None
    for module in model.modules():
        if (
            isinstance(module, nn.ModuleList)
            and len(module)
            and all(_is_decoder_block(layer) for layer in module)
        ):
            if best is None or len(module) > len(best):
                best = module
    if best is None:
        raise ValueError(
            f"found no decoder layers (a ModuleList of blocks with self_attn and mlp, or with "
            f"nn.Linear) in {type(model).__name__}"
        )
    return best


def linear_modules(layer: nn.Module) -> dict[str, nn.Linear]:
    """The prunable linear layers inside one decoder layer, by their name within it."""
    return {name: m for name, m in layer.named_modules() if isinstance(m, nn.Linear)}


def layer_prefix(model: nn.Module) -> str:
    """'model.layers.' for LLaMA, 'model.decoder.layers.' for OPT: the name before a layer's
    index."""
    layers = decoder_layers(model)
    return next(name for name, module in model.named_modules() if module is layers) + "."


def prunable_names(model: nn.Module) -> list[str]:
    """Parameter names of every weight matrix of every linear inside the decoder layers."""
    prefix = layer_prefix(model)
    return [
        f"{prefix}{j}.{name}.weight"
        for j, layer in enumerate(decoder_layers(model))
        for name in linear_modules(layer)
    ]


@lru_cache(maxsize=2)
def _cached_model(
    model_name: str, dtype: str, device: str = "auto"
) -> tuple[nn.Module, Any, dict[str, torch.Tensor]]:
    """The base model on `device`; its dense prunable weights are kept on the CPU (no second copy on
    a GPU)."""
    model = load_base_model(model_name, dtype, device=device)
    params = dict(model.named_parameters())
    dense = {n: params[n].detach().to("cpu", copy=True) for n in prunable_names(model)}
    return model, load_tokenizer(model_name), dense


def dense_model(cfg: ModelSettings) -> tuple[nn.Module, Any]:
    """The process's cached base model with its dense prunable weights restored (pruning mutates
    it)."""
    model, tokenizer, dense = _cached_model(cfg.model_name, cfg.model_dtype, cfg.device)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, weight in dense.items():
            params[name].copy_(weight)
    return model, tokenizer


def prunable_weights(cfg: ModelSettings) -> tuple[dict[str, np.ndarray], str, int]:
    """(dense prunable weights as float32 arrays, decoder-layer name prefix, number of decoder
    layers)."""
    model, _ = dense_model(cfg)
    params = dict(model.named_parameters())
    weights = {
        n: params[n].detach().to("cpu", torch.float32).numpy().copy() for n in prunable_names(model)
    }
    return weights, layer_prefix(model), len(decoder_layers(model))


def model_with_weights(cfg: ModelSettings, state: dict[str, np.ndarray]) -> tuple[nn.Module, Any]:
    """The cached model with `state` written over its dense weights (matrices missing from it stay
    dense)."""
    model, tokenizer = dense_model(cfg)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, weight in state.items():
            params[name].copy_(torch.from_numpy(weight).to(params[name].dtype))
    return model, tokenizer


def calibration_batches(
    examples: Sequence[Example],
    tokenizer: Any,
    segments: int,
    seq_len: int,
    seed: int,
    batch_size: int = 8,
) -> list[torch.Tensor]:
    """`segments` random windows of `seq_len` tokens from the client's text (as SparseGPT draws its
    C4 segments), in batches. A client with less text than one window uses what it has, repeated."""
    texts = [
        {"prompt": "", "response": (e["prompt"] + " " + e["response"]).strip()} for e in examples
    ]
    stream = [t for block, _ in pack_text(texts, tokenizer, 10**9) for t in block]
    if len(stream) <= seq_len:
        stream = stream * (seq_len // max(1, len(stream)) + 2)
    rng = random.Random(seed)
    starts = [rng.randrange(0, len(stream) - seq_len) for _ in range(segments)]
    windows = torch.tensor([stream[s : s + seq_len] for s in starts], dtype=torch.long)
    return list(windows.split(batch_size))
