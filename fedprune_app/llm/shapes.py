"""The shapes of a model's linear layers and of its LoRA tensors, from its config.json alone.

What a checkpoint of a run must hold is known here in milliseconds, without torch, transformers or
the weights: the launcher compares a `resume-from` checkpoint with it before Flower starts. It knows
the LLaMA family's layout (`LLAMA_FAMILY`); for another `model_type`, or LoRA on the output layer
(peft then also saves its base weight), it answers None and the caller builds the real arrays.
Tests compare every answer with the arrays the strategies build.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedprune_app.llm.settings import ALL_LINEAR, LoraSettings, lora_targets

Spec = dict[str, tuple[tuple[int, ...], str]]  # {name: (shape, dtype)}, as `core.protocol.spec_of`
LLAMA_FAMILY = ("llama", "mistral", "qwen2")  # transformers' `model_type`s of the same layout
PEFT_PREFIX = "base_model.model."  # peft's name of the wrapped model in its adapter state
DECODER_PREFIX = "model.layers."  # the decoder layers' names in the LLaMA family


def linear_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, int]] | None:
    """{module name: (out_features, in_features)} of every linear layer of a LLaMA-family causal LM
    (the decoder layers' projections, then `lm_head`), from its config.json; None for another
    `model_type` or a config without the sizes."""
    if config.get("model_type") not in LLAMA_FAMILY:
        return None
    try:
        d, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or d // heads)
        inner, layers = int(config["intermediate_size"]), int(config["num_hidden_layers"])
        vocab = int(config["vocab_size"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):  # transformers could not load it
        return None
    q, kv = heads * head_dim, kv_heads * head_dim
    per_layer = {
        "self_attn.q_proj": (q, d),
        "self_attn.k_proj": (kv, d),
        "self_attn.v_proj": (kv, d),
        "self_attn.o_proj": (d, q),
        "mlp.gate_proj": (inner, d),
        "mlp.up_proj": (inner, d),
        "mlp.down_proj": (d, inner),
    }
    shapes = {
        f"{DECODER_PREFIX}{i}.{name}": shape
        for i in range(layers)
        for name, shape in per_layer.items()
    }
    return shapes | {"lm_head": (vocab, d)}


def decoder_linear_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, int]] | None:
    """`linear_shapes` of the decoder layers alone (the prunable matrices); None as there."""
    shapes = linear_shapes(config)
    if shapes is None:
        return None
    return {k: v for k, v in shapes.items() if k.startswith(DECODER_PREFIX)}


def lora_spec(
    settings: LoraSettings,
    config: Mapping[str, Any],
    rank: int | None = None,
    linear: Mapping[str, tuple[int, int]] | None = None,
) -> Spec | None:
    """The adapter state `llm.models.add_lora` makes (peft's names, float32): A (r, in) and
    B (out, r) of every linear layer whose name is or ends with a `lora-target-modules` entry
    (peft's rule; 'all-linear': every one but `lm_head`), r = `rank` or `lora-rank`; None when
    `linear_shapes` is, or when the output layer is a target. `linear`: the layers'
    (out_features, in_features) where they are not the config's (a pruned or sliced model of the
    same names)."""
    shapes = linear_shapes(config)
    if shapes is not None and linear is not None:
        shapes = dict(linear)
    targets = lora_targets(settings.lora_target_modules)
    if shapes is None:
        return None
    if targets == ALL_LINEAR:  # peft: every linear layer but the output layer
        chosen = [n for n in shapes if n != "lm_head"]
    else:
        chosen = [n for n in shapes if any(n == t or n.endswith("." + t) for t in targets)]
    if "lm_head" in chosen:
        return None
    r = int(rank or settings.lora_rank)
    spec: Spec = {}
    for name in chosen:
        out_features, in_features = shapes[name]
        spec[f"{PEFT_PREFIX}{name}.lora_A.weight"] = ((r, in_features), "float32")
        spec[f"{PEFT_PREFIX}{name}.lora_B.weight"] = ((out_features, r), "float32")
    return spec
