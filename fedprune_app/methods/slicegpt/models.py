"""The models a slicegpt run uses on both sides: the sliced backbone + LoRA built from the global
bases, cached per process (Ray workers reuse it across rounds; callers always load the message's
adapter state), and the FLOP count of a sliced model for the speed ceiling."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedprune_app.core.config import RunConfig
from fedprune_app.llm.layers import dense_model
from fedprune_app.llm.models import add_lora
from fedprune_app.methods.slicegpt.pca import BASIS_PREFIX
from fedprune_app.methods.slicegpt.sliced import num_points, slice_model
from fedprune_app.structural.speed import workload_flops

_CACHE: dict[str, tuple[nn.Module, Any]] = {}


def bases_from_arrays(arrays: Mapping[str, Any], config: Any) -> list[Tensor] | None:
    """The 2L + 1 bases in a message's arrays (float64 tensors), None when the arrays carry none
    (dense)."""
    if BASIS_PREFIX + "0" not in arrays:
        return None
    out = []
    for p in range(num_points(config)):
        value = arrays[BASIS_PREFIX + str(p)]
        out.append(
            torch.as_tensor(
                value.numpy()
                if hasattr(value, "numpy") and not isinstance(value, Tensor)
                else value
            ).to(torch.float64)
        )
    return out


def sliced_model_for(cfg: RunConfig, bases: list[Tensor]) -> tuple[nn.Module, Any]:
    """(the sliced model of the run's base model at `bases`, wrapped with fresh LoRA (lora-* keys),
    tokenizer); one per process, rebuilt when the bases or the LoRA keys change."""
    lora_keys = ("lora-rank", "lora-alpha", "lora-dropout", "lora-target-modules", "seed")
    digest = hashlib.sha1(
        json.dumps(
            [cfg.model_name, cfg.model_dtype, cfg.device] + [cfg[k] for k in lora_keys]
        ).encode()
    )
    for b in bases:
        digest.update(np.ascontiguousarray(b.to(torch.float32).cpu().numpy()).tobytes())
    key = digest.hexdigest()
    if key not in _CACHE:
        _CACHE.clear()
        dense, tokenizer = dense_model(cfg)
        model = add_lora(slice_model(dense, bases), cfg, seed=cfg.seed)
        _CACHE[key] = (model, tokenizer)
    return _CACHE[key]


def sliced_flops(
    config: Any,
    dims: list[int],
    task: str,
    prefill: int = 512,
    new_tokens: int = 32,
    prompt: int = 32,
) -> int:
    """Matmul FLOPs of `speed_table`'s task on the sliced model: SFT-P's count
    (`structural.speed.workload_flops`) with every lane k_p wide, plus the two shortcut matmuls per
    layer and token, with the LM head at k_2L, not d."""

    layers = int(config.num_hidden_layers)
    lanes = [
        {
            "attn-in": dims[2 * i],
            "attn-out": dims[2 * i + 1],
            "ffn-in": dims[2 * i + 1],
            "ffn-out": dims[2 * i + 2],
        }
        for i in range(layers)
    ]
    tokens, logits = {
        "prefill": (prefill, 1),
        "full-logits": (prefill, prefill),
        "generate": (prompt + new_tokens - 1, new_tokens),
    }[task]
    shortcut = sum(
        dims[2 * i] * dims[2 * i + 1] + dims[2 * i + 1] * dims[2 * i + 2] for i in range(layers)
    )
    head_saving = int(config.vocab_size) * (int(config.hidden_size) - dims[-1]) * logits
    flops = workload_flops(
        config, lanes, task, prefill=prefill, new_tokens=new_tokens, prompt=prompt
    )
    return flops + 2 * (tokens * shortcut - head_saving)
