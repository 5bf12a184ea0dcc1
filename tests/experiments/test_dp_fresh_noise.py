"""`experiments/dp_fresh_noise.py`: its four commands are the smoke preset plus valid DP keys that
differ only in σ and the tag, and a release's noise is measured against the noise-free adapter."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments import dp_fresh_noise
from fedprune_app.core import registry
from fedprune_app.core.config import RunConfig
from fedprune_app.core.privacy import DPConfig
from fedprune_cli.launch import merged_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_runs_differ_only_in_sigma_and_tag_and_their_keys_validate() -> None:
    configs = []
    for tag, sigma in (("a", 1.0), ("b", 1.0), ("c", 0.0)):
        cmd = dp_fresh_noise.command(tag, sigma)
        values = merged_config(ROOT, [cmd[3], cmd[5]])
        cfg = RunConfig.from_flower(values, methods=registry.names())
        assert cfg.section(DPConfig).dp_noise_multiplier == sigma
        assert cfg.seed == 0 and cfg.run_tag == tag
        configs.append({k: v for k, v in values.items() if k not in ("run-tag",)})
    assert configs[0] == configs[1]
    assert {k for k in configs[0] if configs[0][k] != configs[2][k]} == {"dp-noise-multiplier"}


def test_the_noise_is_the_release_minus_the_noise_free_adapter_in_a_fixed_key_order() -> None:
    clean = {"b": np.zeros(3, np.float32), "a": np.ones(2, np.float32)}
    noisy = {"a": np.array([1.5, 0.5], np.float32), "b": np.array([0, 1, -1], np.float32)}
    np.testing.assert_array_equal(
        dp_fresh_noise.difference(noisy, clean), [0.5, -0.5, 0.0, 1.0, -1.0]
    )
