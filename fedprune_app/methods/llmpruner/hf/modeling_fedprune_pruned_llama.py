"""LLM-Pruner's compiled model (Ma et al. 2023, §3.1) as a Hugging Face model class.

A LlamaForCausalLM whose q/k/v/o and gate/up/down projections are smaller `nn.Linear`s: per layer
the kept kv groups (each with its G query heads) and MLP channels of the config's
`llmpruner_structure`. HF's LLaMA attention reads the number of heads from the projections
(`view(..., -1, head_dim)`) and G from `num_key_value_groups`, which removing whole kv groups leaves
unchanged, so LLaMA's own forward, KV cache and `generate()` run it: the one compiled forward.
`fedprune_app.methods.llmpruner.structure` builds (`compile_pruned`), saves (`save_pruned`) and
loads (`load_pruned`) this class; `save_pretrained` copies this file and the configuration next to
the weights, so a directory loads anywhere with
`AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`. It imports only torch and
transformers (never fedprune).
"""

from __future__ import annotations

from torch import nn
from transformers.models.llama.modeling_llama import LlamaForCausalLM

from .configuration_fedprune_pruned_llama import FedprunePrunedLlamaConfig


def _resized(
    linear: nn.Linear,
    out_features: int | None = None,
    in_features: int | None = None,
    bias: bool | None = None,
) -> nn.Linear:
    """An empty Linear like `linear` (device, dtype, bias unless `bias` says) with the given widths
    (None: unchanged)."""
    w = linear.weight
    return nn.Linear(
        in_features or linear.in_features,
        out_features or linear.out_features,
        bias=linear.bias is not None if bias is None else bias,
        device=w.device,
        dtype=w.dtype,
    )


def prune_layer_shapes_(
    layer: nn.Module,
    kv_groups: int,
    channels: int,
    head_dim: int,
    groups: int,
    qkv_bias: bool | None = None,
) -> None:
    """Give a LlamaDecoderLayer the projection shapes of `kv_groups` kept kv groups and `channels`
    MLP channels (q/k/v with biases where `qkv_bias`, Qwen2; None: as built)."""
    attn, mlp = layer.self_attn, layer.mlp
    q, kv = kv_groups * groups * head_dim, kv_groups * head_dim
    attn.q_proj, attn.o_proj = (
        _resized(attn.q_proj, out_features=q, bias=qkv_bias),
        _resized(attn.o_proj, in_features=q),
    )
    attn.k_proj, attn.v_proj = (
        _resized(attn.k_proj, out_features=kv, bias=qkv_bias),
        _resized(attn.v_proj, out_features=kv, bias=qkv_bias),
    )
    mlp.gate_proj = _resized(mlp.gate_proj, out_features=channels)
    mlp.up_proj = _resized(mlp.up_proj, out_features=channels)
    mlp.down_proj = _resized(mlp.down_proj, in_features=channels)


class FedprunePrunedLlamaForCausalLM(LlamaForCausalLM):
    """The deployable llmpruner model: LlamaForCausalLM with each layer's projections at its kept
    sizes. Loads with `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`."""

    config_class = FedprunePrunedLlamaConfig

    def __init__(self, config: FedprunePrunedLlamaConfig) -> None:
        super().__init__(config)
        heads, kv = int(config.num_attention_heads), int(config.num_key_value_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        for i, layer in enumerate(self.model.layers):
            prune_layer_shapes_(
                layer,
                *config.layer_sizes(i),
                head_dim,
                heads // kv,
                getattr(config, "qkv_bias", None),
            )
        self.post_init()
