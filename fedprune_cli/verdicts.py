"""Verdicts with their uncertainty: a comparison is held, not held or unresolved by its 95%
interval.

Used by `fedprune compare`, the benchmarks' goal lines and the papers' grids alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

Verdict = (
    bool | str | None
)  # True held, False not held, UNRESOLVED, None not checked (cells missing)
UNRESOLVED = "unresolved"


def mark(held: Verdict) -> str:
    if held == UNRESOLVED:
        return "**unresolved**"
    return (
        "**held**"
        if held
        else ("**not held**" if held is not None else "**not checked** (cells missing)")
    )


Interval = tuple[
    float, float, int
]  # (lo, hi) of a 95% interval of a − b, and the sample size n behind it
Pair = (
    tuple[str, float | None, float | None, Callable[[float, float], bool]]
    | tuple[str, float | None, float | None, Callable[[float, float], bool], Interval | None]
)


def decide(
    ok: Callable[[float, float], bool], a: float, b: float, interval: Interval | None
) -> Verdict:
    """One comparison. Without an interval: ok(a, b), a point comparison (`judge` counts it
    unresolved). With the 95% interval [lo, hi] of a − b: held when ok holds over the whole interval
    (at b + lo and at b + hi), not held when it holds nowhere on it, else UNRESOLVED: an interval
    that straddles the claim's margin (0 for a > b) cannot decide it."""
    if interval is None:
        return ok(a, b)
    lo, hi, _ = interval
    at_lo, at_hi = ok(b + lo, b), ok(b + hi, b)
    return True if at_lo and at_hi else (False if not at_lo and not at_hi else UNRESOLVED)


def judge(pairs: list[Pair]) -> tuple[Verdict, str]:
    """(verdict, evidence) of comparisons (label, a, b, ok(a, b)[, interval of a − b]): not held as
    soon as one measured pair is not held; else not checked while a needed cell is missing; else
    unresolved while one is unresolved or has no interval (a point comparison carries no
    uncertainty, so it decides nothing either way); else held. Evidence per pair: a vs b and the
    effect Δ = a − b with its 95% interval and n ("no interval" where none is given), ✗ when not
    held, ? when unresolved."""
    measured, missing = [], []
    for pair in pairs:
        label, a, b, ok = pair[:4]
        interval = pair[4] if len(pair) > 4 else None  # type: ignore[misc]
        if a is None or b is None:
            missing.append(label)
        else:
            measured.append(
                (label, a, b, interval, decide(ok, a, b, interval) if interval else UNRESOLVED)
            )
    verdicts = [v for *_, v in measured]
    if False in verdicts:
        held: Verdict = False
    elif missing or not pairs:
        held = None
    else:
        held = UNRESOLVED if UNRESOLVED in verdicts else True
    parts = []
    for label, a, b, interval, v in measured:
        effect = (
            f"Δ {a - b:+.2f} [{interval[0]:.2f}, {interval[1]:.2f}], n = {interval[2]}"
            if interval is not None
            else f"Δ {a - b:+.2f}, no interval"
        )
        parts.append(
            f"{label}: {a:.2f} vs {b:.2f} ({effect})" + {False: " ✗", UNRESOLVED: " ?"}.get(v, "")
        )
    text = "; ".join(parts)
    if missing:
        text += ("; " if text else "") + "missing: " + ", ".join(missing)
    return held, text


def pooled_pairs(
    replicates: list[tuple[dict[int, Any], dict[int, Any]]],
    clients: Iterable[int],
    ratio_goal: float | None = None,
) -> list[Pair]:
    """Per client, ppl(ours) at or below ppl(other) over seed replicates of both cells: each
    replicate's paired difference on its own answers, pooled by the two-stage bootstrap
    (`intervals.pooled_interval`: replicates, then answers within each), so the interval holds the
    training noise too; a and b are the replicates' means, n the answers over all replicates. One
    replicate: its own paired percentile interval. With `ratio_goal` the statistic is the ratio
    ppl(ours) / ppl(other), judged at or below the goal (a: the ratio, b: the goal, the interval
    that of ratio − goal)."""
    import numpy as np

    from fedprune_app.llm.intervals import pooled_interval, resampled_perplexities

    pairs: list[Pair] = []
    for c in clients:
        if any(c not in a or c not in b or len(a[c].nll) != len(b[c].nll) for a, b in replicates):
            pairs.append((f"client {c}", None, None, lambda x, y: x <= y))
            continue
        combine = np.subtract if ratio_goal is None else np.divide
        draws = []
        for i, (a, b) in enumerate(replicates):
            d = resampled_perplexities({"a": a[c], "b": b[c]}, iters=2000, seed=7919 * i + c)
            draws.append(combine(d["a"], d["b"]))
        ci = pooled_interval(
            [float(combine(a[c].perplexity, b[c].perplexity)) for a, b in replicates], draws, seed=c
        )
        n = sum(len(a[c].nll) for a, _ in replicates)
        if ratio_goal is None:
            pairs.append(
                (
                    f"client {c}",
                    float(np.mean([a[c].perplexity for a, _ in replicates])),
                    float(np.mean([b[c].perplexity for _, b in replicates])),
                    lambda x, y: x <= y,
                    (ci.lo, ci.hi, n),
                )
            )
        else:
            pairs.append(
                (
                    f"client {c}",
                    ci.estimate,
                    ratio_goal,
                    lambda x, y: x <= y,
                    (ci.lo - ratio_goal, ci.hi - ratio_goal, n),
                )
            )
    return pairs
