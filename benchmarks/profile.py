"""Where a run's wall time goes: `fedprune run` timed as a whole, each of its Flower runs split by
phase.

    fedprune bench profile --out docs/bench/profile-make-run.json -- \\
        --run-config conf/sftp.toml \\
        --federation-config "num-supernodes=4 client-resources-num-cpus=1"
    fedprune bench profile --from outputs/<run> [<run> ...]     # a finished run (no launcher time)
    fedprune bench profile --isa native avx2 -- --run-config conf/sftp.toml  # as on AVX2 alone

`--isa` runs the same `fedprune run` once per named instruction-set cap, one after another, and
shows each phase as a ratio to the first column (the baseline, `native`: this CPU uncapped). A cap
(`ISA_CAPS`) limits what the matrix and vector kernels may use: oneDNN, MKL and ATen read it from
the environment, which Flower's SuperLink and Ray pass on to every ClientApp. So a CPU with AMX
shows what one without it would take at the same clock; 'auto' mixed precision trains in float32
under either cap (`fedprune_app.llm.training.onednn_allows_amx`). It does not turn the CPU into
an older one: clock, caches and memory stay this machine's.

Everything after `--` goes to `fedprune run` unchanged. The phases of one run come from its
summary.json (`phase-seconds`: the ServerApp's own stopwatch) and the `time` of its metrics.jsonl
rows:

- set-up: the ServerApp's config check, run directory and initial global state;
- start-up + untouched evaluation: Ray, the ClientApps and their model loads, then round 0: every
  client scoring the model before training (replies arrive together, so the two are not told apart);
- training: rounds 1..R from the end of the round before to the last train reply (local steps,
  transfers, aggregation), server evaluations excluded;
- server evaluation: the ServerApp scoring the global model after each round;
- client evaluation: the federated evaluations after round 0;
- final artefacts: saving models and adapters, compiling, scoring the compiled models, speed timing;
- references: comparison models scored at the end;
- launcher: the rest of `fedprune run`'s wall time (config checks, FAB build, SuperLink start and
  stop, results, plots, TensorBoard).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.records import finish_record, start_record

# --isa: `native` (no cap) or the environment that keeps oneDNN (bf16 and some float32 matrix
# products), MKL (float32 GEMM) and ATen's vectorised kernels to the named instruction sets
ISA_CAPS: dict[str, dict[str, str]] = {
    "native": {},
    "avx2": {
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
    },
    "avx512_bf16": {  # AVX512_BF16 without AMX
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
        "ATEN_CPU_CAPABILITY": "avx512",
    },
}
RUN_DIR_LINE = re.compile(r"run directory: (?P<path>\S+)\s*$")
PHASES = (
    "set-up",
    "start-up + untouched evaluation",
    "training",
    "server evaluation",
    "client evaluation",
    "final artefacts",
    "references",
)


def run_phases(run_dir: Path) -> dict[str, Any]:
    """The phase seconds of one finished run directory (see the module docstring)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line
    ]
    stages = summary.get("phase-seconds") or {"set-up": summary.get("initial-state-seconds", 0.0)}
    set_up = float(stages["set-up"])
    ends: dict[int, float] = defaultdict(float)  # round -> the time of its last row
    for r in rows:
        if isinstance(r.get("round"), int) and r.get("phase") in (
            "train",
            "evaluate",
            "server-evaluate",
        ):
            ends[r["round"]] = max(ends[r["round"]], r["time"])
    server_by_round: dict[int, float] = defaultdict(float)
    for r in rows:
        if r.get("phase") == "server-evaluate":
            server_by_round[r["round"]] += r.get("seconds", 0.0)
    phases = dict.fromkeys(PHASES, 0.0)
    phases["set-up"] = set_up
    previous = (
        ends[0] if 0 in ends else set_up
    )  # no round 0 (eval-untouched false): start-up is in round 1
    phases["start-up + untouched evaluation"] = previous - set_up - server_by_round.get(0, 0.0)
    for rnd in sorted(k for k in ends if k > 0):
        train_end = max(
            (r["time"] for r in rows if r.get("round") == rnd and r.get("phase") == "train"),
            default=previous,
        )
        phases["training"] += train_end - previous
        phases["client evaluation"] += max(
            ends[rnd] - train_end - server_by_round.get(rnd, 0.0), 0.0
        )
        previous = ends[rnd]
    phases["server evaluation"] = sum(server_by_round.values())
    if "final-artefacts" in stages:
        phases["final artefacts"] = float(stages["final-artefacts"])
        phases["references"] = float(stages.get("references", 0.0))
    else:  # a record from before the ServerApp's stopwatch: up to its last row
        phases["final artefacts"] = max((r["time"] for r in rows), default=previous) - previous
    return {
        "run": str(run_dir),
        "method": summary.get("method"),
        "status": summary.get("status"),
        "seconds": summary.get("seconds"),
        "phases": {k: round(v, 1) for k, v in phases.items()},
    }


def launch(fedprune_args: list[str], isa: str = "native") -> tuple[float, list[Path], int]:
    """Run `fedprune run <args>` (under `ISA_CAPS[isa]` where given), echoing its output; its wall
    seconds, run directories and exit status."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedprune_cli.main", "run", *fedprune_args],
        env={**os.environ, **ISA_CAPS.get(isa, {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    dirs: list[Path] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        found = RUN_DIR_LINE.search(line)
        if found and found["path"] != "None" and "flwr run status" in line:
            dirs.append(Path(found["path"]))
    code = proc.wait()
    return time.perf_counter() - start, dirs, code


def table(record: dict[str, Any]) -> str:
    """The markdown table of a profile record: one column per run, one row per phase; runs launched
    under `--isa` each with its wall time, every figure also as a ratio to the first run's."""
    runs = record["runs"]
    by_isa = all("isa" in r for r in runs)
    head = ["phase"] + [
        f"{r['method']} `{Path(r['run']).name}`" + (f" ({r['isa']})" if by_isa else "")
        for r in runs
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cells(values: list[float | None], bold: bool = False) -> list[str]:
        out = []
        for v in values:
            text = "" if v is None else f"{v:.0f} s"
            if bold and text:
                text = f"**{text}**"
            base = values[0]
            if by_isa and len(runs) > 1 and v is not None and base:
                text += f" ({v / base:.2f}×)"
            out.append(text)
        return out

    for phase in (*PHASES, "launcher"):
        values = [r["phases"].get(phase) for r in runs]
        if phase == "launcher":
            values = (
                [r.get("launcher-seconds") for r in runs]
                if by_isa
                else [record.get("launcher-seconds") if i == 0 else None for i in range(len(runs))]
            )
        if all(v is None or v == 0 for v in values):
            continue
        lines.append("| " + " | ".join([phase, *cells(values)]) + " |")
    totals = [r["seconds"] for r in runs]
    lines.append("| **run total** | " + " | ".join(cells(totals, bold=True)) + " |")
    if by_isa:
        walls = [r.get("wall-seconds") for r in runs]
        lines.append("| `fedprune run` wall time | " + " | ".join(cells(walls, bold=True)) + " |")
    wall = record.get("wall-seconds")
    if wall is not None:
        lines.append(f"\n`fedprune run` wall time: **{wall:.0f} s** ({wall / 60:.1f} min).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    rest = args_in[args_in.index("--") + 1 :] if "--" in args_in else []
    own = args_in[: args_in.index("--")] if "--" in args_in else args_in
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--from",
        dest="dirs",
        nargs="+",
        default=[],
        help="profile finished run directories instead of launching `fedprune run`",
    )
    parser.add_argument(
        "--out", default="", help="the JSON record (e.g. docs/bench/profile-make-run.json)"
    )
    parser.add_argument("--note", default="", help="free text stored in the record")
    parser.add_argument(
        "--isa",
        nargs="+",
        choices=list(ISA_CAPS),
        default=[],
        help="run once per instruction-set cap, the first the baseline (e.g. native avx2; "
        "this machine's clock: see above)",
    )
    args = parser.parse_args(own)
    if not args.dirs and not rest:
        parser.error("give `-- <fedprune run arguments>` or --from <run directories>")
    if args.dirs and args.isa:
        parser.error("--isa caps the runs it launches, not the finished runs of --from")
    record = start_record("profile", "benchmarks.profile", args_in, note=args.note)
    code = 0
    if args.isa:
        record["isa-caps"] = {isa: ISA_CAPS[isa] for isa in args.isa}
        record["runs"] = []
        for isa in args.isa:
            wall, dirs, code = launch(rest, isa)
            runs = [run_phases(d) for d in dirs if (d / "summary.json").is_file()]
            for r in runs:
                r["isa"], r["wall-seconds"] = isa, round(wall, 1)
                r["launcher-seconds"] = round(wall - sum(x["seconds"] or 0 for x in runs), 1)
            record["runs"] += runs
            if code:
                break
    else:
        if args.dirs:
            dirs, wall = [Path(d) for d in args.dirs], None
        else:
            wall, dirs, code = launch(rest)
        record["runs"] = [run_phases(d) for d in dirs if (d / "summary.json").is_file()]
        if wall is not None:
            record["wall-seconds"] = round(wall, 1)
            total = sum(r["seconds"] or 0 for r in record["runs"])
            record["launcher-seconds"] = round(wall - total, 1)
    finish_record(record, args.out or None)
    print("\n" + table(record), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
