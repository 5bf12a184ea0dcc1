"""The SFT-P grid's tables and claims again, on the re-scored accuracies of
`fedprune_cli/rescore_accuracy.py`.

In-run, each client is evaluated on 30 test examples: one example moves its accuracy by 3.3 points,
and the claims compare averages a few examples apart. The re-scoring evaluates the same final models
on each client's test split plus up to `--examples` unused examples of its task, per example, so
every Δ of the claims gets a paired bootstrap interval (resampled within each client: the average
over clients stays an average of client means, as in the tables).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from experiments.grids import Cell, Interval, Pair, judge, mark, replicate_tags
from experiments.grids.sftp.cells import BASELINES, BUDGETS, CLIENTS, VARIANTS, budget_label, tag_of
from experiments.grids.sftp.records import (
    answer_units,
    per_example,
    read_rescore,
    rescored_accuracy,
    rescored_perplexity,
)
from experiments.grids.sftp.schedules import confounds
from experiments.grids.sftp.tables import claims, mixed_groups, table1, table2
from fedprune_cli.verdicts import pooled_pairs


def paired_interval(runs: dict[str, Path]) -> Callable[[str, str, list[int]], Interval | None]:
    """The paired 95% bootstrap interval (×100) of avg(tag) − avg(other) over `clients`, stratified
    by client, with n = the examples per model; None unless both cells were re-scored on the same
    examples."""
    from fedprune_app.llm.evaluation import bootstrap_ci

    def interval(tag: str, other: str, clients: list[int]) -> Interval | None:
        a, b = per_example(runs, tag), per_example(runs, other)
        if not clients or any(c not in a or c not in b or len(a[c]) != len(b[c]) for c in clients):
            return None
        values = [v for c in clients for v in a[c]]
        _, lo, hi = bootstrap_ci(
            values, [v for c in clients for v in b[c]], strata=[c for c in clients for _ in a[c]]
        )
        return 100 * lo, 100 * hi, len(values)

    return interval


def tolerance(grid_cells: list[Cell], runs: dict[str, Path]) -> Callable[[list[int]], float | None]:
    """One example's worth (points) of a group of clients re-scored: 100 / the fewest examples among
    them."""
    sizes: dict[int, int] = {}
    for c in grid_cells:
        for k, v in per_example(runs, c.tag).items():
            sizes[k] = min(sizes.get(k, len(v)), len(v))
    return lambda clients: (
        (100 / min(sizes[k] for k in clients)) if all(k in sizes for k in clients) else None
    )


def section(grid_cells: list[Cell], runs: dict[str, Path]) -> list[str]:
    """Tables 1–2 and the claims on the re-scored accuracies; nothing while no cell has a
    rescore.json."""
    records = {c.tag: r for c in grid_cells if (r := read_rescore(runs, c.tag)) is not None}
    if not records:
        return []
    sizes = sorted(
        {(int(k), int(v["examples"])) for r in records.values() for k, v in r["clients"].items()}
    )
    groups = {g for c in grid_cells for g in c.settings["groups"]}
    heading = " (re-scored)"
    lines = [
        "# Re-scored on more examples per client",
        "",
        "The same final models (SFT-P: each client's compiled model; each baseline: its compiled "
        "model; fedflap also the post hoc cut and the dense model) scored by `fedprune rescore "
        "accuracy` with lm-eval, per example, on each client's test split plus up to "
        f"{max(int(r['per-source']) for r in records.values())} examples of its task that no split "
        "of the runs read (examples per client: "
        + ", ".join(f"{k}: {n}" for k, n in dict(sizes).items())
        + "; a task "
        "with none left keeps its test split only). A Δ's interval is a paired 95% bootstrap over "
        "the examples, resampled within each client. Cells not re-scored show –.",
        "",
    ]
    note = (
        "Accuracy (%) of each client re-scored (see above); dense and post hoc from the first "
        "baseline run of the budget. kept: as in the in-run table."
    )
    if "table1" in groups:
        lines += table1(grid_cells, runs, rescored_accuracy, heading, note)
    if "table2" in groups:
        lines += table2(
            runs,
            rescored_accuracy,
            heading,
            "Accuracy (%) of each client re-scored (see above); group "
            "mean over the group's clients. Kept: as in the in-run table.",
        )
    lines += claims(
        grid_cells,
        runs,
        rescored_accuracy,
        paired_interval(runs),
        tolerance(grid_cells, runs),
        heading,
        budget=False,
    )
    if "table1" in groups and any(answer_units(runs, c.tag) for c in grid_cells):
        lines += [
            "",
            *table1(
                grid_cells, runs, rescored_perplexity, " (re-scored answer perplexity)", PPL_NOTE
            ),
        ]
        lines += perplexity_comparisons(runs)
    return lines


PPL_NOTE = (
    "Answer perplexity (lower is better) of each client's correct answers given the questions, on "
    "the same re-scored examples: the deployed model's quality, with far less noise than accuracy. "
    "avg: the mean over the four clients' perplexities."
)


def _paired_pairs(
    ours: dict[int, Any], other: dict[int, Any], clients: Iterable[int]
) -> list[Pair]:
    """Per client: ppl(ours) at or below ppl(other), with the paired bootstrap interval of the
    difference over the client's answers (one replicate of `pooled_pairs`: the same draws as
    `intervals.paired_perplexity_interval`)."""
    return pooled_pairs([(ours, other)], clients)


def ablation_line(runs: dict[str, Path], budget: float, ours: str, other: str) -> str | None:
    """One ablation of the paper (`ours` at or below `other` in answer perplexity, per client) at a
    budget: on the two cells' own runs, or pooled over every seed both have run (`--seeds`); None
    until both are re-scored."""
    seeds = (
        replicate_tags(runs, tag_of("sftp", budget, ours)),
        replicate_tags(runs, tag_of("sftp", budget, other)),
    )
    replicates = [
        (a, z)
        for s in seeds[0]
        if s in seeds[1]
        if (a := answer_units(runs, seeds[0][s])) and (z := answer_units(runs, seeds[1][s]))
    ]
    if not replicates:
        return None
    held, text = judge(pooled_pairs(replicates, range(CLIENTS)))
    pooled = (
        ""
        if len(replicates) == 1
        else f", pooled over {len(replicates)} seeds (means of the seeds; the interval holds "
        "their spread)"
    )
    caveat = confounds(runs, tag_of("sftp", budget, ours), tag_of("sftp", budget, other))
    return (
        f"- {budget_label(budget)}: SFT-P {VARIANTS[ours][0]} at or below "
        f"{VARIANTS[other][0]}{pooled}: {mark(held)} ({text}).{caveat}"
    )


ABLATIONS = (
    ("c-a", "noc-a"),
    ("c-noa", "noc-noa"),
    ("c-a", "c-noa"),
    ("noc-a", "noc-noa"),
)  # +C vs NOC, +A vs NOA


def perplexity_comparisons(runs: dict[str, Path]) -> list[str]:
    """SFT-P (+C/+A) against each federated baseline and the untouched model on answer perplexity,
    per client: Δ = ppl(SFT-P) − ppl(other) with a paired bootstrap interval over the client's
    answers (`intervals.paired_perplexity_interval`); the paper's two ablations at each budget whose
    pair of cells has run (+C against NOC, +A against NOA, the other switch fixed); and the
    mixed-budget run against the uniform run of each client's budget (Table 2's question). Not
    claims of the paper (it reports accuracy): the quality checks the accuracies are too noisy to
    give."""
    lines = [
        "",
        "## Answer perplexity, paired (re-scored)",
        "",
        "SFT-P (+C/+A) at or below each reference's answer perplexity on every client, each Δ = "
        "ppl(SFT-P) − ppl(reference) with a paired 95% bootstrap interval over that client's "
        "answers (n answers).",
        "",
    ]
    for b in BUDGETS:
        sftp = answer_units(runs, tag_of("sftp", b, "c-a"))
        if not sftp:
            continue
        first = next(
            (t for t in (tag_of(m, b) for m in BASELINES) if answer_units(runs, t, 0)), None
        )
        references = [(label, answer_units(runs, tag_of(m, b))) for m, label in BASELINES.items()]
        if first is not None:
            references.insert(0, ("the untouched model", answer_units(runs, first, 0)))
        for label, other in references:
            held, text = judge(_paired_pairs(sftp, other, range(CLIENTS)))
            lines.append(
                f"- {budget_label(b)}: SFT-P +C/+A at or below {label}: {mark(held)} ({text})."
            )
    lines += [
        line
        for b in BUDGETS
        for ours, other in ABLATIONS
        if (line := ablation_line(runs, b, ours, other))
    ]
    mixed = answer_units(runs, tag_of("sftp", "mixed", "c-a"))
    if mixed:
        for p, clients in mixed_groups(runs).items():
            held, text = judge(
                _paired_pairs(mixed, answer_units(runs, tag_of("sftp", p, "c-a")), clients)
            )
            caveat = confounds(runs, tag_of("sftp", "mixed", "c-a"), tag_of("sftp", p, "c-a"))
            lines.append(
                f"- mixed budgets, clients {', '.join(map(str, clients))} (keep {p:g}): the mixed "
                f"run at or below the uniform run of their budget: {mark(held)} ({text}).{caveat}"
            )
    return lines
