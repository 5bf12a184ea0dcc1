"""experiments.dp_norms: update norms against a brute-force sum and the norm clipping measures, the
presets with DP off, and the rendered table."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import render as render_bench
from experiments import dp_norms
from fedprune_app.core.privacy import clip_update


def test_update_norms_match_a_brute_force_sum_and_the_norm_clipping_sees() -> None:
    rng = np.random.default_rng(0)
    reference = {
        "mask-generator.w": rng.normal(size=(3, 4)).astype(np.float32),
        "layers.0.q_proj.lora_A.weight": rng.normal(size=(2, 4)).astype(np.float32),
        "layers.0.q_proj.lora_B.weight": rng.normal(size=(4, 2)).astype(np.float32),
        "frozen": rng.normal(size=(5,)).astype(np.float32),
    }
    local = {k: v + rng.normal(size=v.shape).astype(np.float32) for k, v in reference.items()}
    keys = [k for k in reference if k != "frozen"]
    out = dp_norms.update_norms(local, reference, keys)
    brute = {"lora": 0.0, "mask-generator": 0.0}
    for k in keys:
        group = "lora" if "lora_" in k else "mask-generator"
        for a, b in zip(local[k].ravel().tolist(), reference[k].ravel().tolist(), strict=True):
            brute[group] += (float(a) - float(b)) ** 2
    assert out["lora"] == pytest.approx(brute["lora"] ** 0.5, rel=1e-12)
    assert out["mask-generator"] == pytest.approx(brute["mask-generator"] ** 0.5, rel=1e-12)
    assert out["all"] == pytest.approx(sum(brute.values()) ** 0.5, rel=1e-12)
    assert out["all"] == pytest.approx(clip_update(local, reference, keys, 1e9)[1], rel=1e-12)


@pytest.mark.parametrize("method", ["fedit", "sftp"])
def test_the_presets_are_measured_with_dp_off_and_their_clipping_norm_kept(method: str) -> None:
    values, clipping = dp_norms.preset_values(method)
    assert clipping > 0
    assert values["dp-clipping-norm"] == values["dp-noise-multiplier"] == 0.0
    assert values["dp-max-epsilon"] == 0.0 and values["method"] == method


def test_the_table_shows_each_client_its_groups_and_the_scale_clipping_applies() -> None:
    record = {
        "command": "python -m experiments.dp_norms --out docs/bench/dp-update-norms.json",
        "date": "2026-12-02 12:00:00",
        "cpus": 2,
        "load-average": {"start": [1.0, 1.0, 1.0], "end": [1.0, 1.0, 1.0]},
        "rows": [
            {
                "method": "sftp",
                "client": 0,
                "entries": 538368,
                "norm": 48.5,
                "groups": {"lora": 1.2, "mask-generator": 48.4},
                "preset-clipping-norm": 0.1,
                "scale": 0.1 / 48.5,
            },
            {
                "method": "fedit",
                "client": 0,
                "entries": 921600,
                "norm": 2.6,
                "groups": {"lora": 2.6},
                "preset-clipping-norm": 0.1,
                "scale": 0.1 / 2.6,
            },
        ],
        "median": {"sftp": 48.5, "fedit": 2.6},
    }
    text = render_bench.dp_norms([record])
    assert "| sftp | 0 | 538,368 | 48.5 | 1.2 | 48.4 | 0.1 | 0.00206 |" in text
    assert "| fedit | 0 | 921,600 | 2.6 | 2.6 | – | 0.1 | 0.0385 |" in text
    assert "Median ‖Δ‖: sftp 48.5, fedit 2.6" in text
