"""The sliced model of SliceGPT (Ashkboos et al. 2024, §3.2–3.4) for the LLaMA family, built from
the dense one.

Points of the residual stream, in order: p = 2l is the input of decoder layer l (what its attention
reads), p = 2l+1 the residual after its attention (what its MLP reads), p = 2L the input of the
final norm (what the LM head reads). Each point p has a basis B_p (d × k_p, orthonormal columns: the
top k_p eigenvectors Q_p[:, :k_p] of the covariance there, `bases_from_covariances`); the sliced
model carries r_p = B_pᵀ x_p (k_p numbers) instead of x_p.

§3.2 RMSNorm folding: γ of `input_layernorm` goes into q/k/v (W ← W·diag γ), of
`post_attention_layernorm` into gate/up, of the final norm into the LM head; what is left, `RMSN`,
is x / sqrt(‖x‖²/d + ε), which commutes with orthogonal maps (‖Qᵀx‖ = ‖x‖). The divisor stays the
dense width d after slicing (as the reference's RMSN does).

§3.3–3.4 rotation and slicing, per layer l, with B_in = B_2l, B_mid = B_2l+1, B_out = B_2l+2:
readers take W·diag(γ)·B (q/k/v: B_in; gate/up: B_mid; LM head: B_2L), writers Bᵀ·W (o_proj: B_mid;
down_proj: B_out; the embedding E·B_0), the residual paths the shortcut matrices B_inᵀB_mid
(attention) and B_midᵀB_out (MLP), applied as r ← r·S (row vectors). With every B_p square (k_p = d)
the model equals the dense one (tests). SmolLM2 ties its LM head to the embedding: the sliced model
unties them (E·B_0 ≠ W·diag(γ)·B_2L) and counts both.

The sliced model is `hf.FedpruneSlicedLlamaForCausalLM` (self-contained HF code, the one
implementation of the sliced forward: `RMSN`, `SlicedDecoderLayer`); `save_sliced` writes it with
`save_pretrained`, so a directory loads with
`AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` or `load_sliced(dir)`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from fedprune_app.llm.models import base_config_values, qkv_bias
from fedprune_app.methods.slicegpt.hf import (
    FedpruneSlicedLlamaConfig,
    FedpruneSlicedLlamaForCausalLM,
)

# re-exported
from fedprune_app.methods.slicegpt.hf.modeling_fedprune_sliced_llama import (  # noqa: F401
    RMSN,
    SlicedDecoderLayer,
)
from fedprune_app.structural.routing import bus_dims, prunable_parameters

# slicegpt.json of a directory written before the HF class (config.json: "llama")
FORMAT = "fedprune-slicegpt/1"


def num_points(config: Any) -> int:
    """2L + 1 residual-stream points (`module docstring`)."""
    return 2 * int(config.num_hidden_layers) + 1


def _w(module: nn.Module) -> Tensor:
    return module.weight.detach().to(torch.float64)


def _copy(dst: nn.Linear, weight: Tensor, bias: nn.Parameter | None = None) -> None:
    with torch.no_grad():
        dst.weight.copy_(weight.to(dst.weight.dtype))
        if bias is not None and dst.bias is not None:
            dst.bias.copy_(bias.detach().to(dst.bias.dtype))


def _sliced_layer(
    dense: nn.Module, config: Any, idx: int, b_in: Tensor, b_mid: Tensor, b_out: Tensor
) -> SlicedDecoderLayer:
    """Layer `idx` of the dense model folded (§3.2), rotated and sliced to the bases (float64
    products)."""
    attn, mlp = dense.self_attn, dense.mlp
    g_in = dense.input_layernorm.weight.detach().to(torch.float64)
    g_mid = dense.post_attention_layernorm.weight.detach().to(torch.float64)
    out = SlicedDecoderLayer(config, idx, b_in.shape[1], b_mid.shape[1], b_out.shape[1])
    out.to(dtype=attn.q_proj.weight.dtype, device=attn.q_proj.weight.device)
    b_in, b_mid, b_out = (
        b.to(attn.q_proj.weight.device, torch.float64) for b in (b_in, b_mid, b_out)
    )
    for name in ("q_proj", "k_proj", "v_proj"):
        _copy(
            getattr(out.self_attn, name),
            (_w(getattr(attn, name)) * g_in) @ b_in,
            getattr(attn, name).bias,
        )
    o_bias = None if attn.o_proj.bias is None else b_mid.T @ attn.o_proj.bias.detach().double()
    _copy(out.self_attn.o_proj, b_mid.T @ _w(attn.o_proj), o_bias)
    for name in ("gate_proj", "up_proj"):
        _copy(
            getattr(out.mlp, name),
            (_w(getattr(mlp, name)) * g_mid) @ b_mid,
            getattr(mlp, name).bias,
        )
    d_bias = None if mlp.down_proj.bias is None else b_out.T @ mlp.down_proj.bias.detach().double()
    _copy(out.mlp.down_proj, b_out.T @ _w(mlp.down_proj), d_bias)
    with torch.no_grad():
        out.attn_shortcut.copy_((b_in.T @ b_mid).to(out.attn_shortcut.dtype))
        out.mlp_shortcut.copy_((b_mid.T @ b_out).to(out.mlp_shortcut.dtype))
    return out.eval()


def _embedding(dense: nn.Module, basis: Tensor) -> nn.Embedding:
    """E·B_0 (vocab × k_0)."""
    ref = dense.model.embed_tokens
    emb = nn.Embedding(ref.weight.shape[0], basis.shape[1], padding_idx=ref.padding_idx)
    with torch.no_grad():
        emb.weight.copy_(_w(ref) @ basis.to(ref.weight.device, torch.float64))
    return emb.to(ref.weight.device, ref.weight.dtype)


def _head(dense: nn.Module, basis: Tensor) -> nn.Linear:
    """The LM head with the final norm's γ folded in, reading B_2L: W·diag(γ)·B_2L (vocab × k_2L),
    untied."""
    ref = dense.lm_head.weight
    head = nn.Linear(basis.shape[1], ref.shape[0], bias=False)
    gamma = dense.model.norm.weight.detach().to(torch.float64)
    _copy(head, (_w(dense.lm_head) * gamma) @ basis.to(ref.device, torch.float64))
    return head.to(ref.device, ref.dtype)


def set_point(model: nn.Module, dense: nn.Module, bases: Sequence[Tensor], p: int) -> None:
    """Rebuild, in the sliced `model`, what reads or writes point p, from `dense` and `bases`
    (`bases[p]` new): the layer(s) around p, the embedding (p = 0) or the LM head (p = 2L). The
    sequential SliceGPT uses it."""
    num_layers = len(model.model.layers)
    for idx in sorted({min(p // 2, num_layers - 1), (p - 1) // 2} if p > 0 else {0}):
        model.model.layers[idx] = _sliced_layer(
            dense.model.layers[idx], model.config, idx, *bases[2 * idx : 2 * idx + 3]
        )
    if p == 0:
        model.model.embed_tokens = _embedding(dense, bases[0])
    if p == 2 * num_layers:
        model.lm_head = _head(dense, bases[p])
    model.config.slicegpt_dims[p] = int(bases[p].shape[1])


def slice_model(dense: nn.Module, bases: Sequence[Tensor]) -> FedpruneSlicedLlamaForCausalLM:
    """A new `FedpruneSlicedLlamaForCausalLM` whose stream at point p is B_pᵀ x_p
    (`module docstring`); `dense` is unchanged.

    `bases`: 2L + 1 matrices d × k_p with orthonormal columns (square ones: the rotated, unsliced
    model)."""
    if len(bases) != num_points(dense.config):
        raise ValueError(
            f"slice_model needs {num_points(dense.config)} bases (2 per layer + the head's), "
            f"got {len(bases)}"
        )
    with torch.device("meta"):
        model = FedpruneSlicedLlamaForCausalLM(
            sliced_config(dense.config, [int(b.shape[1]) for b in bases])
        )
    for idx, layer in enumerate(dense.model.layers):
        model.model.layers[idx] = _sliced_layer(
            layer, model.config, idx, *bases[2 * idx : 2 * idx + 3]
        )
    model.model.embed_tokens, model.lm_head = _embedding(dense, bases[0]), _head(dense, bases[-1])
    model.generation_config = copy.deepcopy(dense.generation_config)
    _rotary_on(model, dense.model.embed_tokens.weight.device)
    return model.eval()


def identity_bases(config: Any, device: torch.device | str = "cpu") -> list[Tensor]:
    """Square identity bases: the folded, unrotated, unsliced model."""
    d = int(config.hidden_size)
    return [torch.eye(d, dtype=torch.float64, device=device) for _ in range(num_points(config))]


def sliced_parameters(config: Any, dims: Sequence[int]) -> dict[str, int]:
    """Parameter counts of a sliced model with widths `dims` (one per point), from the config alone:
    `projections` (q/k/v/o/gate/up/down: what SFT-P's `prunable_parameters` counts dense),
    `shortcuts` (k_in·k_mid + k_mid·k_out per layer, SliceGPT's addition), `embedding` and `head`
    (untied), `total`."""

    _, attn_in, attn_out, ffn_in, ffn_out = bus_dims(config)
    vocab, layers = int(config.vocab_size), int(config.num_hidden_layers)
    proj = sum(
        dims[2 * i] * attn_in + dims[2 * i + 1] * (attn_out + ffn_in) + dims[2 * i + 2] * ffn_out
        for i in range(layers)
    )
    short = sum(
        dims[2 * i] * dims[2 * i + 1] + dims[2 * i + 1] * dims[2 * i + 2] for i in range(layers)
    )
    out = {
        "projections": proj,
        "shortcuts": short,
        "embedding": vocab * dims[0],
        "head": vocab * dims[-1],
    }
    return out | {"total": sum(out.values())}


def sliced_width(config: Any, keep_ratio: float) -> int:
    """The constant width k (1..d) whose kept parameters (projections + shortcuts,
    `sliced_parameters`) are nearest to keep_ratio · SFT-P's prunable parameters (ties: the larger
    k). docs/methods/slicegpt.md#budget."""

    d, n, target = (
        int(config.hidden_size),
        num_points(config),
        keep_ratio * prunable_parameters(config),
    )

    def cost(k: int) -> int:
        p = sliced_parameters(config, [k] * n)
        return p["projections"] + p["shortcuts"]

    return min(range(1, d + 1), key=lambda k: (abs(cost(k) - target), -k))


def sliced_config(base: Any, dims: Sequence[int]) -> FedpruneSlicedLlamaConfig:
    """The sliced model's config: every value of the base LLaMA config (LM head untied), its
    model_type kept as `base_model_type`, the attention implementation it runs with, and the widths
    `slicegpt_dims`."""
    values = base_config_values(base, "slicegpt_dims", "tie_word_embeddings", "qkv_bias")
    config = FedpruneSlicedLlamaConfig(
        **values,
        qkv_bias=qkv_bias(base),
        slicegpt_dims=[int(k) for k in dims],
        tie_word_embeddings=False,
        base_model_type=str(getattr(base, "base_model_type", base.model_type)),
    )
    config._attn_implementation = base._attn_implementation
    return config


def save_sliced(model: nn.Module, out_dir: Path, tokenizer: Any = None) -> None:
    """A standard Hugging Face model directory (`save_pretrained`): `config.json` (model_type
    "fedprune_sliced_llama", `slicegpt_dims`, an `auto_map` to the two code files),
    `model.safetensors`, `generation_config.json`,
    `configuration_fedprune_sliced_llama.py` + `modeling_fedprune_sliced_llama.py`, the tokenizer
    when given. Load with `load_sliced(out_dir)` or
    `AutoModelForCausalLM.from_pretrained(out_dir, trust_remote_code=True)`."""
    if not isinstance(model, FedpruneSlicedLlamaForCausalLM):
        raise TypeError(
            f"save_sliced takes the output of slice_model (LoRA merged), got {type(model).__name__}"
        )
    model.save_pretrained(Path(out_dir))
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)


def load_sliced(out_dir: Path | str) -> FedpruneSlicedLlamaForCausalLM:
    """The model `save_sliced` wrote, in eval mode, ready for forward / `generate()`; also a
    directory written before the HF class (config.json of model_type "llama" + slicegpt.json of
    format "fedprune-slicegpt/1")."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    out_dir = Path(out_dir)
    config = json.loads((out_dir / "config.json").read_text())
    if config.get("model_type") == FedpruneSlicedLlamaConfig.model_type:
        return FedpruneSlicedLlamaForCausalLM.from_pretrained(out_dir).eval()
    meta_file = out_dir / "slicegpt.json"
    meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
    if meta.get("format") != FORMAT:
        raise ValueError(
            f"{out_dir} is not a sliced fedprune model (config.json model_type is "
            f"{config.get('model_type')!r}, not {FedpruneSlicedLlamaConfig.model_type!r}, and "
            f"slicegpt.json format is {meta.get('format')!r}, not {FORMAT!r})"
        )
    with torch.device("meta"):
        model = FedpruneSlicedLlamaForCausalLM(
            sliced_config(AutoConfig.from_pretrained(out_dir), meta["dims"])
        )
    model.load_state_dict(load_file(str(out_dir / "model.safetensors")), strict=True, assign=True)
    _rotary_on(model, "cpu")
    return model.eval()


def _rotary_on(model: nn.Module, device: torch.device | str) -> None:
    """The rotary embedding's buffers (built on meta with the skeleton) computed on `device`."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    with torch.device(device):
        model.model.rotary_emb = LlamaRotaryEmbedding(config=model.config)
