"""Perplexity intervals against brute force: an explicit resampling loop with the same seed,
percentiles by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedprune_app.llm.intervals import (
    TokenScores,
    bootstrap_percentile,
    paired_perplexity_interval,
    perplexity_interval,
    pooled_interval,
    resampled_perplexities,
)

A = TokenScores.of([12.0, 30.5, 7.25, 19.0, 44.0, 3.5, 25.0], [5, 11, 4, 8, 13, 2, 9])
B = TokenScores.of([10.0, 33.0, 6.0, 21.5, 40.0, 5.0, 20.0], [5, 11, 4, 8, 13, 2, 9])


def _percentile_by_hand(values: list[float], q: float) -> float:
    """Linear interpolation between the order statistics at rank q/100 · (n − 1)."""
    v, rank = sorted(values), q / 100 * (len(values) - 1)
    low = math.floor(rank)
    return v[low] + (rank - low) * (v[min(low + 1, len(v) - 1)] - v[low])


def _loop(scores: list[TokenScores], combine, iters: int, seed: int) -> list[float]:
    """One resample at a time: n unit indices drawn with replacement, each model's ppl on them,
    combined."""
    rng, n, out = np.random.default_rng(seed), len(scores[0].nll), []
    for _ in range(iters):
        idx = [int(i) for i in rng.integers(0, n, size=n)]
        ppl = [
            math.exp(sum(s.nll[i] for i in idx) / sum(int(s.tokens[i]) for i in idx))
            for s in scores
        ]
        out.append(combine(*ppl))
    return out


def test_perplexity_interval_is_the_percentile_of_an_explicit_resampling_loop() -> None:
    ci = perplexity_interval(A, iters=300, seed=11, level=0.9)
    ref = _loop([A], lambda p: p, 300, 11)
    assert ci.estimate == pytest.approx(math.exp(sum(A.nll) / 52))
    assert ci.lo == pytest.approx(_percentile_by_hand(ref, 5.0), rel=1e-12)
    assert ci.hi == pytest.approx(_percentile_by_hand(ref, 95.0), rel=1e-12)
    assert ci.lo < ci.estimate < ci.hi
    assert perplexity_interval(A, iters=300, seed=11, level=0.9) == ci  # seeded
    assert perplexity_interval(A, iters=300, seed=12, level=0.9) != ci


@pytest.mark.parametrize(
    ("statistic", "combine"), [("ratio", lambda a, b: a / b), ("difference", lambda a, b: a - b)]
)
def test_paired_interval_resamples_both_models_on_the_same_units(statistic: str, combine) -> None:
    ci = paired_perplexity_interval(A, B, statistic, iters=200, seed=5)
    ref = _loop([A, B], combine, 200, 5)
    assert ci.estimate == pytest.approx(combine(A.perplexity, B.perplexity))
    assert (ci.lo, ci.hi) == pytest.approx(
        (_percentile_by_hand(ref, 2.5), _percentile_by_hand(ref, 97.5)), rel=1e-12
    )


def test_a_model_against_itself_has_a_zero_width_paired_interval_but_not_an_unpaired_one() -> None:
    assert paired_perplexity_interval(A, A, "ratio", iters=100) == pytest.approx(
        type(perplexity_interval(A))(1.0, 1.0, 1.0, 0.95)
    )
    ci = perplexity_interval(A, iters=100)
    assert ci.hi - ci.lo > 0.1 * ci.estimate


def test_bad_input_names_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="statistic must be one of"):
        paired_perplexity_interval(A, B, "quotient")
    with pytest.raises(ValueError, match="same units"):
        paired_perplexity_interval(A, TokenScores.of([1.0], [1]))
    with pytest.raises(ValueError, match="level must be in"):
        bootstrap_percentile(lambda idx: idx.mean(axis=1), 3, 10, 0, level=1.5)
    with pytest.raises(ValueError, match="at least one"):
        TokenScores.of([], [])


def test_resampled_perplexities_draw_one_set_of_units_for_every_model() -> None:
    """Draw by draw, the same resampled units for both models: A − B equals the explicit paired
    loop."""
    draws = resampled_perplexities({"a": A, "b": B}, iters=150, seed=9)
    ref = _loop([A, B], lambda a, b: a - b, 150, 9)
    assert draws["a"] - draws["b"] == pytest.approx(ref, rel=1e-12)
    with pytest.raises(ValueError, match="same units"):
        resampled_perplexities({"a": A, "c": TokenScores.of([1.0], [1])})


def test_pooled_interval_resamples_replicates_then_takes_each_replicates_own_draw() -> None:
    """Two-stage bootstrap against a loop: each sample draws replicates with replacement and
    averages their draws of that sample; one replicate is its own percentile interval."""
    rng = np.random.default_rng(3)
    draws = [rng.normal(mu, 1.0, size=400) for mu in (0.0, 2.0, 5.0)]
    ci = pooled_interval([0.1, 2.1, 4.9], draws, seed=4, level=0.9)
    pick, ref = np.random.default_rng(4).integers(0, 3, size=(400, 3)), []
    for i in range(400):
        ref.append(sum(float(draws[int(j)][i]) for j in pick[i]) / 3)
    assert ci.estimate == pytest.approx(7.1 / 3)
    assert (ci.lo, ci.hi) == pytest.approx(
        (_percentile_by_hand(ref, 5.0), _percentile_by_hand(ref, 95.0)), rel=1e-12
    )
    single = pooled_interval([0.1], draws[:1], level=0.9)
    assert (single.lo, single.hi) == pytest.approx(
        (_percentile_by_hand(list(draws[0]), 5.0), _percentile_by_hand(list(draws[0]), 95.0)),
        rel=1e-12,
    )
    # the replicates' spread widens the interval beyond any one replicate's
    assert ci.hi - ci.lo > single.hi - single.lo
    with pytest.raises(ValueError, match="one set of draws per estimate"):
        pooled_interval([1.0, 2.0], draws[:1])


def test_proportion_interval_is_wilsons() -> None:
    """4 of 8 right: Wilson's closed form gives [0.2152, 0.7848]; shares of 0 and 1 keep a non-empty
    interval inside [0, 1], where the normal approximation collapses to a point."""
    from fedprune_app.llm.intervals import proportion_interval

    ci = proportion_interval(0.5, 8)
    assert (ci.estimate, round(ci.lo, 4), round(ci.hi, 4), ci.level) == (0.5, 0.2152, 0.7848, 0.95)
    none, every = proportion_interval(0.0, 10), proportion_interval(1.0, 30)
    assert none.lo == pytest.approx(0.0, abs=1e-12) and round(none.hi, 4) == 0.2775
    assert every.hi == 1.0 and round(every.lo, 4) == 0.8865
    assert proportion_interval(0.5, 8, level=0.99).lo < ci.lo
    with pytest.raises(ValueError, match="share in"):
        proportion_interval(1.5, 8)
