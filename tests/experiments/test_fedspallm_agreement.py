"""probes.fedspallm.agreement: the error measure, the re-solved weights and the four models against
brute force."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from experiments.probes.fedspallm.agreement import (
    layer_hessians,
    matrix_errors,
    output_error,
    resolve_for_mask,
    resolve_run,
)
from fedprune_app.core.runtime import client_seed
from fedprune_app.llm.data import client_data
from fedprune_app.llm.layers import calibration_batches, prunable_weights
from fedprune_app.llm.models import load_base_model, load_tokenizer
from fedprune_app.methods.fedspallm.aggregation import expand_masks, l0_aggregate
from fedprune_app.methods.fedspallm.masks import save_pruned
from fedprune_app.methods.fedspallm.pruners import sparsegpt_prune
from tests.conftest import small_config


def _hessian(x: torch.Tensor) -> torch.Tensor:
    return 2 * x.T @ x / x.shape[0]


def test_output_error_is_the_relative_output_change_on_the_inputs() -> None:
    g = torch.Generator().manual_seed(
        0
    )  # float64: the 1e-9 check sits below float32's rounding (hosts' BLAS differ)
    w, x = (
        torch.randn(5, 8, generator=g, dtype=torch.float64),
        torch.randn(40, 8, generator=g, dtype=torch.float64),
    )
    pruned = w * (torch.rand(5, 8, generator=g) > 0.5)
    brute = float(((x @ (pruned - w).T) ** 2).sum() / ((x @ w.T) ** 2).sum())
    assert abs(output_error(pruned, w, _hessian(x)) - brute) < 1e-9


def test_resolve_for_mask_is_the_least_squares_fit_on_the_mask() -> None:
    g = torch.Generator().manual_seed(1)
    w, x = (
        torch.randn(4, 10, generator=g, dtype=torch.float64),
        torch.randn(60, 10, generator=g, dtype=torch.float64),
    )
    kept = torch.rand(4, 10, generator=g) > 0.4
    got = resolve_for_mask(w, kept, _hessian(x), percdamp=0.0)
    assert torch.all(got[~kept] == 0)
    for r in range(4):  # min ‖X w′ᵀ − X wᵀ‖ over w′ supported on the row's kept positions
        s = kept[r]
        fit = torch.linalg.lstsq(x[:, s], x @ w[r]).solution
        torch.testing.assert_close(got[r, s], fit, atol=1e-8, rtol=1e-8)


def test_matrix_errors_builds_the_servers_global_model_and_orders_the_fits() -> None:
    g = torch.Generator().manual_seed(2)
    w = torch.randn(16, 24, generator=g)
    xs = [torch.randn(80, 24, generator=g) * torch.linspace(0.2, 2.0, 24) for _ in range(3)]
    hs = [_hessian(x) for x in xs]
    pooled = sum(hs) / 3
    got = matrix_errors(w, hs, pooled, 0.6, blocksize=8, percdamp=0.01)
    replies = [sparsegpt_prune(w, h, 0.6, 0, 0, 8, 0.01) for h in hs]
    merged, pruned_count = l0_aggregate(
        [r.numpy() for r, _ in replies], [m.numpy() for _, m in replies]
    )
    global_w, global_kept = expand_masks(merged, pruned_count, 3, 0.6)
    assert got["global"] == output_error(torch.from_numpy(global_w), w, pooled)
    assert got["standalone"] == np.mean([output_error(r, w, pooled) for r, _ in replies])
    kept_counts = sum(m.numpy().astype(int) for _, m in replies)[global_kept]
    assert got["kept-by"] == [float(np.mean(kept_counts == j)) for j in range(4)]
    # scored on the pooled calibration inputs, the fit for the global mask beats the global model's
    # averaged weights
    assert got["global-mask-resolved"] <= got["global"] + 1e-9


def test_resolve_run_keeps_the_runs_mask_and_refits_its_weights(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    text = tmp_path / "text.jsonl"
    text.write_text(
        "".join(
            json.dumps(
                {
                    "text": f"Paragraph {i}: the river runs past the old mill and the town of "
                    f"number {i} near the hills."
                }
            )
            + "\n"
            for i in range(60)
        )
    )
    cfg = small_config(
        tiny_model_dir,
        method="fedspallm",
        client_data=f"{text}",
        calib_segments=4,
        calib_seq_len=32,
        sparsity=0.5,
        min_nodes=2,
    )
    dense, _, _ = prunable_weights(cfg)
    rng = np.random.default_rng(0)
    state = {
        k: np.where(rng.random(w.shape) < 0.5, 0, w).astype(np.float32) for k, w in dense.items()
    }
    save_pruned(cfg, state, tmp_path)
    resolved, fed = resolve_run(tmp_path, cfg)
    params = dict(resolved.named_parameters())
    for k, w in state.items():
        assert torch.equal(params[k] != 0, torch.from_numpy(w != 0)), k  # the run's mask, exactly
    # layer 0 sees the dense embeddings: its weights are the least-squares fit on the pooled
    # calibration inputs
    base, tokenizer = load_base_model(cfg.model_name), load_tokenizer(cfg.model_name)
    pooled = [
        b
        for pid in range(2)
        for b in calibration_batches(
            client_data(cfg, pid, 2).train, tokenizer, 4, 32, client_seed(cfg.seed, 1, pid)
        )
    ]
    hessians = layer_hessians(base, pooled, {0})
    key = next(k for k in state if ".0.self_attn.q_proj." in k)
    want = resolve_for_mask(
        torch.from_numpy(dense[key]),
        torch.from_numpy(state[key] != 0),
        hessians[(0, "self_attn.q_proj")],
        0.01,
    )
    torch.testing.assert_close(params[key].detach(), want)
    for (
        layer,
        name,
    ), h in hessians.items():  # each refit matrix reproduces the dense outputs better than the mask
        k = f"model.layers.{layer}.{name}.weight"
        w = torch.from_numpy(dense[k])
        assert output_error(params[k].detach(), w, h) < output_error(
            torch.from_numpy(state[k]), w, h
        ), k
