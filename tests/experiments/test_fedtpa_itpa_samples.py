"""probes.fedtpa.itpa_samples: the spread of ITPA's distances against the noise of an n-sample
estimate."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.probes.fedtpa.itpa_samples import spread
from fedprune_app.methods.fedtpa.aggregation import cosine_distances


def clients(shift: float, per: int = 64, d: int = 8, seed: int = 0) -> list[np.ndarray]:
    """Four clients' per-sample features: a shared mean, client k shifted by k·shift along one axis
    each, unit sample noise."""
    rng = np.random.default_rng(seed)
    base = np.full(d, 3.0)
    return [base + shift * k * np.eye(d)[k] + rng.normal(size=(per, d)) for k in range(4)]


def test_draws_center_on_the_server_distances_and_their_noise_shrinks_as_one_over_root_n() -> None:
    feats = clients(1.0)
    expected = cosine_distances(np.stack([f.mean(0) for f in feats]), [64.0] * 4)
    small, large = (spread(feats, [64.0] * 4, n, repeats=400, seed=1) for n in (16, 256))
    np.testing.assert_allclose(
        large["distances-mean-per-client"], expected, atol=0.3 * float(expected.std())
    )
    assert large["signal"] == pytest.approx(float(expected.std()), rel=0.3)
    assert large["noise"] == pytest.approx(
        small["noise"] / 4, rel=0.3
    )  # 16× the samples, 1/4 the noise


def test_signal_to_noise_grows_with_the_sample_count_and_the_client_difference() -> None:
    same = [
        spread(clients(0.0), [64.0] * 4, n, repeats=200, seed=2)["signal-to-noise"] for n in (4, 32)
    ]
    apart = [
        spread(clients(1.5), [64.0] * 4, n, repeats=200, seed=2)["signal-to-noise"] for n in (4, 32)
    ]
    assert (
        apart[1] > apart[0] and apart[1] > 3.0
    )  # distinct clients separate once n is large enough
    assert max(same) < 1.5  # identical clients: whatever spread is seen is the estimate's noise
