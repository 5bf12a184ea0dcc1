"""probes.fedtpa.adapter_norms: update norms against a brute-force sum, dead dimensions, and a real
PEFT folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from benchmarks import render as render_bench
from experiments.probes.fedtpa import adapter_norms as norms


def brute_update_norm(A: np.ndarray, B: np.ndarray, scaling: float) -> float:
    """‖scaling·B·A‖_F entry by entry."""
    total = 0.0
    for i in range(B.shape[0]):
        for j in range(A.shape[1]):
            total += (scaling * sum(B[i, k] * A[k, j] for k in range(A.shape[0]))) ** 2
    return total**0.5


def test_update_norm_and_dead_dimensions_match_a_brute_force_count() -> None:
    rng = np.random.default_rng(0)
    a = {"l0": rng.normal(size=(4, 6)), "l1": rng.normal(size=(4, 6)), "l2": np.zeros((4, 6))}
    b = {"l0": rng.normal(size=(5, 4)), "l1": rng.normal(size=(5, 4)), "l2": np.zeros((5, 4))}
    a["l1"][[1, 3]] = 0.0
    b["l1"][:, [1, 2]] = 0.0  # dimension 1 dead (A row and B column zero); 2 and 3 only half zero
    out = norms.adapter_figures(a, b, scaling=2.0)
    want = np.mean([brute_update_norm(a[k], b[k], 2.0) for k in ("l0", "l1", "l2")])
    assert out["update-norm"] == pytest.approx(want, rel=1e-12)
    assert (out["dead-dims"], out["dims"], out["dead-layers"], out["layers"]) == (1 + 4, 12, 1, 3)


def test_mismatched_ranks_or_missing_factors_are_refused() -> None:
    with pytest.raises(ValueError, match="rank"):
        norms.adapter_figures({"l": np.ones((4, 3))}, {"l": np.ones((2, 5))}, 1.0)
    with pytest.raises(ValueError, match="lora_A and lora_B"):
        norms.adapter_figures({"l": np.ones((4, 3))}, {}, 1.0)


def write_run(root: Path, method: str, tag: str, partitioner: str, scale_b: float) -> Path:
    run = root / f"20261127-000000-{method}-{tag}"
    (run / "adapter").mkdir(parents=True)
    (run / "config.json").write_text(
        json.dumps(
            {
                "method": method,
                "run-tag": tag,
                "partitioner": partitioner,
                "dirichlet-alpha": 1.0,
                "lora-rank": 2,
            }
        )
    )
    (run / "adapter" / "adapter_config.json").write_text(
        json.dumps({"r": 2, "lora_alpha": 4, "rank_pattern": {}})
    )
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    save_file(
        {
            f"{prefix}.lora_A.weight": np.eye(2, 3, dtype=np.float32),
            f"{prefix}.lora_B.weight": np.full((3, 2), scale_b, dtype=np.float32),
        },
        str(run / "adapter" / "adapter_model.safetensors"),
    )
    return run


def test_a_peft_folder_is_read_with_its_scaling_and_rendered_against_fedit(tmp_path: Path) -> None:
    fedit = write_run(tmp_path, "fedit", "a1-fedit", "dirichlet", 1.0)
    tpa = write_run(tmp_path, "fedtpa", "a1-fedtpa", "dirichlet", 0.5)
    iid = write_run(tmp_path, "fedtpa", "ainf-fedtpa", "iid", 0.5)
    record = norms.main([str(fedit), str(tpa), str(iid), "--out", str(tmp_path / "r.json")])
    rows = {row["run-tag"]: row for row in record["runs"]}
    # (α/r)·B·A = 2 · [[1, 1, 0]] × 3 rows: ‖·‖_F = 2·√6 for FedIT, half of it with B halved
    assert rows["a1-fedit"]["update-norm"] == pytest.approx(2 * 6**0.5)
    assert rows["a1-fedtpa"]["update-norm"] == pytest.approx(6**0.5)
    assert (rows["a1-fedtpa"]["alpha"], rows["ainf-fedtpa"]["alpha"]) == ("1", "inf")
    table = render_bench.render("fedtpa-adapter-norms", [tmp_path / "r.json"])
    assert "| `a1-fedtpa` | 1 | 2.449 | 0.50 | 0 of 2 | 0 of 1 |" in table
    assert "| `ainf-fedtpa` | inf | 2.449 | – |" in table


def test_a_run_without_a_final_adapter_is_named(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    with pytest.raises(SystemExit, match="run"):
        norms.main([str(tmp_path / "run")])
