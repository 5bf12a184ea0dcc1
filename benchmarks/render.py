"""Benchmark records (docs/bench/*.json) and the markdown the docs show from them.

Every bench_/sftp_ tool writes one JSON record: its figures, the command that wrote it, the date,
the machine (cores, CPU, torch) and the load average at its start and end (the machine is shared; a
figure measured under load says so). This module starts and finishes such records and renders each
kind as the exact markdown block the docs carry between a pair of markers:

    <!-- bench:<kind> <record> [<record> ...] -->
    ...rendered markdown...
    <!-- /bench:<kind> -->

(<record>: a file under docs/bench/). `tests/cli/test_records.py` re-renders every marked block of
docs/ and fails on a mismatch, so a figure in the docs cannot drift from its record.

    fedprune bench render docs/bench/pruning.json  # print the markdown of one record
    # one block, many
    fedprune bench render --kind budget-trajectory docs/bench/sftp-budget-lam*.json
    fedprune bench render --check                  # compare every marked block in docs/ (exit 1)
    fedprune bench render --write                  # rewrite every marked block in docs/
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.profile import table as profile_table
from benchmarks.records import (  # noqa: F401 (start_record, finish_record: re-exported)
    BENCH_DIR,
    ROOT,
    Record,
    command_of,
    cpu_features,
    finish_record,
    load_line,
    shown_command,
    start_record,
)
from fedprune_cli.verdicts import decide, mark

MARKER = re.compile(
    r"^(?P<indent> *)<!-- bench:(?P<kind>[\w-]+)(?P<records>(?: [\w.-]+\.json)+) -->$", re.M
)


# ---------------------------------------------------------------------------------------- renderers


def pruning(records: Sequence[Record]) -> str:
    """benchmarks/pruning.py: seconds per pruner, calibration throughput, perplexity of each pruned
    model."""
    (r,) = records
    lines = [
        f"| pruner | total s | CPU s | mean s / layer | slowest layer s | calibration tokens / s "
        f"| Wikipedia ppl (dense {r['dense-ppl']:.2f}) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in r["pruners"]:
        lines.append(
            f"| {row['pruner']} | {row['seconds']:.1f} | {row['cpu-seconds']:.1f} "
            f"| {row['mean-layer-seconds']:.2f} | {row['slowest-layer-seconds']:.2f} "
            f"| {row['tokens-per-second']:.0f} | {row['ppl']:.2f} |"
        )
    lines += [
        "",
        f"{r['threads']} thread(s), calibration {r['segments']} × {r['seq-len']} tokens, sparsity "
        f"{r['sparsity']:g}; {load_line(r)}; `{shown_command(r)}`.",
    ]
    return "\n".join(lines)


def aggregation_memory(records: Sequence[Record]) -> str:
    """experiments/benchmarks/aggregation_memory.py: tracemalloc peak of one FedSpaLLM aggregation,
    both paths."""
    (r,) = records
    lines = [
        "| clients × layers per reply (clients per layer) | reply MB | hold every reply, then "
        "aggregate | fold each in as it arrives | ratio | seconds (hold / fold) | same "
        "global weights |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in r["runs"]:
        lines.append(
            f"| {row['clients']} × {row['layers']} (~{row['clients'] * row['layers'] / 30:.1f}) "
            f"| {row['reply-mb']:.0f} | {row['hold-peak-mb']:.0f} MB | {row['stream-peak-mb']:.0f} "
            f"MB | {row['hold-peak-mb'] / row['stream-peak-mb']:.2f}× "
            f"| {row['hold-seconds']:.1f} / {row['stream-seconds']:.1f} "
            f"| {'yes' if row['same-global-weights'] else 'NO'} |"
        )
    lines += ["", f"{load_line(r)}; `{shown_command(r)}`."]
    return "\n".join(lines)


def overhead(records: Sequence[Record]) -> str:
    """benchmarks/overhead.py: the same FedIT work through `flwr run` and as a plain loop."""
    (r,) = records
    fl, pl = r["flower"], r["plain"]
    rounds = len(fl["rounds"])
    steady_fl, steady_pl = r["steady-round"]["flower"], r["steady-round"]["plain"]
    lines = [
        "| | flwr run (simulation) | plain loop | ratio |",
        "|---|---|---|---|",
        f"| wall time, whole job | {fl['total']:.1f} s | {pl['total']:.1f} s | "
        f"{fl['total'] / pl['total']:.2f} |",
        f"| start-up (SuperLink + Ray + ServerApp) | {fl['startup']:.1f} s | – | |",
        f"| round 1 (actors load the model) | {fl['rounds'][0]:.1f} s | {pl['rounds'][0]:.1f} s "
        f"| {fl['rounds'][0] / pl['rounds'][0]:.2f} |",
        f"| steady round (mean of rounds 2..{rounds}) | {steady_fl:.1f} s | {steady_pl:.1f} s "
        f"| {steady_fl / steady_pl:.2f} |",
        "",
        "Flower's per-round overhead in steady state: "
        f"**{100 * (steady_fl / steady_pl - 1):+.1f}%** (goal: within 15%); {r['clients']} clients "
        f"× {rounds} rounds × {r['steps']} steps, flwr {r['flwr']}; {load_line(r)}; "
        f"`{shown_command(r)}`.",
    ]
    return "\n".join(lines)


def _setting(r: Record) -> str:
    s = r["settings"]
    held = s.get("hold-open", s.get("sftp-hold-open"))  # the key's name before 2026-12-06
    return (
        f"p {s['keep-ratio']:g}, λ {s['sftp-lambda']:g}, generator lr {s['sftp-generator-lr']:g}, "
        f"{'+C' if s['sftp-conditioning'] else 'NOC'}, hold-open {held}, "
        f"L_CLM on {s['sftp-loss-on']}"
    )


def budget_trajectory(records: Sequence[Record]) -> str:
    """probes.sftp.budget_trajectory: one client's deterministic kept ratio after each round, per
    setting."""
    rounds = max(len(r["rounds"]) for r in records)
    lines = [
        "| setting | " + " | ".join(f"round {i}" for i in range(1, rounds + 1)) + " | minutes |",
        "|---|" + "---|" * (rounds + 1),
    ]
    for r in records:
        kept = [f"{row['deterministic']:.3f}" for row in r["rounds"]] + [""] * (
            rounds - len(r["rounds"])
        )
        lines.append(f"| {_setting(r)} | " + " | ".join(kept) + f" | {r['seconds'] / 60:.0f} |")
    s = records[0]["settings"]
    lines += [
        "",
        f"Client {s['client']}, {s['local-steps']} steps per round, batch {s['batch-size']}, "
        f"seq-len {s['seq-len']}, {s['torch-threads']} thread(s); "
        + "; ".join(f"`{shown_command(r)}` ({load_line(r)})" for r in records)
        + ".",
    ]
    return "\n".join(lines)


def mask_rounding(records: Sequence[Record]) -> str:
    """probes.sftp.mask_rounding rows (an archived run without its generator has only the
    deterministic kept ratio, from masks.npz) and the last round of
    experiments/probes/sftp/budget_trajectory.py records."""
    lines = [
        "| run | target | deterministic kept | expected under sampling | gates with "
        "0.1 < π < 0.9 |",
        "|---|---|---|---|---|",
    ]
    notes = []
    for r in records:
        if "rounds" in r:  # a budget-trajectory record: its final round
            last = r["rounds"][-1]
            rows = [
                {
                    "run": f"one client alone, {_setting(r)}, {len(r['rounds'])} × "
                    f"{r['settings']['local-steps']} steps",
                    "target": r["settings"]["keep-ratio"],
                    **last,
                }
            ]
        else:
            rows = r["runs"]
        for row in rows:
            cells = [
                f"{row[k]:.3f}" if row.get(k) is not None else "–"
                for k in ("deterministic", "expected", "unsaturated")
            ]
            name = re.sub(
                r"^\d{8}-\d{6}-", "", row["run"]
            )  # an archived run's directory, less its time stamp
            lines.append(f"| {name} | {row['target']} | " + " | ".join(cells) + " |")
        notes.append(f"`{shown_command(r)}` ({load_line(r)})")
    return "\n".join([*lines, "", "; ".join(notes) + "."])


SPEED_GOAL = 0.95  # the goal for measured / ceiling at every budget (docs/claims.md, G6)


def goal_verdict(row: Record, task: str, goal: float = SPEED_GOAL) -> str:
    """`verdicts.decide` on measured / ceiling ≥ `goal` with the record's 95% interval, worded as
    `mark` words it (unbolded): "held", "not held", "unresolved"; "" for a record without
    intervals."""
    if f"{task}-of-ceiling-lo" not in row:
        return ""
    a = row[f"{task}-of-ceiling"]
    interval = (
        row[f"{task}-of-ceiling-lo"] - goal,
        row[f"{task}-of-ceiling-hi"] - goal,
        0,
    )  # decide reads no n
    return mark(decide(lambda x, y: x >= y, a, goal, interval)).strip("*")


def attainable_share(breakdown: dict[str, dict[str, float]], name: str, ceiling: float) -> float:
    """What the breakdown allows model `name`'s prefill to reach of its FLOP `ceiling`: its profiled
    time with the projections at the dense model's GF/s and no lane gathers/scatters, every other op
    (attention, LM head, norms, rotary, SiLU·up: work the bus masks shrink less than the FLOP count,
    or not at all) as profiled; the dense model's profiled total over that, divided by the ceiling.
    Above 1: nothing but the products and the index ops stands between the model and its ceiling;
    below: the ceiling is out of reach even with perfect kernels."""
    row, dense = breakdown[name], breakdown["dense"]
    projections = row["projections"] * row["projections GF/s"] / dense["projections GF/s"]
    bound = row["total"] - row["gather/scatter"] - row["projections"] + projections
    return dense["total"] / bound / ceiling


def compiled_speed(records: Sequence[Record]) -> str:
    """benchmarks/compiled.py: each compiled model's speed-up, its FLOP ceiling and the share
    reached (before → after where the record has '<keep> before' models; its 95% interval where the
    record has one, and the verdict on the goal ≥ 0.95 under the table)."""
    (r,) = records
    m = r["models"]

    def share(name: str, task: str) -> str:
        row = m[name]
        after = f"{row[f'{task}-of-ceiling']:.3f}"
        if f"{task}-of-ceiling-lo" in row:
            after += f"** [{row[f'{task}-of-ceiling-lo']:.3f}, {row[f'{task}-of-ceiling-hi']:.3f}]"
        else:
            after += "**"
        before = m.get(f"{name} before")
        return f"{before[f'{task}-of-ceiling']:.3f} → **{after}" if before else f"**{after}"

    lines = [
        "| model | prefill: speed-up (ceiling) | of ceiling | all logits: of ceiling | generation: "
        "speed-up (ceiling) | of ceiling |",
        "|---|---|---|---|---|---|",
        f"| dense | {m['dense']['prefill-ms']:.0f} ms | | | "
        f"{m['dense']['generate-tok-s']:.1f} tok/s | |",
    ]
    for name, row in m.items():
        if name == "dense" or name.endswith(" before"):
            continue
        lines.append(
            f"| {name} | {row['prefill-speedup']:.2f}× ({row['prefill-ceiling']:.2f}×) "
            f"| {share(name, 'prefill')} | {share(name, 'full-logits')} "
            f"| {row['generate-speedup']:.2f}× ({row['generate-ceiling']:.2f}×) | "
            f"{share(name, 'generate')} |"
        )
    kept = [name for name in m if name not in ("dense", "keep 1") and not name.endswith(" before")]
    verdicts = [
        f"{name} {label} {goal_verdict(m[name], task)}"
        for name in kept
        for task, label in (
            ("prefill", "prefill"),
            ("full-logits", "all logits"),
            ("generate", "generation"),
        )
        if goal_verdict(m[name], task)
    ]
    paired = (
        "; speed-ups: median of the paired per-repeat ratios, [95% interval]" if verdicts else ""
    )
    lines += [
        "",
        f"{r['threads']} thread(s), clock {r['clock']}, prefill {r['prefill']} tokens, "
        f"{r['new-tokens']} generated, medians of {r['repeats']}{paired}; {load_line(r)}; "
        f"`{shown_command(r)}`.",
    ]
    if verdicts:
        lines += [
            "",
            f"Goal ≥ {SPEED_GOAL} of the ceiling (held: the whole interval at or above it): "
            + "; ".join(verdicts)
            + ".",
        ]
    if "breakdown" in r:
        b = r["breakdown"]
        lines += [
            "",
            "| model (one prefill, ms) | projections (GF/s) | attention | gather / scatter | LM "
            "head | other | total | bound: of ceiling |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, row in b["models"].items():
            bound = f"{attainable_share(b['models'], name, m[name]['prefill-ceiling']):.3f}"
            lines.append(
                f"| {name} | {row['projections']:.0f} ({row['projections GF/s']:.0f}) | "
                f"{row['attention']:.0f} | {row['gather/scatter']:.0f} | {row['LM head']:.0f} | "
                f"{row['other']:.0f} | {row['total']:.0f} | {bound} |"
            )
        lines += [
            "",
            f"Ops' self time, torch profiler, mean of {b['profiled-prefills']} profiled prefills "
            "per model (models interleaved, after the timed repeats); other: norms, rotary, "
            "SiLU·up, adds, copies. Bound: the share of the prefill ceiling the model would reach "
            "with its projections at the dense model's GF/s and no gathers/scatters, every other "
            "op as profiled (`benchmarks.render.attainable_share`).",
        ]
    return "\n".join(lines)


def packing(records: Sequence[Record]) -> str:
    """experiments/benchmarks/packing.py: SFT-P's local step on padded and on packed rows, per
    client, same process."""
    r = records[0]
    lines = [
        "| client | tokens per step, padded → packed | s per step, padded → packed | speed-up | "
        "max \\|ΔCLM\\| |",
        "|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['client']} `{row['data'].split(':', 1)[-1]}` | "
            f"{row['padded-tokens-per-step']:.0f} → {row['packed-tokens-per-step']:.0f} | "
            f"{row['padded-s-per-step']:.3f} → {row['packed-s-per-step']:.3f} | "
            f"{row['speed-up']:.2f}× | {row['max-clm-difference']:.1e} |"
        )
    lines += [
        "",
        f"All four clients: **{r['speed-up-all']:.2f}×** (sum of seconds per step). {r['steps']} "
        f"steps, medians of {r['repeats']} round-robin repeats, {r['clock']} clock, 1 thread; "
        f"`{shown_command(r)}` ({load_line(r)}).",
    ]
    return "\n".join(lines)


def deployed_speed(records: Sequence[Record]) -> str:
    """benchmarks/deployed.py: the grid runs' deployed models against the dense model, one
    process."""
    lines = [
        "| model | params (M) | params / dense | prefill speed-up (ceiling) | of ceiling | "
        "generation speed-up (ceiling) | of ceiling |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        for row in r["rows"]:
            if row["model"] == "dense":
                lines.append(
                    f"| dense | {row['params'] / 1e6:.1f} | 1.000 | {row['prefill-ms']:.0f} ms | | "
                    f"{row['generate-tok-s']:.1f} tok/s | |"
                )
                continue
            lines.append(
                f"| {row['model']} | {row['params'] / 1e6:.1f} | {row['params-ratio']:.3f} | "
                f"{row['prefill-speedup']:.2f}× ({row['prefill-ceiling']:.2f}×) | "
                f"{row['prefill-of-ceiling']:.2f} | {row['generate-speedup']:.2f}× "
                f"({row['generate-ceiling']:.2f}×) | {row['generate-of-ceiling']:.2f} |"
            )
    lines += [
        "",
        "; ".join(
            f"Prefill {r['prefill']} tokens (last-token logits), generation 32 tokens after 32, "
            f"batch 1, medians of {r['repeats']} round-robin runs, {r['clock']} clock, 1 thread; "
            f"`{shown_command(r)}` ({load_line(r)})"
            for r in records
        )
        + ".",
    ]
    return "\n".join(lines)


def sftp_conditioning(records: Sequence[Record]) -> str:
    """probes.sftp.conditioning: per schedule and client-specific share ρ, each mode's final
    `captured` (mean over clients, min–max) and the deployed cuts' `shared-cut` (mean), beside how
    alike the clients' own best cuts are."""
    modes = (
        ("fed", "+C, federated"),
        ("noc", "NOC, federated"),
        ("alone", "+C, each client alone"),
    )
    lines = [
        "| schedule | ρ | own best cuts: shared-cut | "
        + " | ".join(f"{label}: captured (min–max) | shared-cut" for _, label in modes)
        + " |",
        "|---|---|---|" + "---|---|" * len(modes),
    ]
    notes = []
    for r in records:
        s = r["settings"]
        extras = [
            f"e_k std {s['embed-std']:g}" if s.get("embed-std", 1.0) != 1.0 else "",
            f"noise σ {s['noise']:g}" if s.get("noise") else "",
            f"layer share {s['layer-share']:g}" if s.get("layer-share") else "",
        ]
        schedule = ", ".join(
            [
                f"keep {s['keep-ratio']:g}",
                f"{s['rounds']} × {s['steps']} steps",
                f"lr {s['lr']:g}",
                f"τ {s['tau']:g}",
                f"wd {s['weight-decay']:g}",
                *(e for e in extras if e),
            ]
        )
        for cell in r["cells"]:
            best = cell["best-cuts-shared-cut"]
            row = [schedule, f"{cell['specific']:g}", f"{sum(best) / len(best):.2f}"]
            for mode, _ in modes:
                if mode not in cell:
                    row += ["–", "–"]
                    continue
                last = cell[mode][-1]
                cap, shared = last["captured"], last["shared-cut"]
                row += [
                    f"{sum(cap) / len(cap):.2f} ({min(cap):.2f} – {max(cap):.2f})",
                    f"{sum(shared) / len(shared):.2f}",
                ]
            lines.append("| " + " | ".join(row) + " |")
        notes.append(f"`{shown_command(r)}` ({load_line(r)}, {r['seconds']:.0f} s)")
    return "\n".join([*lines, "", "; ".join(notes) + "."])


def fedspallm_resolved(records: Sequence[Record]) -> str:
    """probes.fedspallm.agreement --run: a FedSpaLLM run's global mask with its weights re-solved on
    the pooled calibration data, beside the run's own models on the same held-out windows (paired
    differences, 95%)."""
    lines = [
        "| run | corpus | windows | global | global mask, re-solved | standalone (mean) | "
        "centralized | re-solved − global | re-solved − centralized |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for r in records:
        run = Path(r["run"]).name
        for corpus, row in r["corpora"].items():
            ppl = row["ppl"]
            diff = [
                f"{d[0]:+.1f} [{d[1]:+.1f}, {d[2]:+.1f}]"
                for d in (row["resolved - global"], row["resolved - centralized"])
            ]
            lines.append(
                f"| `{run}` | `{corpus.split(':')[-1]}` | {row['windows']} | "
                f"{ppl['global (record)']:.1f} | **{ppl['resolved']:.1f}** | "
                f"{ppl['standalone mean']:.1f} | {ppl['centralized']:.1f} | {diff[0]} | {diff[1]} |"
            )
        same = all(
            abs(row["ppl"]["global (re-scored)"] - row["ppl"]["global (record)"])
            < 1e-6 * row["ppl"]["global (record)"]
            for row in r["corpora"].values()
        )
        notes.append(
            f"`{shown_command(r)}` ({load_line(r)}, {r['seconds']:.0f} s; the global model "
            f"re-scored {'equals' if same else 'DIFFERS FROM'} the run's record on every corpus)"
        )
    return "\n".join([*lines, "", "; ".join(notes) + "."])


def _calib_and_time(facts: Record) -> str:
    tokens = "/".join(f"{t:,}" for t in facts.get("calib-tokens", [])) or "?"
    seconds = facts.get("seconds")
    return f"{tokens} calibration tokens per client, " + (
        f"{seconds:,.0f} s" if seconds else "time not recorded"
    )


def fedspallm_compare(records: Sequence[Record]) -> str:
    """probes.fedspallm.compare: two FedSpaLLM runs of one seed that differ in one key, paired on
    the same held-out windows (variant − base, 95%)."""
    lines = [
        "| variant | corpus | windows | global: base → variant | standalone mean: base → variant | "
        "global − standalone: base → variant | Δ global | Δ standalone | Δ (global − standalone) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []

    def ci(x: Sequence[float]) -> str:
        return f"{x[0]:+.1f} [{x[1]:+.1f}, {x[2]:+.1f}]"

    for r in records:
        for corpus, row in r["corpora"].items():
            b, v, d = row["base"], row["variant"], row["variant - base"]
            cells = [f"{b[k][0]:.1f} → {v[k][0]:.1f}" for k in ("global", "standalone mean")]
            lines.append(
                f"| {r['label']} | `{corpus.split(':')[-1]}` | {row['windows']} | {cells[0]} | "
                f"{cells[1]} | {ci(b['global - standalone mean'])} → "
                f"{ci(v['global - standalone mean'])} | {ci(d['global'])} | "
                f"{ci(d['standalone mean'])} | {ci(d['global - standalone mean'])} |"
            )
        runs = [
            f"{k} `{Path(r[k]).name}` ({_calib_and_time(r.get('runs', {}).get(k, {}))})"
            for k in ("base", "variant")
        ]
        notes.append(f"`{shown_command(r)}` ({load_line(r)}); " + ", ".join(runs))
    return "\n".join([*lines, "", "; ".join(notes) + "."])


def fedtpa_adapter_norms(records: Sequence[Record]) -> str:
    """experiments/probes/fedtpa/adapter_norms.py: each run's global update ‖(α/r)·B·A‖ (mean over
    layers), its ratio to FedIT's at the same Dirichlet α, and the rank dimensions zero-padding left
    dead."""
    lines = [
        "| run | α | mean ‖(α/r)·B·A‖ per layer | vs FedIT, same α | dead dimensions | "
        "dead layers |",
        "|---|---|---|---|---|---|",
    ]
    notes = []
    for r in records:
        fedit = {row["alpha"]: row["update-norm"] for row in r["runs"] if row["method"] == "fedit"}
        for row in r["runs"]:
            base = fedit.get(row["alpha"])
            ratio = f"{row['update-norm'] / base:.2f}" if base else "–"
            lines.append(
                f"| `{row['run-tag'] or row['run']}` | {row['alpha']} | {row['update-norm']:.3f} "
                f"| {ratio} | {row['dead-dims']} of {row['dims']} | {row['dead-layers']} of "
                f"{row['layers']} |"
            )
        notes.append(f"`{shown_command(r)}` ({load_line(r)})")
    return "\n".join([*lines, "", "; ".join(notes) + "."])


def profile(records: Sequence[Record]) -> str:
    """Each record's phase table (`benchmarks.profile.table`), with its command and load."""
    return "\n".join(f"{profile_table(r)}\n`{shown_command(r)}`; {load_line(r)}." for r in records)


def precision(records: Sequence[Record]) -> str:
    """`fedprune bench precision`: CPU seconds per step of one train message per method and mode."""
    lines = []
    for r in records:
        st = r["settings"]
        lines += [
            "| method | mixed-precision | CPU s per step (median) | speed-up | training loss |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {row['method']} | {row['mode']} | {row['cpu-s-per-step']:.3f} | "
            f"{row['ratio']:.2f}× | {row['train-loss']:.4f} |"
            for row in r["rows"]
        ]
        lines += [
            "",
            f"Client {st['partition']}'s round-1 train message, {st['steps']} steps, medians of "
            f"{st['repeats']} interleaved repeats, thread clock, {st['threads']} thread; "
            f"`{shown_command(r)}` ({load_line(r)}).",
        ]
    return "\n".join(lines)


def cores(records: Sequence[Record]) -> str:
    """`fedprune bench cores`: the same messages, k clients at once vs one client with k threads."""
    lines = []
    for r in records:
        st = r["settings"]
        lines += ["| layout | wall s (median) | repeats |", "|---|---|---|"]
        lines += [
            f"| {row['layout']} | {row['wall-s']:.1f} | {', '.join(f'{x:.1f}' for x in row['all'])}"
            " |"
            for row in r["rows"]
        ]
        lines += [
            "",
            f"{st['method']}, {st['clients']} clients' round-1 train messages of {st['steps']} "
            f"steps (mixed-precision {st['mode']}) on {st['cores']} cores: concurrent / threaded = "
            f"{r['ratio']:.2f}×; `{shown_command(r)}` ({load_line(r)}).",
        ]
    return "\n".join(lines)


def dp_norms(records: Sequence[Record]) -> str:
    """experiments/dp_norms.py: each client's round-1 update norm over what DP releases, per group,
    against its preset's clipping norm C and the factor clipping scales the update by."""
    lines = []
    for r in records:
        groups = sorted({g for row in r["rows"] for g in row["groups"]})
        lines += [
            "| method | client | entries | ‖Δ‖ | "
            + "".join(f"‖Δ‖ {g} | " for g in groups)
            + "preset C | C / ‖Δ‖ |",
            "|---|---|---|---|" + "---|" * len(groups) + "---|---|",
        ]
        for row in r["rows"]:
            cells = "".join(
                f"{row['groups'][g]:.3g} | " if g in row["groups"] else "– | " for g in groups
            )
            lines.append(
                f"| {row['method']} | {row['client']} | {row['entries']:,} | {row['norm']:.3g} | "
                f"{cells}{row['preset-clipping-norm']:g} | {row['scale']:.3g} |"
            )
        medians = ", ".join(f"{m} {v:.3g}" for m, v in r["median"].items())
        lines += ["", f"Median ‖Δ‖: {medians}; `{shown_command(r)}` ({load_line(r)})."]
    return "\n".join(lines)


RENDERERS: dict[str, Callable[[Sequence[Record]], str]] = {
    "compiled-speed": compiled_speed,
    "pruning": pruning,
    "aggregation-memory": aggregation_memory,
    "overhead": overhead,
    "budget-trajectory": budget_trajectory,
    "mask-rounding": mask_rounding,
    "packing": packing,
    "deployed-speed": deployed_speed,
    "sftp-conditioning": sftp_conditioning,
    "fedspallm-resolved": fedspallm_resolved,
    "fedspallm-compare": fedspallm_compare,
    "fedtpa-adapter-norms": fedtpa_adapter_norms,
    "profile": profile,
    "precision": precision,
    "cores": cores,
    "dp-norms": dp_norms,
}


def load_record(name: str | Path) -> Record:
    path = Path(name)
    if not path.exists():
        path = BENCH_DIR / Path(name).name
    return json.loads(path.read_text())


def render(kind: str, names: Sequence[str | Path]) -> str:
    if kind not in RENDERERS:
        raise KeyError(f"unknown bench kind {kind!r}; known: {', '.join(RENDERERS)}")
    return RENDERERS[kind]([load_record(n) for n in names])


def blocks(text: str) -> list[tuple[str, list[str], str, int, int, str]]:
    """Every marked block of a markdown text: (kind, record names, current body, body start, body
    end, indent). A marker indented (inside a list item) indents its block alike."""
    out = []
    for m in MARKER.finditer(text):
        kind, indent = m["kind"], m["indent"]
        end_marker = f"\n{indent}<!-- /bench:{kind} -->"
        end = text.find(end_marker, m.end())
        if end < 0:
            raise ValueError(f"{m.group(0).strip()} has no closing {end_marker.strip()}")
        out.append(
            (kind, m["records"].split(), text[m.end() : end].strip("\n"), m.end(), end + 1, indent)
        )
    return out


def indented(markdown: str, indent: str) -> str:
    return "\n".join(indent + line if line else line for line in markdown.split("\n"))


def doc_files() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md"))


def dated_links(markdown: str, names: Sequence[str], doc: Path) -> str:
    """`markdown` with each record's date (`, YYYY-MM-DD`) made a link to that record, relative to
    `doc`: a manual names a measurement's date only as the way to its record."""

    for name in names:
        path = Path(name) if Path(name).exists() else BENCH_DIR / Path(name).name
        date = str(load_record(path).get("date", ""))[:10]
        if len(date) == 10 and f"]({date}" not in markdown:
            link = Path(os.path.relpath(path.resolve(), doc.resolve().parent)).as_posix()
            markdown = markdown.replace(f", {date}", f", [{date}]({link})")
    return markdown


def check(paths: Sequence[Path] | None = None, write: bool = False) -> list[str]:
    """Re-render every marked block in `paths` (default: docs/**/*.md); returns the mismatches
    (empty = all equal). `write` rewrites the blocks that differ."""
    problems = []
    for path in doc_files() if paths is None else paths:
        text = path.read_text()
        found = blocks(text)
        for kind, names, body, start, end, indent in reversed(found):
            try:
                want = indented(dated_links(render(kind, names), names, path), indent)
            except FileNotFoundError as err:
                problems.append(
                    f"{path}: bench:{kind} {' '.join(names)}: record missing ({err.filename})"
                )
                continue
            except KeyError as err:
                problems.append(f"{path}: bench:{kind}: {err.args[0]}")
                continue
            if body != want:
                problems.append(f"{path}: bench:{kind} {' '.join(names)} differs from its record")
                text = text[:start] + "\n" + want + "\n" + text[end:]
        if write and found:
            path.write_text(text)
    return problems


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "records", nargs="*", help="records to render (kind from the file name unless --kind)"
    )
    parser.add_argument("--kind", choices=list(RENDERERS), help="renderer for the records given")
    parser.add_argument("--check", action="store_true", help="compare every marked block in docs/")
    parser.add_argument("--write", action="store_true", help="rewrite every marked block in docs/")
    args = parser.parse_args(argv)
    if args.check or args.write:
        problems = check(write=args.write)
        print("\n".join(problems) or "every marked block matches its record")
        sys.exit(1 if problems and not args.write else 0)
    if (
        args.kind
    ):  # one block from all the records given (a trajectory table has one row per record)
        print(render(args.kind, args.records))
        return
    for name in args.records:
        kind = load_record(name).get("kind")
        if kind is None:
            parser.error(f"{name}: the record names no kind; pass --kind")
        print(render(kind, [name]) + "\n")


if __name__ == "__main__":
    main()
