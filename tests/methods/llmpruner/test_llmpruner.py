"""llmpruner (LLM-Pruner, federated): Taylor importance against finite differences,
federated = pooled averaging, the cut's budget, the compiled model against the masked one,
save/load, FLOPs, and a whole tiny run."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedprune_app.core.config import ConfigError
from fedprune_app.llm.layers import decoder_layers
from fedprune_app.methods.llmpruner.importance import (
    ROWS,
    average_rows,
    client_importance,
    dims,
    group_scores,
    loss_gradients,
    row_widths,
    taylor_rows,
)
from fedprune_app.methods.llmpruner.structure import (
    compile_pruned,
    cut,
    kept_parameters,
    layer_range,
    load_pruned,
    pruned_forward_flops,
    save_pruned,
    structure_costs,
    zero_pruned_,
)
from fedprune_app.structural.routing import prunable_parameters
from fedprune_app.structural.speed import forward_flops
from tests.local_grid import LocalGrid, method_config, run_server


@pytest.fixture()
def model(tiny_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()


def _batches(seed: int, n: int = 2, vocab: int = 500) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, vocab, (2, 12), generator=g)
        mask = torch.ones_like(ids)
        mask[1, 9:] = 0  # a padded row: its pad targets are ignored
        labels = ids.masked_fill(mask == 0, -100)
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


def _mean_loss(model: Any, batches: list[dict[str, torch.Tensor]]) -> float:
    total, tokens = 0.0, 0
    with torch.no_grad():
        for b in batches:
            logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
            t = b["labels"][:, 1:]
            total += float(
                torch.nn.functional.cross_entropy(
                    logits[:, :-1].reshape(-1, logits.shape[-1]),
                    t.reshape(-1),
                    ignore_index=-100,
                    reduction="sum",
                )
            )
            tokens += int((t != -100).sum())
    return total / tokens


def test_taylor_rows_are_finite_differences_of_the_loss(model: Any) -> None:
    """Σ_row w·∂L/∂w (vectorize, before |·|) = d/dε L(w + ε·w_row) at 0, by central differences, for
    the largest row of q/k/v/gate/up and column of o/down of a layer; param_first's rows are Σ|w·g|
    of the same gradient. (HF's RMSNorm computes in float32 even in a float64 model, so ε is 1e-2
    and the loss's float32 noise allows 1% on a row.)"""
    batches = _batches(0)
    tokens = loss_gradients(model, batches)
    assert tokens == sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
    signed, absolute = taylor_rows(model, "vectorize"), taylor_rows(model, "param_first")
    layer = decoder_layers(model)[1]
    grads = {
        n: w.grad.clone()
        for n, w in (("q", layer.self_attn.q_proj.weight), ("down", layer.mlp.down_proj.weight))
    }
    model.zero_grad(set_to_none=True)
    eps = 1e-2
    matrices = {
        "q": (layer.self_attn.q_proj.weight, 1),
        "k": (layer.self_attn.k_proj.weight, 1),
        "v": (layer.self_attn.v_proj.weight, 1),
        "o": (layer.self_attn.o_proj.weight, 0),
        "gate": (layer.mlp.gate_proj.weight, 1),
        "up": (layer.mlp.up_proj.weight, 1),
        "down": (layer.mlp.down_proj.weight, 0),
    }
    for name, (weight, axis) in matrices.items():
        index = int(np.argmax(np.abs(signed[name][1])))
        original = weight.detach().clone()
        direction = torch.zeros_like(original)
        if axis == 1:
            direction[index] = original[index]
        else:
            direction[:, index] = original[:, index]
        with torch.no_grad():
            weight.copy_(original + eps * direction)
            up = _mean_loss(model, batches)
            weight.copy_(original - eps * direction)
            down = _mean_loss(model, batches)
            weight.copy_(original)
        assert signed[name][1, index] == pytest.approx((up - down) / (2 * eps), rel=1e-2), name
    expected = (layer.self_attn.q_proj.weight.detach() * grads["q"]).abs().sum(1)
    np.testing.assert_allclose(absolute["q"][1], expected.numpy(), rtol=1e-12)
    expected = (layer.mlp.down_proj.weight.detach() * grads["down"]).abs().sum(0)
    np.testing.assert_allclose(absolute["down"][1], expected.numpy(), rtol=1e-12)


def test_group_scores_sum_the_coupled_rows(model: Any) -> None:
    """kv group j = q rows + o columns of its G query heads + k, v rows of head j; channel
    c = gate + up + down."""
    s = dims(model.config)
    rng = np.random.default_rng(0)
    rows = {n: rng.normal(size=(s["layers"], w)) for n, w in row_widths(model.config).items()}
    scores = group_scores(rows, model.config)
    hd, g = s["head_dim"], s["groups"]
    for layer in range(s["layers"]):
        for j in range(s["kv"]):
            q = slice(j * g * hd, (j + 1) * g * hd)
            kv = slice(j * hd, (j + 1) * hd)
            brute = sum(np.abs(rows[n][layer, q]).sum() for n in ("q", "o")) + sum(
                np.abs(rows[n][layer, kv]).sum() for n in ("k", "v")
            )
            assert scores["heads"][layer, j] == pytest.approx(brute)
        brute = sum(np.abs(rows[n][layer]) for n in ("gate", "up", "down"))
        np.testing.assert_allclose(scores["channels"][layer], brute)


def test_federated_average_equals_the_pooled_importance(model: Any) -> None:
    """Clients' rows averaged by their token counts = the rows of the pooled data: exact for
    `vectorize` (linear in the gradient); for `param_first` the average is ≥ the pooled rows
    (triangle inequality)."""
    clients = [_batches(1, 1), _batches(2, 2), _batches(3, 1)]
    pooled = [b for c in clients for b in c]
    for mode in ("vectorize", "param_first"):
        per = [client_importance(model, c, mode) for c in clients]
        federated = average_rows([r for r, _ in per], [t for _, t in per])
        reference, _ = client_importance(model, pooled, mode)
        for name in ROWS:
            if mode == "vectorize":
                np.testing.assert_allclose(federated[name], reference[name], rtol=1e-9, atol=1e-14)
            else:
                assert (federated[name] >= reference[name] - 1e-12).all()
        if mode == "vectorize":
            assert not np.allclose(per[0][0]["q"], per[1][0]["q"])  # the clients really differ


def test_cut_meets_the_budget_and_drops_the_lowest_structures(model: Any) -> None:
    config = model.config
    s, costs = dims(config), structure_costs(config)
    assert s["layers"] * (
        s["kv"] * costs["heads"] + s["inter"] * costs["channels"]
    ) == prunable_parameters(config)
    rng = np.random.default_rng(1)
    scores = {
        "heads": rng.random((s["layers"], s["kv"])),
        "channels": rng.random((s["layers"], s["inter"])),
    }
    total = prunable_parameters(config)
    for p in (0.9, 0.6, 0.4):
        keep = cut(scores, config, p, layer_range(config, 0, 0))
        kept = kept_parameters(config, keep)
        assert p * total - costs["channels"] < kept <= p * total
        for layer in range(s["layers"]):
            for name in ("heads", "channels"):
                dropped, kept_scores = (
                    scores[name][layer][~keep[name][layer]],
                    scores[name][layer][keep[name][layer]],
                )
                assert keep[name][layer].any()
                if dropped.size:
                    assert dropped.max() <= kept_scores.min()
    keep = cut(scores, config, 0.8, layer_range(config, 1, 0))
    assert keep["heads"][0].all() and keep["channels"][0].all()  # outside the range: dense
    with pytest.raises(ConfigError, match="llmpruner-keep-ratio"):
        cut(scores, config, 0.2, layer_range(config, 1, 0))
    with pytest.raises(ConfigError, match="llmpruner-layer-start"):
        layer_range(config, 2, 0)


def test_compiled_model_is_smaller_and_computes_the_masked_model(
    model: Any, tmp_path: Path
) -> None:
    s = dims(model.config)
    keep = {
        "heads": np.array([[True, False], [False, True]]),
        "channels": np.ones((2, s["inter"]), bool),
    }
    keep["channels"][0, ::3] = False
    keep["channels"][1, 5:40] = False
    compiled = compile_pruned(model, keep)
    masked = zero_pruned_(copy.deepcopy(model), keep)
    ids = torch.randint(0, 500, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = masked(input_ids=ids).logits
        got = compiled(input_ids=ids).logits
        dense = model(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(got, dense)
    n = sum(p.numel() for p in compiled.parameters())
    assert sum(p.numel() for p in model.parameters()) - n == prunable_parameters(
        model.config
    ) - kept_parameters(model.config, keep)
    layer = decoder_layers(compiled)[0]
    assert layer.self_attn.q_proj.out_features == s["groups"] * s["head_dim"]
    assert layer.mlp.gate_proj.out_features == int(keep["channels"][0].sum())
    save_pruned(compiled, tmp_path / "compiled")
    loaded = load_pruned(tmp_path / "compiled")
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, got)
        out = loaded.generate(ids[:1, :4], max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 7)
    structure = json.loads((tmp_path / "compiled" / "structure.json").read_text())
    assert structure[0]["kv-groups"] == [0] and structure[1]["kv-groups"] == [1]


def test_pruned_flops_count_the_dense_model_as_sftp_does(model: Any) -> None:
    config = model.config
    for tokens, past, logits in ((16, 0, 1), (1, 20, 1), (8, 4, 8)):
        assert pruned_forward_flops(config, None, tokens, past, logits) == forward_flops(
            config, None, tokens, past, logits, "full"
        )
    s = dims(config)
    keep = {
        "heads": np.array([[True, False], [True, True]]),
        "channels": np.ones((2, s["inter"]), bool),
    }
    hd, d, g = s["head_dim"], s["d"], s["groups"]
    saved = 2 * (
        d * (g + 2) * hd + g * hd * d + 2 * g * hd * 1
    )  # one kv group of layer 0, one token, no past
    assert pruned_forward_flops(config, None, 1) - pruned_forward_flops(config, keep, 1) == saved


@pytest.mark.slow
def test_whole_tiny_run(tiny_model_dir: Path, tmp_path: Path, flower_ids: None) -> None:
    """Round 1 importance → one global cut at the budget; recovery rounds train LoRA on the pruned
    model; the run leaves a compiled model that loads and a results.md with the compiled table; the
    centralized references run."""
    cfg = method_config(
        tiny_model_dir, tmp_path, "llmpruner", llmpruner_centralized=True, fraction_train=1.0
    )
    grid = LocalGrid(cfg, 4, seed=0)
    run_dir, err = run_server(cfg, grid)
    assert err is None, err
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("phase") == "train"]
    assert {r["round"] for r in train} == {1, 2, 3}
    compiled = {r["model"]: r for r in rows if r.get("phase") == "compiled"}
    assert compiled["llmpruner"]["kept-ratio-prunable"] <= 0.6
    assert compiled["llmpruner"]["params-ratio"] < 1.0
    refs = {r["model"] for r in rows if r.get("phase") == "reference"}
    assert refs == {"centralized", "federated-cut"}
    model = load_pruned(run_dir / "compiled")
    assert sum(p.numel() for p in model.parameters()) == compiled["llmpruner"]["params"]
    assert "Compiled models" in (run_dir / "results.md").read_text()
