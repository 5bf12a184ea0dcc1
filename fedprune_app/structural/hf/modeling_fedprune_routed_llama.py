"""SFT-P's compiled (routed) model (§3.1, Eq. 1–9; Appx. A.1, Eq. 16–18) as a Hugging Face model
class.

The one implementation of the compiled forward: `fedprune_app.structural.routing` builds these
classes (`compile_model`) and loads them (`load_compiled`), and `save_pretrained` copies this file
(and its relative import, the configuration) next to the weights, so that a compiled model directory
loads anywhere with `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`. It
therefore imports only torch and transformers (never fedprune: an absolute import would become a
requirement of the saved model).

Per decoder layer and submodule m ∈ {attn, ffn} the lanes π^{m,in}, π^{m,out} ⊆ {0..d-1} (config
`lanes`) are gathered with `index_select`, run through dense sub-matrices
W[:, π_in] / W_out[π_out, :] and written back with `index_add_` onto the d-wide residual bus. The
norm is RMS over the |π_in| lane coordinates (Eq. 3); an empty lane skips its submodule (a skipped
attention still writes zero keys/values so every layer's cache length stays right). LLaMA-family
family (RMSNorm weight · x̂, rotary embeddings, gated MLP, GQA; Qwen2's q/k/v biases; Qwen3's q/k
norms, config `qk_norm`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import (
    LlamaForCausalLM,
    LlamaModel,
    LlamaPreTrainedModel,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    eager_attention_forward,
)

from .configuration_fedprune_routed_llama import FedpruneRoutedLlamaConfig


def _rms_norm(h: Tensor, weight: Tensor, eps: float) -> Tensor:
    dtype = h.dtype
    h = h.to(torch.promote_types(dtype, torch.float32))
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)


def _in_place() -> bool:
    """In-place kernels only when autograd is off (the deployed model runs under
    no_grad / inference_mode)."""
    return not torch.is_grad_enabled()


def _rotary(qk: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """HF's `apply_rotary_pos_emb` (x·cos + rotate_half(x)·sin) on the (batch, seq, heads, head_dim)
    q and k heads at once: x·cos, then ∓ the swapped halves times sin added in place (no negated
    copy and concatenation as in rotate_half). Returns a new contiguous tensor."""
    half = qk.shape[-1] // 2
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    x1, x2 = qk[..., :half], qk[..., half:]
    if not _in_place():
        return torch.cat(
            [
                x1 * cos[..., :half] - x2 * sin[..., :half],
                x2 * cos[..., half:] + x1 * sin[..., half:],
            ],
            dim=-1,
        )
    out = qk * cos
    out[..., :half].addcmul_(x2, sin[..., :half], value=-1)
    out[..., half:].addcmul_(x1, sin[..., half:])
    return out


def _input_major(linear: nn.Linear) -> nn.Linear:
    """Keep `linear`'s (out, in) weight as the transposed view of a row-major (in, out) array, so
    that F.linear multiplies by a contiguous (in, out) matrix (MKL's non-transposed B): for the wide
    products of a lane (fused q/k/v, fused gate/up: in = |π_in| ≤ d < out) one decoding token then
    streams the weights faster, and a prefill is no slower (measured: "Speed of the compiled
    models" in docs/notes/2026-11-sftp-investigations.md). Same shapes, values and state-dict
    names; `copy_`, `load_state_dict`, `.to(dtype)` and `deepcopy` keep the layout;
    `from_pretrained` restores it (the stored tensors are contiguous)."""
    linear.weight = nn.Parameter(
        linear.weight.detach().t().contiguous().t(), requires_grad=linear.weight.requires_grad
    )
    return linear


class _Lane(nn.Module):
    """Shared part of a compiled submodule: lane indices π_in, π_out (buffers), the sliced norm
    weight, the gather with the lane norm (Eq. 1 + 3) and the write-back (Eq. 2 + 5). A lane keeping
    all d coordinates skips the index ops; the residual is (n, d), the batch and sequence axes
    flattened."""

    def __init__(self, pi_in: Sequence[int], pi_out: Sequence[int], eps: float, d: int) -> None:
        super().__init__()
        self.lane_indices = (list(map(int, pi_in)), list(map(int, pi_out)))
        self.register_buffer(
            "pi_in", torch.tensor(self.lane_indices[0], dtype=torch.long), persistent=False
        )
        self.register_buffer(
            "pi_out", torch.tensor(self.lane_indices[1], dtype=torch.long), persistent=False
        )
        self.norm_weight = nn.Parameter(torch.ones(len(pi_in)))
        self.eps = eps
        self.full_in, self.full_out = list(pi_in) == list(range(d)), list(pi_out) == list(range(d))
        # An output width that is not a multiple of 16 slows MKL's sgemm: such lanes compute the
        # transposed product W_out · hᵀ instead, whose output width is the token count (same
        # values; measured: docs/notes/2026-11-sftp-investigations.md, "Speed of the compiled
        # models").
        self.transposed_out = len(pi_out) % 16 != 0

    def lane_input(self, x: Tensor) -> Tensor:
        """Eq. 1 + 3: Norm(route(x; π_in)) on the k_in-wide lane, RMS over the lane only
        (index_select on the 2-D view: on CPU several times faster than along the last axis of a 3-D
        tensor)."""
        h = x if self.full_in else x.index_select(1, self.pi_in)
        if not _in_place() or h.dtype not in (
            torch.float32,
            torch.float64,
        ):  # else: HF's upcast to float32
            return _rms_norm(h, self.norm_weight, self.eps)
        r = (
            h.square().mean(-1, keepdim=True).add_(self.eps).rsqrt_()
        )  # as HF's RMSNorm, in place on the lane
        h = h * r if self.full_in else h.mul_(r)
        return h.mul_(self.norm_weight)

    def write_back(self, x: Tensor, h: Tensor, proj: nn.Linear, owned: bool) -> Tensor:
        """Eq. 2 + 5 with Eq. 17–18: x + W_out h scattered to the π_out coordinates (`index_add`),
        in place when this layer owns x (it created it) and autograd is off."""
        if self.transposed_out:
            w = proj.weight
            update = (
                torch.mm(w, h.t())
                if proj.bias is None
                else torch.addmm(proj.bias.unsqueeze(1), w, h.t())
            ).t()
        else:
            update = proj(h)
        owned = owned and _in_place()
        if self.full_out:
            return x.add_(update) if owned else x + update
        return (
            x.index_add_(1, self.pi_out, update) if owned else x.index_add(1, self.pi_out, update)
        )


class CompiledAttention(_Lane):
    """Self-attention on a lane: fused q/k/v = X̃ W[π_in, :] (Eq. 16), o_proj restricted to the
    π_out rows (Eq. 17–18). Rotary embeddings, GQA, attention masks and the KV cache as in HF's
    LlamaAttention."""

    def __init__(
        self,
        config: Any,
        layer_idx: int,
        pi_in: Sequence[int],
        pi_out: Sequence[int],
        qkv_bias: bool,
        o_bias: bool,
    ) -> None:
        d = int(config.hidden_size)
        super().__init__(pi_in, pi_out, float(config.rms_norm_eps), d)
        self.config, self.layer_idx, self.is_causal = config, layer_idx, True
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(getattr(config, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or d // self.num_heads)
        self.num_key_value_groups = self.num_heads // self.num_kv_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = float(getattr(config, "attention_dropout", 0.0))
        self.split = [self.num_heads * self.head_dim] + [self.num_kv_heads * self.head_dim] * 2
        self.qkv_proj = _input_major(nn.Linear(len(pi_in), sum(self.split), bias=qkv_bias))
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, len(pi_out), bias=o_bias)
        if getattr(config, "qk_norm", False):  # Qwen3: RMSNorm over each head of q and of k
            self.q_norm = LlamaRMSNorm(self.head_dim, eps=self.eps)
            self.k_norm = LlamaRMSNorm(self.head_dim, eps=self.eps)

    def forward(
        self,
        x: Tensor,
        shape: tuple[int, int],
        position_embeddings: tuple[Tensor, Tensor],
        attention_mask: Tensor | None,
        past_key_values: Any,
        owned: bool,
        **kwargs: Any,
    ) -> Tensor:
        """x: the (batch·seq, d) residual; returns it with the attention update written back."""

        batch, seq = shape
        qkv = self.qkv_proj(self.lane_input(x)).view(batch, seq, -1)
        qk = qkv[..., : self.split[0] + self.split[1]].view(batch, seq, -1, self.head_dim)
        if hasattr(self, "q_norm"):
            kv_heads = self.split[1] // self.head_dim
            gamma = torch.cat(
                [
                    self.q_norm.weight.expand(self.num_heads, -1),
                    self.k_norm.weight.expand(kv_heads, -1),
                ]
            )
            qk = _rms_norm(qk, gamma, self.eps)
        qk = _rotary(qk, *position_embeddings).transpose(1, 2)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[..., -self.split[2] :].view(batch, seq, -1, self.head_dim).transpose(1, 2)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        out, _ = attend(
            self,
            q,
            k,
            v,
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        return self.write_back(x, out.reshape(batch * seq, -1), self.o_proj, owned)


SPLIT_GATE_UP_ROWS = 128  # from this many tokens on, `CompiledMLP` runs gate and up as two products


class CompiledMLP(_Lane):
    """Gated MLP on a lane: fused gate/up = X̃ W[π_in, :] (Eq. 16), down_proj restricted to π_out
    (Eq. 17–18)."""

    def __init__(
        self,
        config: Any,
        pi_in: Sequence[int],
        pi_out: Sequence[int],
        gate_up_bias: bool,
        down_bias: bool,
    ) -> None:
        super().__init__(pi_in, pi_out, float(config.rms_norm_eps), int(config.hidden_size))
        inter = int(config.intermediate_size)
        self.gate_up_proj = _input_major(nn.Linear(len(pi_in), 2 * inter, bias=gate_up_bias))
        self.down_proj = nn.Linear(inter, len(pi_out), bias=down_bias)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: Tensor, owned: bool) -> Tensor:
        """x: the (batch·seq, d) residual; returns it with the MLP update written back."""
        h_in, proj = self.lane_input(x), self.gate_up_proj
        if h_in.shape[0] >= SPLIT_GATE_UP_ROWS:
            # many tokens (prefill): gate and up as two GEMMs on the halves of the one stored weight
            # (views, no copy), so SiLU·up works on contiguous halves; one decoding token keeps the
            # fused product, where the strided halves cost more (same note as above).
            inter = proj.out_features // 2
            bias = (None, None) if proj.bias is None else (proj.bias[:inter], proj.bias[inter:])
            gate = nn.functional.linear(h_in, proj.weight[:inter], bias[0])
            up = nn.functional.linear(h_in, proj.weight[inter:], bias[1])
        else:
            gate, up = proj(h_in).chunk(2, dim=-1)
        h = self.act_fn(gate)
        return self.write_back(x, h.mul_(up) if _in_place() else h * up, self.down_proj, owned)


class CompiledDecoderLayer(nn.Module):
    """A decoder layer in compiled form (Eq. 3–6 with Appx. A.1): per submodule, gather the lane,
    run dense sub-matrices, scatter-add back (`index_add`). `routing` holds the lanes π (index
    lists) it was built from; a submodule with an empty lane is None (skipped)."""

    def __init__(
        self,
        config: Any,
        layer_idx: int,
        routing: dict[str, list[int]],
        bias: dict[str, list[bool]],
    ) -> None:
        super().__init__()
        self.layer_idx, self.routing = layer_idx, {k: list(map(int, v)) for k, v in routing.items()}
        self.bias_flags = {k: [bool(b) for b in v] for k, v in bias.items()}
        r = self.routing
        self.self_attn = (
            CompiledAttention(config, layer_idx, r["attn-in"], r["attn-out"], *bias["attn"])
            if r["attn-in"] and r["attn-out"]
            else None
        )
        self.mlp = (
            CompiledMLP(config, r["ffn-in"], r["ffn-out"], *bias["ffn"])
            if r["ffn-in"] and r["ffn-out"]
            else None
        )
        self.num_kv_heads = int(
            getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        )
        self.head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )

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
        batch, seq, d = hidden_states.shape
        x, owned = (
            hidden_states.reshape(batch * seq, d),
            False,
        )  # write in place only on a tensor made here
        if self.self_attn is not None:
            x = self.self_attn(
                x,
                (batch, seq),
                position_embeddings,
                attention_mask,
                past_key_values,
                owned,
                position_ids=position_ids,
                **kwargs,
            )
            owned = True
        elif past_key_values is not None:  # keep this layer's cache length in step with the others
            zeros = x.new_zeros(batch, self.num_kv_heads, seq, self.head_dim)
            past_key_values.update(zeros, zeros, self.layer_idx)
        if self.mlp is not None:
            x = self.mlp(x, owned)
        return x.view(batch, seq, d)


def _fused_inputs(model: nn.Module) -> list[nn.Linear]:
    """The fused q/k/v and gate/up projections of a compiled model (the ones `_input_major` lays
    out)."""
    return [
        m.qkv_proj if isinstance(m, CompiledAttention) else m.gate_up_proj
        for m in model.modules()
        if isinstance(m, CompiledAttention | CompiledMLP)
    ]


class _LaneInit(LlamaPreTrainedModel):
    """`from_pretrained` builds the model on the meta device and loads only the stored tensors; the
    lane indices π (non-persistent buffers, derived from the config) are set here, as transformers
    sets rotary `inv_freq`."""

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, _Lane):
            init.copy_(module.pi_in, torch.tensor(module.lane_indices[0], dtype=torch.long))
            init.copy_(module.pi_out, torch.tensor(module.lane_indices[1], dtype=torch.long))


class FedpruneRoutedLlamaModel(_LaneInit, LlamaModel):
    """LlamaModel whose decoder layers are `CompiledDecoderLayer`s built from the config's lanes (no
    dense layer is ever built); embeddings, final norm, rotary embeddings and the forward loop are
    LlamaModel's."""

    config_class = FedpruneRoutedLlamaConfig
    _no_split_modules = ["CompiledDecoderLayer"]
    _can_record_outputs = {"hidden_states": CompiledDecoderLayer, "attentions": CompiledAttention}

    def __init__(self, config: FedpruneRoutedLlamaConfig) -> None:
        LlamaPreTrainedModel.__init__(self, config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList(
            CompiledDecoderLayer(config, i, *config.layer_spec(i))
            for i in range(config.num_hidden_layers)
        )
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        self.gradient_checkpointing = False
        self.post_init()


class FedpruneRoutedLlamaForCausalLM(_LaneInit, LlamaForCausalLM):
    """The deployable SFT-P / fedflap model: LlamaForCausalLM (lm_head, `generate()`) over
    `FedpruneRoutedLlamaModel`. Loads with
    `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`."""

    config_class = FedpruneRoutedLlamaConfig
    _no_split_modules = ["CompiledDecoderLayer"]
    _can_record_outputs = FedpruneRoutedLlamaModel._can_record_outputs

    def __init__(self, config: FedpruneRoutedLlamaConfig) -> None:
        LlamaPreTrainedModel.__init__(self, config)
        self.model = FedpruneRoutedLlamaModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> FedpruneRoutedLlamaForCausalLM:
        """PreTrainedModel.from_pretrained, then the fused input projections laid out input-major
        again (the loader replaces parameters with the stored, row-major tensors: same values,
        slower decoding)."""
        model = super().from_pretrained(*args, **kwargs)
        for linear in _fused_inputs(model):
            _input_major(linear)
        return model
