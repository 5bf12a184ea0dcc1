"""Residual-safe routing of the bus (SFT-P §3.1, Eq. 1–9; Appx. A.1, Eq. 16–18), shared by every
structural method: the masked training form (`masked`), parameter accounting T(g), and the compiled
deployable model.

The residual bus stays d-wide. Per decoder layer and submodule m ∈ {attn, ffn} the masks g^{m,in},
g^{m,out} ∈ {0,1}^d (Eq. 7–9) pick the lanes π^{m,in}, π^{m,out}. Masked form (training, gradients
reach g): `x_in = route(x, g_in, norm_m)`, `x = merge(x, f_m(x_in), g_out)`. Compiled form
(deployment): dense sub-matrices W[:, π_in] / W_out[π_out, :] with `index_select` / `index_add_` —
the same function, smaller and faster.

Choices where the paper is silent:
- Norm (Eq. 3): RMS statistics over the |π_in| active coordinates only (ones: exactly the dense
  RMSNorm), times the norm weight; LLaMA-family RMSNorm (weight · x̂; Gemma's (1 + weight) form is
  not covered).
- An empty lane (|π_in| = 0 or |π_out| = 0) skips the submodule in the compiled form. Without
  projection biases (LLaMA) f(0) = 0, so the masked form agrees untouched and the gate gradients
  stay alive; with biases the masked update is multiplied by the constant 1[|π_in| > 0] so both
  forms agree.
- A skipped attention still writes zero keys/values to the KV cache, so every layer's cache length
  (which HF reads for positions and masks) stays right.
- LoRA: `compile_model` merges the adapters (peft `merge_and_unload`) on its copy before slicing.

The compiled model is `hf.FedpruneRoutedLlamaForCausalLM` (self-contained HF code, the one
implementation of the compiled forward). `save_compiled` writes a standard HF directory that loads
with `load_compiled(out_dir)` or, without fedprune,
`AutoModelForCausalLM.from_pretrained(out_dir, trust_remote_code=True)` (docs/artefacts.md);
`load_compiled` also reads directories of the earlier format ("fedprune-compiled/1").
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedprune_app.llm.layers import decoder_layers
from fedprune_app.llm.models import base_config_values
from fedprune_app.structural.hf.configuration_fedprune_routed_llama import (
    MASK_NAMES,
    FedpruneRoutedLlamaConfig,
)
from fedprune_app.structural.hf.modeling_fedprune_routed_llama import (  # noqa: F401 (re-exported)
    SPLIT_GATE_UP_ROWS,
    CompiledAttention,
    CompiledDecoderLayer,
    CompiledMLP,
    FedpruneRoutedLlamaForCausalLM,
    _input_major,
    _Lane,
)

LayerMasks = dict[str, torch.Tensor]
# routing.json's format; "fedprune-compiled/1": written before the HF model class
FORMAT = "fedprune-compiled/2"


# ---------------------------------------------------------------- masked form (Eq. 1–6)


def route(x: Tensor, g: Tensor, norm: nn.Module) -> Tensor:
    """Eq. 1 + 3 on the d-wide bus: Norm(x ⊙ g) with the RMS over the sum(g) active coordinates,
    times the norm weight (zeros off the lane). Computed in (at least) float32 like HF's RMSNorm; an
    empty lane gives zeros."""
    eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
    g = g.to(
        x.device
    )  # masks from a generator elsewhere (e.g. on the CPU) follow the hidden states
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
    """Mixin put in front of a decoder layer's class by `install_routing`: the masked form when
    masks are set."""

    routing_masks: LayerMasks | None

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
        g = self.routing_masks
        if g is None:
            return super().forward(  # type: ignore[misc]
                hidden_states,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=past_key_values,
                use_cache=use_cache,
                position_embeddings=position_embeddings,
                **kwargs,
            )
        x = hidden_states
        x_in = route(x, g["attn-in"], self.input_layernorm)
        update, _ = self.self_attn(
            hidden_states=x_in,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            position_embeddings=position_embeddings,
            **kwargs,
        )
        x = merge(x, update, self._live_out(g, "attn"))
        x_in = route(x, g["ffn-in"], self.post_attention_layernorm)
        return merge(x, self.mlp(x_in), self._live_out(g, "ffn"))

    def _live_out(self, g: LayerMasks, m: str) -> Tensor:
        """g_out, times the constant 1[|π_in| > 0] when the submodule has biases (see the module
        docstring)."""
        if not self.routing_bias[m]:
            return g[f"{m}-out"]
        return g[f"{m}-out"] * (g[f"{m}-in"].detach().sum() > 0).to(g[f"{m}-out"].dtype)


_ROUTED_CLASSES: dict[type, type] = {}


def install_routing(model: nn.Module) -> None:
    """Patch every decoder layer (its class becomes a subclass with the masked forward, §3.1 Eq.
    3–6) of a HF LLaMA-family causal LM, peft-wrapped or not. With no masks set it is exactly the
    original layer."""
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
    """One LayerMasks per decoder layer (None, or a None entry = dense) put on the routed layers;
    only `masked` calls it, so that every mask has a scope. The tensors are used as given, so
    gradients flow from the loss into them (and through them to the gate surrogate)."""
    layers = decoder_layers(model)
    if not all(isinstance(layer, _RoutedLayer) for layer in layers):
        raise RuntimeError("call install_routing(model) before routing it by masks")
    masks = [None] * len(layers) if masks is None else list(masks)
    if len(masks) != len(layers):
        raise ValueError(f"got masks for {len(masks)} layers, the model has {len(layers)}")
    for g in masks:  # every layer checked before any is changed
        if g is not None and set(g) != set(MASK_NAMES):
            raise KeyError(f"layer masks must have exactly the keys {MASK_NAMES}, got {sorted(g)}")
    for layer, g in zip(layers, masks, strict=True):
        layer.routing_masks = g


@contextmanager
def masked(model: nn.Module, masks: Sequence[LayerMasks | None] | None) -> Iterator[nn.Module]:
    """`model` routed by `masks` (one LayerMasks per decoder layer; None = dense) inside the block;
    on leaving, also by an exception, the masks it had before, so blocks nest (as peft's
    `with model.disable_adapter():`). Outside every block a routed model is dense. The masks'
    tensors are used as given: a loss computed inside the block carries gradients to them (backward
    may run after the block)."""
    layers = decoder_layers(model)
    previous = [getattr(layer, "routing_masks", None) for layer in layers]
    set_masks(model, masks)
    try:
        yield model
    finally:
        for layer, g in zip(layers, previous, strict=True):
            layer.routing_masks = g


class MaskedModel(nn.Module):
    """A routed model whose every call runs under `masked(model, masks)`: what a strategy hands out
    as its global model (server evaluation scores it like any model) without leaving the masks on
    the shared cached model. Attributes other than `model` and `masks` (config, generation settings,
    ...) are the routed model's."""

    def __init__(self, model: nn.Module, masks: Sequence[LayerMasks] | None) -> None:
        super().__init__()
        self.model, self.masks = model, masks

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The routed model's forward under the masks."""
        with masked(self.model, self.masks):
            return self.model(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "model":  # not set yet (a copy under construction)
                raise
            return getattr(self.model, name)


# --------------------------------------------------------------- parameter accounting T(g) (Eq. 13)


def bus_dims(config: Any) -> tuple[int, int, int, int, int]:
    """(d, q_out + k_out + v_out, o_in, gate_out + up_out, down_in): the weights one kept bus
    coordinate keeps in an attention input lane (q/k/v rows), its output lane (o columns), an FFN
    input lane (gate/up rows) and its output lane (down columns)."""
    d = int(config.hidden_size)
    head_dim = int(getattr(config, "head_dim", None) or d // config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    q_out = int(config.num_attention_heads) * head_dim
    inter = int(config.intermediate_size)
    return d, q_out + 2 * kv * head_dim, q_out, 2 * inter, inter


def kept_parameters(config: Any, masks: Sequence[LayerMasks]) -> Tensor:
    """T(g) of Eq. 13, differentiable in the masks: weights of the pruned projections that the masks
    keep. Per layer: attn |in|·(q_out + k_out + v_out) + |out|·o_in; ffn
    |in|·(gate_out + up_out) + |out|·down_in, |in| = g.sum(). A submodule with an empty lane counts
    0 (the compiled model drops it; the indicator is a constant). Norm weights and biases are not
    counted (O(d) each; `prunable_parameters` likewise)."""
    _, attn_in, attn_out, ffn_in, ffn_out = bus_dims(config)
    total = torch.zeros((), device=masks[0]["attn-in"].device if masks else "cpu")
    for g in masks:
        for m, per_in, per_out in (("attn", attn_in, attn_out), ("ffn", ffn_in, ffn_out)):
            n_in, n_out = g[f"{m}-in"].float().sum(), g[f"{m}-out"].float().sum()
            live = ((n_in.detach() > 0) & (n_out.detach() > 0)).float()
            total = total + live * (n_in * per_in + n_out * per_out)
    return total


def coordinate_costs(config: Any) -> dict[str, int]:
    """Parameters one kept bus coordinate of each mask adds to `kept_parameters` (all lanes
    non-empty)."""
    _, attn_in, attn_out, ffn_in, ffn_out = bus_dims(config)
    return {"attn-in": attn_in, "attn-out": attn_out, "ffn-in": ffn_in, "ffn-out": ffn_out}


def fill_budget(
    scores: Mapping[str, np.ndarray],
    costs: Mapping[str, int],
    target: float,
    forced: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The top of one global ranking that fits a parameter budget: {name: bool (layers, d)}.

    The `forced` coordinates are kept first; then all others of all layers and masks, in descending
    score order (stable: ties by mask, layer, index), are kept while the running cost (`costs` per
    coordinate of each mask) stays ≤ `target`; the first that does not fit ends the fill. So the
    kept set is the top of the ranking and its cost lies within one coordinate's cost below the
    target (above it only when the forced ones exceed it). The cost assumes every lane non-empty
    (`kept_parameters` counts an empty lane's submodule as 0).
    """
    names = [n for n in MASK_NAMES if n in scores]
    flat = np.concatenate([np.asarray(scores[n], np.float64).reshape(-1) for n in names])
    cost = np.concatenate([np.full(np.asarray(scores[n]).size, costs[n], np.int64) for n in names])
    keep = (
        np.zeros(flat.size, dtype=bool)
        if forced is None
        else np.concatenate([np.asarray(forced[n], bool).reshape(-1) for n in names])
    )
    spent = int(cost[keep].sum())
    for i in np.argsort(-flat, kind="stable"):
        if keep[i]:
            continue
        if spent + cost[i] > target:
            break
        keep[i] = True
        spent += int(cost[i])
    shape = np.asarray(scores[names[0]]).shape
    parts = keep.reshape(len(names), *shape)
    return {n: parts[j].copy() for j, n in enumerate(names)}


def prunable_parameters(config: Any) -> int:
    """T_total: `kept_parameters` at all-ones masks (q/k/v/o/gate/up/down weights of every decoder
    layer)."""
    d, attn_in, attn_out, ffn_in, ffn_out = bus_dims(config)
    return int(config.num_hidden_layers) * d * (attn_in + attn_out + ffn_in + ffn_out)


def kept_ratios(kept: float, prunable_total: int, model_total: int) -> dict[str, float]:
    """Kept share of the prunable projections, T/T_total, and of the whole model,
    1 − (T_total − T)/N."""
    return {
        "kept-ratio-prunable": kept / prunable_total,
        "kept-ratio-model": 1 - (prunable_total - kept) / model_total,
    }


def backbone_parameters(model: nn.Module) -> int:
    """N: parameters of the backbone (LoRA tensors excluded, tied weights counted once)."""
    return sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)


def model_kept_ratios(model: nn.Module, masks: Sequence[LayerMasks] | None) -> dict[str, float]:
    """`kept_ratios` of a routed model under `masks` (None = dense): what SFT-P's and fedflap's
    clients report."""
    total = prunable_parameters(model.config)
    kept = float(total if masks is None else kept_parameters(model.config, masks))
    return kept_ratios(kept, total, backbone_parameters(model))


# ------------------------------------------------------------- compiled form (Appx. A.1, Eq. 16–18)
# The compiled classes (`CompiledDecoderLayer`, ..., `FedpruneRoutedLlamaForCausalLM`) live in
# `hf/`, imported above.


def _lanes(
    layer: nn.Module, g: LayerMasks | None, d: int
) -> tuple[dict[str, list[int]], dict[str, list[bool]]]:
    """The lanes π (index lists) of hard masks g (bool or 0/1, thresholded at 0.5; None = dense) and
    the bias flags of a HF decoder layer's fused input / output projections."""
    routing = {
        name: list(range(d))
        if g is None
        else torch.nonzero(g[name].detach().float().cpu() > 0.5).flatten().tolist()
        for name in MASK_NAMES
    }
    attn, mlp = layer.self_attn, layer.mlp
    bias = {
        "attn": [attn.q_proj.bias is not None, attn.o_proj.bias is not None],
        "ffn": [mlp.gate_proj.bias is not None, mlp.down_proj.bias is not None],
    }
    return routing, bias


def _compile_layer(
    layer: nn.Module, layer_idx: int, config: FedpruneRoutedLlamaConfig
) -> CompiledDecoderLayer:
    """Slice a (merged, un-LoRA'd) HF decoder layer to the lanes of `config.layer_spec(layer_idx)`
    (Eq. 16–17)."""
    out = CompiledDecoderLayer(config, layer_idx, *config.layer_spec(layer_idx)).to(
        layer.input_layernorm.weight.device
    )
    attn, mlp = layer.self_attn, layer.mlp
    with torch.no_grad():
        if (a := out.self_attn) is not None:
            _fill(
                a,
                a.qkv_proj,
                a.o_proj,
                layer.input_layernorm,
                [attn.q_proj, attn.k_proj, attn.v_proj],
                attn.o_proj,
            )
            if hasattr(a, "q_norm"):
                a.q_norm.weight.copy_(attn.q_norm.weight)
                a.k_norm.weight.copy_(attn.k_norm.weight)
        if (f := out.mlp) is not None:
            _fill(
                f,
                f.gate_up_proj,
                f.down_proj,
                layer.post_attention_layernorm,
                [mlp.gate_proj, mlp.up_proj],
                mlp.down_proj,
            )
    return out.to(layer.input_layernorm.weight.dtype)


def _fill(
    lane: _Lane,
    fused: nn.Linear,
    last: nn.Linear,
    norm: nn.Module,
    inputs: list[nn.Linear],
    output: nn.Linear,
) -> None:
    """Copy W[:, π_in] of the input projections (fused), W_out[π_out, :] and the sliced norm weight
    (Eq. 16–17)."""
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
    """The four (layers × d) mask arrays of a model (numpy or torch, e.g. a masks.npz) as one
    `LayerMasks` per decoder layer, `compile_model`'s input."""
    as_tensor = {n: torch.as_tensor(stacked[n]) for n in MASK_NAMES}
    return [
        {n: as_tensor[n][layer] for n in MASK_NAMES}
        for layer in range(as_tensor[MASK_NAMES[0]].shape[0])
    ]


def routed_config(
    base: Any,
    lanes: Sequence[tuple[Mapping[str, Sequence[int]], Mapping[str, Sequence[bool]]]],
    qk_norm: bool = False,
) -> FedpruneRoutedLlamaConfig:
    """The compiled model's config: every value of the base (LLaMA-family) config, its model_type
    kept as `base_model_type`, the attention implementation it runs with, one `lanes` entry per
    (routing, bias), and whether the attention has q/k norms (Qwen3)."""
    values = base_config_values(base, "lanes", "num_hidden_layers", "qk_norm")
    config = FedpruneRoutedLlamaConfig(
        **values,
        qk_norm=qk_norm,
        num_hidden_layers=len(lanes),
        lanes=[FedpruneRoutedLlamaConfig.lane_spec(r, b) for r, b in lanes],
        base_model_type=str(getattr(base, "base_model_type", base.model_type)),
    )
    config._attn_implementation = base._attn_implementation
    return config


def compile_model(
    model: nn.Module, masks: Sequence[LayerMasks | None]
) -> FedpruneRoutedLlamaForCausalLM:
    """The deployable model (Appx. A.1): a `FedpruneRoutedLlamaForCausalLM` whose decoder layers are
    `CompiledDecoderLayer`s sliced from a copy of `model` (peft adapters merged with
    `merge_and_unload`) by the hard masks (bool or 0/1, thresholded at 0.5); embeddings, final norm
    and lm_head are the copy's. The input model is left untouched; the result is in eval mode
    (`save_compiled` / `save_pretrained` store it)."""
    layers = decoder_layers(model)
    if len(masks) != len(layers):
        raise ValueError(f"got masks for {len(masks)} layers, the model has {len(layers)}")
    held = [
        layer.__dict__.pop("routing_masks", None) for layer in layers
    ]  # non-leaf tensors cannot be deep-copied
    try:
        model = copy.deepcopy(model)
    finally:
        for layer, g in zip(layers, held, strict=True):
            if isinstance(layer, _RoutedLayer):
                layer.routing_masks = g
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    layers, d = decoder_layers(model), int(model.config.hidden_size)
    config = routed_config(
        model.config,
        [_lanes(layer, g, d) for layer, g in zip(layers, masks, strict=True)],
        qk_norm=hasattr(layers[0].self_attn, "q_norm"),
    )
    decoder = model.get_decoder()
    if not all(hasattr(decoder, n) for n in ("embed_tokens", "norm", "rotary_emb")):
        raise TypeError(
            f"compile_model takes a LLaMA-family causal LM (embed_tokens, norm, rotary_emb), got "
            f"{type(model).__name__}"
        )
    with torch.device(
        "meta"
    ):  # the shell allocates nothing: every module is replaced by the copy's or a sliced one
        out = FedpruneRoutedLlamaForCausalLM(config)
    out.model.embed_tokens, out.model.norm = decoder.embed_tokens, decoder.norm
    out.model.rotary_emb = decoder.rotary_emb
    out.lm_head = model.get_output_embeddings()
    for i in range(len(layers)):
        out.model.layers[i] = _compile_layer(layers[i], i, config)
        layers[i] = nn.Identity()  # the dense layer is no longer needed
    if any(t.is_meta for t in [*out.parameters(), *out.buffers()]):
        raise TypeError(
            f"compile_model: {type(model).__name__} has modules the compiled LLaMA model "
            "does not take"
        )
    out.generation_config = copy.deepcopy(model.generation_config)
    return out.eval()


# ---------------------------------------------------------------- save / load


def save_compiled(model: nn.Module, out_dir: Path, tokenizer: Any = None) -> None:
    """A standard Hugging Face model directory (`save_pretrained`): `config.json` (model_type
    "fedprune_routed_llama", the lanes, an `auto_map` to the two code files), `model.safetensors`,
    `generation_config.json`,
    `configuration_fedprune_routed_llama.py` + `modeling_fedprune_routed_llama.py`, the tokenizer
    when given, and `routing.json` (the lanes as index lists, for reading; the loaders use
    config.json). Loads with `load_compiled(out_dir)` or
    `AutoModelForCausalLM.from_pretrained(out_dir, trust_remote_code=True)`."""
    if not isinstance(model, FedpruneRoutedLlamaForCausalLM):
        raise TypeError(
            f"save_compiled takes the output of compile_model, got {type(model).__name__}"
        )
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    meta = {
        "format": FORMAT,
        "layers": [
            {"routing": layer.routing, "bias": layer.bias_flags} for layer in model.model.layers
        ],
    }
    (out_dir / "routing.json").write_text(json.dumps(meta) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)


def load_compiled(out_dir: Path) -> FedpruneRoutedLlamaForCausalLM:
    """The model saved by `save_compiled`, in eval mode, ready for forward / `generate()`; also a
    directory written before the HF model class (config.json of the base model + routing.json of
    format "fedprune-compiled/1")."""
    out_dir = Path(out_dir)
    config = json.loads((out_dir / "config.json").read_text())
    if config.get("model_type") == FedpruneRoutedLlamaConfig.model_type:
        return FedpruneRoutedLlamaForCausalLM.from_pretrained(out_dir).eval()
    return _load_format_1(out_dir)


def _load_format_1(out_dir: Path) -> FedpruneRoutedLlamaForCausalLM:
    """A compiled model saved before `FedpruneRoutedLlamaForCausalLM`: base config.json,
    routing.json (format "fedprune-compiled/1": per layer the lanes as index lists and the bias
    flags), model.safetensors with the same tensor names."""
    from safetensors.torch import load_model
    from transformers import AutoConfig, GenerationConfig

    routing = out_dir / "routing.json"
    meta = json.loads(routing.read_text()) if routing.exists() else {}
    if meta.get("format") != "fedprune-compiled/1":
        raise ValueError(
            f"{out_dir} is not a compiled fedprune model (config.json model_type is not "
            f"{FedpruneRoutedLlamaConfig.model_type!r} and routing.json format is "
            f"{meta.get('format')!r}, not 'fedprune-compiled/1')"
        )
    config = routed_config(
        AutoConfig.from_pretrained(out_dir),
        [(spec["routing"], spec["bias"]) for spec in meta["layers"]],
    )
    model = FedpruneRoutedLlamaForCausalLM(config)
    model.to(
        config.dtype
        if isinstance(config.dtype, torch.dtype)
        else getattr(torch, str(config.dtype or "float32"))
    )
    load_model(model, str(out_dir / "model.safetensors"), strict=True)
    if (out_dir / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(out_dir)
    return model.eval()


def mask_statistics(masks: Mapping[int, Mapping[str, np.ndarray]]) -> dict[str, Any]:
    """Per client and mask, the density of each layer (Fig. 5); per mask and layer, the share of
    coordinates on which every client agrees (Fig. 3's agreement); per client, `shared-cut`: the
    share of the coordinates it drops (all masks and layers) that every client drops (1.0 = its cut
    is the common cut; how far the private e_k moves a client's mask away from the others)."""
    clients = sorted(masks)
    density = {
        str(k): {n: masks[k][n].mean(axis=1).round(4).tolist() for n in MASK_NAMES} for k in clients
    }
    agreement = {}
    for n in MASK_NAMES:
        stack = np.stack([masks[k][n] for k in clients])  # clients × layers × d
        agreement[n] = (stack.all(axis=0) | ~stack.any(axis=0)).mean(axis=1).round(4).tolist()
    dropped_by_all = {n: ~np.stack([masks[k][n] for k in clients]).any(axis=0) for n in MASK_NAMES}
    shared = {}
    for k in clients:
        dropped = sum(int((~masks[k][n]).sum()) for n in MASK_NAMES)
        common = sum(int(dropped_by_all[n].sum()) for n in MASK_NAMES)
        shared[str(k)] = round(common / dropped, 4) if dropped else 1.0
    return {
        "clients": clients,
        "density": density,
        "agreement": agreement,
        "mean-agreement": float(np.mean([np.mean(v) for v in agreement.values()])),
        "shared-cut": shared,
    }
