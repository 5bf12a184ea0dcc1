"""Configuration of LLM-Pruner's compiled model (Ma et al. 2023, §3.1: whole kv groups and MLP
channels removed).

Self-contained: imports only transformers, so `save_pretrained` can copy this file next to the
weights and `AutoConfig.from_pretrained(dir, trust_remote_code=True)` can load it on a machine
without fedprune.

The base LLaMA config plus `llmpruner_structure`: per decoder layer the kept kv groups (`kv-groups`)
and kept MLP channels (`channels`) as index lists into the dense layer (the shapes follow from their
counts).
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig


@strict
class FedprunePrunedLlamaConfig(LlamaConfig):
    """LlamaConfig + the kept kv groups and MLP channels of every decoder layer (see the module
    docstring)."""

    model_type = "fedprune_pruned_llama"

    llmpruner_structure: list | None = None
    base_model_type: str = "llama"
    qkv_bias: bool | None = None  # q/k/v biases apart from o_proj's (Qwen2); None: attention_bias

    def layer_sizes(self, layer_idx: int) -> tuple[int, int]:
        """(kept kv groups, kept MLP channels) of decoder layer `layer_idx`."""
        structure = self.llmpruner_structure
        if structure is None or len(structure) != self.num_hidden_layers:
            have = None if structure is None else len(structure)
            raise ValueError(
                f"config 'llmpruner_structure' must hold one entry per decoder layer "
                f"({self.num_hidden_layers}), got {have}"
            )
        layer = structure[layer_idx]
        kv, channels = len(layer["kv-groups"]), len(layer["channels"])
        if not 0 < kv <= self.num_key_value_heads or not 0 < channels <= self.intermediate_size:
            raise ValueError(
                f"config 'llmpruner_structure' layer {layer_idx}: {kv} kv groups (1..."
                f"{self.num_key_value_heads}) and {channels} channels "
                f"(1...{self.intermediate_size})"
            )
        return kv, channels
