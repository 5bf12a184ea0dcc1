"""The privacy-utility curve: FedIT and SFT-P (keep 0.8) at ε = ∞ (the same clipping, no noise), 8
and 2.

    python -m experiments.dp_utility --clients 100 --fraction 0.1 --out docs/runs/dp-utility
    python -m experiments.dp_utility --clients 100 --fraction 0.1 --dry-run  # the cells only

Each cell is one `fedprune run` of `conf/<method>-dp.toml` on `--clients` simulated SuperNodes (the
default data dealt by source, so a task is shared by clients/4 of them), `--fraction` of them
sampled per round (m), for `--rounds` (per method: FedIT 3, SFT-P its preset's 6, the steps its
masks need to reach keep 0.8), δ = 1/N unless `--delta` is given, σ from `noise_multiplier_for(ε,
rounds, δ)` (ε = ∞: σ = 0, the same C). The record (`<out>/dp-utility.json`, with the command
that wrote it) holds per cell σ, the reported ε, and per evaluated client its score before and
after (n, 95% interval); `<out>/dp-utility.md` tables them beside the untouched model. What is not
measured is said there: only the clients of the evaluation panel, one seed."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
METRICS = ("acc", "acc_norm", "ppl")


@dataclass(frozen=True)
class Cell:
    """One run: a method at a target ε (inf = no noise, the same clipping)."""

    method: str
    epsilon: float
    sigma: float
    run_config: tuple[str, ...]


ROUNDS = "fedit=3,sftp=6"  # SFT-P's masks need its preset's 6 x 25 local steps to reach keep 0.8


def rounds_of(text: str | int | dict[str, int], method: str) -> int:
    """A method's rounds from `--rounds` ("3": every method; "fedit=3,sftp=6": per method) or from a
    record's `rounds` (an int, or {method: rounds})."""
    if isinstance(text, int):
        return text
    if isinstance(text, dict):
        return int(text[method])
    if "=" not in text:
        return int(text)
    per_method = dict(item.split("=", 1) for item in text.split(",") if item.strip())
    if method not in per_method:
        raise SystemExit(f"--rounds {text!r} names no rounds for method {method!r}")
    return int(per_method[method])


def cells(args: argparse.Namespace) -> list[Cell]:
    """The grid's cells, each with its preset and overrides."""
    from fedprune_app.core.privacy import noise_multiplier_for

    delta = args.delta or 1.0 / args.clients
    # --noise-as-clients M: σ·C/m of this run's m equals that of M clients per round at the target
    scale = (
        sampled(args.fraction, args.clients) / args.noise_as_clients
        if args.noise_as_clients
        else 1.0
    )
    out = []
    for method in args.methods.split(","):
        rounds = rounds_of(args.rounds, method)
        for text in args.epsilons.split(","):
            eps = float(text)
            sigma = (
                0.0
                if math.isinf(eps)
                else ceil_digits(noise_multiplier_for(eps, rounds, delta) * scale)
            )  # ε ≤ the target (of M clients per round, with --noise-as-clients)
            tag = f"dp-{method}-eps-{text}" + (
                f"-as-{args.noise_as_clients}" if args.noise_as_clients else ""
            )
            overrides = (
                f"num-server-rounds={rounds} fraction-train={args.fraction} "
                f"fraction-evaluate={args.evaluate} dp-clipping-norm={args.clipping_norm} "
                f"dp-noise-multiplier={sigma} dp-delta={delta} dp-max-epsilon=0.0 "
                f"output-dir='{args.out}' run-tag='{tag}' {args.run_config}"
            ).strip()
            out.append(
                Cell(method, eps, sigma, (str(ROOT / "conf" / f"{method}-dp.toml"), overrides))
            )
    return out


def ceil_digits(x: float, digits: int = 5) -> float:
    """`x` > 0 rounded up to `digits` significant digits (σ up: ε stays at or below its target)."""
    unit = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    return round(math.ceil(x / unit - 1e-9) * unit, 12)


def sampled(fraction: float, clients: int) -> int:
    """m, the clients sampled per round (Flower's rounding of fraction-train × N, at least 1)."""
    return max(int(fraction * clients), 1)


def scores(run_dir: Path) -> dict[str, Any]:
    """A finished run's reported ε and, per evaluated client, its scores before / after with n and
    interval."""
    summary = json.loads((run_dir / "summary.json").read_text())
    clients = [
        {
            k: v
            for k, v in row.items()
            if k in ("client", "data", "final-round")
            or k.split("/")[0].removesuffix("-lo").removesuffix("-hi").removesuffix("-n") in METRICS
        }
        for row in summary.get("clients", [])
    ]
    return {
        "run": run_dir.name,
        "status": summary.get("status"),
        "privacy": summary.get("privacy", {}),
        "server": summary.get("server", {}),
        "clients": clients,
    }


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def render(record: dict[str, Any]) -> str:
    """The curve as a table: per cell and client, accuracy (or perplexity) untouched -> trained, n,
    interval. Clients with identical rows (one global model scored on a task's shared test split)
    share a line."""
    lines = [
        "| method | target ε | σ | noise std σ·C/m | reported ε | clients | data | score "
        "| untouched | trained [95% interval] | n |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    m = record.get("sampled") or sampled(record["fraction"], record["clients"])
    for cell in record["cells"]:
        std = cell["sigma"] * record["clipping-norm"] / m
        res = cell.get("result") or {}
        eps = (res.get("privacy") or {}).get("epsilon")
        rows: dict[str, list[str]] = {}  # the line after the clients column -> its clients
        for row in res.get("clients", []):
            for metric in ("acc", "ppl"):
                if row.get(f"{metric}/tuned") is None:
                    continue
                lo, hi = row.get(f"{metric}-lo/tuned"), row.get(f"{metric}-hi/tuned")
                interval = f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else ""
                rest = (
                    f"{row.get('data', '')} | {metric} | "
                    f"{_number(row.get(f'{metric}/untouched'))} | "
                    f"{row[f'{metric}/tuned']:.3f}{interval} | {row.get(f'{metric}-n/tuned')} |"
                )
                rows.setdefault(rest, []).append(str(row["client"]))
        for rest, clients in rows.items():
            lines.append(
                f"| {cell['method']} | {cell['epsilon']} | {cell['sigma']:g} | {std:.3g} | "
                f"{'∞' if eps is None else f'{eps:.2f}'} | {', '.join(clients)} | {rest}"
            )
    lines += ["", *server_rows(record)]
    if record.get("noise-as-clients"):
        lines += [
            "",
            f"σ is sized as {record['noise-as-clients']} clients per round would have it: the "
            f"noise std σ·C/m of this run's m = {m} equals that of m = "
            f"{record['noise-as-clients']} at the target ε; the ε reported is this run's own.",
        ]
    lines += [
        "",
        "Not measured: clients outside the evaluation panel (fraction-evaluate), other seeds, "
        "amplification by sampling (none is claimed).",
    ]
    return "\n".join(lines) + "\n"


def server_rows(record: dict[str, Any]) -> list[str]:
    """The server's held-out score per cell: round 0 (the untouched model) and the last round."""
    lines = [
        "| method | target ε | reported ε | server score | round 0 (untouched) | last round |",
        "|---|---|---|---|---|---|",
    ]
    for cell in record["cells"]:
        res = cell.get("result") or {}
        server = res.get("server") or {}
        if not server:
            continue
        first, last = server[min(server, key=int)], server[max(server, key=int)]
        eps = (res.get("privacy") or {}).get("epsilon")
        for name in sorted(first):
            lines.append(
                f"| {cell['method']} | {cell['epsilon']} | "
                f"{'∞' if eps is None else f'{eps:.2f}'} | {name} | {first[name]:.3f} | "
                f"{last.get(name, math.nan):.3f} (round {max(server, key=int)}) |"
            )
    return lines


def merged(old: dict[str, Any] | None, new: dict[str, Any], force: bool) -> dict[str, Any]:
    """`new`'s plan with the finished cells of an earlier record of the same grid kept (unless
    `force`): the curve is run cell by cell, across sessions."""
    if not old:
        return new
    grid = ("clients", "fraction", "clipping-norm", "noise-as-clients")
    done = {(c["method"], str(c["epsilon"])): c for c in old.get("cells", []) if "result" in c}
    methods = {m for m, _ in done} & {c["method"] for c in new["cells"]}
    if any(old.get(k) != new.get(k) for k in grid) or any(
        rounds_of(old["rounds"], m) != rounds_of(new["rounds"], m) for m in methods
    ):
        held = ", ".join(f"{k}={old.get(k)}" for k in (*grid, "rounds"))
        raise SystemExit(f"--out holds a record of another grid ({held}); choose another --out")
    cells = []
    for cell in new["cells"]:
        kept = done.pop((cell["method"], str(cell["epsilon"])), None)
        cells.append(cell if force or kept is None else kept)
    cells += done.values()
    rounds = {c["method"]: rounds_of(new["rounds"], c["method"]) for c in new["cells"]}
    rounds |= {m: rounds_of(old["rounds"], m) for m in {c["method"] for c in done.values()}}
    return {**new, "rounds": rounds, "cells": cells}


def write(out: Path, record: dict[str, Any]) -> None:
    """The record and its table, rewritten after every cell."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "dp-utility.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "dp-utility.md").write_text(render(record))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--clients", type=int, default=100, help="simulated SuperNodes N (default 100)"
    )
    parser.add_argument(
        "--fraction", type=float, default=0.1, help="fraction-train: m = fraction x N"
    )
    parser.add_argument(
        "--evaluate", type=float, default=0.1, help="fraction-evaluate (the scored panel)"
    )
    parser.add_argument(
        "--rounds",
        default=ROUNDS,
        help="num-server-rounds: one for every method, or per method (default %(default)s)",
    )
    parser.add_argument("--methods", default="fedit,sftp")
    parser.add_argument("--epsilons", default="inf,8,2")
    parser.add_argument("--delta", type=float, default=0.0, help="δ (default 1/N)")
    parser.add_argument(
        "--clipping-norm", type=float, default=0.1, help="dp-clipping-norm C of every cell"
    )
    parser.add_argument(
        "--noise-as-clients",
        type=int,
        default=0,
        help="size σ so that the noise std σ·C/m equals that of this many clients per round at "
        "each target ε (utility at a larger deployment's noise; the ε reported is this run's)",
    )
    parser.add_argument("--run-config", default="", help="'k=v ...' appended to every cell")
    parser.add_argument(
        "--out", default="outputs/dp-utility", help="runs, record and table go here"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the cells' commands, run nothing"
    )
    parser.add_argument("--timeout", type=float, default=7200)
    parser.add_argument(
        "--force", action="store_true", help="run cells again that the record already holds"
    )
    args = parser.parse_args(argv)
    args.out = str(Path(args.out).resolve())
    federation = f"num-supernodes={args.clients} client-resources-num-cpus=1"
    record: dict[str, Any] = {
        "command": "python -m experiments.dp_utility " + shlex.join(argv or sys.argv[1:]),
        "clients": args.clients,
        "fraction": args.fraction,
        "rounds": {m: rounds_of(args.rounds, m) for m in args.methods.split(",")},
        "clipping-norm": args.clipping_norm,
        "sampled": sampled(args.fraction, args.clients),
        **({"noise-as-clients": args.noise_as_clients} if args.noise_as_clients else {}),
        "cells": [],
    }
    planned = cells(args)
    for cell in planned:
        command = [
            "fedprune",
            "run",
            *[a for rc in cell.run_config for a in ("--run-config", rc)],
            "--federation-config",
            federation,
        ]
        record["cells"].append(
            {
                "method": cell.method,
                "epsilon": "inf" if math.isinf(cell.epsilon) else cell.epsilon,
                "sigma": cell.sigma,
                "command": shlex.join(command),
            }
        )
    if args.dry_run:
        print("\n".join(c["command"] for c in record["cells"]))
        return 0
    out = Path(args.out)
    path = out / "dp-utility.json"
    record = merged(json.loads(path.read_text()) if path.is_file() else None, record, args.force)
    plan = {(c.method, "inf" if math.isinf(c.epsilon) else str(c.epsilon)): c for c in planned}
    for entry in record["cells"]:
        cell = plan.get((entry["method"], str(entry["epsilon"])))
        if "result" in entry or cell is None:
            continue
        from fedprune_cli.launch import launch

        start = time.monotonic()
        launched = launch(list(cell.run_config), federation, timeout=args.timeout)
        entry["seconds"] = round(time.monotonic() - start, 1)
        if launched.run_dir is not None and (launched.run_dir / "summary.json").is_file():
            entry["result"] = scores(launched.run_dir)
        write(out, record)  # each finished cell is kept, whatever the next one does
    write(out, record)
    print(render(record))
    return 0 if all("result" in c for c in record["cells"]) else 1


if __name__ == "__main__":
    sys.exit(main())
