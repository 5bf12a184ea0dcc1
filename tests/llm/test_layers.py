"""`decoder_layers` (one rule for every method) on LLaMA- and OPT-shaped tiny models, bare and
peft-wrapped, with the names `layer_prefix` / `prunable_names` derive from it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM

from fedprune_app.llm.layers import decoder_layers, layer_prefix, prunable_names


def _llama() -> nn.Module:
    torch.manual_seed(0)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=3,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=32,
        )
    )


def _opt() -> nn.Module:
    torch.manual_seed(0)
    return OPTForCausalLM(
        OPTConfig(
            vocab_size=64,
            hidden_size=16,
            ffn_dim=32,
            num_hidden_layers=3,
            num_attention_heads=2,
            max_position_embeddings=32,
            word_embed_proj_dim=16,
        )
    )


@pytest.mark.parametrize(
    ("build", "stack", "linears"),
    [
        (
            _llama,
            "model.layers",
            [
                "self_attn.q_proj",
                "self_attn.k_proj",
                "self_attn.v_proj",
                "self_attn.o_proj",
                "mlp.gate_proj",
                "mlp.up_proj",
                "mlp.down_proj",
            ],
        ),
        (
            _opt,
            "model.decoder.layers",
            [
                "self_attn.k_proj",
                "self_attn.v_proj",
                "self_attn.q_proj",
                "self_attn.out_proj",
                "fc1",
                "fc2",
            ],
        ),  # OPT's blocks have self_attn but no `mlp`
    ],
    ids=["llama", "opt"],
)
def test_decoder_layers_of_llama_and_opt(
    build: Callable[[], nn.Module], stack: str, linears: list[str]
) -> None:
    model = build()
    layers = decoder_layers(model)
    assert layers is model.get_submodule(stack) and len(layers) == 3
    assert layer_prefix(model) == stack + "."
    assert prunable_names(model) == [
        f"{stack}.{j}.{name}.weight" for j in range(3) for name in linears
    ]
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert decoder_layers(wrapped) is layers  # LoRA's ModuleDicts are no stack of blocks


def test_a_block_with_self_attn_and_mlp_counts_without_a_linear() -> None:
    """SFT-P's compiled layer whose lanes are all empty holds no nn.Linear
    (self_attn = mlp = None)."""

    class Skipped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.self_attn, self.mlp = None, None

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = nn.ModuleList([nn.Linear(2, 2)])  # a shorter list of blocks with a linear
            self.layers = nn.ModuleList([Skipped(), nn.Sequential(nn.Linear(2, 2)), Skipped()])

    model = Model()
    assert decoder_layers(model) is model.layers  # the longest qualifying list
    with pytest.raises(ValueError, match="found no decoder layers"):
        decoder_layers(nn.Sequential(nn.Linear(2, 2), nn.ModuleList([nn.LayerNorm(2)])))
