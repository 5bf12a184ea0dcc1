"""Two `experiments.probes.sftp.trajectory` records of one client and seed, paired question by
question.

Finding: Paired per question, the 300-step budget warm-up lowers client 1's answer NLL at keep 0.5
  by 1.037 [0.923, 1.157] nats (client 0, seed 1: 0.680 [0.309, 1.030]), so conf/sftp-50.toml warms
  the budget up (sftp-budget-warmup-steps=300).
Record: none (it prints; it reads docs/runs/sftp-trajectory/*.json and re-scored runs); quoted in
  docs/notes/2026-11-sftp-investigations.md.

For the chosen client and round (default: the last) of each record: the deployed model's answer NLL
(token-weighted mean over the test questions), the untouched model's (round 0), and the paired
differences B − A, A − untouched and B − untouched in nats, each with its 95% bootstrap interval
over questions (both models resampled on the same questions: `intervals.paired_perplexity_interval`,
whose perplexity ratio is exp of the NLL difference). Records of one client and seed score the same
questions; others are refused. Needs rows with `example-nll` (older records lack them).

Either side may also be a re-scored Flower run (a run directory with `rescore.json` from
`fedprune rescore accuracy`): its deployed models on the test split plus the task's unused examples,
the questions of a trajectory record written with `--eval-examples 30 --unused-examples 100` of the
same seed: a client alone set beside the federated run.

    python -m experiments.probes.sftp.trajectory_compare \\
        docs/runs/sftp-50/20261128-033928-sftp-warmup300-seed0 \\
        docs/runs/sftp-trajectory/keep05-client1-alone-warmup300-s0.json

    python -m experiments.probes.sftp.trajectory_compare \\
        docs/runs/sftp-trajectory/keep05-client0-alone-s1.json \\
        docs/runs/sftp-trajectory/keep05-client0-alone-warmup300-s1.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from experiments.grids import read_config, read_metrics
from fedprune_app.llm.intervals import TokenScores, paired_perplexity_interval
from fedprune_cli.compare import split_keys_differ

Record = dict[str, Any]


def run_record(run_dir: Path) -> Record:
    """A re-scored Flower run as a trajectory record: per client, its deployed model at the last
    round (`federated`) and, when re-scored with `--dense`, the untouched model (round 0), with the
    run's config."""
    rescored = json.loads((run_dir / "rescore.json").read_text())
    config = read_config(run_dir)
    last = int(config["num-server-rounds"])
    kept = {
        row["client"]: row.get("kept-ratio-prunable", math.nan)
        for row in read_metrics(run_dir)
        if row.get("phase") == "evaluate"
        and row.get("round") == last
        and isinstance(row.get("client"), int)
    }
    rows = []
    for model, mode, rnd in (("dense", "untouched", 0), ("final", "federated", last)):
        for k, scores in rescored["models"].get(model, {}).items():
            rows.append(
                {
                    "mode": mode,
                    "client": int(k),
                    "round": rnd,
                    "kept": 1.0 if rnd == 0 else kept[int(k)],
                    "example-nll": scores["nll"],
                    "example-tokens": scores["tokens"],
                    "questions": rescored["clients"][k].get("questions"),
                }
            )
    return {"config": config, "rows": rows}


def load(path: Path) -> Record:
    """A trajectory record (JSON file) or a re-scored run directory (`run_record`)."""
    return run_record(path) if path.is_dir() else json.loads(path.read_text())


def row_scores(row: dict[str, Any]) -> TokenScores:
    if "example-nll" not in row:
        raise ValueError(
            f"row {row['mode']} client {row['client']} round {row['round']} has no per-question "
            "scores (written by experiments.probes.sftp.trajectory before it stored "
            "them): re-run it"
        )
    return TokenScores.of(row["example-nll"], row["example-tokens"])


def pick_row(record: Record, client: int, rnd: int | None) -> dict[str, Any]:
    """The client's row at round `rnd` (None: its last round), federated if the record has it, else
    alone."""
    rows = [r for r in record["rows"] if r["client"] == client and r["mode"] != "untouched"]
    if not rows:
        raise ValueError(f"no trained rows for client {client} in this record")
    mode = "federated" if any(r["mode"] == "federated" for r in rows) else "alone"
    rows = [r for r in rows if r["mode"] == mode]
    wanted = max(r["round"] for r in rows) if rnd is None else rnd
    found = [r for r in rows if r["round"] == wanted]
    if not found:
        raise ValueError(
            f"client {client} has no round {wanted}; rounds: {sorted(r['round'] for r in rows)}"
        )
    return found[0]


def untouched_row(record: Record, client: int) -> dict[str, Any]:
    return next(r for r in record["rows"] if r["client"] == client and r["mode"] == "untouched")


def nll_difference(
    b: TokenScores, a: TokenScores, iters: int, seed: int
) -> tuple[float, float, float]:
    """Mean answer NLL of b minus a's on the same questions, with its paired 95% bootstrap interval
    (nats)."""
    try:
        ratio = paired_perplexity_interval(b, a, "ratio", iters, seed)
    except ValueError as err:
        raise ValueError(
            f"the two rows were not scored on the same questions ({err}): compare records of one "
            "client and one seed"
        ) from None
    return math.log(ratio.estimate), math.log(ratio.lo), math.log(ratio.hi)


def compare(
    a: Record, b: Record, client: int, rnd: int | None = None, iters: int = 2000, seed: int = 0
) -> dict[str, Any]:
    if differ := split_keys_differ(a.get("config"), b.get("config")):
        raise ValueError(
            f"the two records draw their data splits differently ({', '.join(differ)} differ), so "
            "they were not scored on the same questions"
        )
    base_record = (
        a if any(r["client"] == client and r["mode"] == "untouched" for r in a["rows"]) else b
    )
    ra, rb, base = (
        pick_row(a, client, rnd),
        pick_row(b, client, rnd),
        untouched_row(base_record, client),
    )
    if ra.get("questions") and rb.get("questions") and ra["questions"] != rb["questions"]:
        raise ValueError(
            "the two rows were scored on different questions (their digests differ): compare "
            "records of one client, one seed and the same --eval-examples / --unused-examples"
        )
    sa, sb, s0 = row_scores(ra), row_scores(rb), row_scores(base)
    return {
        "client": client,
        "round": (ra["round"], rb["round"]),
        "questions": len(sa.nll),
        "answer-nll": {"untouched": s0.mean_nll, "A": sa.mean_nll, "B": sb.mean_nll},
        "kept": {"A": ra["kept"], "B": rb["kept"]},
        "B - A": nll_difference(sb, sa, iters, seed),
        "A - untouched": nll_difference(sa, s0, iters, seed),
        "B - untouched": nll_difference(sb, s0, iters, seed),
    }


def render(result: dict[str, Any], names: tuple[str, str]) -> str:
    nll = result["answer-nll"]
    lines = [
        f"client {result['client']}, round {result['round'][0]} / {result['round'][1]}, "
        f"{result['questions']} questions; A = {names[0]}, B = {names[1]}",
        f"answer NLL: untouched {nll['untouched']:.3f}, A {nll['A']:.3f} (kept "
        f"{result['kept']['A']:.3f}), B {nll['B']:.3f} (kept {result['kept']['B']:.3f})",
    ]
    for key in ("B - A", "A - untouched", "B - untouched"):
        d, lo, hi = result[key]
        lines.append(f"{key}: {d:+.3f} [{lo:+.3f}, {hi:+.3f}] nats")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--client", type=int, help="default: the one client both records trained")
    parser.add_argument("--round", type=int, help="default: each record's last round")
    parser.add_argument("--iters", type=int, default=2000)
    args = parser.parse_args(argv)
    a, b = load(args.a), load(args.b)
    clients = sorted(
        {r["client"] for r in a["rows"] if r["mode"] != "untouched"}
        & {r["client"] for r in b["rows"] if r["mode"] != "untouched"}
    )
    if args.client is None and len(clients) != 1:
        parser.error(f"--client is needed: the records share clients {clients}")
    client = clients[0] if args.client is None else args.client
    print(render(compare(a, b, client, args.round, args.iters), (args.a.name, args.b.name)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
