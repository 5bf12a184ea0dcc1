"""SFT-P routing (§3.1, Appx. A.1): masked form, compiled form, T(g), save/load, generation — on the
tiny LLaMA."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from fedprune_app.llm.layers import decoder_layers
from fedprune_app.llm.models import add_lora, load_base_model
from fedprune_app.structural.routing import (
    MASK_NAMES,
    CompiledDecoderLayer,
    LayerMasks,
    compile_model,
    install_routing,
    kept_parameters,
    load_compiled,
    masked,
    merge,
    prunable_parameters,
    route,
    save_compiled,
)
from tests.conftest import small_config

D = 64  # tiny LLaMA hidden size
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
COMPILED = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def _sharpen(model: nn.Module) -> nn.Module:
    """Random init at std 0.02 makes every layer nearly the identity and greedy decoding repeat one
    token; scaled weights make the logits depend on the routed context, so the comparisons below can
    fail."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(10.0)
    return model


@pytest.fixture()
def model(tiny_model_dir: Path) -> nn.Module:
    return _sharpen(load_base_model(str(tiny_model_dir)))


def random_masks(layers: int, density: dict[str, float], seed: int) -> list[LayerMasks]:
    """Float 0/1 masks with exactly round(density·d) ones per mask (a density 0 gives an empty
    lane)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(layers):
        masks = {}
        for name in MASK_NAMES:
            g = torch.zeros(D)
            g[torch.randperm(D, generator=gen)[: round(density[name] * D)]] = 1.0
            masks[name] = g
        out.append(masks)
    return out


def uniform(p: float) -> dict[str, float]:
    return dict.fromkeys(MASK_NAMES, p)


def _ids(batch: int = 2, seq: int = 10, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 2000, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _logits(
    model: nn.Module, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=attention_mask).logits


def test_route_is_rmsnorm_on_the_lane_and_merge_is_index_add(model: nn.Module) -> None:
    norm = model.model.layers[0].input_layernorm
    with torch.no_grad():
        norm.weight.copy_(torch.randn(D))
    x, u = torch.randn(2, 5, D), torch.randn(2, 5, D)
    g = random_masks(1, uniform(0.4), seed=1)[0]["attn-in"]
    pi = torch.nonzero(g).flatten()
    lane_norm = type(norm)(len(pi), eps=norm.variance_epsilon)
    with torch.no_grad():
        lane_norm.weight.copy_(norm.weight[pi])
        routed = route(x, g, norm)
        torch.testing.assert_close(routed[..., pi], lane_norm(x[..., pi]))
        assert torch.equal(routed[..., g == 0], torch.zeros_like(routed[..., g == 0]))
        torch.testing.assert_close(route(x, torch.ones(D, dtype=torch.bool), norm), norm(x))
        torch.testing.assert_close(merge(x, u, g.bool()), x.index_add(-1, pi, u[..., pi]))


def test_no_masks_and_all_ones_masks_equal_the_original(model: nn.Module) -> None:
    ids = _ids()
    reference = _logits(model, ids)
    install_routing(model)
    assert torch.equal(_logits(model, ids), reference)
    with masked(model, [{k: torch.ones(D) for k in MASK_NAMES}] * 2):
        torch.testing.assert_close(_logits(model, ids), reference, atol=1e-5, rtol=1e-5)
        with masked(model, random_masks(2, uniform(0.5), seed=0)):
            assert not torch.allclose(_logits(model, ids), reference, atol=1e-2)
            with masked(model, None):
                assert torch.equal(_logits(model, ids), reference)
        torch.testing.assert_close(
            _logits(model, ids), reference, atol=1e-5, rtol=1e-5
        )  # the outer masks back
    assert torch.equal(_logits(model, ids), reference)  # dense outside every block


def test_masked_restores_the_previous_masks_on_an_error(model: nn.Module) -> None:
    install_routing(model)
    ids = _ids()
    reference = _logits(model, ids)
    outer = random_masks(2, uniform(0.5), seed=1)
    with masked(model, outer):
        routed = _logits(model, ids)
        bad = [
            random_masks(1, uniform(0.3), seed=3)[0],
            {"attn-in": torch.ones(D)},
        ]  # the second layer's
        with pytest.raises(KeyError, match="exactly the keys"), masked(model, bad):
            pass
        with (
            pytest.raises(RuntimeError, match="inner"),
            masked(model, random_masks(2, uniform(0.3), seed=2)),
        ):
            raise RuntimeError("inner")
        assert torch.equal(_logits(model, ids), routed)
    assert torch.equal(_logits(model, ids), reference)


CASES = {
    "attn sparse, ffn dense-ish": {"attn-in": 0.3, "attn-out": 0.4, "ffn-in": 0.8, "ffn-out": 0.9},
    "attn dense-ish, ffn sparse": {"attn-in": 0.9, "attn-out": 0.7, "ffn-in": 0.25, "ffn-out": 0.2},
    "nearly empty": {"attn-in": 1 / D, "attn-out": 0.5, "ffn-in": 0.6, "ffn-out": 2 / D},
    "empty lanes": {"attn-in": 0.0, "attn-out": 0.5, "ffn-in": 0.5, "ffn-out": 0.0},
    "full lanes in": {
        "attn-in": 1.0,
        "attn-out": 0.5,
        "ffn-in": 1.0,
        "ffn-out": 0.4,
    },  # no index_select
    "full lanes out": {
        "attn-in": 0.6,
        "attn-out": 1.0,
        "ffn-in": 0.3,
        "ffn-out": 1.0,
    },  # no index_add
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_masked_equals_compiled(model: nn.Module, case: str, attn: str) -> None:
    model.set_attn_implementation(attn)
    masks = random_masks(2, CASES[case], seed=len(case))
    masks[1] = random_masks(1, uniform(0.5), seed=7)[0]  # the second layer: a moderate mask
    ids = _ids(seq=12)
    padding = torch.ones_like(ids)
    padding[1, :4] = 0  # left padding in the second row exercises the attention mask
    install_routing(model)
    with masked(model, masks):
        routed = _logits(model, ids, padding)
        compiled = compile_model(model, masks)
        assert all(isinstance(layer, CompiledDecoderLayer) for layer in compiled.model.layers)
        torch.testing.assert_close(_logits(compiled, ids, padding), routed, atol=1e-4, rtol=1e-5)
        assert torch.equal(_logits(model, ids, padding), routed)  # the input model is untouched
    bool_masks = [{k: v.bool() for k, v in g.items()} for g in masks]
    torch.testing.assert_close(
        _logits(compile_model(model, bool_masks), ids, padding), routed, atol=1e-4, rtol=1e-5
    )


def test_compiled_autograd_path_equals_the_inference_path(model: nn.Module) -> None:
    """With autograd on, the compiled layers skip their in-place kernels: same logits, and gradients
    flow."""
    masks = random_masks(2, CASES["full lanes out"], seed=6)
    masks[1] = random_masks(1, uniform(0.8), seed=8)[0]  # |π| = 51: the transposed output product
    compiled = compile_model(model, masks)
    ids = _ids(seq=12)
    logits = compiled(input_ids=ids).logits
    torch.testing.assert_close(logits, _logits(compiled, ids), atol=1e-5, rtol=1e-5)
    logits.logsumexp(-1).mean().backward()
    grads = [
        p.grad
        for n, p in compiled.named_parameters()
        if n.endswith(("norm_weight", "o_proj.weight"))
    ]
    assert len(grads) == 6 and all(g is not None and g.abs().sum() > 0 for g in grads)


def test_kept_parameters_counts_the_compiled_projections(model: nn.Module) -> None:
    dense = sum(
        p.numel()
        for n, p in model.named_parameters()
        if n.endswith(tuple(f"{x}.weight" for x in PROJ))
    )
    assert prunable_parameters(model.config) == dense
    assert (
        float(kept_parameters(model.config, [{k: torch.ones(D) for k in MASK_NAMES}] * 2)) == dense
    )
    total = sum(p.numel() for p in model.parameters())
    for seed, density in enumerate(
        [uniform(0.5), uniform(0.8), CASES["nearly empty"], CASES["empty lanes"]]
    ):
        masks = random_masks(2, density, seed)
        compiled = compile_model(model, masks)
        kept = sum(
            p.numel()
            for n, p in compiled.named_parameters()
            if n.endswith(tuple(f"{x}.weight" for x in COMPILED))
        )
        assert float(kept_parameters(model.config, masks)) == kept
        assert sum(p.numel() for p in compiled.parameters()) < total


def test_kept_parameters_gradient_is_the_per_lane_cost(model: nn.Module) -> None:
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    per = {
        "attn-in": attn.q_proj.out_features + attn.k_proj.out_features + attn.v_proj.out_features,
        "attn-out": attn.o_proj.in_features,
        "ffn-in": mlp.gate_proj.out_features + mlp.up_proj.out_features,
        "ffn-out": mlp.down_proj.in_features,
    }
    masks = [
        {k: v.requires_grad_() for k, v in g.items()} for g in random_masks(2, uniform(0.5), seed=3)
    ]
    kept_parameters(model.config, masks).backward()
    for g in masks:
        for name, cost in per.items():
            assert torch.equal(g[name].grad, torch.full((D,), float(cost)))


def test_gradients_reach_the_masks_and_match_finite_differences(model: nn.Module) -> None:
    model.double()
    install_routing(model)
    masks = [
        {k: v.double().requires_grad_() for k, v in g.items()}
        for g in random_masks(2, uniform(0.6), seed=5)
    ]
    ids = _ids(batch=1, seq=8)

    def loss() -> torch.Tensor:  # next-token CE in float64 (HF's loss upcasts only to float32)
        with masked(model, masks):
            logits = model(input_ids=ids).logits[0, :-1]
        return nn.functional.cross_entropy(logits, ids[0, 1:])

    loss().backward()
    eps = 1e-3  # HF's final RMSNorm rounds to float32 even in a float64 model
    for layer in range(2):
        for name in MASK_NAMES:
            grad = masks[layer][name].grad
            assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
            i = int(torch.argmax(grad.abs()))
            with torch.no_grad():
                masks[layer][name][i] += eps
                up = loss()
                masks[layer][name][i] -= 2 * eps
                down = loss()
                masks[layer][name][i] += eps
            torch.testing.assert_close((up - down) / (2 * eps), grad[i], rtol=1e-3, atol=1e-4)
    surrogate = [
        {k: v * 1.0 for k, v in g.items()} for g in masks
    ]  # non-leaf, as a straight-through gate gives
    with masked(model, surrogate):
        routed = _logits(model, ids)
        torch.testing.assert_close(
            _logits(compile_model(model, surrogate), ids), routed, atol=1e-8, rtol=1e-8
        )


def test_lora_model_routes_and_compiles_with_merged_adapters(
    model: nn.Module, tiny_model_dir: Path
) -> None:
    peft_model = add_lora(model, small_config(tiny_model_dir), seed=0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)  # B = 0 at init: the adapters would change nothing
    ids = _ids()
    reference = _logits(peft_model, ids)
    install_routing(peft_model)
    with masked(peft_model, [{k: torch.ones(D) for k in MASK_NAMES}] * 2):
        torch.testing.assert_close(_logits(peft_model, ids), reference, atol=1e-5, rtol=1e-5)
    masks = random_masks(2, uniform(0.5), seed=11)
    with masked(peft_model, masks):
        routed = _logits(peft_model, ids)
    compiled = compile_model(peft_model, masks)
    assert not any("lora" in n for n, _ in compiled.named_parameters())
    torch.testing.assert_close(_logits(compiled, ids), routed, atol=1e-4, rtol=1e-5)
    assert any(
        "lora" in n for n, _ in peft_model.named_parameters()
    )  # the adapters stay on the input model


def test_projection_biases_and_empty_lanes_agree(tiny_model_dir: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=500,
        hidden_size=D,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=True,
        mlp_bias=True,
    )
    torch.manual_seed(0)
    biased = _sharpen(LlamaForCausalLM(config).eval())
    with torch.no_grad():
        for n, p in biased.named_parameters():
            if n.endswith("bias"):
                p.normal_(0.0, 1.0)
    masks = random_masks(
        2, {"attn-in": 0.0, "attn-out": 0.5, "ffn-in": 0.0, "ffn-out": 0.7}, seed=2
    )
    install_routing(biased)
    ids = _ids(seq=9) % 500
    with masked(biased, masks):
        routed = _logits(biased, ids)
    torch.testing.assert_close(
        _logits(compile_model(biased, masks), ids), routed, atol=1e-4, rtol=1e-5
    )


def test_save_load_round_trip(model: nn.Module, tmp_path: Path) -> None:
    masks = random_masks(2, CASES["attn sparse, ffn dense-ish"], seed=4)
    masks[1]["ffn-in"].zero_()  # a skipped submodule must survive the round trip
    compiled = compile_model(model, masks)
    save_compiled(compiled, tmp_path / "compiled")
    assert (tmp_path / "compiled" / "model.safetensors").exists()
    routing = json.loads((tmp_path / "compiled" / "routing.json").read_text())["layers"]
    for spec, g in zip(routing, masks, strict=True):
        for name in MASK_NAMES:
            assert spec["routing"][name] == torch.nonzero(g[name]).flatten().tolist()
    loaded = load_compiled(tmp_path / "compiled")
    ids = _ids()
    assert torch.equal(_logits(loaded, ids), _logits(compiled, ids))
    assert {n: p.shape for n, p in loaded.named_parameters()} == {
        n: p.shape for n, p in compiled.named_parameters()
    }
    assert loaded.model.layers[1].mlp is None


def test_a_fully_skipped_layer_compiles_saves_and_loads(model: nn.Module, tmp_path: Path) -> None:
    """A layer whose four lanes are all empty keeps no nn.Linear (self_attn and mlp are None); it is
    still one of the compiled model's decoder layers, so the model saves, loads and computes what
    the masked model does."""
    masks = random_masks(2, uniform(0.5), seed=5)
    for name in MASK_NAMES:
        masks[0][name].zero_()
    ids = _ids()
    install_routing(model)
    with masked(model, masks):
        routed = _logits(model, ids)
    compiled = compile_model(model, masks)
    assert compiled.model.layers[0].self_attn is None and compiled.model.layers[0].mlp is None
    assert decoder_layers(compiled) is compiled.model.layers
    save_compiled(compiled, tmp_path / "compiled")
    loaded = load_compiled(tmp_path / "compiled")
    assert loaded.model.layers[0].self_attn is None and loaded.model.layers[0].mlp is None
    torch.testing.assert_close(_logits(loaded, ids), routed, atol=1e-4, rtol=1e-5)


def _greedy_without_cache(model: nn.Module, ids: torch.Tensor, steps: int) -> torch.Tensor:
    with torch.no_grad():
        for _ in range(steps):
            nxt = model(input_ids=ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=-1)
    return ids


def test_compiled_generate_equals_masked_greedy(model: nn.Module) -> None:
    masks = random_masks(2, uniform(0.6), seed=9)
    masks[0][
        "attn-in"
    ].zero_()  # layer 0 attention skipped: the KV cache must still count its tokens
    install_routing(model)
    prompt = _ids(batch=1, seq=6, seed=3)
    with masked(model, masks):
        expected = _greedy_without_cache(model, prompt, steps=8)
        generated = model.generate(prompt, max_new_tokens=8, do_sample=False, min_new_tokens=8)
    assert len(set(expected[0, 6:].tolist())) > 1  # not a degenerate repetition
    compiled = compile_model(model, masks).generate(
        prompt, max_new_tokens=8, do_sample=False, min_new_tokens=8
    )
    assert torch.equal(generated, expected)
    assert torch.equal(compiled, expected)


def test_compiled_kv_cache_positions_with_a_skipped_first_attention(model: nn.Module) -> None:
    """Decoding with the cache and no position ids: HF takes the positions from layer 0's cache
    length."""
    masks = random_masks(2, uniform(0.6), seed=9)
    masks[0]["attn-in"].zero_()
    compiled = compile_model(model, masks)
    ids = _ids(batch=1, seq=7, seed=4)
    full = _logits(compiled, ids)[:, -1]
    with torch.no_grad():
        past = compiled(input_ids=ids[:, :-1], use_cache=True).past_key_values
        step = compiled(input_ids=ids[:, -1:], past_key_values=past, use_cache=True).logits[:, -1]
    torch.testing.assert_close(step, full, atol=1e-4, rtol=1e-5)


def test_wide_projections_are_stored_input_major_through_copy_dtype_save_and_load(
    model: nn.Module, tmp_path: Path
) -> None:
    """The fused q/k/v and gate/up weights (in = |π_in| < out) are (out, in) views of row-major (in,
    out) arrays, which MKL streams ~2× faster for one decoding token; o/down stay (out, in)
    row-major. The layout survives deepcopy, a dtype round trip and save_compiled / load_compiled,
    with the same values."""
    import copy

    def layouts(m: nn.Module) -> list[tuple[int, ...]]:
        return [
            p.stride()
            for layer in m.model.layers
            for mod in (layer.self_attn, layer.mlp)
            for p in (
                mod.qkv_proj.weight if hasattr(mod, "qkv_proj") else mod.gate_up_proj.weight,
                mod.o_proj.weight if hasattr(mod, "o_proj") else mod.down_proj.weight,
            )
        ]

    compiled = compile_model(model, random_masks(2, uniform(0.5), seed=12))
    wide = compiled.model.layers[0].mlp.gate_up_proj.weight
    assert wide.stride() == (1, wide.shape[0]) and wide.t().is_contiguous()
    assert compiled.model.layers[0].self_attn.o_proj.weight.is_contiguous()
    expected = layouts(compiled)
    assert layouts(copy.deepcopy(compiled)) == expected
    assert layouts(copy.deepcopy(compiled).double().float()) == expected
    save_compiled(compiled, tmp_path / "compiled")
    loaded = load_compiled(tmp_path / "compiled")
    assert layouts(loaded) == expected
    assert torch.equal(loaded.model.layers[0].mlp.gate_up_proj.weight, wide)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_prefill_sized_inputs_split_gate_and_up_and_still_equal_the_masked_form(
    model: nn.Module, attn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From `SPLIT_GATE_UP_ROWS` tokens on, gate and up run as two products on the halves of the
    stored weight: the same logits as the fused product and as the masked form."""
    # where CompiledMLP reads it
    import fedprune_app.structural.hf.modeling_fedprune_routed_llama as routing

    model.set_attn_implementation(attn)
    masks = random_masks(2, CASES["attn dense-ish, ffn sparse"], seed=13)
    ids = _ids(batch=2, seq=80, seed=5)  # 160 rows ≥ SPLIT_GATE_UP_ROWS
    assert ids.numel() >= routing.SPLIT_GATE_UP_ROWS
    install_routing(model)
    with masked(model, masks):
        routed = _logits(model, ids)
    compiled = compile_model(model, masks)
    split = _logits(compiled, ids)
    torch.testing.assert_close(split, routed, atol=1e-4, rtol=1e-5)
    monkeypatch.setattr(routing, "SPLIT_GATE_UP_ROWS", 10**9)
    torch.testing.assert_close(_logits(compiled, ids), split, atol=1e-6, rtol=1e-6)
