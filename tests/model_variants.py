"""The model variants the packed code paths must handle (the packed evaluator, packed training):
plain LLaMA, peft LoRA, SFT-P routed and compiled, LLM-Pruner compiled, SliceGPT sliced, each built
on the tiny LLaMA with non-trivial weights or masks; and two decoders that break packing (they
ignore the mask / the positions)."""

from __future__ import annotations

import numpy as np
import torch
from transformers import LlamaModel


def peft(model):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(
        model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"])
    )
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:  # B = 0 would leave the model unchanged
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return peft_model.eval()


def masks(model, seed: int):
    from fedprune_app.structural.hf.configuration_fedprune_routed_llama import MASK_NAMES

    d, gen = model.config.hidden_size, torch.Generator().manual_seed(seed)
    return [
        {n: (torch.rand(d, generator=gen) < 0.6).float() for n in MASK_NAMES}
        for _ in range(model.config.num_hidden_layers)
    ]


def routed(model):
    from fedprune_app.structural.routing import MaskedModel, install_routing

    install_routing(model)
    return MaskedModel(model, masks(model, 1)).eval()


def compiled(model):
    from fedprune_app.structural.routing import compile_model

    return compile_model(model, masks(model, 2))


def llmpruner(model):
    from fedprune_app.methods.llmpruner.structure import compile_pruned

    keep = {
        "heads": np.ones((model.config.num_hidden_layers, model.config.num_key_value_heads), bool),
        "channels": np.random.default_rng(4).random(
            (model.config.num_hidden_layers, model.config.intermediate_size)
        )
        < 0.6,
    }
    keep["heads"][:, 0] = False
    return compile_pruned(model, keep)


def slicegpt(model):
    from fedprune_app.methods.slicegpt.sliced import num_points, slice_model

    d, gen = model.config.hidden_size, torch.Generator().manual_seed(5)
    bases = [
        torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))[0][:, : d - 3]
        for _ in range(num_points(model.config))
    ]
    return slice_model(model, bases)


class IgnoresMask(LlamaModel):
    """A decoder that ignores the attention mask it is given (plain causal attention): choices see
    each other."""

    def forward(self, *args, attention_mask=None, **kwargs):
        return super().forward(*args, **kwargs)


class IgnoresPositions(LlamaModel):
    """A decoder that ignores the positions and mask it is given: its packed scores are wrong."""

    def forward(self, *args, position_ids=None, attention_mask=None, **kwargs):
        return super().forward(*args, **kwargs)
