"""fedflap (federated FLAP-style structural baseline): importance, averaging, the global cut, and a
whole tiny run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import MessageType

from fedprune_app.core.config import ConfigError
from fedprune_app.llm.layers import decoder_layers
from fedprune_app.llm.models import set_adapter_state
from fedprune_app.methods.fedflap.importance import (
    IMPORTANCE_PREFIX,
    MASK_PREFIX,
    average_importance,
    cut_masks,
    fedflap_model_for,
    importance_scores,
    masks_from_arrays,
    standardise,
)
from fedprune_app.structural.routing import (
    MASK_NAMES,
    coordinate_costs,
    kept_parameters,
    load_compiled,
    masked,
    per_layer_masks,
    prunable_parameters,
)
from strategies.fedflap import FedFLAPStrategy
from tests.conftest import small_config
from tests.local_grid import LocalGrid, run_server


@pytest.fixture()
def model(tiny_model_dir: Path) -> Any:
    model, _ = fedflap_model_for(small_config(tiny_model_dir))
    return model


def _brute_force(model: Any, input_ids: torch.Tensor) -> dict[str, np.ndarray]:
    """Each layer's four quantities recomputed from its submodules, layer by layer, without
    hooks."""
    base = model.get_base_model()
    out: dict[str, list[np.ndarray]] = {n: [] for n in MASK_NAMES}
    with torch.no_grad(), model.disable_adapter():
        hidden = base.model(input_ids=input_ids, output_hidden_states=True).hidden_states
        positions = torch.arange(input_ids.shape[1])[None]
        for i, layer in enumerate(decoder_layers(model)):
            h = hidden[i]
            rope = base.model.rotary_emb(h, positions)
            x = layer.input_layernorm(h)
            attn, _ = layer.self_attn(
                hidden_states=x, position_embeddings=rope, attention_mask=None
            )
            y = layer.post_attention_layernorm(h + attn)
            ffn = layer.mlp(y)
            if i + 1 < len(hidden) - 1:  # the last hidden state is after the final norm
                torch.testing.assert_close(h + attn + ffn, hidden[i + 1], atol=1e-4, rtol=1e-4)
            a, m = layer.self_attn, layer.mlp

            def var(t: torch.Tensor) -> np.ndarray:
                return t.reshape(-1, t.shape[-1]).double().var(dim=0, unbiased=True).numpy()

            def cols(*mods: Any) -> np.ndarray:
                return sum(
                    mod.base_layer.weight.double().pow(2).sum(0).numpy()
                    if hasattr(mod, "base_layer")
                    else mod.weight.double().pow(2).sum(0).numpy()
                    for mod in mods
                )

            out["attn-in"].append(var(x) * cols(a.q_proj, a.k_proj, a.v_proj))
            out["attn-out"].append(var(attn))
            out["ffn-in"].append(var(y) * cols(m.gate_proj, m.up_proj))
            out["ffn-out"].append(var(ffn))
    return {n: np.stack(v) for n, v in out.items()}


def test_importance_matches_a_brute_force_computation(model: Any) -> None:
    ids = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(0))
    got = importance_scores(model, [{"input_ids": ids, "attention_mask": torch.ones_like(ids)}])
    want = _brute_force(model, ids)
    layers, d = len(decoder_layers(model)), int(model.config.hidden_size)
    for n in MASK_NAMES:
        assert got[n].shape == (layers, d) and got[n].dtype == np.float32 and (got[n] >= 0).all()
        np.testing.assert_allclose(got[n], want[n], rtol=1e-4, atol=1e-9)


def test_importance_ignores_padding(model: Any) -> None:
    """Right padding (causal attention) must not change the statistics: a padded batch = the rows
    alone."""
    gen = torch.Generator().manual_seed(1)
    a, b = (
        torch.randint(0, 1000, (1, 10), generator=gen),
        torch.randint(0, 1000, (1, 6), generator=gen),
    )
    padded = torch.cat([a, torch.cat([b, torch.zeros(1, 4, dtype=torch.long)], 1)])
    mask = torch.cat(
        [torch.ones(1, 10), torch.cat([torch.ones(1, 6), torch.zeros(1, 4)], 1)]
    ).long()
    got = importance_scores(model, [{"input_ids": padded, "attention_mask": mask}])
    want = importance_scores(
        model,
        [
            {"input_ids": a, "attention_mask": torch.ones_like(a)},
            {"input_ids": b, "attention_mask": torch.ones_like(b)},
        ],
    )
    for n in MASK_NAMES:
        np.testing.assert_allclose(got[n], want[n], rtol=1e-4, atol=1e-6)


def test_weighted_average_against_brute_force() -> None:
    rng = np.random.default_rng(0)
    states = [{n: rng.random((2, 5)).astype(np.float32) for n in MASK_NAMES} for _ in range(3)]
    weights = [3.0, 1.0, 6.0]
    got = average_importance(states, weights)
    for n in MASK_NAMES:
        want = np.zeros((2, 5))
        for s, w in zip(states, weights, strict=True):
            want += w * s[n].astype(np.float64)
        np.testing.assert_allclose(got[n], want / sum(weights), rtol=1e-12)


def test_standardise_per_row() -> None:
    rows = np.array([[1.0, 2.0, 3.0, 6.0], [5.0, 5.0, 5.0, 5.0]])
    z = standardise(rows)
    np.testing.assert_allclose(z[0].mean(), 0, atol=1e-12)
    np.testing.assert_allclose(z[0].std(), 1, atol=1e-12)
    assert (z[1] == 0).all()


def kept_of(config: Any, stacked: dict[str, np.ndarray]) -> int:
    """T(g) of stacked (layers × d) masks by SFT-P's `kept_parameters`."""
    return int(kept_parameters(config, per_layer_masks(stacked)))


@pytest.mark.parametrize("p", [0.2, 0.5, 0.8, 1.0])
def test_cut_reaches_the_budget_and_keeps_the_top_scores(p: float, model: Any) -> None:
    config = model.config
    layers, d = int(config.num_hidden_layers), int(config.hidden_size)
    rng = np.random.default_rng(int(p * 10))
    scores = {n: rng.normal(size=(layers, d)) for n in MASK_NAMES}
    costs = coordinate_costs(config)
    target = p * prunable_parameters(config)
    masks = cut_masks(scores, costs, target)
    cost = kept_of(config, masks)  # SFT-P's budget accounting
    assert cost <= target + 1e-6 and target - cost < max(costs.values())
    assert all(masks[n][i].any() for n in MASK_NAMES for i in range(layers))
    # brute force: the non-forced kept coordinates are exactly a prefix of the global descending
    # order
    entries = sorted(
        (
            (-scores[n][i, j], k, i, j)
            for k, n in enumerate(MASK_NAMES)
            for i in range(layers)
            for j in range(d)
        )
    )
    forced = {
        (k, i, int(np.argmax(scores[n][i])))
        for k, n in enumerate(MASK_NAMES)
        for i in range(layers)
    }
    kept = [masks[MASK_NAMES[k]][i, j] for _, k, i, j in entries]
    free = [(k, i, j) not in forced for _, k, i, j in entries]
    flags = [kp for kp, f in zip(kept, free, strict=True) if f]
    assert flags == sorted(flags, reverse=True)  # all True first, then all False
    rest = [(k, i, j) for (_, k, i, j), kp in zip(entries, kept, strict=True) if not kp]
    if rest:
        assert cost + costs[MASK_NAMES[rest[0][0]]] > target  # the next one would not fit


def test_cut_never_empties_a_lane(model: Any) -> None:
    layers, d = int(model.config.num_hidden_layers), int(model.config.hidden_size)
    scores = {n: np.random.default_rng(0).random((layers, d)) for n in MASK_NAMES}
    masks = cut_masks(scores, coordinate_costs(model.config), 1.0)
    assert all(int(masks[n][i].sum()) == 1 for n in MASK_NAMES for i in range(layers))


def test_several_budgets_are_refused(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="single keep ratio"):
        FedFLAPStrategy(
            small_config(tiny_model_dir, method="fedflap", keep_ratios="0.5,0.8,0.5,0.5")
        )
    assert (
        FedFLAPStrategy(
            small_config(tiny_model_dir, method="fedflap", keep_ratios="0.5,0.5")
        ).keep_ratio
        == 0.5
    )


def test_whole_tiny_run(tiny_model_dir: Path, tmp_path: Path, flower_ids: None) -> None:
    cfg = small_config(
        tiny_model_dir,
        method="fedflap",
        output_dir=str(tmp_path / "runs"),
        num_server_rounds=3,
        fraction_train=1.0,
        fraction_evaluate=0.5,
        test_examples=4,
        keep_ratios="0.5",
        fedflap_batches=2,
    )
    grid = LocalGrid(cfg, 4, seed=0)
    run, err = run_server(cfg, grid)
    assert err is None, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed", summary.get("error")
    assert summary["num-partitions"] == 4  # though half the clients evaluate
    saved = dict(np.load(run / "masks.npz"))
    model, _ = fedflap_model_for(cfg)
    layers, d = int(model.config.num_hidden_layers), int(model.config.hidden_size)
    costs, total = coordinate_costs(model.config), prunable_parameters(model.config)
    assert 0.5 * total - max(costs.values()) < kept_of(model.config, saved) <= 0.5 * total
    final: dict[str, torch.Tensor] = {}
    for msg, reply in grid.exchanges:
        assert not reply.has_error(), reply.error.reason
        kind, rnd = (
            msg.metadata.message_type,
            msg.content.config_records["config"].get("server-round"),
        )
        sent = msg.content.array_records.get("arrays")
        if kind in (MessageType.TRAIN, MessageType.EVALUATE) and sent is not None:
            masks = {
                k[len(MASK_PREFIX) :]: v.numpy()
                for k, v in sent.items()
                if k.startswith(MASK_PREFIX)
            }
            has_masks = rnd >= 2 or (kind == MessageType.EVALUATE and rnd >= 1)
            assert bool(masks) == has_masks, (kind, rnd)
            for n, m in masks.items():  # every client gets the one global mask
                assert m.dtype == bool and np.array_equal(m, saved[n])
            if kind == MessageType.EVALUATE and rnd == 3:
                final = sent.to_torch_state_dict()
        if kind == MessageType.TRAIN:
            arrays = reply.content.array_records["arrays"]
            assert all(a.numpy().dtype == np.float32 for a in arrays.values())
            if rnd == 1:
                assert set(arrays) == {IMPORTANCE_PREFIX + n for n in MASK_NAMES}
                assert all(a.numpy().shape == (layers, d) for a in arrays.values())
            else:
                assert all("lora_" in k for k in arrays)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluated = {r["round"] for r in rows if r["phase"] == "evaluate" and r.get("status") == "ok"}
    assert evaluated == {0, 1, 3}
    table = json.loads((run / "fedflap.json").read_text())
    assert {"dense", "post-hoc", "fedflap"} <= set(table) and table["rounds"]["post-hoc"] == "1"
    assert table["post-hoc"]["mean"]["kept-ratio-prunable"] == pytest.approx(
        kept_of(model.config, saved) / total
    )
    assert "| post-hoc (1) |" in (run / "fedflap.md").read_text()
    # the compiled model = the masked model with the final LoRA
    set_adapter_state(model, {k: v for k, v in final.items() if not k.startswith(MASK_PREFIX)})
    ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), masked(model, masks_from_arrays(final, torch.device("cpu"))):
        routed = model(input_ids=ids).logits
    with torch.no_grad():
        compiled = load_compiled(run / "compiled")(input_ids=ids).logits
    torch.testing.assert_close(compiled, routed, atol=1e-4, rtol=1e-4)
    assert sum(p.numel() for p in load_compiled(run / "compiled").parameters()) < sum(
        p.numel() for n, p in model.named_parameters() if "lora_" not in n
    )
