"""SFT-P residual-safe routing (§3.1, Eq. 1–9; Appx. A.1, Eq. 16–18): masked training form, parameter
accounting T(g), and the compiled deployable model.

The residual bus stays d-wide. Per decoder layer and submodule m ∈ {attn, ffn} the masks g^{m,in}, g^{m,out}
∈ {0,1}^d (Eq. 7–9) pick the lanes π^{m,in}, π^{m,out}. Masked form (training, gradients reach g):
`x_in = route(x, g_in, norm_m)`, `x = merge(x, f_m(x_in), g_out)`. Compiled form (deployment): dense
sub-matrices W[:, π_in] / W_out[π_out, :] with `index_select` / `index_add_` — the same function, smaller and faster.

Choices where the paper is silent:
- Norm (Eq. 3): RMS statistics over the |π_in| active coordinates only (ones: exactly the dense RMSNorm), times
  the norm weight; LLaMA-family RMSNorm (weight · x̂; Gemma's (1 + weight) form is not covered).
- An empty lane (|π_in| = 0 or |π_out| = 0) skips the submodule in the compiled form. Without projection
  biases (LLaMA) f(0) = 0, so the masked form agrees untouched and the gate gradients stay alive; with biases
  the masked update is multiplied by the constant 1[|π_in| > 0] so both forms agree.
- A skipped attention still writes zero keys/values to the KV cache, so every layer's cache length (which
  HF reads for positions and masks) stays right.
- LoRA: `compile_model` merges the adapters (peft `merge_and_unload`) on its copy before slicing.

Load a compiled model with one call: `model = fedprune_app.methods.sftp.routing.load_compiled(out_dir)`
(tokenizer, if saved: `AutoTokenizer.from_pretrained(out_dir)`); `model.save_pretrained` cannot store it, use
`save_compiled`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedprune_app.llm.layers import decoder_layers

MASK_NAMES = ("attn-in", "attn-out", "ffn-in", "ffn-out")
LayerMasks = dict[str, torch.Tensor]
FORMAT = "fedprune-compiled/1"


# ---------------------------------------------------------------- masked form (Eq. 1–6)

def route(x: Tensor, g: Tensor, norm: nn.Module) -> Tensor:
    """Eq. 1 + 3 on the d-wide bus: Norm(x ⊙ g) with the RMS over the sum(g) active coordinates, times the norm
    weight (zeros off the lane). Computed in (at least) float32 like HF's RMSNorm; an empty lane gives zeros."""
    eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
    g = g.to(x.device)  # masks from a generator elsewhere (e.g. on the CPU) follow the hidden states
    routed = (x * g.to(x.dtype)).to(torch.promote_types(x.dtype, torch.float32))
    active = g.to(routed.dtype).sum().clamp_min(1.0)
    variance = routed.pow(2).sum(-1, keepdim=True) / active
    return norm.weight * (routed * torch.rsqrt(variance + eps)).to(x.dtype)


def merge(x: Tensor, update: Tensor, g: Tensor) -> Tensor:
    """Eq. 2 + 5 on the d-wide bus: x + update ⊙ g (write-back on the active coordinates only)."""
    return x + update * g.to(update.device, update.dtype)


def _has_bias(module: nn.Module) -> bool:
    return any(isinstance(m, nn.Linear) and m.bias is not None for m in module.modules())


class _RoutedLayer:
    """Mixin put in front of a decoder layer's class by `install_routing`: the masked form when masks are set."""

    routing_masks: LayerMasks | None

    def forward(self, hidden_states: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                past_key_values: Any = None, use_cache: bool | None = False,
                position_embeddings: tuple[Tensor, Tensor] | None = None, **kwargs: Any) -> Tensor:
        g = self.routing_masks
        if g is None:
            return super().forward(hidden_states, attention_mask=attention_mask, position_ids=position_ids,  # type: ignore[misc]
                                   past_key_values=past_key_values, use_cache=use_cache,
                                   position_embeddings=position_embeddings, **kwargs)
        x = hidden_states
        x_in = route(x, g["attn-in"], self.input_layernorm)
        update, _ = self.self_attn(hidden_states=x_in, attention_mask=attention_mask, position_ids=position_ids,
                                   past_key_values=past_key_values, use_cache=use_cache,
                                   position_embeddings=position_embeddings, **kwargs)
        x = merge(x, update, self._live_out(g, "attn"))
        x_in = route(x, g["ffn-in"], self.post_attention_layernorm)
        return merge(x, self.mlp(x_in), self._live_out(g, "ffn"))

    def _live_out(self, g: LayerMasks, m: str) -> Tensor:
        """g_out, times the constant 1[|π_in| > 0] when the submodule has biases (see the module docstring)."""
        if not self.routing_bias[m]:
            return g[f"{m}-out"]
        return g[f"{m}-out"] * (g[f"{m}-in"].detach().sum() > 0).to(g[f"{m}-out"].dtype)


_ROUTED_CLASSES: dict[type, type] = {}


def install_routing(model: nn.Module) -> None:
    """Patch every decoder layer (its class becomes a subclass with the masked forward, §3.1 Eq. 3–6) of a HF
    LLaMA-family causal LM, peft-wrapped or not. With no masks set it is exactly the original layer."""
    for layer in decoder_layers(model):
        if isinstance(layer, _RoutedLayer):
            continue
        cls = type(layer)
        if cls not in _ROUTED_CLASSES:
            _ROUTED_CLASSES[cls] = type(f"Routed{cls.__name__}", (_RoutedLayer, cls), {})
        layer.__class__ = _ROUTED_CLASSES[cls]
        layer.routing_masks = None
        layer.routing_bias = {"attn": _has_bias(layer.self_attn), "ffn": _has_bias(layer.mlp)}


def set_masks(model: nn.Module, masks: Sequence[LayerMasks | None] | None) -> None:
    """One LayerMasks per decoder layer (None, or a None entry = dense). The tensors are used as given, so
    gradients flow from the loss into them (and through them to the gate surrogate)."""
    layers = decoder_layers(model)
    if not all(isinstance(layer, _RoutedLayer) for layer in layers):
        raise RuntimeError("call install_routing(model) before set_masks")
    masks = [None] * len(layers) if masks is None else list(masks)
    if len(masks) != len(layers):
        raise ValueError(f"got masks for {len(masks)} layers, the model has {len(layers)}")
    for layer, g in zip(layers, masks, strict=True):
        if g is not None and set(g) != set(MASK_NAMES):
            raise KeyError(f"layer masks must have exactly the keys {MASK_NAMES}, got {sorted(g)}")
        layer.routing_masks = g


# ---------------------------------------------------------------- parameter accounting T(g) (Eq. 13)

def bus_dims(config: Any) -> tuple[int, int, int, int, int]:
    """(d, q_out + k_out + v_out, o_in, gate_out + up_out, down_in): the weights one kept bus coordinate keeps
    in an attention input lane (q/k/v rows), its output lane (o columns), an FFN input lane (gate/up rows) and
    its output lane (down columns)."""
    d = int(config.hidden_size)
    head_dim = int(getattr(config, "head_dim", None) or d // config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    q_out = int(config.num_attention_heads) * head_dim
    inter = int(config.intermediate_size)
    return d, q_out + 2 * kv * head_dim, q_out, 2 * inter, inter


def kept_parameters(config: Any, masks: Sequence[LayerMasks]) -> Tensor:
    """T(g) of Eq. 13, differentiable in the masks: weights of the pruned projections that the masks keep.
    Per layer: attn |in|·(q_out + k_out + v_out) + |out|·o_in; ffn |in|·(gate_out + up_out) + |out|·down_in,
    |in| = g.sum(). A submodule with an empty lane counts 0 (the compiled model drops it; the indicator is a
    constant). Norm weights and biases are not counted (O(d) each; `prunable_parameters` likewise)."""
    _, attn_in, attn_out, ffn_in, ffn_out = bus_dims(config)
    total = torch.zeros((), device=masks[0]["attn-in"].device if masks else "cpu")
    for g in masks:
        for m, per_in, per_out in (("attn", attn_in, attn_out), ("ffn", ffn_in, ffn_out)):
            n_in, n_out = g[f"{m}-in"].float().sum(), g[f"{m}-out"].float().sum()
            live = ((n_in.detach() > 0) & (n_out.detach() > 0)).float()
            total = total + live * (n_in * per_in + n_out * per_out)
    return total


def prunable_parameters(config: Any) -> int:
    """T_total: `kept_parameters` at all-ones masks (q/k/v/o/gate/up/down weights of every decoder layer)."""
    d, attn_in, attn_out, ffn_in, ffn_out = bus_dims(config)
    return int(config.num_hidden_layers) * d * (attn_in + attn_out + ffn_in + ffn_out)


# ---------------------------------------------------------------- compiled form (Appx. A.1, Eq. 16–18)

def _rms_norm(h: Tensor, weight: Tensor, eps: float) -> Tensor:
    dtype = h.dtype
    h = h.to(torch.promote_types(dtype, torch.float32))
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)


def _in_place() -> bool:
    """In-place kernels only when autograd is off (the deployed model runs under no_grad / inference_mode)."""
    return not torch.is_grad_enabled()


def _rotary(qk: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """HF's `apply_rotary_pos_emb` (x·cos + rotate_half(x)·sin) on the (batch, seq, heads, head_dim) q and k heads
    at once: x·cos, then ∓ the swapped halves times sin added in place (no negated copy and concatenation as in
    rotate_half). Returns a new contiguous tensor."""
    half = qk.shape[-1] // 2
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    x1, x2 = qk[..., :half], qk[..., half:]
    if not _in_place():
        return torch.cat([x1 * cos[..., :half] - x2 * sin[..., :half], x2 * cos[..., half:] + x1 * sin[..., half:]],
                         dim=-1)
    out = qk * cos
    out[..., :half].addcmul_(x2, sin[..., :half], value=-1)
    out[..., half:].addcmul_(x1, sin[..., half:])
    return out


def _input_major(linear: nn.Linear) -> nn.Linear:
    """Keep `linear`'s (out, in) weight as the transposed view of a row-major (in, out) array, so that F.linear
    multiplies by a contiguous (in, out) matrix (MKL's non-transposed B). For the wide products of a lane (fused
    q/k/v, fused gate/up: in = |π_in| ≤ d < out) one decoding token streams the weights ~2× faster this way
    (SmolLM2 at keep 0.5, weights from DRAM, 1 thread: gate/up 288 → 3072 190 µs instead of 425 µs) and a
    512-token prefill is no slower. Same shapes, values and state-dict names; `copy_`, `load_state_dict`,
    `.to(dtype)` and `deepcopy` keep the layout (`save_compiled` writes contiguous tensors)."""
    linear.weight = nn.Parameter(linear.weight.detach().t().contiguous().t(), requires_grad=linear.weight.requires_grad)
    return linear


class _Lane(nn.Module):
    """Shared part of a compiled submodule: lane indices π_in, π_out (buffers), the sliced norm weight, the gather
    with the lane norm (Eq. 1 + 3) and the write-back (Eq. 2 + 5). A lane keeping all d coordinates skips the
    index ops; the residual is (n, d), the batch and sequence axes flattened."""

    def __init__(self, pi_in: Sequence[int], pi_out: Sequence[int], eps: float, d: int) -> None:
        super().__init__()
        self.register_buffer("pi_in", torch.tensor(list(pi_in), dtype=torch.long), persistent=False)
        self.register_buffer("pi_out", torch.tensor(list(pi_out), dtype=torch.long), persistent=False)
        self.norm_weight = nn.Parameter(torch.ones(len(pi_in)))
        self.eps = eps
        self.full_in, self.full_out = list(pi_in) == list(range(d)), list(pi_out) == list(range(d))
        # MKL's sgemm is ~12% slower when the output width is not a multiple of 16 (1 thread, 512 tokens: |π_out| =
        # 461 costs nearly as much as d = 576): such lanes compute the transposed product W_out · hᵀ instead, whose
        # output width is the token count (same values; the scatter of the transposed result costs ~0.2 ms more).
        self.transposed_out = len(pi_out) % 16 != 0

    def lane_input(self, x: Tensor) -> Tensor:
        """Eq. 1 + 3: Norm(route(x; π_in)) on the k_in-wide lane, RMS over the lane only (index_select on the 2-D
        view: on CPU several times faster than along the last axis of a 3-D tensor)."""
        h = x if self.full_in else x.index_select(1, self.pi_in)
        if not _in_place() or h.dtype not in (torch.float32, torch.float64):  # else: HF's upcast to float32
            return _rms_norm(h, self.norm_weight, self.eps)
        r = h.square().mean(-1, keepdim=True).add_(self.eps).rsqrt_()  # as HF's RMSNorm, in place on the lane
        h = h * r if self.full_in else h.mul_(r)
        return h.mul_(self.norm_weight)

    def write_back(self, x: Tensor, h: Tensor, proj: nn.Linear, owned: bool) -> Tensor:
        """Eq. 2 + 5 with Eq. 17–18: x + W_out h scattered to the π_out coordinates (`index_add`), in place when
        this layer owns x (it created it) and autograd is off."""
        if self.transposed_out:
            w = proj.weight
            update = (torch.mm(w, h.t()) if proj.bias is None else torch.addmm(proj.bias.unsqueeze(1), w, h.t())).t()
        else:
            update = proj(h)
        owned = owned and _in_place()
        if self.full_out:
            return x.add_(update) if owned else x + update
        return x.index_add_(1, self.pi_out, update) if owned else x.index_add(1, self.pi_out, update)


class CompiledAttention(_Lane):
    """Self-attention on a lane: fused q/k/v = X̃ W[π_in, :] (Eq. 16), o_proj restricted to the π_out rows
    (Eq. 17–18). Rotary embeddings, GQA, attention masks and the KV cache as in HF's LlamaAttention."""

    def __init__(self, config: Any, layer_idx: int, pi_in: Sequence[int], pi_out: Sequence[int],
                 qkv_bias: bool, o_bias: bool) -> None:
        d = int(config.hidden_size)
        super().__init__(pi_in, pi_out, float(config.rms_norm_eps), d)
        self.config, self.layer_idx, self.is_causal = config, layer_idx, True
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(getattr(config, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or d // self.num_heads)
        self.num_key_value_groups = self.num_heads // self.num_kv_heads
        self.scaling = self.head_dim ** -0.5
        self.attention_dropout = float(getattr(config, "attention_dropout", 0.0))
        self.split = [self.num_heads * self.head_dim] + [self.num_kv_heads * self.head_dim] * 2
        self.qkv_proj = _input_major(nn.Linear(len(pi_in), sum(self.split), bias=qkv_bias))
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, len(pi_out), bias=o_bias)

    def forward(self, x: Tensor, shape: tuple[int, int], position_embeddings: tuple[Tensor, Tensor],
                attention_mask: Tensor | None, past_key_values: Any, owned: bool, **kwargs: Any) -> Tensor:
        """x: the (batch·seq, d) residual; returns it with the attention update written back."""
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        from transformers.models.llama.modeling_llama import eager_attention_forward

        batch, seq = shape
        qkv = self.qkv_proj(self.lane_input(x)).view(batch, seq, -1)
        qk = _rotary(qkv[..., :self.split[0] + self.split[1]].view(batch, seq, -1, self.head_dim),
                     *position_embeddings).transpose(1, 2)
        q, k = qk[:, :self.num_heads], qk[:, self.num_heads:]
        v = qkv[..., -self.split[2]:].view(batch, seq, -1, self.head_dim).transpose(1, 2)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        out, _ = attend(self, q, k, v, attention_mask, dropout=self.attention_dropout if self.training else 0.0,
                        scaling=self.scaling, **kwargs)
        return self.write_back(x, out.reshape(batch * seq, -1), self.o_proj, owned)


SPLIT_GATE_UP_ROWS = 128  # from this many tokens on, `CompiledMLP` runs gate and up as two products


class CompiledMLP(_Lane):
    """Gated MLP on a lane: fused gate/up = X̃ W[π_in, :] (Eq. 16), down_proj restricted to π_out (Eq. 17–18)."""

    def __init__(self, config: Any, pi_in: Sequence[int], pi_out: Sequence[int], gate_up_bias: bool,
                 down_bias: bool) -> None:
        from transformers.activations import ACT2FN

        super().__init__(pi_in, pi_out, float(config.rms_norm_eps), int(config.hidden_size))
        inter = int(config.intermediate_size)
        self.gate_up_proj = _input_major(nn.Linear(len(pi_in), 2 * inter, bias=gate_up_bias))
        self.down_proj = nn.Linear(inter, len(pi_out), bias=down_bias)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: Tensor, owned: bool) -> Tensor:
        """x: the (batch·seq, d) residual; returns it with the MLP update written back."""
        h_in, proj = self.lane_input(x), self.gate_up_proj
        if h_in.shape[0] >= SPLIT_GATE_UP_ROWS:
            # many tokens (prefill): gate and up as two GEMMs on the halves of the one stored weight (views, no
            # copy): MKL runs the two 1536-wide products ~5% faster than the 3072-wide one at 512 tokens and a
            # lane of 288-461, and SiLU·up then works on contiguous halves. One decoding token keeps the fused
            # product (the strided halves cost ~20% there).
            inter = proj.out_features // 2
            bias = (None, None) if proj.bias is None else (proj.bias[:inter], proj.bias[inter:])
            gate = nn.functional.linear(h_in, proj.weight[:inter], bias[0])
            up = nn.functional.linear(h_in, proj.weight[inter:], bias[1])
        else:
            gate, up = proj(h_in).chunk(2, dim=-1)
        h = self.act_fn(gate)
        return self.write_back(x, h.mul_(up) if _in_place() else h * up, self.down_proj, owned)


class CompiledDecoderLayer(nn.Module):
    """A decoder layer in compiled form (Eq. 3–6 with Appx. A.1): per submodule, gather the lane, run dense
    sub-matrices, scatter-add back (`index_add`). `routing` holds the lanes π (index lists) it was built from;
    a submodule with an empty lane is None (skipped)."""

    def __init__(self, config: Any, layer_idx: int, routing: dict[str, list[int]], bias: dict[str, list[bool]]
                 ) -> None:
        super().__init__()
        self.layer_idx, self.routing = layer_idx, {k: list(map(int, v)) for k, v in routing.items()}
        self.bias_flags = {k: [bool(b) for b in v] for k, v in bias.items()}
        r = self.routing
        self.self_attn = CompiledAttention(config, layer_idx, r["attn-in"], r["attn-out"], *bias["attn"]) \
            if r["attn-in"] and r["attn-out"] else None
        self.mlp = CompiledMLP(config, r["ffn-in"], r["ffn-out"], *bias["ffn"]) \
            if r["ffn-in"] and r["ffn-out"] else None
        self.num_kv_heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)

    def forward(self, hidden_states: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                past_key_values: Any = None, use_cache: bool | None = False,
                position_embeddings: tuple[Tensor, Tensor] | None = None, **kwargs: Any) -> Tensor:
        batch, seq, d = hidden_states.shape
        x, owned = hidden_states.reshape(batch * seq, d), False  # write in place only on a tensor made here
        if self.self_attn is not None:
            x = self.self_attn(x, (batch, seq), position_embeddings, attention_mask, past_key_values, owned,
                               position_ids=position_ids, **kwargs)
            owned = True
        elif past_key_values is not None:  # keep this layer's cache length in step with the others
            zeros = x.new_zeros(batch, self.num_kv_heads, seq, self.head_dim)
            past_key_values.update(zeros, zeros, self.layer_idx)
        if self.mlp is not None:
            x = self.mlp(x, owned)
        return x.view(batch, seq, d)

    @classmethod
    def from_layer(cls, layer: nn.Module, g: LayerMasks | None, layer_idx: int, config: Any) -> CompiledDecoderLayer:
        """Slice a (merged, un-LoRA'd) HF decoder layer by hard masks g (bool or 0/1; None = dense)."""
        d = int(config.hidden_size)
        routing = {name: list(range(d)) if g is None else
                   torch.nonzero(g[name].detach().float().cpu() > 0.5).flatten().tolist() for name in MASK_NAMES}
        attn, mlp = layer.self_attn, layer.mlp
        bias = {"attn": [attn.q_proj.bias is not None, attn.o_proj.bias is not None],
                "ffn": [mlp.gate_proj.bias is not None, mlp.down_proj.bias is not None]}
        out = cls(config, layer_idx, routing, bias).to(layer.input_layernorm.weight.device)
        with torch.no_grad():
            if (a := out.self_attn) is not None:
                _fill(a, a.qkv_proj, a.o_proj, layer.input_layernorm, [attn.q_proj, attn.k_proj, attn.v_proj],
                      attn.o_proj)
            if (f := out.mlp) is not None:
                _fill(f, f.gate_up_proj, f.down_proj, layer.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj],
                      mlp.down_proj)
        return out.to(layer.input_layernorm.weight.dtype)


def _fill(lane: _Lane, fused: nn.Linear, last: nn.Linear, norm: nn.Module, inputs: list[nn.Linear],
          output: nn.Linear) -> None:
    """Copy W[:, π_in] of the input projections (fused), W_out[π_out, :] and the sliced norm weight (Eq. 16–17)."""
    if any(type(m) is not nn.Linear for m in [*inputs, output]):
        raise TypeError("compile a model whose adapters are merged (peft merge_and_unload)")
    lane.norm_weight.copy_(norm.weight[lane.pi_in])
    fused.weight.copy_(torch.cat([m.weight[:, lane.pi_in] for m in inputs]))
    if fused.bias is not None:
        fused.bias.copy_(torch.cat([m.bias for m in inputs]))
    last.weight.copy_(output.weight[lane.pi_out])
    if last.bias is not None:
        last.bias.copy_(output.bias[lane.pi_out])


def per_layer_masks(stacked: Mapping[str, Any]) -> list[LayerMasks]:
    """The four (layers × d) mask arrays of a model (numpy or torch, e.g. a masks.npz) as one `LayerMasks` per
    decoder layer, `compile_model`'s input."""
    as_tensor = {n: torch.as_tensor(stacked[n]) for n in MASK_NAMES}
    return [{n: as_tensor[n][layer] for n in MASK_NAMES} for layer in range(as_tensor[MASK_NAMES[0]].shape[0])]


def compile_model(model: nn.Module, masks: Sequence[LayerMasks | None]) -> nn.Module:
    """The deployable model (Appx. A.1): a copy of `model` (peft adapters merged with `merge_and_unload`) whose
    decoder layers are `CompiledDecoderLayer`s built from the hard masks (bool or 0/1, thresholded at 0.5).
    The input model is left untouched; the result is in eval mode."""
    layers = decoder_layers(model)
    if len(masks) != len(layers):
        raise ValueError(f"got masks for {len(masks)} layers, the model has {len(layers)}")
    held = [layer.__dict__.pop("routing_masks", None) for layer in layers]  # non-leaf tensors cannot be deep-copied
    try:
        model = copy.deepcopy(model)
    finally:
        for layer, g in zip(layers, held, strict=True):
            if isinstance(layer, _RoutedLayer):
                layer.routing_masks = g
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    layers = decoder_layers(model)
    for i, g in enumerate(masks):
        layers[i] = CompiledDecoderLayer.from_layer(layers[i], g, i, model.config)
    return model.eval()


# ---------------------------------------------------------------- save / load

def save_compiled(model: nn.Module, out_dir: Path, tokenizer: Any = None) -> None:
    """`config.json` (base config), `routing.json` (lanes π as index lists per layer), `model.safetensors`,
    `generation_config.json`, and the tokenizer when given. Load with `load_compiled(out_dir)`."""
    from safetensors.torch import save_model

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    layers = decoder_layers(model)
    if not all(isinstance(layer, CompiledDecoderLayer) for layer in layers):
        raise TypeError("save_compiled takes the output of compile_model")
    model.config.save_pretrained(out_dir)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out_dir)
    meta = {"format": FORMAT, "layers": [{"routing": layer.routing, "bias": layer.bias_flags} for layer in layers]}
    (out_dir / "routing.json").write_text(json.dumps(meta) + "\n")
    save_model(model, str(out_dir / "model.safetensors"))
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)


def load_compiled(out_dir: Path) -> nn.Module:
    """The model saved by `save_compiled`, in eval mode, ready for forward / `generate()`."""
    from safetensors.torch import load_model
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    out_dir = Path(out_dir)
    meta = json.loads((out_dir / "routing.json").read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{out_dir} is not a compiled fedprune model (format {meta.get('format')!r})")
    config = AutoConfig.from_pretrained(out_dir)
    n_layers = config.num_hidden_layers
    config.num_hidden_layers = 0  # build the shell without dense decoder layers, then add the compiled ones
    model = AutoModelForCausalLM.from_config(config)
    model.config.num_hidden_layers = config.num_hidden_layers = n_layers
    layers = model.get_decoder().layers
    layers.extend(CompiledDecoderLayer(model.config, i, spec["routing"], spec["bias"])
                  for i, spec in enumerate(meta["layers"]))
    model.to(model.get_input_embeddings().weight.dtype)
    load_model(model, str(out_dir / "model.safetensors"), strict=True)
    if (out_dir / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(out_dir)
    return model.eval()






def mask_statistics(masks: Mapping[int, Mapping[str, np.ndarray]]) -> dict[str, Any]:
    """Per client and mask, the density of each layer (Fig. 5); per mask and layer, the share of coordinates
    on which every client agrees (Fig. 3's agreement)."""
    clients = sorted(masks)
    density = {str(k): {n: masks[k][n].mean(axis=1).round(4).tolist() for n in MASK_NAMES} for k in clients}
    agreement = {}
    for n in MASK_NAMES:
        stack = np.stack([masks[k][n] for k in clients])  # clients × layers × d
        agreement[n] = (stack.all(axis=0) | ~stack.any(axis=0)).mean(axis=1).round(4).tolist()
    return {"clients": clients, "density": density, "agreement": agreement,
            "mean-agreement": float(np.mean([np.mean(v) for v in agreement.values()]))}
