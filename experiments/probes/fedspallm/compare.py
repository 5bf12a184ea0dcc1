"""Two FedSpaLLM runs of one setting that differ in one key, compared on the same held-out windows.

Finding: At the paper's 2,048-token calibration segments the 80% global model is still 28–33% above
  the standalone mean (1,024 tokens: 10–13%, 256: 44–67%), so short calibration does not explain the
  80% reversal.
Record: docs/bench/fedspallm-calib-1024-s80.json and docs/bench/fedspallm-calib-2048-s80.json;
  quoted in docs/notes/2026-11-fedspallm-investigations.md, docs/methods/fedspallm.md and
  docs/claims.md.

A run's seed draws the held-out text it scores, so two runs with the same seed and evaluation keys
score the same windows (checked: the dense model's per-window NLLs must agree to 1e-6 relative, else
the tool stops). Each model of the two runs (global = the last round's model, standalone = the
clients' round-1 models, their mean perplexity) is then paired window by window across the runs: one
bootstrap over the windows resamples all of them at once (`intervals.resampled_perplexities`), so
`variant − base` of the global model, of the standalone mean and of the claim's own statistic
(global − standalone mean) each get a paired 95% interval. The intervals cover the scored text only:
a changed key also redraws what the runs' clients calibrated on, whose run-to-run spread needs
seeds. Used for the calibration-length question at 80% (docs/methods/fedspallm.md): one seed with
`calib-seq-len` 256 against 1,024 and 2,048.

    python -m experiments.probes.fedspallm.compare \
        --base docs/runs/fedspallm/<run>-paper-s80-seed1 \
        --variant docs/runs/fedspallm-seq2048/<run>-paper-s80-seed1 --label "calib-seq-len 2048" \
        --out docs/bench/fedspallm-calib-2048-s80.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.render import finish_record, start_record
from experiments.grids import read_metrics
from experiments.grids.fedspallm.records import window_scores
from fedprune_app.llm.intervals import TokenScores, pooled_interval, resampled_perplexities

ITERS = 2000
STATISTICS = ("global", "standalone mean", "global - standalone mean")
MODELS = ("dense", "fedspallm", "standalone")


def _same_windows(a: TokenScores, b: TokenScores) -> bool:
    return (
        len(a.nll) == len(b.nll)
        and np.array_equal(a.tokens, b.tokens)
        and bool(np.allclose(a.nll, b.nll, rtol=1e-6, atol=0.0))
    )


def _interval(point: float, draws: np.ndarray) -> list[float]:
    ci = pooled_interval([point], [draws])  # one replicate: the percentile interval of its draws
    return [ci.estimate, ci.lo, ci.hi]


def compare_corpus(
    base: dict[str, list[TokenScores]], variant: dict[str, list[TokenScores]], seed: int = 0
) -> dict[str, Any]:
    """The two runs' models on one corpus ({model: [scores]} each: `dense`, `fedspallm`,
    `standalone`): each run's perplexities and global − standalone mean, and variant − base of every
    statistic, with paired intervals."""
    if not _same_windows(base["dense"][0], variant["dense"][0]):
        raise ValueError(
            "the two runs did not score the same windows (their dense models' per-window NLLs "
            "differ): compare runs with the same seed and evaluation keys"
        )
    models: dict[Any, TokenScores] = {}
    for run, scores in (("base", base), ("variant", variant)):
        models[(run, "global")] = scores["fedspallm"][0]
        models.update({(run, k): s for k, s in enumerate(scores["standalone"])})
    draws = resampled_perplexities(models, ITERS, seed)
    out: dict[str, Any] = {
        "windows": len(base["dense"][0].nll),
        "dense": base["dense"][0].perplexity,
    }
    stats: dict[str, dict[str, tuple[float, np.ndarray]]] = {}
    for run, scores in (("base", base), ("variant", variant)):
        n = len(scores["standalone"])
        std_point = float(np.mean([s.perplexity for s in scores["standalone"]]))
        std_draws = np.mean([draws[(run, k)] for k in range(n)], axis=0)
        fed = scores["fedspallm"][0].perplexity
        stats[run] = {
            "global": (fed, draws[(run, "global")]),
            "standalone mean": (std_point, std_draws),
            "global - standalone mean": (fed - std_point, draws[(run, "global")] - std_draws),
        }
        out[run] = {k: _interval(*v) for k, v in stats[run].items()}
    out["variant - base"] = {
        k: _interval(
            stats["variant"][k][0] - stats["base"][k][0],
            stats["variant"][k][1] - stats["base"][k][1],
        )
        for k in STATISTICS
    }
    return out


def compare_runs(base: Path, variant: Path) -> dict[str, Any]:
    """compare_corpus on every corpus both runs scored, from their metrics.jsonl."""
    a, b = window_scores(base), window_scores(variant)
    for run, scores in ((base, a), (variant, b)):
        if not all(scores.get(m) for m in MODELS):
            raise ValueError(
                f"{run}: needs per-window scores of the dense, global and standalone models "
                "(a run with `fedspallm-references` including 'standalone')"
            )
    corpora = sorted(set(a["dense"]) & set(b["dense"]))
    if not corpora:
        raise ValueError(f"{base} and {variant} scored no corpus in common")
    return {
        c: compare_corpus({m: a[m][c] for m in MODELS}, {m: b[m][c] for m in MODELS})
        for c in corpora
    }


def run_facts(run: Path) -> dict[str, Any]:
    """What a reader needs beside the figures: the run's wall time and each client's calibration
    tokens."""
    summary = run / "summary.json"
    seconds = json.loads(summary.read_text()).get("seconds") if summary.exists() else None
    tokens = sorted(
        {
            int(r["calib-tokens"])
            for r in read_metrics(run)
            if r.get("phase") == "train" and r.get("calib-tokens") is not None
        }
    )
    return {"seconds": seconds, "calib-tokens": tokens}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", type=Path, required=True, help="a finished FedSpaLLM run (its folder)")
    p.add_argument(
        "--variant", type=Path, required=True, help="the same setting with one key changed"
    )
    p.add_argument(
        "--label", required=True, help="what the variant changes, e.g. 'calib-seq-len 1024'"
    )
    p.add_argument("--out", type=Path, help="the JSON record to write (docs/bench/...)")
    args = p.parse_args(argv)
    record = start_record("fedspallm-compare", "experiments.probes.fedspallm.compare", argv)
    record.update(
        {
            "base": str(args.base),
            "variant": str(args.variant),
            "label": args.label,
            "runs": {"base": run_facts(args.base), "variant": run_facts(args.variant)},
            "corpora": compare_runs(args.base, args.variant),
        }
    )
    return finish_record(record, args.out)


if __name__ == "__main__":
    main()
