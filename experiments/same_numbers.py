"""Two runs of the same seed, number by number: do they agree? (Behaviour-preserving changes prove
it so.)

Finding: the smoke preset's FedIT and SFT-P runs before (e00afe3) and after the `fedprune` command
  reshape agree in every number of metrics.jsonl (110 and 182 compared, 0 differ).
Record: docs/runs/smoke-e00afe3/ against docs/runs/smoke/; quoted in
  docs/notes/2026-12-01-fedprune-command.md.
Finding: the strategy reshape (issue 73) changed none of 1,665 numbers of the eight methods' smoke
  runs and `make run`. Record: docs/runs/same-numbers-reshape/; quoted in
  docs/notes/2026-12-06-strategy-reshape.md.

    python -m experiments.same_numbers docs/runs/smoke-e00afe3/<run> docs/runs/smoke/<run>
    python -m experiments.same_numbers --sets outputs/same-before outputs/same-after  # every pair

Rows of metrics.jsonl are matched by (phase, round, client, data, model), since replies arrive in
any order; every number both rows hold is compared exactly, except timings, sizes on the wire and
node ids. Prints the numbers that differ, the counts, and the keys only the second run has. Exits 1
when a number differs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

SKIPPED = (
    "seconds",
    "time",
    "wall",
    "speed",
    "prefill",
    "generate",
    "tokens-per",
    "-ms",
    "started",
    "latency",
    "step-s",
    "node",
    "mb",
    "duration",
)  # parts of key names that are not results


def rows(run: Path) -> dict[tuple[Any, ...], dict[str, Any]]:
    """{(phase, round, client, data, model): row} of a run's metrics.jsonl."""
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            key = (
                row.get("phase"),
                row.get("round"),
                row.get("client"),
                str(row.get("data")),
                str(row.get("model")),
            )
            out[key] = row
    return out


def differences(a: Path, b: Path) -> tuple[int, list[str], list[str]]:
    """(numbers compared, 'row key: a vs b' for each that differs, rows only one run has)."""
    ra, rb = rows(a), rows(b)
    compared, differ = 0, []
    for key in sorted(set(ra) & set(rb), key=str):
        x, y = ra[key], rb[key]
        for name in sorted(set(x) & set(y)):
            u, v = x[name], y[name]
            if (
                any(s in name.lower() for s in SKIPPED)
                or isinstance(u, bool)
                or isinstance(v, bool)
            ):
                continue
            if isinstance(u, int | float) and isinstance(v, int | float):
                compared += 1
                if not (u == v or (math.isnan(u) and math.isnan(v))):
                    differ.append(f"{key} {name}: {u} vs {v}")
    return compared, differ, [str(k) for k in sorted(set(ra) ^ set(rb), key=str)]


def paired_runs(a: Path, b: Path) -> list[tuple[str, Path, Path]]:
    """(name, run in a, run in b) for every run name (the directory name after its
    `<date>-<time>-` stamp) both output directories hold, in order."""

    def named(root: Path) -> dict[str, Path]:
        runs = sorted(d for d in root.iterdir() if (d / "metrics.jsonl").is_file())
        return {d.name.split("-", 2)[2]: d for d in runs}

    first, second = named(a), named(b)
    return [(n, first[n], second[n]) for n in sorted(set(first) & set(second))]


def compare_sets(a: Path, b: Path) -> int:
    """One markdown row per run both output directories hold: numbers compared and differing."""
    print("| run | before | after | numbers compared | differ | rows in one run only |")
    print("|---|---|---|---|---|---|")
    failed = 0
    for name, x, y in paired_runs(a, b):
        compared, differ, unmatched = differences(x, y)
        failed += bool(differ or unmatched)
        print(
            f"| {name} | `{x.name}` | `{y.name}` | {compared} | {len(differ)} | {len(unmatched)} |"
        )
        for line in differ[:5]:
            print(f"|  | {line} |  |  |  |  |")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.same_numbers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("a", type=Path, help="a run directory (with metrics.jsonl)")
    parser.add_argument("b", type=Path, help="the run of the same seed to compare it with")
    parser.add_argument(
        "--sets",
        action="store_true",
        help="a and b are output directories: compare every run name both hold, one table row each",
    )
    args = parser.parse_args(argv)
    if args.sets:
        return compare_sets(args.a, args.b)
    compared, differ, unmatched = differences(args.a, args.b)
    print("\n".join(differ[:20]))
    print(
        f"{compared} numbers compared, {len(differ)} differ; rows in one run only: "
        f"{unmatched or 'none'}"
    )
    new = sorted(
        {k for r in rows(args.b).values() for k in r}
        - {k for r in rows(args.a).values() for k in r}
    )
    print(f"keys only in {args.b.name}: {', '.join(new) or 'none'}")
    return 1 if differ or unmatched else 0


if __name__ == "__main__":
    sys.exit(main())
