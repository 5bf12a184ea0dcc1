"""SFT-P's Tables 1–2, the claims and the communication table, from the records; the accuracies come
from an `Accuracy` (in-run by default, re-scored in rescored.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from experiments.grids import (
    Cell,
    Interval,
    Verdict,
    judge,
    model_parameters,
    read_config,
    train_rows,
)
from experiments.grids import mark as _mark
from experiments.grids.sftp.cells import (
    BASELINES,
    BUDGET_TOLERANCE,
    BUDGETS,
    CLIENTS,
    MIXED,
    VARIANTS,
    budget_label,
    tag_of,
)
from experiments.grids.sftp.records import (
    Accuracy,
    accuracy,
    client_names,
    evaluations,
    last_round,
    mean_of,
    targets,
    values,
)
from fedprune_app.core.config import per_client

IntervalOf = Callable[
    [str, str, list[int]], Interval | None
]  # (tag, other, clients) -> 95% interval of Δ avg


def mark(held: Verdict) -> str:
    return _mark(held).replace("(cells missing)", "(cells or evaluations missing)")


def fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


# --- tables ---------------------------------------------------------------------------------------


def _row(label: str, acc: dict[int, float], kept: dict[int, float]) -> str:
    kept_mean = sum(kept.values()) / len(kept) if kept else None
    return (
        f"| {label} | "
        + " | ".join(fmt(acc.get(c)) for c in range(CLIENTS))
        + f" | {fmt(mean_of(acc))} | {fmt(kept_mean, 3)} |"
    )


def table1(
    grid_cells: list[Cell],
    runs: dict[str, Path],
    acc: Accuracy = accuracy,
    heading: str = "",
    note: str = "",
) -> list[str]:
    """Per budget: dense, post hoc, fedflap and the four SFT-P variants; acc ×100 per client (from
    `acc`: in-run or re-scored), the average over the four clients (– unless all four have one) and
    the mean kept ratio of the prunable projections."""
    tags = {c.tag for c in grid_cells}
    names = client_names(runs.values())
    head = (
        "| model | "
        + " | ".join(f"client {c} `{names.get(c, '?')}`" for c in range(CLIENTS))
        + " | avg | kept (prunable) |"
    )
    lines = [
        f"## Table 1: dense, post hoc, the federated baselines and the SFT-P variants{heading}",
        "",
        note
        or "Accuracy (%) of each client on its own test split in the run's last round (dense = "
        "round 0, post hoc = fedflap's round 1: its cut masks before any training; each baseline's "
        "last round: after the same LoRA steps as SFT-P). avg: over the four clients. kept: the "
        "mean kept ratio of the prunable projections of the models evaluated (SFT-P: each client's "
        "deployed mask).",
        "",
    ]
    for b in BUDGETS:
        baselines = [tag_of(m, b) for m in BASELINES]
        block = [*baselines, *(tag_of("sftp", b, v) for v in VARIANTS)]
        if not any(t in tags for t in block):
            continue
        lines += [f"### {budget_label(b)}", "", head, "|---|" + "---|" * (CLIENTS + 2)]
        dense_tag = next((t for t in block if t in runs), None)
        if dense_tag is None:
            lines.append("| dense (round 0) | *not run* |")
        else:
            rows = evaluations(runs[dense_tag], 0)
            lines.append(
                _row(
                    f"dense (round 0 of `{dense_tag}`)",
                    acc(runs, dense_tag, 0),
                    values(rows, "kept-ratio-prunable"),
                )
            )
        flap = tag_of("fedflap", b)
        if flap in runs:
            lines.append(
                _row(
                    "post hoc (fedflap round 1)",
                    acc(runs, flap, 1),
                    values(evaluations(runs[flap], 1), "kept-ratio-prunable"),
                )
            )
        elif flap in tags:
            lines.append("| post hoc | *not run* |")
        for method, label in BASELINES.items():
            tag = tag_of(method, b)
            if tag in runs:
                lines.append(
                    _row(
                        f"{label} (round {last_round(runs[tag])})",
                        acc(runs, tag, None),
                        values(evaluations(runs[tag]), "kept-ratio-prunable"),
                    )
                )
            elif tag in tags:
                lines.append(f"| {label} | *not run* |")
        for v, (label, _, _) in VARIANTS.items():
            tag = tag_of("sftp", b, v)
            if tag in runs:
                lines.append(
                    _row(
                        f"SFT-P {label}",
                        acc(runs, tag, None),
                        values(evaluations(runs[tag]), "kept-ratio-prunable"),
                    )
                )
            elif tag in tags:
                lines.append(f"| SFT-P {label} | *not run* |")
        lines.append("")
    return lines


def mixed_groups(runs: dict[str, Path]) -> dict[float, list[int]]:
    """{keep ratio: clients} of the mixed run (its config.json), or of MIXED when it did not run."""
    run = runs.get(tag_of("sftp", "mixed", "c-a"))
    per = (
        targets(run)
        if run is not None
        else dict(enumerate(per_client(MIXED, CLIENTS, float, "mixed")))
    )
    groups: dict[float, list[int]] = defaultdict(list)
    for client, p in sorted(per.items()):
        groups[p].append(client)
    return dict(sorted(groups.items(), reverse=True))


def table2(
    runs: dict[str, Path], acc: Accuracy = accuracy, heading: str = "", note: str = ""
) -> list[str]:
    """Uniform vs mixed (+C/+A): per budget group, the group's clients in the mixed run and in the
    uniform run of their budget; then each client's final kept ratio vs its target."""
    names = client_names(runs.values())
    mixed = tag_of("sftp", "mixed", "c-a")
    lines = [
        f"## Table 2: SFT-P +C/+A under uniform vs mixed budgets{heading}",
        "",
        note
        or "Accuracy (%) on each client's own test split in the last round; group mean over the "
        "group's clients. Kept: the client's final kept ratio of the prunable projections / "
        "its target p.",
        "",
    ]
    for p, clients in mixed_groups(runs).items():
        uniform = tag_of("sftp", p, "c-a")
        lines += [
            f"### Clients {', '.join(map(str, clients))} at {budget_label(p)}",
            "",
            "| setting | "
            + " | ".join(f"client {c} `{names.get(c, '?')}`" for c in clients)
            + " | group mean |",
            "|---|" + "---|" * (len(clients) + 1),
        ]
        for label, tag in (
            (f"+C/+A ({round((1 - p) * 100)}% all)", uniform),
            ("+C/+A (mixed)", mixed),
        ):
            if tag not in runs:
                lines.append(f"| {label} | *not run* |")
                continue
            per = acc(runs, tag, None)
            lines.append(
                f"| {label} | "
                + " | ".join(fmt(per.get(c)) for c in clients)
                + f" | {fmt(mean_of(per, clients))} |"
            )
        for label, tag in (
            (f"kept / target ({round((1 - p) * 100)}% all)", uniform),
            ("kept / target (mixed)", mixed),
        ):
            if tag in runs:
                kept, goal = (
                    values(evaluations(runs[tag]), "kept-ratio-prunable"),
                    targets(runs[tag]),
                )
                lines.append(
                    f"| {label} | "
                    + " | ".join(f"{fmt(kept.get(c), 3)} / {goal[c]:.2f}" for c in clients)
                    + " | |"
                )
        lines.append("")
    return lines


# --- claims ---------------------------------------------------------------------------------------


def budget_claim(grid_cells: list[Cell], runs: dict[str, Path]) -> tuple[bool | None, str]:
    """Every client of every SFT-P run ends with |kept − p| ≤ BUDGET_TOLERANCE (absolute, prunable
    ratio): the last round's evaluate rows (each client's deterministic mask, the one compiled and
    deployed). Not held as soon as one measured client is outside; not checked while a run or a
    client's final kept ratio is missing."""
    parts, missing, bad = [], [], False
    for c in grid_cells:
        if c.settings["method"] != "sftp":
            continue
        run = runs.get(c.tag)
        if run is None:
            missing.append(f"`{c.tag}`")
            continue
        kept, goal = values(evaluations(run), "kept-ratio-prunable"), targets(run)
        each = []
        for client in range(CLIENTS):
            if client not in kept:
                missing.append(f"`{c.tag}` client {client}")
                continue
            off = abs(kept[client] - goal[client]) > BUDGET_TOLERANCE + 1e-9
            bad |= off
            each.append(f"{kept[client]:.3f}/{goal[client]:.2f}" + (" ✗" if off else ""))
        if each:
            parts.append(f"`{c.tag}` " + ", ".join(each))
    held = False if bad else (None if missing or not parts else True)
    text = "; ".join(parts) + (
        ("; " if parts else "") + "missing: " + ", ".join(missing) if missing else ""
    )
    return held, text


def gt(a: float, b: float) -> bool:
    return a > b


def binomial_interval(runs: dict[str, Path], acc: Accuracy = accuracy) -> IntervalOf:
    """The in-run interval of Δ avg = avg(tag) − avg(other) over `clients` (×100): each client's
    accuracy a binomial mean of its n evaluated examples (`num-examples` of its last evaluate row),
    the two runs taken as independent (normal approximation: var Δ = Σ_k
    [p_k(1 − p_k)/n_k + q_k(1 − q_k)/m_k] / K²). The two runs score the same examples, so the true
    paired interval is narrower: this one can only call too much unresolved, never too much held.
    n = the examples behind avg(tag). None when a run or client is missing."""

    def interval(tag: str, other: str, clients: list[int]) -> Interval | None:
        if tag not in runs or other not in runs:
            return None
        a, b = acc(runs, tag, None), acc(runs, other, None)
        na, nb = (values(evaluations(runs[t]), "num-examples") for t in (tag, other))
        if not clients or any(
            c not in a or c not in b or not na.get(c) or not nb.get(c) for c in clients
        ):
            return None
        var = (
            sum(
                (a[c] / 100) * (1 - a[c] / 100) / na[c] + (b[c] / 100) * (1 - b[c] / 100) / nb[c]
                for c in clients
            )
            / len(clients) ** 2
        )
        delta = sum(a[c] - b[c] for c in clients) / len(clients)
        half = 1.96 * 100 * var**0.5
        return delta - half, delta + half, int(sum(na[c] for c in clients))

    return interval


def claims(
    grid_cells: list[Cell],
    runs: dict[str, Path],
    acc: Accuracy = accuracy,
    interval: IntervalOf | None = None,
    tolerance: Callable[[list[int]], float | None] | None = None,
    heading: str = "",
    budget: bool = True,
) -> list[str]:
    """The claims on the accuracies `acc` gives (in-run or re-scored) and, with `budget`, the budget
    claim (it reads masks, not accuracies: the same either way). Every Δ carries the 95% interval
    `interval` gives (default: the in-run binomial one, `binomial_interval`); a claim whose interval
    straddles its margin is unresolved. `tolerance(clients)` is one example's worth in points for
    the mixed-budget claim (default 100 / the mixed run's test-examples)."""
    interval = interval or binomial_interval(runs, acc)
    groups = {g for c in grid_cells for g in c.settings["groups"]}
    lines = [
        f"## Claims{heading}",
        "",
        "Each comparison: a vs b (Δ = a − b, its 95% interval, n = the examples behind a). Held: "
        "the claim holds over the whole interval; not held: nowhere on it; unresolved: the "
        "interval straddles the claim's margin (0 for 'beats').",
        "",
    ]
    if budget and any(c.settings["method"] == "sftp" for c in grid_cells):
        held, text = budget_claim(grid_cells, runs)
        lines.append(
            f"- Every client ends within ±2% of its budget (|kept − p| ≤ {BUDGET_TOLERANCE} "
            "absolute, on the kept ratio of the prunable projections; kept/p per client 0…3 of "
            "every SFT-P run, from the last round's deployed masks; a count, no sampling error): "
            f"{mark(held)} ({text})."
        )

    def avg(tag: str, clients: Iterable[int] = range(CLIENTS)) -> float | None:
        return mean_of(acc(runs, tag, None), clients)

    def pair(
        label: str,
        tag: str,
        other: str,
        ok: Callable[[float, float], bool] = gt,
        clients: Iterable[int] = range(CLIENTS),
    ) -> tuple[Any, ...]:
        clients = list(clients)
        return label, avg(tag, clients), avg(other, clients), ok, interval(tag, other, clients)

    if "table1" in groups:
        held, text = judge(
            [
                pair(
                    f"{VARIANTS[c][0]} vs {VARIANTS[n][0]}",
                    tag_of("sftp", 0.5, c),
                    tag_of("sftp", 0.5, n),
                )
                for c, n in (("c-a", "noc-a"), ("c-noa", "noc-noa"))
            ]
        )
        lines.append(
            "- +C beats NOC on the average accuracy at 50%, with adapters and without: "
            f"{mark(held)} ({text})."
        )
        for b in BUDGETS:
            sftp = tag_of("sftp", b, "c-a")
            held, text = judge(
                [pair(f"+C/+A vs {label}", sftp, tag_of(m, b)) for m, label in BASELINES.items()]
            )
            lines.append(
                "- SFT-P (+C/+A) beats every federated baseline (fedflap, LLM-Pruner (FL), "
                f"SliceGPT (FL)) on the average accuracy at {budget_label(b)}: "
                f"{mark(held)} ({text})."
            )
    if "table2" in groups:
        mixed = tag_of("sftp", "mixed", "c-a")
        run = runs.get(mixed)
        if tolerance is None:
            in_run = 100 / int(read_config(run)["test-examples"]) if run is not None else None
            tolerance = lambda _clients: in_run  # noqa: E731
        pairs, tols = [], []
        for p, clients in mixed_groups(runs).items():
            tol = tolerance(clients)
            tols.append("–" if tol is None else f"{tol:.2f}")
            pairs.append(
                pair(
                    f"keep {p:g} (clients {','.join(map(str, clients))}) mixed vs uniform",
                    mixed,
                    tag_of("sftp", p, "c-a"),
                    lambda a, b, tol=tol: a >= b - (tol or 0.0) - 1e-9,
                    clients,
                )
            )
        held, text = judge(pairs)
        lines.append(
            "- Mixed budgets do not hurt either group (each group's mean accuracy in the mixed "
            "run ≥ the same clients' in the uniform run of their budget − one test example's "
            f"worth, 100/examples = {' / '.join(dict.fromkeys(tols))} points): "
            f"{mark(held)} ({text})."
        )
    return lines


# --- communication --------------------------------------------------------------------------------


def _bytes_row(label: str, rows: list[dict[str, Any]], fp32: float | None) -> str:
    if not rows:
        return f"| {label} | *no accepted train reply* | | | | |"
    per: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        if isinstance(r.get("client"), int):
            per[int(r["client"])].append(float(r["bytes-up"]))
    up = sum(float(r["bytes-up"]) for r in rows) / len(rows)
    down = sum(float(r["bytes-down"]) for r in rows) / len(rows)
    each = " · ".join(
        f"{sum(per[c]) / len(per[c]) / 1e6:.3f}" if c in per else "–" for c in range(CLIENTS)
    )
    share = "–" if not fp32 else f"{100 * up / fp32:.2f}% / {100 * down / fp32:.2f}%"
    return (
        f"| {label} | {up / 1e6:.3f} | {each} | {down / 1e6:.3f} | "
        f"{fmt(fp32 and fp32 / 1e6, 1)} | {share} |"
    )


def communication(grid_cells: list[Cell], runs: dict[str, Path]) -> list[str]:
    """Bytes up and down per client and round (accepted train replies) of the comm cells vs the
    model in fp32."""
    lines = [
        "## Communication per client and round",
        "",
        "| run | up, mean (MB) | up per client 0…3 (MB) | down, mean (MB) | model fp32 (MB) | up / "
        "down vs fp32 |",
        "|---|---|---|---|---|---|",
    ]
    for c in grid_cells:
        if "comm" not in c.settings["groups"]:
            continue
        method = c.settings["method"]
        label = (
            f"{BASELINES[method]} ({c.tag})"
            if method in BASELINES
            else f"SFT-P {VARIANTS[c.settings['variant']][0]} ({c.tag})"
        )
        run = runs.get(c.tag)
        if run is None:
            lines.append(f"| {label} | *not run* | | | | |")
            continue
        params = model_parameters(str(read_config(run).get("model-name", "embedded")))
        fp32 = None if params is None else 4.0 * params
        rows = train_rows(run)
        if method == "fedflap":
            lines.append(
                _bytes_row(
                    f"{label}, recovery rounds 2…R", [r for r in rows if r.get("round") != 1], fp32
                )
            )
            lines.append(
                _bytes_row(
                    f"{label}, importance round 1", [r for r in rows if r.get("round") == 1], fp32
                )
            )
        else:
            lines.append(_bytes_row(label, rows, fp32))
    lines += [
        "",
        "SFT-P: up = the generator Θ and, with +A, the LoRA Φ (fp32) and the metrics; down = the "
        "global Θ (+ Φ). e_k never travels; the final masks (bool, 4 × layers × d per client) ride "
        "once on the last evaluation reply and are not counted here. fedflap: round 1 sends "
        "nothing down and gets 4 float32 (layers × d) importance arrays up; recovery rounds send "
        "the LoRA tensors and the fixed bool masks down and get the LoRA tensors up. Model fp32: 4 "
        "bytes × the base model's parameters (config.json's `model-name`, counted from its config; "
        "– when the model is not available here).",
    ]
    return lines
