"""The deployed SFT-P mask (`sftp-deploy-mask`): the budget rule against a brute-force ranking, the
threshold rule, and the held gates; fedflap's cut keeps the held coordinates too."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig

from fedprune_app.core.config import ConfigError, RunConfig
from fedprune_app.methods.fedflap.importance import cut_masks
from fedprune_app.methods.sftp.generator import deployed_gates, deterministic_mask, layer_masks
from fedprune_app.structural.held import force_open
from fedprune_app.structural.routing import (
    MASK_NAMES,
    coordinate_costs,
    fill_budget,
    kept_parameters,
    prunable_parameters,
)

CONFIG = LlamaConfig(
    hidden_size=16,
    intermediate_size=40,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def brute_force_fill(
    scores: dict[str, np.ndarray],
    costs: dict[str, int],
    target: float,
    forced: dict[str, np.ndarray],
) -> set[tuple[str, int, int]]:
    """Forced entries, then the longest prefix of the descending order (ties by mask, layer, index)
    that fits."""
    kept = {(n, i, j) for n in scores for i, j in zip(*np.nonzero(forced[n]), strict=True)}
    spent = sum(costs[n] for n, _, _ in kept)
    order = sorted(
        (-scores[n][i, j], k, i, j)
        for k, n in enumerate(MASK_NAMES)
        for i in range(scores[n].shape[0])
        for j in range(scores[n].shape[1])
    )
    for _, k, i, j in order:
        entry = (MASK_NAMES[k], int(i), int(j))
        if entry in kept:
            continue
        if spent + costs[entry[0]] > target:
            break
        kept.add(entry)
        spent += costs[entry[0]]
    return {(n, int(i), int(j)) for n, i, j in kept}


@pytest.mark.parametrize("p", [0.3, 0.5, 0.8])
def test_fill_budget_is_the_top_of_the_ranking(p: float) -> None:
    rng = np.random.default_rng(int(p * 10))
    scores = {n: rng.random((3, 16)) for n in MASK_NAMES}
    forced = {n: np.zeros((3, 16), bool) for n in MASK_NAMES}
    forced["ffn-out"][:, 5] = True
    costs = coordinate_costs(CONFIG)
    target = p * prunable_parameters(CONFIG)
    kept = fill_budget(scores, costs, target, forced)
    got = {
        (n, int(i), int(j)) for n in MASK_NAMES for i, j in zip(*np.nonzero(kept[n]), strict=True)
    }
    assert got == brute_force_fill(scores, costs, target, forced)
    spent = sum(costs[n] * int(kept[n].sum()) for n in MASK_NAMES)
    assert target - max(costs.values()) < spent <= target


def pi_spread(seed: int = 0) -> torch.Tensor:
    """Logits whose π = σ(s + 3) spread over (0, 1), none in an empty lane."""
    return (
        torch.randn(3, len(MASK_NAMES), 16, generator=torch.Generator().manual_seed(seed)) * 3
        - 3.0
        + 1.0
    )


@pytest.mark.parametrize("p", [0.5, 0.8])
def test_budget_rule_meets_the_budget_with_the_most_probable_gates(p: float) -> None:
    s, held = pi_spread(), torch.zeros(16)
    held[[2, 11]] = 1.0
    gates = deployed_gates(s, 3.0, held, CONFIG, p, "budget")
    assert set(gates.unique().tolist()) <= {0.0, 1.0}
    assert bool((gates[:, :, [2, 11]] == 1).all())  # held gates are kept whatever their π
    total = prunable_parameters(CONFIG)
    kept = float(kept_parameters(CONFIG, layer_masks(gates))) / total
    assert p - max(coordinate_costs(CONFIG).values()) / total < kept <= p + 1e-9
    pi, free = torch.sigmoid(s + 3.0), torch.ones_like(s, dtype=torch.bool)
    free[:, :, [2, 11]] = False
    on, off = pi[(gates == 1) & free], pi[(gates == 0) & free]
    assert on.min() >= off.max()  # top-π: no dropped gate is more probable than a kept one
    # the threshold rule can miss the budget by its rounding; the budget rule does not
    loose = (
        float(kept_parameters(CONFIG, layer_masks(force_open(deterministic_mask(s, 3.0), held))))
        / total
    )
    assert abs(loose - p) > abs(kept - p)


def test_threshold_rule_and_no_budget_are_one_half_rounding() -> None:
    s, held = pi_spread(1), torch.zeros(16)
    held[0] = 1.0
    expected = force_open(deterministic_mask(s, 3.0), held)
    assert torch.equal(deployed_gates(s, 3.0, held, CONFIG, 0.5, "threshold"), expected)
    assert torch.equal(deployed_gates(s, 3.0, held, CONFIG, None, "budget"), expected)
    with pytest.raises(ValueError, match="'budget' or 'threshold'"):
        deployed_gates(s, 3.0, held, CONFIG, 0.5, "top-k")


def test_deploy_mask_key_names_its_values() -> None:
    with pytest.raises(ConfigError, match="sftp-deploy-mask.*budget.*threshold"):
        RunConfig.from_flower({"method": "sftp", "sftp-deploy-mask": "top-k"})


def test_fedflap_cut_keeps_the_held_coordinates() -> None:
    """A massive coordinate has a near-constant input (low FLAP fluctuation): ranked last, still
    kept."""
    rng = np.random.default_rng(3)
    scores = {n: rng.random((3, 16)) + 1.0 for n in MASK_NAMES}
    for n in MASK_NAMES:
        scores[n][:, 7] = 0.0  # the lowest score everywhere
    costs, target = coordinate_costs(CONFIG), 0.5 * prunable_parameters(CONFIG)
    assert not any(cut_masks(scores, costs, target)[n][:, 7].any() for n in MASK_NAMES)
    held = np.zeros(16, bool)
    held[7] = True
    masks = cut_masks(scores, costs, target, held)
    assert all(masks[n][:, 7].all() for n in MASK_NAMES)
    assert sum(costs[n] * int(masks[n].sum()) for n in MASK_NAMES) <= target
