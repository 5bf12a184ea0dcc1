"""The routed-model cache (`structural.models.RoutedModels`) and the masked view a strategy hands
out (`structural.routing.MaskedModel`), on the tiny LLaMA."""

from __future__ import annotations

from pathlib import Path

import torch

from fedprune_app.llm.layers import decoder_layers
from fedprune_app.structural.models import RoutedModels
from fedprune_app.structural.routing import MASK_NAMES, MaskedModel, masked
from tests.conftest import small_config


def _masks(model: torch.nn.Module, seed: int) -> list[dict[str, torch.Tensor]]:
    d, gen = model.config.hidden_size, torch.Generator().manual_seed(seed)
    return [
        {n: (torch.rand(d, generator=gen) < 0.5).float() for n in MASK_NAMES}
        for _ in range(model.config.num_hidden_layers)
    ]


def test_the_cache_keeps_one_model_per_setting_and_drops_the_least_recent(
    tiny_model_dir: Path,
) -> None:
    cache = RoutedModels(size=1)
    cfg = small_config(tiny_model_dir, device="cpu")
    plain, _ = cache.routed(cfg, adapters=False)
    assert cache.routed(cfg, adapters=False)[0] is plain  # the same process, the same model
    assert not any(p.requires_grad for p in plain.parameters())  # the backbone is frozen
    lora, _ = cache.routed(cfg, adapters=True)
    assert lora is not plain and any("lora_" in n for n, _ in lora.named_parameters())
    assert cache.routed(cfg, adapters=False)[0] is not plain  # size 1: the plain one was dropped
    calls = []
    assert cache.massive("key", lambda: calls.append(1) or [3]) == [3]
    assert cache.massive("key", lambda: calls.append(1) or [4]) == [3] and calls == [1]


def test_a_masked_model_routes_every_call_and_leaves_the_shared_model_dense(
    tiny_model_dir: Path,
) -> None:
    model, _ = RoutedModels().routed(small_config(tiny_model_dir, device="cpu"), adapters=False)
    ids = torch.tensor([[1, 20, 300, 40, 5, 6]])
    masks = _masks(model, seed=0)
    with torch.no_grad():
        dense = model(input_ids=ids).logits
        with masked(model, masks):
            routed = model(input_ids=ids).logits
        view = MaskedModel(model, masks)
        assert torch.equal(view(input_ids=ids).logits, routed)
        assert not torch.allclose(routed, dense, atol=1e-3)
        assert torch.equal(model(input_ids=ids).logits, dense)  # the shared model stays dense
    assert all(layer.routing_masks is None for layer in decoder_layers(model))
    assert view.config is model.config
    assert view.get_input_embeddings() is model.get_input_embeddings()
