"""probes.sftp.conditioning: the surrogate's best cuts against brute force, the `captured` score,
and Alg. 1's mask side learning what the surrogate asks (alone: the client's own cut; NOC: one cut
for all)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from transformers import LlamaConfig

from experiments.probes.sftp.conditioning import (
    best_cut,
    captured,
    cost_tensor,
    surrogate_importance,
    surrogate_loss,
    train,
)
from fedprune_app.methods.sftp.generator import layer_masks
from fedprune_app.structural.routing import kept_parameters, prunable_parameters


def tiny_config(layers: int = 1, hidden: int = 4) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=hidden,
        intermediate_size=6,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_hidden_layers=layers,
    )


def test_cost_tensor_is_the_kept_parameters_of_one_coordinate() -> None:
    config = tiny_config(layers=2)
    gates = torch.ones(2, 4, 4)
    assert float(cost_tensor(config).sum()) == float(kept_parameters(config, layer_masks(gates)))
    assert float(cost_tensor(config).sum()) == prunable_parameters(config)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_best_cut_is_optimal_among_every_mask_of_at_most_its_cost(seed: int) -> None:
    """Brute force over all 2^16 gate sets of a 1-layer, 4-coordinate bus: no set that costs at most
    what the best cut keeps loses less (a ratio-ordered prefix is the LP optimum at its own
    cost)."""
    config = tiny_config()
    w = surrogate_importance(config, 1, 0.0, 16.0, seed, layer_share=1.0)[0]
    cut = best_cut(w, config, 0.6)
    cost, weights = cost_tensor(config).reshape(-1).numpy(), w.reshape(-1).numpy()
    spent = float((cut.reshape(-1).numpy() * cost).sum())
    assert spent <= 0.6 * prunable_parameters(config)
    subsets = np.array(list(itertools.product([0, 1], repeat=cost.size)))
    feasible = subsets[subsets @ cost <= spent + 1e-9]
    best_loss = ((1 - feasible) * weights).sum(axis=1).min()
    assert float(surrogate_loss(w, cut)) == pytest.approx(best_loss, rel=1e-6)


def test_importance_shares_what_rho_says() -> None:
    config = tiny_config(layers=3, hidden=8)
    same = surrogate_importance(config, 3, 0.0, 16.0, 0)
    assert all(torch.equal(same[0], w) for w in same)
    assert torch.equal(
        same[0][0], same[0][2]
    )  # layer_share 0: one importance per coordinate in every layer
    own = surrogate_importance(config, 2, 1.0, 16.0, 0)
    assert not torch.allclose(own[0], own[1])
    with pytest.raises(ValueError, match="--specific"):
        surrogate_importance(config, 2, 1.5, 16.0, 0)


def test_captured_is_one_at_the_own_cut_and_zero_at_the_common_cut() -> None:
    config = tiny_config(layers=2, hidden=8)
    w = surrogate_importance(config, 2, 0.5, 16.0, 3)
    own, common = best_cut(w[0], config, 0.7), best_cut(w[0] + w[1], config, 0.7)
    assert captured(w[0], own, own, common) == pytest.approx(1.0)
    assert captured(w[0], common, own, common) == pytest.approx(0.0)
    everything = torch.ones_like(own)  # keeps more than the budget: loses nothing, so beats both
    assert captured(w[0], everything, own, common) > 1.0


SETTINGS = {
    "rounds": 3,
    "steps": 25,
    "lr": 0.03,
    "weight-decay": 0.05,
    "tau": 1.0,
    "bias": 3.0,
    "lambda": 16.0,
    "embed-dim": 8,
    "hidden": 16,
    "max-grad-norm": 1.0,
}


def test_each_mode_learns_what_its_design_allows() -> None:
    """The real generator, gates and penalty on a 2-layer, 16-coordinate bus, two clients with fully
    client-specific importance: alone, each client gets nearly all of its personal gain at its
    budget; federated with +C (Θ averaged, e_k private) most of it; under NOC every client deploys
    the same cut, so none of it. Fails if e_k did not condition the generator (fed = NOC) or a
    client deployed another's mask."""
    config = tiny_config(layers=2, hidden=16)
    w = surrogate_importance(config, 2, 1.0, 16.0, 0)
    alone = train("alone", w, config, 0.7, SETTINGS, seed=0)[-1]
    assert min(alone["captured"]) > 0.8
    assert all(abs(k - 0.7) <= 0.05 for k in alone["kept"])
    fed = train("fed", w, config, 0.7, SETTINGS, seed=0)[-1]
    assert min(fed["captured"]) > 0.5
    assert max(fed["shared-cut"]) < 0.8
    noc = train("noc", w, config, 0.7, SETTINGS, seed=0)[-1]
    assert noc["shared-cut"] == [1.0, 1.0]
    assert max(noc["captured"]) < 0.2
    with pytest.raises(ValueError, match="mode"):
        train("both", w, config, 0.7, SETTINGS, seed=0)
