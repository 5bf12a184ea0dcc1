"""Configuration of SFT-P's compiled (routed) LLaMA-family model (§3.1; Appx. A.1, Eq. 16–18).

Self-contained: imports only transformers, so `save_pretrained` can copy this file next to the
weights and `AutoConfig.from_pretrained(dir, trust_remote_code=True)` can load it on a machine
without fedprune.

The base model's config plus `lanes`: per decoder layer the four lanes π (attn-in, attn-out, ffn-in,
ffn-out) as hex bitmasks over the d-wide residual bus (bit i of `int(text, 16)` set ⇔ coordinate i
is in the lane), and `bias`: whether the fused input projection and the output projection of each
submodule have biases. `qk_norm`: the attention normalises each head of q and k (Qwen3's q_norm,
k_norm) before the rotary embedding.
"""

from __future__ import annotations

from collections.abc import Sequence

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig

MASK_NAMES = ("attn-in", "attn-out", "ffn-in", "ffn-out")


def encode_lane(indices: Sequence[int]) -> str:
    """The lane π (coordinate indices) as a hex bitmask: bit i set ⇔ i ∈ π ("0" for an empty
    lane)."""
    return format(sum(1 << int(i) for i in set(indices)), "x")


def decode_lane(text: str, d: int) -> list[int]:
    """The sorted coordinate indices of a hex bitmask written by `encode_lane`; ValueError if it
    names a coordinate at or beyond the bus width d."""
    bits = int(text, 16)
    if bits >> d:
        raise ValueError(f"lane bitmask {text[:16]}... names a coordinate >= hidden_size {d}")
    return [i for i, b in enumerate(reversed(bin(bits)[2:])) if b == "1"]


@strict
class FedpruneRoutedLlamaConfig(LlamaConfig):
    """LlamaConfig + the lanes of every compiled decoder layer (see the module docstring)."""

    model_type = "fedprune_routed_llama"

    lanes: list | None = None
    base_model_type: str = "llama"
    qk_norm: bool = False

    def layer_spec(self, layer_idx: int) -> tuple[dict[str, list[int]], dict[str, list[bool]]]:
        """(lanes π as index lists, bias flags) of decoder layer `layer_idx`."""
        if self.lanes is None or len(self.lanes) != self.num_hidden_layers:
            have = None if self.lanes is None else len(self.lanes)
            raise ValueError(
                f"config 'lanes' must hold one entry per decoder layer ({self.num_hidden_layers}), "
                f"got {have}"
            )
        spec = self.lanes[layer_idx]
        routing = {name: decode_lane(spec[name], int(self.hidden_size)) for name in MASK_NAMES}
        bias = {m: [bool(b) for b in spec["bias"][m]] for m in ("attn", "ffn")}
        return routing, bias

    @staticmethod
    def lane_spec(routing: dict[str, Sequence[int]], bias: dict[str, Sequence[bool]]) -> dict:
        """One `lanes` entry from lane index lists and bias flags (the inverse of `layer_spec`)."""
        return {
            **{name: encode_lane(routing[name]) for name in MASK_NAMES},
            "bias": {m: [bool(b) for b in bias[m]] for m in ("attn", "ffn")},
        }
