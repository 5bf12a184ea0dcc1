"""slicegpt: folding + rotation are exact, the slice keeps the top components, the federated
covariance sum is the pooled one, the parameter accounting, the saved model, and a whole tiny
run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from fedprune_app.core.config import ConfigError
from fedprune_app.llm.data import client_data, training_batches
from fedprune_app.llm.models import load_tokenizer
from fedprune_app.methods.slicegpt.models import sliced_flops
from fedprune_app.methods.slicegpt.pca import (
    covariance_sums,
    one_shot_bases,
    principal_basis,
    sequential_bases,
    sum_covariances,
)
from fedprune_app.methods.slicegpt.sliced import (
    identity_bases,
    load_sliced,
    num_points,
    save_sliced,
    slice_model,
    sliced_parameters,
    sliced_width,
)
from fedprune_app.structural.routing import prunable_parameters
from fedprune_app.structural.speed import workload_flops
from tests.conftest import small_config
from tests.local_grid import LocalGrid, run_server
from tests.tiny import perturb


@pytest.fixture()
def dense(tiny_model_dir: Path) -> torch.nn.Module:
    """The tiny LLaMA in float32 with non-trivial RMSNorm weights (so folding them matters)."""
    return perturb(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval())


def _batches(
    tiny_model_dir: Path, cfg_dir: Path, pid: int = 0, n: int = 2
) -> list[dict[str, torch.Tensor]]:
    cfg = small_config(tiny_model_dir)
    tok = load_tokenizer(str(tiny_model_dir))
    return list(training_batches(client_data(cfg, pid, 4).train, tok, 2, n, 32, seed=pid))


def test_rotated_unsliced_model_equals_the_dense_one(
    dense: torch.nn.Module, tiny_model_dir: Path
) -> None:
    """§3.2–3.3: RMSNorm folded, every point rotated by its PCA eigenvectors (square Q), shortcuts
    QᵀQ': same logits as the dense model (fp32) to 1e-4; so does the folded, unrotated model
    (identity bases)."""
    batches = _batches(tiny_model_dir, tiny_model_dir)
    covs, _ = covariance_sums(dense, batches)
    d = int(dense.config.hidden_size)
    rotated = slice_model(dense, one_shot_bases(covs, d))
    folded = slice_model(dense, identity_bases(dense.config))
    x = batches[0]
    with torch.no_grad():
        ref = dense(input_ids=x["input_ids"], attention_mask=x["attention_mask"]).logits
        for model in (rotated, folded):
            got = model(input_ids=x["input_ids"], attention_mask=x["attention_mask"]).logits
            assert torch.allclose(got, ref, atol=1e-4, rtol=0), (got - ref).abs().max()
    assert not torch.allclose(rotated.model.embed_tokens.weight, dense.model.embed_tokens.weight)


def test_slice_keeps_the_top_eigenvectors_and_error_falls_with_width() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(400, 12, generator=gen, dtype=torch.float64) * torch.linspace(
        3, 0.1, 12, dtype=torch.float64
    )
    x = x @ torch.linalg.qr(torch.randn(12, 12, generator=gen, dtype=torch.float64))[0]
    cov = x.T @ x
    values, basis = principal_basis(cov, 5)
    assert torch.all(values[:-1] >= values[1:])
    ref_values, ref_vectors = np.linalg.eigh(cov.numpy())
    top = ref_vectors[:, np.argsort(ref_values)[::-1][:5]]
    assert np.allclose(
        np.abs(top.T @ basis.numpy()), np.eye(5), atol=1e-8
    )  # same columns up to sign
    errors = []
    for k in range(1, 13):
        b = principal_basis(cov, k)[1]
        errors.append(float((x - x @ b @ b.T).pow(2).sum()))
        assert errors[-1] == pytest.approx(
            float(values[k:].sum()), rel=1e-8, abs=1e-8
        )  # PCA's optimum
    assert (
        all(a > b for a, b in zip(errors[:-1], errors[1:], strict=False))
        and errors[-1] < 1e-18 * errors[0] + 1e-9
    )


def test_federated_covariance_sum_equals_the_pooled_one(
    dense: torch.nn.Module, tiny_model_dir: Path
) -> None:
    parts = [_batches(tiny_model_dir, tiny_model_dir, pid) for pid in range(3)]
    sums = [covariance_sums(dense, b) for b in parts]
    pooled, tokens = covariance_sums(dense, [b for part in parts for b in part])
    federated = sum_covariances([s for s, _ in sums])
    assert tokens == sum(t for _, t in sums) and set(federated) == set(
        range(num_points(dense.config))
    )
    for p in pooled:
        assert torch.allclose(federated[p], pooled[p], rtol=1e-10, atol=1e-8)
    x = parts[0][0]  # point 0 brute force: the embedding rows of the non-padding tokens
    emb = dense.model.embed_tokens.weight[x["input_ids"][x["attention_mask"].bool()]].double()
    assert torch.allclose(
        covariance_sums(dense, [x], [0])[0][0], emb.T @ emb, rtol=1e-10, atol=1e-10
    )


def test_sliced_model_parameters_match_the_accounting(
    dense: torch.nn.Module, tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = dense.config
    k = sliced_width(config, 0.5)
    counts = sliced_parameters(config, [k] * num_points(config))
    brute = {
        kk: abs(
            sliced_parameters(config, [kk] * num_points(config))["projections"]
            + sliced_parameters(config, [kk] * num_points(config))["shortcuts"]
            - 0.5 * prunable_parameters(config)
        )
        for kk in range(1, 65)
    }
    assert brute[k] == min(brute.values())
    covs, _ = covariance_sums(dense, _batches(tiny_model_dir, tiny_model_dir))
    model = slice_model(dense, one_shot_bases(covs, k))
    assert sum(p.numel() for p in model.parameters()) == counts["total"]
    assert (
        model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    )  # untied, counted twice
    save_sliced(model, tmp_path / "sliced")
    loaded = load_sliced(tmp_path / "sliced")
    x = torch.randint(0, 1000, (1, 10))
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, model(x).logits)
    assert loaded.generate(x, max_new_tokens=3, do_sample=False).shape == (1, 13)
    dims = [k] * num_points(
        config
    )  # FLOP ceiling: SFT-P's dense count at k = d, more than 1 below it
    assert sliced_flops(
        config, [64] * num_points(config), "prefill", prefill=64
    ) - 2 * 64 * 2 * 64 * 64 * 2 == workload_flops(config, None, "prefill", prefill=64)
    assert sliced_flops(config, dims, "generate") < workload_flops(config, None, "generate")


def test_sequential_reference_rotates_the_sliced_stream(
    dense: torch.nn.Module, tiny_model_dir: Path
) -> None:
    """Sequential (reference) SliceGPT: point 0 as the one-shot one (the dense embedding stream),
    later points differ (they see the sliced stream); at full width it is exact again."""
    batches = _batches(tiny_model_dir, tiny_model_dir)
    covs, _ = covariance_sums(dense, batches)
    seq, model = sequential_bases(dense, batches, 40)
    one = one_shot_bases(covs, 40)
    assert np.allclose((seq[0].T @ one[0]).abs().numpy(), np.eye(40), atol=1e-6)
    assert not np.allclose((seq[-1].T @ one[-1]).abs().numpy(), np.eye(40), atol=1e-3)
    full, exact = sequential_bases(dense, batches[:1], 64)
    x = batches[0]
    with torch.no_grad():
        assert torch.allclose(
            exact(x["input_ids"]).logits, dense(x["input_ids"]).logits, atol=1e-4, rtol=0
        )
        assert torch.isfinite(model(x["input_ids"]).logits).all()


def test_bad_references_key_names_it(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="slicegpt-references"):
        small_config(tiny_model_dir, method="slicegpt", slicegpt_references="random")


@pytest.mark.slow  # ~40 s: 3 rounds, the compiled model's timing and the sequential reference
def test_whole_tiny_run(tiny_model_dir: Path, tmp_path: Path, flower_ids: None) -> None:
    cfg = small_config(
        tiny_model_dir,
        method="slicegpt",
        output_dir=str(tmp_path / "runs"),
        num_server_rounds=3,
        fraction_train=1.0,
        fraction_evaluate=0.5,
        test_examples=4,
        slicegpt_keep_ratio=0.5,
        slicegpt_batches=2,
        slicegpt_speed_prefill=16,
        slicegpt_references="centralized",
    )
    grid = LocalGrid(cfg, 4, seed=0)
    run, err = run_server(cfg, grid)
    assert err is None, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed", summary.get("error")
    stats = json.loads((run / "slicegpt.json").read_text())
    model = load_sliced(run / "compiled")
    assert sum(p.numel() for p in model.parameters()) == stats["parameters"]["total"]
    assert set(model.config.slicegpt_dims) == {stats["width"]}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    compiled = {r["model"]: r for r in rows if r.get("phase") == "compiled"}
    assert (
        compiled["slicegpt"]["params"] == stats["parameters"]["total"]
        and "prefill-ceiling" in compiled["slicegpt"]
    )
    assert any(r.get("phase") == "reference" and r.get("model") == "centralized" for r in rows)
    assert "Compiled models" in (run / "results.md").read_text()
