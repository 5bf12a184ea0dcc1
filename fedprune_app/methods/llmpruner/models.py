"""The models llmpruner's two sides build: the dense model for the Taylor pass, the pruned model
with LoRA."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache

import numpy as np
import torch
from torch import nn

from fedprune_app.core.config import RunConfig
from fedprune_app.llm.models import Lora, add_lora, load_base_model, load_tokenizer
from fedprune_app.methods.llmpruner.structure import KEEP_PREFIX, shrink_


def dense_model(cfg: RunConfig) -> tuple[nn.Module, object]:
    """A fresh dense model (no LoRA, eval mode) and the tokenizer: what the round-1 Taylor pass
    differentiates."""
    if cfg.model_quantization != "none":
        raise ValueError(
            "method 'llmpruner' needs the weights' gradients: run-config key 'model-quantization' "
            f"must be 'none', got {cfg.model_quantization!r}"
        )
    return load_base_model(cfg.model_name, cfg.model_dtype, "none", cfg.device), load_tokenizer(
        cfg.model_name
    )


@lru_cache(maxsize=1)
def _pruned(
    model_name: str, dtype: str, device: str, lora: Lora, structure: bytes, shape_key: str
) -> tuple[nn.Module, object]:
    shapes = json.loads(shape_key)
    flat = np.frombuffer(structure, dtype=bool)
    keep = {
        "heads": flat[: np.prod(shapes["heads"])].reshape(shapes["heads"]),
        "channels": flat[np.prod(shapes["heads"]) :].reshape(shapes["channels"]),
    }
    model = load_base_model(model_name, dtype, "none", device)
    return add_lora(shrink_(model, keep), lora, seed=lora.seed), load_tokenizer(model_name)


def pruned_model_for(cfg: RunConfig, keep: Mapping[str, np.ndarray]) -> tuple[nn.Module, object]:
    """The process's cached pruned model (structures `keep` removed) wrapped with fresh LoRA (lora-*
    keys, seeded by `seed`) and the tokenizer; callers load the adapter state they need before
    use."""
    heads, channels = np.asarray(keep["heads"], bool), np.asarray(keep["channels"], bool)
    structure = np.concatenate([heads.reshape(-1), channels.reshape(-1)]).tobytes()
    shape_key = json.dumps({"heads": list(heads.shape), "channels": list(channels.shape)})
    return _pruned(cfg.model_name, cfg.model_dtype, cfg.device, Lora.of(cfg), structure, shape_key)


def keep_from_arrays(
    arrays: Mapping[str, torch.Tensor | np.ndarray],
) -> dict[str, np.ndarray] | None:
    """The global structure in a message's arrays, None when absent (round 0 and 1: the dense
    model)."""
    if KEEP_PREFIX + "heads" not in arrays:
        return None
    return {
        k: np.asarray(
            arrays[KEEP_PREFIX + k].numpy()
            if hasattr(arrays[KEEP_PREFIX + k], "numpy")
            else arrays[KEEP_PREFIX + k],
            bool,
        )
        for k in ("heads", "channels")
    }
