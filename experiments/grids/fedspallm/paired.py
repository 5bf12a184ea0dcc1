"""FedSpaLLM's perplexity claims as paired comparisons with 95% intervals.

Every model of a run is scored on the same windows of each held-out text (`window-nll`,
`window-tokens` in its metrics rows), so a comparison resamples the windows once for all the models
it involves (`intervals.resampled_perplexities`). Runs of two sparsities with the same seed score
the same text, so the gap between them is paired as well. Replicates of a setting (the same cell
with other seeds: `--seeds`) are pooled by a two-stage bootstrap (`intervals.pooled_interval`): the
interval then holds the run-to-run variation too.

- `global_vs_standalone`: ppl(global) − mean_k ppl(standalone_k) on one text (the paper's
  claim: ≤ 0);
- `gap_growth`: gap(s₂) − gap(s₁), gap = mean over texts of (standalone mean − global) / standalone
  mean, in percent (the claim: > 0 between consecutive sparsities).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from experiments.grids import Pair
from experiments.grids.fedspallm.records import window_scores
from fedprune_app.llm.intervals import TokenScores, pooled_interval, resampled_perplexities

ITERS = 2000


def _stream(replicate: int, source: str) -> int:
    """A bootstrap seed per (replicate, text): their resamples are independent, and the same on
    every render."""
    return replicate * 7919 + sum(ord(c) for c in source)


def _global_and_standalone(run: Path, source: str) -> tuple[TokenScores, list[TokenScores]] | None:
    scores = window_scores(run)
    std = scores.get("standalone", {}).get(source, [])
    fed = scores.get("fedspallm", {}).get(source, [])
    return (fed[0], std) if fed and std else None


def global_vs_standalone(runs: Sequence[Path], source: str, label: str) -> Pair | None:
    """(label, ppl global, mean ppl standalone, ≤, interval of the difference and n windows), pooled
    over the replicate runs; None when a run lacks per-window scores."""
    points, draws, fed_ppl, std_ppl, windows = [], [], [], [], 0
    for i, run in enumerate(runs):
        pair = _global_and_standalone(run, source)
        if pair is None:
            return None
        fed, std = pair
        d = resampled_perplexities({"fed": fed, **dict(enumerate(std))}, ITERS, _stream(i, source))
        draws.append(d["fed"] - np.mean([d[k] for k in range(len(std))], axis=0))
        fed_ppl.append(fed.perplexity)
        std_ppl.append(float(np.mean([s.perplexity for s in std])))
        points.append(fed_ppl[-1] - std_ppl[-1])
        windows += len(fed.nll)
    ci = pooled_interval(points, draws)
    return (
        label,
        float(np.mean(fed_ppl)),
        float(np.mean(std_ppl)),
        lambda a, b: a <= b,
        (ci.lo, ci.hi, windows),
    )


def _gap_draws(fed: TokenScores, std: list[TokenScores], draws: dict) -> tuple[float, np.ndarray]:
    std_point = float(np.mean([s.perplexity for s in std]))
    std_draws = np.mean([draws[id(s)] for s in std], axis=0)
    return (std_point - fed.perplexity) / std_point, (std_draws - draws[id(fed)]) / std_draws


def gap_growth(
    low: Sequence[Path], high: Sequence[Path], sources: Sequence[str], label: str
) -> Pair | None:
    """(label, gap at the higher sparsity %, gap at the lower %, >, interval of the difference and n
    windows): replicate i of one sparsity is paired with replicate i of the other (same seed, same
    text); None when a run lacks per-window scores or two paired runs scored different text."""
    points, draws, gaps_hi, gaps_lo, windows = [], [], [], [], 0
    for i, (run_lo, run_hi) in enumerate(zip(low, high, strict=False)):
        point_sum, draw_sum, hi_sum, lo_sum = 0.0, 0.0, 0.0, 0.0
        for source in sources:
            lo_pair, hi_pair = (
                _global_and_standalone(run_lo, source),
                _global_and_standalone(run_hi, source),
            )
            if lo_pair is None or hi_pair is None:
                return None
            models = [lo_pair[0], *lo_pair[1], hi_pair[0], *hi_pair[1]]
            try:
                d = resampled_perplexities({id(s): s for s in models}, ITERS, _stream(i, source))
            except ValueError:  # the two runs scored different text: nothing to pair
                return None
            g_lo, d_lo = _gap_draws(*lo_pair, d)
            g_hi, d_hi = _gap_draws(*hi_pair, d)
            point_sum, draw_sum = point_sum + (g_hi - g_lo), draw_sum + (d_hi - d_lo)
            hi_sum, lo_sum = hi_sum + g_hi, lo_sum + g_lo
            windows += len(lo_pair[0].nll)
        k = len(sources)
        points.append(100 * point_sum / k)
        draws.append(100 * draw_sum / k)
        gaps_hi.append(100 * hi_sum / k)
        gaps_lo.append(100 * lo_sum / k)
    if not points:
        return None
    ci = pooled_interval(points, draws)
    return (
        label,
        float(np.mean(gaps_hi)),
        float(np.mean(gaps_lo)),
        lambda a, b: a > b,
        (ci.lo, ci.hi, windows),
    )
