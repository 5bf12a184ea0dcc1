"""SliceGPT's compiled (sliced) model (Ashkboos et al. 2024, §3.2–3.4) as a Hugging Face model
class.

The one implementation of the sliced forward: `fedprune_app.methods.slicegpt.sliced` builds these
classes (`slice_model`) and loads them (`load_sliced`), and `save_pretrained` copies this file (and
its relative import, the configuration) next to the weights, so that a sliced model directory loads
anywhere with `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`. It imports only
torch and transformers.

The residual stream at point p carries k_p numbers (config `slicegpt_dims`). Every RMSNorm's γ is
folded into the linear maps that read it (§3.2), leaving `RMSN` (x / sqrt(‖x‖²/d + ε), d the DENSE
width); each decoder layer's projections are sliced to its points' widths, and its two residual
paths apply the shortcut matrices B_inᵀB_mid (attention) and B_midᵀB_out (MLP) as r ← r·S. Embedding
(vocab × k_0) and LM head (k_2L → vocab) are untied. Everything else (rotary embeddings, attention,
KV cache, `generate()`) is LLaMA's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaForCausalLM

from .configuration_fedprune_sliced_llama import FedpruneSlicedLlamaConfig


class RMSN(nn.Module):
    """RMSNorm without its weight (folded into the next linear maps): x / sqrt(Σx²/d + ε), d the
    DENSE width."""

    def __init__(self, dense_width: int, eps: float) -> None:
        super().__init__()
        self.dense_width, self.variance_epsilon = int(dense_width), float(eps)

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(
            x.pow(2).sum(-1, keepdim=True) / self.dense_width + self.variance_epsilon
        )
        return x.to(dtype)


class SlicedDecoderLayer(LlamaDecoderLayer):
    """A LLaMA decoder layer on the sliced stream: weightless norms, sliced projections, the two
    shortcuts."""

    def __init__(self, config: Any, layer_idx: int, k_in: int, k_mid: int, k_out: int) -> None:
        super().__init__(config, layer_idx)
        d, eps = int(config.hidden_size), float(config.rms_norm_eps)
        attn, mlp = self.self_attn, self.mlp
        qkv_bias = getattr(config, "qkv_bias", None)
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(attn, name)
            bias = old.bias is not None if qkv_bias is None else bool(qkv_bias)
            setattr(attn, name, nn.Linear(k_in, old.out_features, bias=bias))
        attn.o_proj = nn.Linear(attn.o_proj.in_features, k_mid, bias=attn.o_proj.bias is not None)
        mlp.gate_proj = nn.Linear(
            k_mid, mlp.gate_proj.out_features, bias=mlp.gate_proj.bias is not None
        )
        mlp.up_proj = nn.Linear(k_mid, mlp.up_proj.out_features, bias=mlp.up_proj.bias is not None)
        mlp.down_proj = nn.Linear(
            mlp.down_proj.in_features, k_out, bias=mlp.down_proj.bias is not None
        )
        self.input_layernorm, self.post_attention_layernorm = RMSN(d, eps), RMSN(d, eps)
        self.attn_shortcut = nn.Parameter(torch.zeros(k_in, k_mid), requires_grad=False)
        self.mlp_shortcut = nn.Parameter(torch.zeros(k_mid, k_out), requires_grad=False)

    def forward(
        self,
        hidden_states: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        past_key_values: Any = None,
        use_cache: bool | None = False,
        position_embeddings: tuple[Tensor, Tensor] | None = None,
        **kwargs: Any,
    ) -> Tensor:
        out, _ = self.self_attn(
            hidden_states=self.input_layernorm(hidden_states),
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            position_embeddings=position_embeddings,
            **kwargs,
        )
        hidden_states = hidden_states @ self.attn_shortcut.to(hidden_states.dtype) + out
        out = self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states @ self.mlp_shortcut.to(hidden_states.dtype) + out


class FedpruneSlicedLlamaForCausalLM(LlamaForCausalLM):
    """The deployable slicegpt model: LlamaForCausalLM with `SlicedDecoderLayer`s, a weightless
    final norm and an untied k_0-wide embedding / k_2L-wide LM head (widths from `slicegpt_dims`).
    Loads with `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`."""

    config_class = FedpruneSlicedLlamaConfig

    def __init__(self, config: FedpruneSlicedLlamaConfig) -> None:
        dims = config.point_widths()
        config.tie_word_embeddings = False
        super().__init__(config)
        model = self.model
        for i in range(len(model.layers)):
            model.layers[i] = SlicedDecoderLayer(config, i, *dims[2 * i : 2 * i + 3])
        model.norm = RMSN(int(config.hidden_size), float(config.rms_norm_eps))
        model.embed_tokens = nn.Embedding(int(config.vocab_size), dims[0], config.pad_token_id)
        self.lm_head = nn.Linear(dims[-1], int(config.vocab_size), bias=False)
        self.post_init()
