"""Perplexity with its uncertainty: a percentile bootstrap over the scored units (windows of a text,
or the answers of a test set).

Perplexity is exp(Σ NLL / Σ tokens) over the units, so a bootstrap sample draws n units with
replacement and recomputes that ratio (units of different token counts weigh by their tokens, as in
the point estimate). Two models scored on the same units are compared paired: each bootstrap sample
draws one set of unit indices and computes the ratio (or the difference) of the two models'
perplexities on it (Efron & Tibshirani 1993, ch. 13, the percentile interval). Draws come from
`numpy.random.default_rng(seed)`: the same seed gives the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

STATISTICS = ("ratio", "difference")


@dataclass(frozen=True)
class TokenScores:
    """Per scored unit (a perplexity window, or one answer): the summed NLL of its scored tokens and
    their count."""

    nll: np.ndarray
    tokens: np.ndarray

    def __post_init__(self) -> None:
        if len(self.nll) != len(self.tokens) or len(self.nll) == 0:
            raise ValueError(
                "TokenScores needs as many token counts as NLLs (at least one), got "
                f"{len(self.nll)} NLLs and {len(self.tokens)} counts"
            )

    @classmethod
    def of(cls, nll: Sequence[float], tokens: Sequence[int]) -> TokenScores:
        return cls(np.asarray(nll, dtype=np.float64), np.asarray(tokens, dtype=np.int64))

    @property
    def token_count(self) -> int:
        return int(self.tokens.sum())

    @property
    def mean_nll(self) -> float:
        """Token-weighted mean NLL over the units (log of `perplexity`)."""
        return float(self.nll.sum()) / self.token_count

    @property
    def perplexity(self) -> float:
        return math.exp(self.mean_nll)


@dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile-bootstrap interval at `level`."""

    estimate: float
    lo: float
    hi: float
    level: float


def bootstrap_percentile(
    statistic: Callable[[np.ndarray], np.ndarray],
    n: int,
    iters: int,
    seed: int,
    level: float = 0.95,
) -> tuple[float, float]:
    """(lo, hi): the (1 − level)/2 and (1 + level)/2 percentiles (linear interpolation) of
    `statistic` over `iters` resamples of n indices with replacement; `statistic` maps an [iters, n]
    index array to `iters` values."""
    if iters < 1 or n < 1:
        raise ValueError(
            f"bootstrap needs at least one resample of at least one unit, got iters={iters}, n={n}"
        )
    if not 0.0 < level < 1.0:
        raise ValueError(f"bootstrap level must be in (0, 1), got {level}")
    values = statistic(np.random.default_rng(seed).integers(0, n, size=(iters, n)))
    lo, hi = np.percentile(values, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def _resampled_perplexity(scores: TokenScores) -> Callable[[np.ndarray], np.ndarray]:
    return lambda idx: np.exp(scores.nll[idx].sum(axis=1) / scores.tokens[idx].sum(axis=1))


def perplexity_interval(
    scores: TokenScores, iters: int = 1000, seed: int = 0, level: float = 0.95
) -> Interval:
    """A model's perplexity and its bootstrap interval over the scored units."""
    lo, hi = bootstrap_percentile(
        _resampled_perplexity(scores), len(scores.nll), iters, seed, level
    )
    return Interval(scores.perplexity, lo, hi, level)


def paired_perplexity_interval(
    a: TokenScores,
    b: TokenScores,
    statistic: str = "ratio",
    iters: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> Interval:
    """ppl(a) / ppl(b) (`ratio`) or ppl(a) − ppl(b) (`difference`) of two models scored on the same
    units, with a paired bootstrap interval (both resampled on the same unit indices)."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}")
    if len(a.nll) != len(b.nll) or not np.array_equal(a.tokens, b.tokens):
        raise ValueError(
            "paired perplexity needs both models scored on the same units (equal token counts)"
        )
    pa, pb = _resampled_perplexity(a), _resampled_perplexity(b)
    combine = np.divide if statistic == "ratio" else np.subtract
    lo, hi = bootstrap_percentile(
        lambda idx: combine(pa(idx), pb(idx)), len(a.nll), iters, seed, level
    )
    return Interval(float(combine(a.perplexity, b.perplexity)), lo, hi, level)


def resampled_perplexities(
    scores: Mapping[Hashable, TokenScores], iters: int = 1000, seed: int = 0
) -> dict[Hashable, np.ndarray]:
    """Each model's perplexity on the same `iters` bootstrap resamples of the units all of them were
    scored on: the draws of a paired comparison of any statistic of several models (e.g. one model
    against the mean of several others), computed draw by draw."""
    units = next(iter(scores.values())).tokens
    if any(not np.array_equal(s.tokens, units) for s in scores.values()):
        raise ValueError(
            "paired perplexities need every model scored on the same units (equal token counts)"
        )
    idx = np.random.default_rng(seed).integers(0, len(units), size=(iters, len(units)))
    return {key: _resampled_perplexity(s)(idx) for key, s in scores.items()}


def pooled_interval(
    estimates: Sequence[float], draws: Sequence[np.ndarray], seed: int = 0, level: float = 0.95
) -> Interval:
    """A statistic measured in independent replicates (runs with different seeds), each with its
    bootstrap draws over units: the estimate is the replicates' mean, and each bootstrap sample
    draws the replicates with replacement and averages their draws of that sample (a two-stage
    bootstrap: replicates, then units within each; Davison & Hinkley 1997, §3.8). One replicate: its
    own percentile interval."""
    if len(estimates) != len(draws) or not draws:
        raise ValueError(
            f"pooled_interval needs one set of draws per estimate, got {len(estimates)} and "
            f"{len(draws)}"
        )
    stacked = np.stack(draws)  # [replicates, iters]
    reps, iters = stacked.shape
    pick = (
        np.random.default_rng(seed).integers(0, reps, size=(iters, reps))
        if reps > 1
        else np.zeros((iters, 1), int)
    )
    values = stacked[pick, np.arange(iters)[:, None]].mean(axis=1)
    lo, hi = np.percentile(values, [50 * (1 - level), 50 * (1 + level)])
    return Interval(float(np.mean(estimates)), float(lo), float(hi), level)


def proportion_interval(share: float, n: int, level: float = 0.95) -> Interval:
    """A share of n independent trials (an accuracy) and its Wilson score interval at `level`
    (Wilson 1927): inside [0, 1], and not empty at a share of 0 or 1, unlike the normal one."""
    if n < 1 or not 0.0 <= share <= 1.0:
        raise ValueError(f"a proportion needs n >= 1 and a share in [0, 1], got {share} of {n}")
    z = float(NormalDist().inv_cdf(0.5 + level / 2))
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n))
    return Interval(share, max(0.0, centre - half), min(1.0, centre + half), level)
