"""Client-side pruners and the sequential layer loop, against reference computations."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM

from fedprune_app.llm.layers import decoder_layers
from fedprune_app.methods.fedspallm.pruners import (
    capture_layer0_inputs,
    magnitude_prune,
    make_pruner,
    prune_sequentially,
    sparsegpt_prune,
    sparsity_of,
    wanda_prune,
)


def _correlated_inputs(n: int = 2048, d: int = 64, seed: int = 0) -> torch.Tensor:
    """Strongly correlated features (rank-16 signal + noise), as LLM activations are."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 16, generator=g) @ torch.randn(16, d, generator=g) + 0.1 * torch.randn(
        n, d, generator=g
    )


def _hessian(x: torch.Tensor) -> torch.Tensor:
    return 2.0 * x.T @ x / x.shape[0]


@pytest.mark.parametrize("sparsity", [0.5, 0.6])
def test_sparsegpt_reconstructs_the_layer_output_better_than_magnitude_and_wanda(
    sparsity: float,
) -> None:
    x = _correlated_inputs()
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    dense = x @ w.T

    def err(pruned: torch.Tensor) -> float:
        return float(torch.linalg.norm(dense - x @ pruned.T))

    w_sgpt, keep = sparsegpt_prune(w, _hessian(x), sparsity)
    w_mag, _ = magnitude_prune(w, sparsity)
    w_wanda, _ = wanda_prune(w, (x**2).mean(0), sparsity)
    assert sparsity_of(keep) == pytest.approx(sparsity, abs=1 / keep.numel())
    assert float((w_sgpt == 0).float().mean()) >= sparsity_of(keep)
    assert (w_sgpt[~keep] == 0).all()
    assert err(w_sgpt) < 0.6 * err(w_mag) and err(w_sgpt) < err(w_wanda)


def test_n_m_sparsity_prunes_n_of_every_m() -> None:
    x = _correlated_inputs(d=64)
    w = torch.randn(8, 64)
    for pruned, keep in (
        sparsegpt_prune(w, _hessian(x), 0.5, prunen=2, prunem=4, blocksize=32),
        wanda_prune(w, (x**2).mean(0), 0.5, 2, 4),
        magnitude_prune(w, 0.5, 2, 4),
    ):
        assert (keep.reshape(8, 16, 4).sum(-1) == 2).all() and (pruned[~keep] == 0).all()


def test_wanda_prunes_within_each_row() -> None:
    w = torch.arange(1.0, 13.0).reshape(2, 6)
    pruned, keep = wanda_prune(w, torch.ones(6), 0.5)
    assert keep.sum(1).tolist() == [3, 3] and pruned[0, :3].eq(0).all()


def _tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg).eval()


def _tiny_opt() -> OPTForCausalLM:
    torch.manual_seed(0)
    cfg = OPTConfig(
        vocab_size=128,
        hidden_size=32,
        ffn_dim=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=64,
        word_embed_proj_dim=32,
    )
    return OPTForCausalLM(cfg).eval()


@pytest.mark.parametrize("build", [_tiny_llama, _tiny_opt], ids=["llama", "opt"])
def test_layer_loop_replays_every_keyword_argument(build) -> None:
    """Replaying the captured kwargs through the layers gives the model's own hidden states (rotary
    too)."""
    model = build()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        reference = model(input_ids=ids, output_hidden_states=True).hidden_states
    inputs = capture_layer0_inputs(model, [ids])
    h = inputs.hidden[0]
    layers = decoder_layers(model)
    assert len(layers) == 3
    for j, layer in enumerate(layers[:-1]):
        with torch.no_grad():
            out = layer(h, **inputs.kwargs[0])
        h = out[0] if isinstance(out, tuple) else out
        torch.testing.assert_close(h, reference[j + 1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("build", [_tiny_llama, _tiny_opt], ids=["llama", "opt"])
def test_sparsity_zero_leaves_the_model_exactly_dense(build) -> None:
    model = build()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        before = model(input_ids=ids).logits.clone()
    masks = prune_sequentially(model, [ids], range(3), make_pruner("sparsegpt", 0.0))
    assert all(m.all() for m in masks.values()) and len(masks) == 3 * len(
        [n for n, m in decoder_layers(model)[0].named_modules() if isinstance(m, torch.nn.Linear)]
    )
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, before)


def test_only_the_sampled_layers_are_pruned() -> None:
    model = _tiny_llama()
    ids = torch.randint(0, 128, (2, 16))
    dense = {n: p.clone() for n, p in model.named_parameters()}
    masks = prune_sequentially(model, [ids], [1], make_pruner("sparsegpt", 0.5, blocksize=16))
    assert masks and all(name.startswith("model.layers.1.") for name in masks)
    for name, p in model.named_parameters():
        if name in masks:
            assert sparsity_of(masks[name]) == pytest.approx(0.5) and (p[~masks[name]] == 0).all()
        else:
            torch.testing.assert_close(p, dense[name])


@pytest.mark.parametrize("kind", ["magnitude", "wanda"])
def test_cheaper_pruners_through_the_loop_match_the_direct_call(kind: str) -> None:
    model = _tiny_llama()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(5))
    layer = decoder_layers(model)[0]
    original = layer.mlp.down_proj.weight.detach().clone()
    captured: list[torch.Tensor] = []
    handle = layer.mlp.down_proj.register_forward_hook(
        lambda _m, a, _o: captured.append(a[0].detach())
    )
    with torch.no_grad():
        model(input_ids=ids)
    handle.remove()
    x = captured[0].reshape(-1, captured[0].shape[-1])
    expected = (
        magnitude_prune(original, 0.5)[0]
        if kind == "magnitude"
        else wanda_prune(original, (x**2).mean(0), 0.5)[0]
    )
    prune_sequentially(model, [ids], [0], make_pruner(kind, 0.5))
    torch.testing.assert_close(layer.mlp.down_proj.weight, expected)


@pytest.mark.parametrize("name", ["self_attn.q_proj", "self_attn.v_proj", "mlp.up_proj"])
def test_shared_input_hessians_match_each_linears_own(name: str) -> None:
    """q/k/v (and gate/up) read the same tensor and share one Hessian; SparseGPT's result must equal
    the direct call with the Hessian of that linear's own captured inputs, over two calibration
    batches."""
    model = _tiny_llama()
    batches = [
        torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(s)) for s in (6, 7)
    ]
    layer = decoder_layers(model)[0]
    linear = layer.get_submodule(name)
    original = linear.weight.detach().clone()
    captured: list[torch.Tensor] = []
    handle = linear.register_forward_hook(lambda _m, a, _o: captured.append(a[0].detach()))
    with torch.no_grad():
        for ids in batches:
            model(input_ids=ids)
    handle.remove()
    x = torch.cat([c.reshape(-1, c.shape[-1]) for c in captured])
    expected, _ = sparsegpt_prune(original, _hessian(x), 0.5, blocksize=16)
    prune_sequentially(model, batches, [0], make_pruner("sparsegpt", 0.5, blocksize=16))
    torch.testing.assert_close(linear.weight, expected, rtol=1e-4, atol=1e-5)


def test_linears_reading_the_same_tensor_share_their_statistics() -> None:
    from fedprune_app.llm.layers import linear_modules
    from fedprune_app.methods.fedspallm.pruners import collect_input_stats

    model = _tiny_llama()
    inputs = capture_layer0_inputs(model, [torch.randint(0, 128, (2, 16))])
    layer = decoder_layers(model)[0]
    stats = collect_input_stats(
        layer, linear_modules(layer), inputs.hidden, inputs.kwargs, "hessian"
    )
    assert stats["self_attn.q_proj"] is stats["self_attn.k_proj"] is stats["self_attn.v_proj"]
    assert stats["mlp.gate_proj"] is stats["mlp.up_proj"]
    assert len({id(s) for s in stats.values()}) == 4  # qkv, o, gate/up, down
