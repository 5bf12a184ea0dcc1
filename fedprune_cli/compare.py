"""Two re-scored runs side by side, per client: answer perplexity (A at or below B?) and accuracy,
each difference with its paired 95% bootstrap interval over the client's answers.

For a run outside a grid (a new setting tried on one cell) against the grid's archived cells: both
runs must have been re-scored on the same examples
(`fedprune rescore accuracy <run> --examples 100`). `--b-model dense` compares A with the untouched
model that B (a fedflap run, or A itself re-scored with `--dense`) scored.

    fedprune compare outputs/exp-sftp/<run> docs/runs/sftp/20261126-061133-sftp-p50-noc-a

Several pairs (A1 B1 A2 B2 ...: seed replicates, each pair scored on its own questions) are pooled:
each pair's paired difference on its own answers, then the two-stage bootstrap over the pairs and
the answers within each (`intervals.pooled_interval`, as the grid pools its seed replicates), so the
interval holds the training noise:

    fedprune compare <seed-0 run> <seed-0 run> <seed-1 run> <seed-1 run> --b-model dense

`--ratio-goal R` also judges ppl(A) / ppl(B) ≤ R per client with its paired interval (SFT-P against
its ceiling: the make-run goal ≤ 1.25 at keep 0.8):

    fedprune compare <sftp run> <ceiling run> --ratio-goal 1.25
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fedprune_cli.runfiles import (
    MODEL_OF_ROUND,
    answer_units,
    per_example,
    read_config,
    read_rescore,
)
from fedprune_cli.verdicts import judge, mark, pooled_pairs

ROUND_OF_MODEL = {v: k for k, v in MODEL_OF_ROUND.items()}
# the run-config keys that draw a client's test split and unused tail
# (fedprune_app.llm.data.client_data)
SPLIT_KEYS = (
    "seed",
    "client-data",
    "partitioner",
    "dirichlet-alpha",
    "test-examples",
    "val-examples",
    "max-train-examples",
)


def split_keys_differ(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    """The SPLIT_KEYS on which two run configs differ ([] when either config is unknown)."""
    return [] if a is None or b is None else [key for key in SPLIT_KEYS if a.get(key) != b.get(key)]


def check_same_questions(a: Path, b: Path, clients: list[int]) -> None:
    """Refuse to pair two runs whose clients were scored on different questions: by the digests
    rescore.json carries (`fedprune rescore accuracy`), else (older records) by the run-config keys
    that draw the splits."""
    runs = {"a": a, "b": b}
    digests = []
    for tag in runs:
        scored = (read_rescore(runs, tag) or {}).get("clients")
        digests.append(
            {int(k): c.get("questions") for k, c in scored.items()}
            if isinstance(scored, dict)
            else {}
        )
    differ = [
        k
        for k in clients
        if digests[0].get(k) and digests[1].get(k) and digests[0][k] != digests[1][k]
    ]
    if differ:
        raise SystemExit(
            f"error: client(s) {differ} were re-scored on different questions in A and B"
        )
    if all(digests[0].get(k) and digests[1].get(k) for k in clients):
        return
    configs = [read_config(r) if (r / "config.json").is_file() else None for r in (a, b)]
    if keys := split_keys_differ(*configs):
        raise SystemExit(
            f"error: A and B draw their test splits differently ({', '.join(keys)} differ), so "
            "their clients were scored on different questions; re-score both with "
            "`fedprune rescore accuracy <run> --dense` and compare each with its own "
            "`--b-model dense`"
        )


def compare(a: Path, b: Path, b_model: str = "final") -> list[str]:
    """The two lines: answer perplexity (judged per client: A at or below B) and accuracy Δ (A − B,
    points) per client and over the clients both scored, each with its paired interval."""
    return compare_pooled([(a, b)], b_model)


def compare_pooled(
    pairs: list[tuple[Path, Path]], b_model: str = "final", ratio_goal: float | None = None
) -> list[str]:
    """`compare` over one or more (A, B) pairs: each pair's paired differences on its own questions;
    with several pairs the estimates are their means and the intervals the two-stage bootstrap over
    pairs, then answers (`pooled_pairs`, `accuracy_interval`); n counts the answers of every pair.
    Clients: those every pair scored. With `ratio_goal` a third line judges ppl(A) / ppl(B) at or
    below it per client (e.g. SFT-P against its ceiling: ≤ 1.25 at keep 0.8 and ≤ 2 at keep 0.5),
    each ratio with its paired interval."""
    if all(is_rouge(read_rescore({"r": r}, "r")) for pair in pairs for r in pair):
        return [compare_rouge(pairs)]
    replicates, accuracy = [], []
    for a, b in pairs:
        runs = {"a": a, "b": b}
        units_a, units_b = answer_units(runs, "a"), answer_units(runs, "b", ROUND_OF_MODEL[b_model])
        if not units_a or not units_b:
            raise SystemExit(
                f"error: {a if not units_a else b} has no re-scored answers for model '"
                f"{'final' if not units_a else b_model}' (run fedprune_cli.rescore_accuracy first)"
            )
        check_same_questions(a, b, sorted(set(units_a) & set(units_b)))
        replicates.append((units_a, units_b))
        accuracy.append((per_example(runs, "a"), per_example(runs, "b", ROUND_OF_MODEL[b_model])))
    clients = sorted(set.intersection(*(set(ua) & set(ub) for ua, ub in replicates)))
    held, text = judge(pooled_pairs(replicates, clients))
    pooled = "" if len(pairs) == 1 else f", pooled over {len(pairs)} pairs"
    lines = [f"answer perplexity, A at or below B{pooled}: {mark(held)} ({text})"]
    parts = []
    for group in [*([k] for k in clients), clients]:
        mean, lo, hi, n = accuracy_interval(accuracy, group)
        name = f"client {group[0]}" if len(group) == 1 else "all clients"
        parts.append(f"{name}: Δ {100 * mean:+.1f} [{100 * lo:.1f}, {100 * hi:.1f}], n = {n}")
    lines.append(f"accuracy, A − B (points){pooled}: " + "; ".join(parts))
    if ratio_goal is not None:
        held, text = judge(pooled_pairs(replicates, clients, ratio_goal))
        lines.append(
            f"answer perplexity ratio A / B at or below {ratio_goal:g}{pooled}: {mark(held)} "
            f"(per client: the ratio vs the goal, Δ = ratio − goal; {text})"
        )
    return lines


def accuracy_interval(
    pairs: list[tuple[dict[int, list[float]], dict[int, list[float]]]], group: list[int]
) -> tuple[float, float, float, int]:
    """(Δ, lo, hi, n) of the accuracy difference A − B over the clients in `group` (the mean of
    their means, each client resampled within itself): the mean of the pairs' Δ with
    `intervals.pooled_interval` over their bootstrap draws (one pair: its paired percentile
    interval, `evaluation.bootstrap_ci`'s)."""
    from fedprune_app.llm.evaluation import bootstrap_means
    from fedprune_app.llm.intervals import pooled_interval

    estimates, draws, n = [], [], 0
    for i, (acc_a, acc_b) in enumerate(pairs):
        if any(len(acc_a[k]) != len(acc_b[k]) for k in group):
            raise SystemExit(
                f"error: client(s) {group} were re-scored on different examples in A and B"
            )
        estimate, means = bootstrap_means(
            [v for k in group for v in acc_a[k]],
            [v for k in group for v in acc_b[k]],
            seed=i,
            strata=[k for k in group for _ in acc_a[k]],
        )
        estimates.append(estimate)
        draws.append(means)
        n += sum(len(acc_a[k]) for k in group)
    ci = pooled_interval(estimates, draws)  # one pair: the percentile interval of its own draws
    return ci.estimate, ci.lo, ci.hi, n


def is_rouge(record: dict[str, Any] | None) -> bool:
    """A `fedprune rescore rouge` record (Rouge-L per example), not an accuracy one."""
    return record is not None and "rouge-l" in record


def compare_rouge(pairs: list[tuple[Path, Path]]) -> str:
    """Rouge-L ×100 of A − B on the same unused examples, paired per example; several pairs pooled
    like `accuracy_interval` (two-stage bootstrap over the pairs, then the examples)."""
    from fedprune_app.llm.evaluation import bootstrap_means
    from fedprune_app.llm.intervals import pooled_interval

    estimates, draws, n = [], [], 0
    for i, (a, b) in enumerate(pairs):
        configs = [read_config(r) if (r / "config.json").is_file() else None for r in (a, b)]
        if keys := split_keys_differ(*configs):
            raise SystemExit(
                f"error: A and B drew their examples differently ({', '.join(keys)} differ)"
            )
        scores_a, scores_b = (read_rescore({"r": r}, "r")["scores"] for r in (a, b))
        if len(scores_a) != len(scores_b):
            raise SystemExit(
                f"error: A and B were re-scored on {len(scores_a)} and {len(scores_b)} examples; "
                "re-score both with the same --examples"
            )
        estimate, means = bootstrap_means(scores_a, scores_b, seed=i)
        estimates.append(estimate)
        draws.append(means)
        n += len(scores_a)
    ci = pooled_interval(estimates, draws)
    pooled = "" if len(pairs) == 1 else f", pooled over {len(pairs)} pairs"
    verdict = "unresolved" if ci.lo <= 0 <= ci.hi else ("A above B" if ci.lo > 0 else "A below B")
    return (
        f"Rouge-L ×100, A − B{pooled}: Δ {100 * ci.estimate:+.2f} [{100 * ci.lo:.2f}, "
        f"{100 * ci.hi:.2f}], n = {n}: **{verdict}**"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `fedprune compare`."""
    parser.add_argument(
        "runs",
        type=Path,
        nargs="+",
        metavar="A B",
        help="one pair A B, or several pairs A1 B1 A2 B2 ... to pool (seed replicates); each run "
        "re-scored first with `fedprune rescore`",
    )
    parser.add_argument(
        "--b-model",
        default="final",
        choices=sorted(ROUND_OF_MODEL),
        help="B's model: final (its deployed models), dense (the untouched model B scored with "
        "`rescore accuracy --dense`), post-hoc (a fedflap run's post hoc cut)",
    )
    parser.add_argument(
        "--ratio-goal",
        type=float,
        default=None,
        metavar="R",
        help=(
            "also judge the answer-perplexity ratio A / B at or below R per client (paired "
            "interval)"
        ),
    )


def run(args: argparse.Namespace) -> int:
    """Print A and B and the comparison lines."""
    if len(args.runs) % 2:
        print(f"error: runs come in pairs A B; got {len(args.runs)} paths", file=sys.stderr)
        return 2
    if args.ratio_goal is not None and not args.ratio_goal > 0:
        print(
            f"error: --ratio-goal must be a positive ratio (e.g. 1.25), got {args.ratio_goal}",
            file=sys.stderr,
        )
        return 2
    pairs = list(zip(args.runs[::2], args.runs[1::2], strict=True))
    for i, (a, b) in enumerate(pairs, 1):
        tag = "" if len(pairs) == 1 else str(i)
        print(f"A{tag} = {a.name}\nB{tag} = {b.name} ({args.b_model})")
    print("\n".join(compare_pooled(pairs, args.b_model, args.ratio_goal)))
    return 0
