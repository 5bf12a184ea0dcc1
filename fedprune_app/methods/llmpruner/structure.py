"""LLM-Pruner's cut and its compiled model: which kv groups and MLP channels each layer keeps at a
parameter budget, and the really smaller LLaMA model with them removed (Ma et al. 2023, §3.1
"structural pruning", block-wise).

Budget: SFT-P's accounting (`fedprune_app.structural.routing.prunable_parameters`): the
q/k/v/o/gate/up/down weights of every decoder layer; a kv group costs d·head_dim·(2G + 2) of them,
an MLP channel 3d. The cut keeps at most p of them. LLM-Pruner's block-wise recipe prunes every
layer of a range by one ratio r (its LLaMA-7B recipe: layers 4..29 of 32, the others dense); here r
is the ratio that removes (1 − p) of ALL prunable weights from the range: each layer of the range
drops round(r·kv) kv groups (at least one kept), and the MLP channels left to reach the budget are
spread evenly over the range (their counts differ by at most one). Inside a layer the structures
with the lowest averaged importance go.

Compiled form: a copy of the (LoRA-merged) HF model whose q/k/v/o and gate/up/down are smaller
`nn.Linear`s: HF's LLaMA attention reads the number of heads from the projections (view(..., -1,
head_dim)) and G from `num_key_value_groups`, which pruning whole kv groups leaves unchanged, so the
stock forward and `generate` run it. The SFT-P routed form cannot express this (its masks select
residual-bus coordinates, never heads or channels), so the model is compiled directly. Per-layer
sizes differ, which LLaMA's config cannot state: the compiled model is
`hf.FedprunePrunedLlamaForCausalLM` (config `llmpruner_structure`: per layer the kept kv groups and
channels), a self-contained HF class that `save_pruned` writes beside the weights
(`save_pretrained`), so a directory loads with
`AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` or `load_pruned(dir)`.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedprune_app.core.config import ConfigError
from fedprune_app.llm.layers import decoder_layers
from fedprune_app.llm.models import base_config_values, qkv_bias
from fedprune_app.methods.llmpruner.hf import (
    FedprunePrunedLlamaConfig,
    FedprunePrunedLlamaForCausalLM,
)
from fedprune_app.methods.llmpruner.importance import dims
from fedprune_app.methods.llmpruner.shapes import KEEP_PREFIX  # noqa: F401 (re-exported)


def structure_costs(config: Any) -> dict[str, int]:
    """Prunable weights one kv group and one MLP channel hold."""
    s = dims(config)
    return {"heads": s["d"] * s["head_dim"] * (2 * s["groups"] + 2), "channels": 3 * s["d"]}


def kept_parameters(config: Any, keep: Mapping[str, np.ndarray]) -> int:
    """Prunable weights the structure `keep` ({"heads": bool (L, kv), "channels": bool (L, inter)})
    keeps."""
    costs = structure_costs(config)
    return int(sum(int(np.asarray(keep[k]).sum()) * costs[k] for k in costs))


def layer_range(config: Any, start: int, end: int) -> range:
    """The pruned layers
    [start, end): negative start and end <= 0 count from the end (ConfigError if empty)."""
    n = dims(config)["layers"]
    lo, hi = (start + n if start < 0 else start), (end + n if end <= 0 else end)
    if not 0 <= lo < hi <= n:
        raise ConfigError(
            f"run-config keys 'llmpruner-layer-start' = {start} and 'llmpruner-layer-end' = {end} "
            f"give the empty or out-of-range layer range [{lo}, {hi}) on a {n}-layer model"
        )
    return range(lo, hi)


def cut(
    scores: Mapping[str, np.ndarray], config: Any, keep_ratio: float, layers: range
) -> dict[str, np.ndarray]:
    """The global structure {"heads": bool (L, kv), "channels": bool (L, inter)} at the budget
    `keep_ratio` (see the module docstring); kept parameters ≤ keep_ratio · prunable, short of it by
    less than one channel's cost."""
    s, costs = dims(config), structure_costs(config)
    total = s["layers"] * (s["kv"] * costs["heads"] + s["inter"] * costs["channels"])
    prune = total - math.floor(keep_ratio * total + 1e-9)  # weights to remove, at least
    in_range = len(layers) * (s["kv"] * costs["heads"] + s["inter"] * costs["channels"])
    ratio = prune / in_range
    n_heads = min(s["kv"] - 1, round(ratio * s["kv"]))
    channels = max(
        0, math.ceil((prune - len(layers) * n_heads * costs["heads"]) / costs["channels"])
    )
    per_layer = [channels // len(layers) + (i < channels % len(layers)) for i in range(len(layers))]
    if per_layer[0] > s["inter"] - 1:
        raise ConfigError(
            f"run-config key 'llmpruner-keep-ratio' = {keep_ratio:g} cannot be reached by pruning "
            f"layers [{layers.start}, {layers.stop}) only (widen 'llmpruner-layer-start'/'-end')"
        )
    keep = {
        "heads": np.ones((s["layers"], s["kv"]), bool),
        "channels": np.ones((s["layers"], s["inter"]), bool),
    }
    for i, layer in enumerate(layers):
        for name, count in (("heads", n_heads), ("channels", per_layer[i])):
            order = np.argsort(np.asarray(scores[name][layer], np.float64), kind="stable")
            keep[name][layer, order[:count]] = False
    return keep


def _indices(keep: Mapping[str, np.ndarray], layer: int, config: Any) -> dict[str, torch.Tensor]:
    """Kept rows of q/o (query heads of the kept groups), k/v (the kept kv heads) and the kept MLP
    channels."""
    s = dims(config)
    hd, g = s["head_dim"], s["groups"]
    groups = np.flatnonzero(keep["heads"][layer])
    kv = np.concatenate([np.arange(j * hd, (j + 1) * hd) for j in groups])
    q = np.concatenate(
        [np.arange(h * hd, (h + 1) * hd) for j in groups for h in range(j * g, (j + 1) * g)]
    )
    return {
        "q": torch.as_tensor(q),
        "kv": torch.as_tensor(kv),
        "channels": torch.as_tensor(np.flatnonzero(keep["channels"][layer])),
    }


def _sliced(
    linear: nn.Linear, rows: torch.Tensor | None = None, cols: torch.Tensor | None = None
) -> nn.Linear:
    """A new Linear with the kept output rows / input columns of `linear` (bias sliced with the
    rows)."""
    w = linear.weight.detach()
    w = w if rows is None else w.index_select(0, rows.to(w.device))
    w = w if cols is None else w.index_select(1, cols.to(w.device))
    out = nn.Linear(
        w.shape[1], w.shape[0], bias=linear.bias is not None, device=w.device, dtype=w.dtype
    )
    with torch.no_grad():
        out.weight.copy_(w)
        if linear.bias is not None:
            b = linear.bias.detach()
            out.bias.copy_(b if rows is None else b.index_select(0, rows.to(b.device)))
    return out


def shrink_(model: nn.Module, keep: Mapping[str, np.ndarray]) -> nn.Module:
    """Replace, in place, every decoder layer's projections by their kept slices; returns
    `model`."""
    config = model.config
    for i, layer in enumerate(decoder_layers(model)):
        idx, attn, mlp = _indices(keep, i, config), layer.self_attn, layer.mlp
        if any(
            type(m) is not nn.Linear
            for m in (attn.q_proj, attn.o_proj, mlp.gate_proj, mlp.down_proj)
        ):
            raise TypeError("shrink a model whose adapters are merged (peft merge_and_unload)")
        attn.q_proj, attn.o_proj = (
            _sliced(attn.q_proj, rows=idx["q"]),
            _sliced(attn.o_proj, cols=idx["q"]),
        )
        attn.k_proj, attn.v_proj = (
            _sliced(attn.k_proj, rows=idx["kv"]),
            _sliced(attn.v_proj, rows=idx["kv"]),
        )
        mlp.gate_proj, mlp.up_proj = (
            _sliced(mlp.gate_proj, rows=idx["channels"]),
            _sliced(mlp.up_proj, rows=idx["channels"]),
        )
        mlp.down_proj = _sliced(mlp.down_proj, cols=idx["channels"])
    model.config.llmpruner_structure = structure_json(keep)
    return model


def merged_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` with its peft adapters merged (`merge_and_unload`), eval mode; `model` is
    left untouched. On an already pruned LoRA model (the recovery rounds' model) this is the
    deployable model."""
    model = copy.deepcopy(model)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    return model.eval()


def compile_pruned(
    model: nn.Module, keep: Mapping[str, np.ndarray]
) -> FedprunePrunedLlamaForCausalLM:
    """The deployable model from a dense one: a copy of `model` (peft adapters merged) with the
    pruned structures removed, as `FedprunePrunedLlamaForCausalLM`, eval mode; the input model is
    left untouched."""
    return as_compiled(shrink_(merged_copy(model), keep))


def pruned_config(base: Any, structure: list[Mapping[str, list[int]]]) -> FedprunePrunedLlamaConfig:
    """The compiled model's config: every value of the base LLaMA-family config, its model_type
    kept as `base_model_type`, the attention implementation it runs with, `qkv_bias` (Qwen2) and
    `llmpruner_structure`."""
    values = base_config_values(base, "llmpruner_structure", "qkv_bias")
    config = FedprunePrunedLlamaConfig(
        **values,
        qkv_bias=qkv_bias(base),
        llmpruner_structure=[dict(layer) for layer in structure],
        base_model_type=str(getattr(base, "base_model_type", base.model_type)),
    )
    config._attn_implementation = base._attn_implementation
    return config


def as_compiled(model: nn.Module) -> FedprunePrunedLlamaForCausalLM:
    """A shrunk, merged LlamaForCausalLM (`shrink_`) as `FedprunePrunedLlamaForCausalLM`, sharing
    its tensors (built on the meta device, then the state assigned: no copy of the weights), eval
    mode."""
    if isinstance(model, FedprunePrunedLlamaForCausalLM):
        return model.eval()
    structure = getattr(model.config, "llmpruner_structure", None)
    if structure is None:
        raise TypeError(
            "a compiled llmpruner model is built from a shrunk model (shrink_, adapters merged)"
        )
    with torch.device("meta"):
        out = FedprunePrunedLlamaForCausalLM(pruned_config(model.config, structure))
    out.load_state_dict(model.state_dict(), strict=True, assign=True)
    # `assign` gave lm_head and the embedding each its own entry of the state dict
    out.tie_weights()
    out.model.rotary_emb = model.model.rotary_emb  # non-persistent buffers: not in the state dict
    out.generation_config = copy.deepcopy(model.generation_config)
    return out.eval()


@torch.no_grad()
def zero_pruned_(model: nn.Module, keep: Mapping[str, np.ndarray]) -> nn.Module:
    """The masked form: the pruned structures' weights set to zero in place (same function as
    `compile_pruned`: a zero o_proj column / down_proj column removes what the head / channel
    writes)."""
    s = dims(model.config)
    for i, layer in enumerate(decoder_layers(model)):
        heads = np.repeat(~keep["heads"][i], s["head_dim"])
        q = torch.as_tensor(np.repeat(~keep["heads"][i], s["groups"] * s["head_dim"]))
        ch = torch.as_tensor(~keep["channels"][i])
        attn, mlp = layer.self_attn, layer.mlp
        attn.q_proj.weight[q] = 0
        attn.o_proj.weight[:, q] = 0
        attn.k_proj.weight[torch.as_tensor(heads)] = 0
        attn.v_proj.weight[torch.as_tensor(heads)] = 0
        mlp.gate_proj.weight[ch] = 0
        mlp.up_proj.weight[ch] = 0
        mlp.down_proj.weight[:, ch] = 0
    return model


def structure_json(keep: Mapping[str, np.ndarray]) -> list[dict[str, list[int]]]:
    """Per layer the kept kv groups and MLP channels as index lists (config.json's
    `llmpruner_structure`)."""
    return [
        {"kv-groups": np.flatnonzero(h).tolist(), "channels": np.flatnonzero(c).tolist()}
        for h, c in zip(keep["heads"], keep["channels"], strict=True)
    ]


def keep_from_json(structure: list[Mapping[str, list[int]]], config: Any) -> dict[str, np.ndarray]:
    """`structure_json`'s inverse: the bool arrays {"heads": (L, kv), "channels": (L, inter)}."""
    s, n = dims(config), len(structure)
    keep = {"heads": np.zeros((n, s["kv"]), bool), "channels": np.zeros((n, s["inter"]), bool)}
    for i, layer in enumerate(structure):
        keep["heads"][i, layer["kv-groups"]] = True
        keep["channels"][i, layer["channels"]] = True
    return keep


def save_pruned(model: nn.Module, out_dir: Path, tokenizer: Any = None) -> None:
    """A standard Hugging Face model directory (`save_pretrained` of `as_compiled(model)`):
    config.json (model_type "fedprune_pruned_llama", `llmpruner_structure`, an `auto_map` to the two
    code files), model.safetensors, generation_config.json,
    `configuration_fedprune_pruned_llama.py` + `modeling_fedprune_pruned_llama.py`, structure.json
    (per layer: kept kv groups and channels, for reading) and the tokenizer when given."""
    if not hasattr(model.config, "llmpruner_structure"):
        raise TypeError("save_pruned takes the output of compile_pruned")
    out_dir = Path(out_dir)
    compiled = as_compiled(model)
    compiled.save_pretrained(out_dir)
    (out_dir / "structure.json").write_text(json.dumps(compiled.config.llmpruner_structure) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)


def load_pruned(out_dir: Path) -> FedprunePrunedLlamaForCausalLM:
    """The model `save_pruned` wrote, in eval mode; also a directory written before the HF class
    (config.json of model_type "llama" with `llmpruner_structure`, safetensors of the same tensor
    names)."""
    from safetensors.torch import load_model
    from transformers import AutoConfig, GenerationConfig

    out_dir = Path(out_dir)
    raw = json.loads((out_dir / "config.json").read_text())
    if raw.get("model_type") == FedprunePrunedLlamaConfig.model_type:
        return FedprunePrunedLlamaForCausalLM.from_pretrained(out_dir).eval()
    if raw.get("llmpruner_structure") is None:
        raise ValueError(
            f"{out_dir} is not a compiled llmpruner model: config.json model_type is "
            f"{raw.get('model_type')!r}, not {FedprunePrunedLlamaConfig.model_type!r}, and it has "
            "no 'llmpruner_structure'"
        )
    config = AutoConfig.from_pretrained(out_dir)
    model = FedprunePrunedLlamaForCausalLM(pruned_config(config, raw["llmpruner_structure"]))
    load_model(model, str(out_dir / "model.safetensors"), strict=True)
    if (out_dir / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(out_dir)
    return model.eval()


def pruned_forward_flops(
    config: Any, keep: Mapping[str, np.ndarray] | None, tokens: int, past: int = 0, logits: int = 1
) -> int:
    """Matmul FLOPs of one batch-1 forward, counted as `fedprune_app.structural.speed.forward_flops`
    ('full' attention) counts the dense model, for the model with the structures `keep`
    (None = dense)."""
    s = dims(config)
    d, hd, g = s["d"], s["head_dim"], s["groups"]
    macs = 0
    for i in range(s["layers"]):
        kv = s["kv"] if keep is None else int(np.sum(keep["heads"][i]))
        inter = s["inter"] if keep is None else int(np.sum(keep["channels"][i]))
        heads = kv * g
        macs += tokens * (d * (heads + 2 * kv) * hd + heads * hd * d) + 2 * heads * hd * (
            tokens * past + tokens**2
        )
        macs += tokens * 3 * d * inter
    return 2 * (macs + d * int(config.vocab_size) * logits)


def pruned_ceiling(
    config: Any,
    keep: Mapping[str, np.ndarray],
    task: str,
    prefill: int = 512,
    new_tokens: int = 32,
    prompt: int = 32,
) -> float:
    """FLOPs(dense) / FLOPs(pruned) of one of speed_table's tasks (prefill: last-token logits;
    generate: prompt forward + new_tokens − 1 cached one-token steps)."""

    def work(k: Mapping[str, np.ndarray] | None) -> int:
        if task == "prefill":
            return pruned_forward_flops(config, k, prefill)
        return pruned_forward_flops(config, k, prompt) + sum(
            pruned_forward_flops(config, k, 1, prompt + i) for i in range(new_tokens - 1)
        )

    return work(None) / work(keep)
