"""Configuration of SliceGPT's compiled (sliced) model (Ashkboos et al. 2024, §3.2–3.4).

Self-contained: imports only transformers, so `save_pretrained` can copy this file next to the
weights and `AutoConfig.from_pretrained(dir, trust_remote_code=True)` can load it on a machine
without fedprune.

The base LLaMA config (LM head untied) plus `slicegpt_dims`: the width k_p of the residual stream at
each of the 2L + 1 points (p = 2l: input of layer l, p = 2l + 1: after its attention, p = 2L: input
of the final norm).
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig


@strict
class FedpruneSlicedLlamaConfig(LlamaConfig):
    """LlamaConfig + the sliced widths of the residual stream (see the module docstring)."""

    model_type = "fedprune_sliced_llama"

    slicegpt_dims: list | None = None
    base_model_type: str = "llama"
    qkv_bias: bool | None = None  # q/k/v biases apart from o_proj's (Qwen2); None: attention_bias

    def point_widths(self) -> list[int]:
        """k_p of the 2L + 1 points, checked against the config."""
        dims, n = self.slicegpt_dims, 2 * int(self.num_hidden_layers) + 1
        if (
            dims is None
            or len(dims) != n
            or not all(0 < int(k) <= int(self.hidden_size) for k in dims)
        ):
            raise ValueError(
                f"config 'slicegpt_dims' must hold {n} widths (2 per decoder layer + the head's) "
                f"in 1..{self.hidden_size}, got {dims}"
            )
        return [int(k) for k in dims]
