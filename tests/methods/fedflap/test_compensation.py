"""FLAP's bias compensation on the routed form (`fedflap.compensation`): zero means give the masked
form; the removed coordinates read / write the dense calibration means, the kept ones are untouched;
pooled means are the means over all clients' tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedprune_app.llm.layers import decoder_layers
from fedprune_app.llm.models import load_base_model
from fedprune_app.methods.fedflap.compensation import compensated, lane_means, pooled_means
from fedprune_app.methods.fedflap.importance import bus_moments
from fedprune_app.structural.routing import MASK_NAMES, install_routing, masked, route


def _setup(tiny_model_dir: Path):
    model = load_base_model(str(tiny_model_dir)).eval()
    install_routing(model)
    d, gen = model.config.hidden_size, torch.Generator().manual_seed(0)
    masks = [
        {n: (torch.rand(d, generator=gen) < 0.7).float() for n in MASK_NAMES}
        for _ in decoder_layers(model)
    ]
    ids = torch.randint(1, model.config.vocab_size, (2, 12), generator=gen)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    return model, masks, batch


@torch.no_grad()
def test_zero_means_give_the_masked_form(tiny_model_dir: Path) -> None:
    model, masks, batch = _setup(tiny_model_dir)
    with masked(model, masks):
        plain = model(input_ids=batch["input_ids"]).logits
    zeros = [{n: torch.zeros(model.config.hidden_size) for n in MASK_NAMES} for _ in masks]
    with compensated(model, masks, zeros) as m:
        assert torch.allclose(m(input_ids=batch["input_ids"]).logits, plain, atol=1e-5)
    with compensated(model, masks, zeros, lanes=()) as m:
        assert torch.allclose(m(input_ids=batch["input_ids"]).logits, plain, atol=1e-5)
    assert all(layer.routing_masks is None for layer in decoder_layers(model))  # cleared on exit


@torch.no_grad()
def test_removed_coordinates_carry_the_dense_means(tiny_model_dir: Path) -> None:
    model, masks, batch = _setup(tiny_model_dir)
    means = lane_means(bus_moments(model, [batch]))
    layer = decoder_layers(model)[0]
    seen: dict[str, torch.Tensor] = {}
    with compensated(model, masks, means) as m:
        h1 = layer.self_attn.q_proj.register_forward_pre_hook(
            lambda _m, a: seen.__setitem__("q-in", a[0])
        )
        h2 = layer.self_attn.register_forward_hook(
            lambda _m, _a, out: seen.__setitem__("write", out[0])
        )
        h3 = layer.register_forward_pre_hook(lambda _m, a: seen.__setitem__("x", a[0]))
        m(input_ids=batch["input_ids"])
        for h in (h1, h2, h3):
            h.remove()
    g_in, g_out = masks[0]["attn-in"].bool(), masks[0]["attn-out"].bool()
    # in-lane: kept coordinates = the routed input (RMS over the active lane), removed = the dense
    # mean
    routed = route(seen["x"], masks[0]["attn-in"], layer.input_layernorm)
    assert torch.allclose(seen["q-in"][..., g_in], routed[..., g_in], atol=1e-6)
    assert torch.allclose(
        seen["q-in"][..., ~g_in], means[0]["attn-in"][~g_in].expand_as(seen["q-in"][..., ~g_in])
    )
    # out-lane: a removed coordinate of the attention's write is its dense mean at every token
    assert torch.allclose(
        seen["write"][..., ~g_out],
        means[0]["attn-out"][~g_out].expand_as(seen["write"][..., ~g_out]),
    )
    # and the mean really is the dense write's mean: layer 0 reads the embeddings in both models
    dense = {}
    h = layer.self_attn.o_proj.register_forward_hook(
        lambda _m, _a, out: dense.__setitem__("y", out)
    )
    model(input_ids=batch["input_ids"])
    h.remove()
    assert torch.allclose(
        dense["y"].reshape(-1, dense["y"].shape[-1]).mean(0), means[0]["attn-out"], atol=1e-6
    )


def test_pooled_means_are_the_means_over_all_tokens(tiny_model_dir: Path) -> None:
    model, _, batch = _setup(tiny_model_dir)
    other = {
        "input_ids": batch["input_ids"][:, :7].flip(0),
        "attention_mask": torch.ones(2, 7, dtype=torch.long),
    }
    pooled = pooled_means([bus_moments(model, [batch]), bus_moments(model, [other])])
    both = lane_means(bus_moments(model, [batch, other]))
    for a, b in zip(pooled, both, strict=True):
        for n in MASK_NAMES:
            assert torch.allclose(a[n], b[n], atol=1e-6)


def test_unknown_lane_is_refused(tiny_model_dir: Path) -> None:
    model, masks, _ = _setup(tiny_model_dir)
    with (
        pytest.raises(ValueError, match="compensation lanes"),
        compensated(model, masks, [], lanes=("sideways",)),
    ):
        pass
