"""Two re-scored runs side by side, per client: answer perplexity (A at or below B?) and accuracy, each difference
with its paired 95% bootstrap interval over the client's answers.

For a run outside a grid (a new setting tried on one cell) against the grid's archived cells: both runs must have
been re-scored on the same examples (`python -m tools.rescore_accuracy <run> --examples 100`). `--b-model dense`
compares A with the untouched model that B (a fedflap run) scored.

    python -m tools.compare_runs outputs/exp-sftp/<run> docs/runs/sftp/20261126-061133-sftp-p50-noc-a
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fedprune_app.llm.evaluation import bootstrap_ci
from tools.grids import judge, mark, read_config
from tools.grids.sftp.records import MODEL_OF_ROUND, answer_units, per_example, read_rescore
from tools.grids.sftp.rescored import _paired_pairs

ROUND_OF_MODEL = {v: k for k, v in MODEL_OF_ROUND.items()}
# the run-config keys that draw a client's test split and unused tail (fedprune_app.llm.data.client_data)
SPLIT_KEYS = ("seed", "client-data", "partitioner", "dirichlet-alpha", "test-examples", "val-examples",
              "max-train-examples")


def split_keys_differ(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    """The SPLIT_KEYS on which two run configs differ ([] when either config is unknown)."""
    return [] if a is None or b is None else [key for key in SPLIT_KEYS if a.get(key) != b.get(key)]


def check_same_questions(a: Path, b: Path, clients: list[int]) -> None:
    """Refuse to pair two runs whose clients were scored on different questions: by the digests rescore.json
    carries (tools.rescore_accuracy since 2026-11-28), else by the run-config keys that draw the splits."""
    runs = {"a": a, "b": b}
    digests = []
    for tag in runs:
        scored = (read_rescore(runs, tag) or {}).get("clients")
        digests.append({int(k): c.get("questions") for k, c in scored.items()} if isinstance(scored, dict) else {})
    differ = [k for k in clients if digests[0].get(k) and digests[1].get(k) and digests[0][k] != digests[1][k]]
    if differ:
        raise SystemExit(f"error: client(s) {differ} were re-scored on different questions in A and B")
    if all(digests[0].get(k) and digests[1].get(k) for k in clients):
        return
    configs = [read_config(r) if (r / "config.json").is_file() else None for r in (a, b)]
    if keys := split_keys_differ(*configs):
        raise SystemExit(f"error: A and B draw their test splits differently ({', '.join(keys)} differ), so "
                         "their clients were scored on different questions; re-score both with "
                         "`python -m tools.rescore_accuracy <run> --dense` and compare each with its own "
                         "`--b-model dense`")


def compare(a: Path, b: Path, b_model: str = "final") -> list[str]:
    """The two lines: answer perplexity (judged per client: A at or below B) and accuracy Δ (A − B, points) per
    client and over the clients both scored, each with its paired interval."""
    runs = {"a": a, "b": b}
    units_a, units_b = answer_units(runs, "a"), answer_units(runs, "b", ROUND_OF_MODEL[b_model])
    if not units_a or not units_b:
        raise SystemExit(f"error: {a if not units_a else b} has no re-scored answers for model '"
                         f"{'final' if not units_a else b_model}' (run tools.rescore_accuracy first)")
    clients = sorted(set(units_a) & set(units_b))
    check_same_questions(a, b, clients)
    held, text = judge(_paired_pairs(units_a, units_b, clients))
    lines = [f"answer perplexity, A at or below B: {mark(held)} ({text})"]
    acc_a, acc_b = per_example(runs, "a"), per_example(runs, "b", ROUND_OF_MODEL[b_model])
    parts = []
    for group in [*([k] for k in clients), clients]:
        if any(len(acc_a[k]) != len(acc_b[k]) for k in group):
            raise SystemExit(f"error: client(s) {group} were re-scored on different examples in A and B")
        mean, lo, hi = bootstrap_ci([v for k in group for v in acc_a[k]], [v for k in group for v in acc_b[k]],
                                    strata=[k for k in group for _ in acc_a[k]])
        name = f"client {group[0]}" if len(group) == 1 else "all clients"
        n = sum(len(acc_a[k]) for k in group)
        parts.append(f"{name}: Δ {100 * mean:+.1f} [{100 * lo:.1f}, {100 * hi:.1f}], n = {n}")
    lines.append("accuracy, A − B (points): " + "; ".join(parts))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--b-model", default="final", choices=sorted(ROUND_OF_MODEL),
                        help="B's model: final (its deployed models), dense / post-hoc (a fedflap run's references)")
    args = parser.parse_args(argv)
    print(f"A = {args.a.name}\nB = {args.b.name} ({args.b_model})")
    print("\n".join(compare(args.a, args.b, args.b_model)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
