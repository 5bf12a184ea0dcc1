"""FlexLoRA under differential privacy: the server clips each client's change of ΔW (not its
factors), averages uniformly and adds σ·C/m noise on the dense ΔW; with σ = 0 and nothing clipped it
is FlexLoRA."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import MetricRecord, RecordDict

from fedprune_app.core.config import RunConfig
from fedprune_app.core.protocol import numpy_state, to_record
from fedprune_app.llm.lora import LORA_A, LORA_B, truncate_factors
from fedprune_app.methods.flexlora.svd import average_deltas, lora_delta
from strategies.flexlora import FlexLoRAStrategy

LAYERS = ["m.layers.0.q_proj", "m.layers.1.q_proj"]
ALPHA, R_MAX = 8.0, 4


def _factors(rng: np.random.Generator, rank: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    out = {}
    for layer in LAYERS:
        out[layer + LORA_B] = (scale * rng.normal(size=(6, rank))).astype(np.float32)
        out[layer + LORA_A] = rng.normal(size=(rank, 5)).astype(np.float32)
    return out


def _strategy(rows: list[dict[str, Any]], **dp: Any) -> tuple[FlexLoRAStrategy, list[dict]]:
    cfg = RunConfig.from_flower(
        {
            "method": "flexlora",
            "flexlora-ranks": "2,4",
            "lora-alpha": ALPHA,
            **{k.replace("_", "-"): v for k, v in dp.items()},
        }
    )
    strategy = FlexLoRAStrategy(cfg, recorder=rows.append)
    strategy.layers, strategy.num_connected = list(LAYERS), 4
    seen: list[dict] = []
    real = strategy.factors

    def capture(server_round: int, deltas: dict) -> Any:
        seen.append({k: np.array(v) for k, v in deltas.items()})
        return real(server_round, deltas)

    strategy.factors = capture  # type: ignore[method-assign]
    return strategy, seen


def _round(scale: float) -> tuple[dict[str, np.ndarray], list[RecordDict], list[dict], list[int]]:
    rng = np.random.default_rng(7)
    glob = _factors(rng, R_MAX)
    ranks = [2, 4, 4]
    states = []
    for rank in ranks:  # what the client was sent (the global at its rank) plus a change
        sent = {}
        for layer in LAYERS:
            sent[layer + LORA_B], sent[layer + LORA_A] = truncate_factors(
                glob[layer + LORA_B], glob[layer + LORA_A], rank
            )
        move = _factors(rng, rank, scale)
        states.append({k: sent[k] + (move[k] if k.endswith(LORA_B) else 0) for k in sent})
    replies = [
        RecordDict(
            {
                "arrays": to_record(s),
                "metrics": MetricRecord(
                    {"rank": r, "num-examples": 10 * (i + 1), "partition-id": i}
                ),
            }
        )
        for i, (s, r) in enumerate(zip(states, ranks, strict=True))
    ]
    return glob, replies, states, ranks


def _products(state: dict[str, np.ndarray], rank: int) -> dict[str, np.ndarray]:
    return {
        layer: lora_delta(state[layer + LORA_B], state[layer + LORA_A], ALPHA, rank)
        for layer in LAYERS
    }


def test_sigma_zero_without_clipping_is_flexloras_uniform_mean() -> None:
    glob, replies, states, ranks = _round(0.01)
    strategy, seen = _strategy([], dp_clipping_norm=1e6)
    strategy.dp_aggregate(1, replies, to_record(glob), 3)
    want = average_deltas(states, ranks, [1.0, 1.0, 1.0], LAYERS, ALPHA)
    for layer in LAYERS:
        np.testing.assert_allclose(seen[0][layer], want[layer], rtol=1e-6, atol=1e-9)


def test_each_clients_change_from_the_global_delta_w_is_clipped_to_c_and_averaged_over_m() -> None:
    """The public reference is the global ΔW at r_max (what the last release became), whatever a
    client's rank: ΔW = ΔW_g + Σ_i clip_C(ΔW_i − ΔW_g) / m."""
    glob, replies, states, ranks = _round(3.0)
    rows: list[dict[str, Any]] = []
    strategy, seen = _strategy(rows, dp_clipping_norm=0.5)
    strategy.dp_aggregate(1, replies, to_record(glob), 4)  # 3 replies of 4 sampled
    ref = _products(glob, R_MAX)
    change = {layer: 0.0 for layer in LAYERS}
    for state, rank in zip(states, ranks, strict=True):
        own = _products(state, rank)
        norm = np.sqrt(sum(np.sum((own[k] - ref[k]) ** 2) for k in LAYERS))
        assert norm > 0.5
        for layer in LAYERS:
            change[layer] += (own[layer] - ref[layer]) * (0.5 / norm) / 4
    for layer in LAYERS:
        np.testing.assert_allclose(seen[0][layer], ref[layer] + change[layer], rtol=1e-6, atol=1e-9)
    (row,) = [r for r in rows if r.get("phase") == "privacy"]
    assert row["dp-clipped"] == 3 and row["dp-sampled"] == 4 and row["dp-epsilon"] is None


def test_the_noise_on_delta_w_has_std_sigma_c_over_m() -> None:
    """3 replies of m = 4 sampled, 50 rounds of 60 entries: std σ·C/4 (±5%)."""
    glob, replies, _states, _ranks = _round(3.0)
    quiet, seen_quiet = _strategy([], dp_clipping_norm=0.5)
    quiet.dp_aggregate(1, replies, to_record(glob), 4)
    noisy, seen_noisy = _strategy([], dp_clipping_norm=0.5, dp_noise_multiplier=2.0)
    for _ in range(50):
        noisy.dp_aggregate(1, replies, to_record(glob), 4)
    noise = np.concatenate(
        [(seen[k] - seen_quiet[0][k]).ravel() for seen in seen_noisy for k in LAYERS]
    )
    assert noise.size == 3000
    assert noise.std() == pytest.approx(2.0 * 0.5 / 4, rel=0.05)  # SE of the std ≈ 1.3%
    assert numpy_state(noisy.factors(1, seen_noisy[0]))[LAYERS[0] + LORA_B].shape == (6, R_MAX)
