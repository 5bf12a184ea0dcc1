"""SFT-P's gates, generator and budget penalty against hand-derived and brute-force references."""

from __future__ import annotations

import math

import pytest
import torch

from fedprune_app.methods.sftp.generator import (
    MaskGenerator,
    deterministic_mask,
    get_generator_state,
    initial_embedding,
    layer_masks,
    mask_rounding,
    reinmax_binary,
    set_generator_state,
    stacked_masks,
)
from fedprune_app.methods.sftp.objective import budget_penalty, sftp_objective
from fedprune_app.methods.sftp.schedules import cosine_lr
from fedprune_app.structural.routing import (
    MASK_NAMES,
    kept_parameters,
    kept_ratios,
    prunable_parameters,
)


def reinmax_reference(
    logits: torch.Tensor, one_hot: torch.Tensor, grad_sample: torch.Tensor, tau: float
) -> torch.Tensor:
    """ReinMax's backward in its general K-class form (REFERENCES.md), written out row by row."""
    out = torch.empty_like(logits)
    for i in range(logits.shape[0]):
        theta, d, g = logits[i], one_hot[i], grad_sample[i]
        pi0 = torch.softmax(theta, -1)
        pi1 = 0.5 * (torch.softmax(theta / tau, -1) + d)
        grad = 2 * (pi1 * g - pi1 * (pi1 * g).sum()) - 0.5 * (pi0 * g - pi0 * (pi0 * g).sum())
        out[i] = grad - grad.mean()
    return out


def test_gates_are_hard_with_the_bernoulli_frequency() -> None:
    n = 40_000
    s = torch.tensor([-4.0, -3.0, -2.0, 0.0]).repeat_interleave(n)
    g = reinmax_binary(s, tau=0.4, c=3.0, generator=torch.Generator().manual_seed(0))
    assert set(g.unique().tolist()) <= {0.0, 1.0}
    for i, p in enumerate(torch.sigmoid(torch.tensor([-1.0, 0.0, 1.0, 3.0])).tolist()):
        freq = g[i * n : (i + 1) * n].mean().item()
        assert abs(freq - p) < 4 * math.sqrt(p * (1 - p) / n)


def test_same_generator_seed_same_gates() -> None:
    s = torch.randn(1000)
    a = reinmax_binary(s, 0.4, 0.0, torch.Generator().manual_seed(3))
    b = reinmax_binary(s, 0.4, 0.0, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and not torch.equal(
        a, reinmax_binary(s, 0.4, 0.0, torch.Generator().manual_seed(4))
    )


@pytest.mark.parametrize(("tau", "c"), [(0.4, 3.0), (1.0, 0.0), (2.5, -1.0)])
def test_gradient_is_reinmax_on_the_two_class_logits(tau: float, c: float) -> None:
    torch.manual_seed(0)
    s = (2 * torch.randn(64)).requires_grad_()
    upstream = torch.randn(64)
    g = reinmax_binary(s, tau, c, torch.Generator().manual_seed(1))
    (g * upstream).sum().backward()
    logits = torch.stack([s.detach() + c, torch.zeros(64)], dim=-1)
    one_hot = torch.stack([g.detach(), 1 - g.detach()], dim=-1)
    grad_sample = torch.stack([upstream, torch.zeros(64)], dim=-1)  # only channel 0 is used
    expected = reinmax_reference(logits, one_hot, grad_sample, tau)[:, 0]
    torch.testing.assert_close(s.grad, expected, rtol=1e-5, atol=1e-7)
    assert 0 < g.sum() < 64  # both branches (g = 0 and g = 1) were exercised


def test_tau_below_one_is_accepted_and_what_it_costs() -> None:
    """τ = 1: the surrogate averages to σ'(s + c) exactly; τ = 0.4 (the paper's): smaller at
    saturated gates, negative whenever the sampled gate is 1, still positive on average."""
    n = 200_000
    for a in (-1.0, 0.5, 3.0):
        true = torch.sigmoid(torch.tensor(a)) * (1 - torch.sigmoid(torch.tensor(a)))
        means = {}
        for tau in (1.0, 0.4):
            s = torch.full((n,), a, requires_grad=True)
            g = reinmax_binary(s, tau, 0.0, torch.Generator().manual_seed(5))
            g.sum().backward()
            means[tau] = s.grad.mean().item()
            if tau == 0.4 and a == 3.0:
                assert (s.grad[g == 1] < 0).all() and (s.grad[g == 0] > 0).all()
        assert means[1.0] == pytest.approx(true.item(), rel=0.03)
        if a == 3.0:
            assert 0 < means[0.4] < 0.2 * true.item()
    with pytest.raises(ValueError, match="tau"):
        reinmax_binary(torch.zeros(3), 0.0, 3.0)


def test_deterministic_mask_thresholds_at_one_half() -> None:
    s = torch.tensor([-3.5, -3.0 + 1e-4, -2.0, 1.0])
    assert deterministic_mask(s, 3.0).tolist() == [0.0, 1.0, 1.0, 1.0]
    assert deterministic_mask(s, 0.0).tolist() == [0.0, 0.0, 0.0, 1.0]


def test_budget_penalty_is_zero_at_target_and_symmetric_in_log_ratio() -> None:
    target = 1234.0
    assert budget_penalty(torch.tensor(target), target).item() == 0.0
    for r in (1.01, 1.5, 4.0):
        up, down = (
            budget_penalty(torch.tensor(target * r), target),
            budget_penalty(torch.tensor(target / r), target),
        )
        assert up.item() == pytest.approx(math.log(r), rel=1e-5) and down.item() == pytest.approx(
            up.item(), rel=1e-5
        )
    kept = torch.tensor([2000.0, 500.0], requires_grad=True)
    budget_penalty(kept, target).sum().backward()
    torch.testing.assert_close(kept.grad, torch.tensor([1 / 2000.0, -1 / 500.0]))


def test_objective_is_clm_plus_lambda_penalty() -> None:
    clm, kept = torch.tensor(2.5), torch.tensor(300.0)
    got, penalty = sftp_objective(clm, kept, keep_ratio=0.5, total=1000, lam=16.0)
    assert penalty.item() == pytest.approx(math.log(500 / 300), rel=1e-6)
    assert got.item() == pytest.approx(2.5 + 16 * math.log(500 / 300), rel=1e-6)


def test_kept_ratios() -> None:
    r = kept_ratios(600.0, prunable_total=1000, model_total=4000)
    assert r == {"kept-ratio-prunable": 0.6, "kept-ratio-model": pytest.approx(3600 / 4000)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_initial_masks_are_all_ones(seed: int) -> None:
    torch.manual_seed(seed)
    gen = MaskGenerator(num_layers=30, hidden_size=576, embed_dim=16, hidden=32)
    for _ in range(5):
        logits = gen(torch.randn(16))
        assert logits.shape == (30, len(MASK_NAMES), 576)
        assert deterministic_mask(logits, 3.0).min().item() == 1.0
    noc = MaskGenerator(30, 576, conditioning=False)
    assert deterministic_mask(noc(), 3.0).min().item() == 1.0


def test_conditioning_on_and_off() -> None:
    torch.manual_seed(0)
    gen = MaskGenerator(3, 8, embed_dim=4, hidden=5)
    e1, e2 = torch.randn(4), torch.randn(4)
    assert not torch.allclose(gen(e1), gen(e2))
    with pytest.raises(ValueError, match="e_k"):
        gen(None)
    noc = MaskGenerator(3, 8, embed_dim=4, hidden=5, conditioning=False)
    torch.testing.assert_close(noc(e1), noc(e2))
    torch.testing.assert_close(noc(e1), noc(None))
    layers = gen(e1)
    assert not torch.allclose(layers[0], layers[1])  # the layer identity enters


def test_initial_embedding_scale_and_zero_start_equals_noc() -> None:
    """e_k^(0) = std · N(0, I) from its seed; at std 0 a conditioned generator starts with NOC's
    logits (same Θ), and e_k still gets a gradient, so +C can leave NOC from the client's own
    data."""
    from fedprune_app.core.config import RunConfig

    def cfg(std: float) -> RunConfig:
        return RunConfig.from_flower(
            {"method": "sftp", "sftp-embed-init-std": std, "sftp-embed-dim": 4}
        )

    unit = torch.randn(4, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(initial_embedding(cfg(1.0), 7), unit)
    torch.testing.assert_close(initial_embedding(cfg(2.5), 7), 2.5 * unit)
    zero = initial_embedding(cfg(0.0), 7)
    assert torch.count_nonzero(zero) == 0
    torch.manual_seed(0)
    gen = MaskGenerator(3, 8, embed_dim=4, hidden=5)
    noc = MaskGenerator(3, 8, embed_dim=4, hidden=5, conditioning=False)
    noc.load_state_dict(gen.state_dict())
    e = zero.clone().requires_grad_(True)
    torch.testing.assert_close(gen(e), noc())
    budget_penalty(
        reinmax_binary(gen(e), 0.4, 3.0, torch.Generator().manual_seed(0)).sum(), 10.0
    ).backward()
    assert e.grad is not None and e.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="sftp-embed-init-std"):
        cfg(-1.0)


def test_gradients_reach_theta_and_the_embedding() -> None:
    torch.manual_seed(0)
    gen = MaskGenerator(2, 8, embed_dim=4, hidden=5)
    e = torch.randn(4, requires_grad=True)
    gates = reinmax_binary(gen(e), 0.4, 3.0, torch.Generator().manual_seed(0))
    budget_penalty(gates.sum(), 10.0).backward()
    assert e.grad is not None and e.grad.abs().sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in gen.parameters())


def test_state_moves_through_get_and_set() -> None:
    torch.manual_seed(0)
    a = MaskGenerator(3, 8, embed_dim=4, hidden=5)
    torch.manual_seed(1)
    b = MaskGenerator(3, 8, embed_dim=4, hidden=5)
    e = torch.randn(4)
    assert not torch.allclose(a(e), b(e))
    state = get_generator_state(a)
    assert all(
        k.startswith("mask-generator.") and v.dtype == torch.float32 for k, v in state.items()
    )
    set_generator_state(
        b, {**state, "base_model.lora_A.weight": torch.zeros(2)}
    )  # other entries ignored
    torch.testing.assert_close(a(e), b(e))
    with pytest.raises(KeyError, match="lacks"):
        set_generator_state(b, {k: v for k, v in state.items() if "fc2" not in k})
    bad = dict(state)
    bad["mask-generator.fc1.bias"] = torch.zeros(7)
    with pytest.raises(ValueError, match="shape"):
        set_generator_state(b, bad)


def test_layer_mask_views_round_trip() -> None:
    gates = (torch.rand(3, len(MASK_NAMES), 8) > 0.5).float()
    per_layer = layer_masks(gates)
    assert len(per_layer) == 3 and set(per_layer[0]) == set(MASK_NAMES)
    torch.testing.assert_close(per_layer[2][MASK_NAMES[1]], gates[2, 1])
    stacked = stacked_masks(per_layer)
    for i, name in enumerate(MASK_NAMES):
        torch.testing.assert_close(stacked[name], gates[:, i])


def test_cosine_schedule() -> None:
    assert cosine_lr(2e-5, 0, 10) == pytest.approx(2e-5)
    assert cosine_lr(2e-5, 5, 10) == pytest.approx(1e-5)
    assert cosine_lr(2e-5, 10, 10) == pytest.approx(0.0, abs=1e-15)


def test_mask_rounding_against_sampled_gates() -> None:
    """The expected kept ratio equals the mean over sampled Bernoulli(π) masks (Monte Carlo), the
    deterministic one rounds π at 0.5, and gates at π = 0.7 round up: the bias that keeps a p = 0.8
    run above its budget."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=16,
        intermediate_size=40,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    gen = torch.Generator().manual_seed(0)
    c = 3.0
    s = torch.randn(3, len(MASK_NAMES), 16, generator=gen) * 3 - c  # π spread over (0, 1)
    r = mask_rounding(s, c, config)
    pi, total = torch.sigmoid(s + c), prunable_parameters(config)
    samples = [
        float(kept_parameters(config, layer_masks(torch.bernoulli(pi, generator=gen)))) / total
        for _ in range(4000)
    ]
    assert r["expected"] == pytest.approx(sum(samples) / len(samples), abs=0.005)
    assert (
        r["deterministic"]
        == float(kept_parameters(config, layer_masks((pi > 0.5).float()))) / total
    )
    assert r["unsaturated"] == pytest.approx(float(((pi > 0.1) & (pi < 0.9)).float().mean()))
    flat = mask_rounding(torch.full((3, len(MASK_NAMES), 16), math.log(0.7 / 0.3) - c), c, config)
    assert flat == pytest.approx({"deterministic": 1.0, "expected": 0.7, "unsaturated": 1.0})
