"""Moved from fedprune_app.core.rundir in the re-layout."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESCORE_FILE = "rescore.json"  # written by tools/rescore_rouge.py and tools/rescore_accuracy.py


def rescore_runs(description: str, examples_help: str, skip_reason: Callable[[Path], str | None],
                 rescore: Callable[[Path, int, int], dict[str, Any]],
                 report: Callable[[Path, dict[str, Any]], None]) -> None:
    """The command line of the re-scoring scripts: for each run directory given, `rescore(run, examples,
    batch_size)` writes `<run>/rescore.json` unless one with the same `--examples` exists (or `--force`), a run
    `skip_reason` names is skipped, and `report(run, record)` prints the result."""
    import torch

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("runs", nargs="+", type=Path, help="finished run directories")
    parser.add_argument("--examples", type=int, default=100, help=examples_help)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--force", action="store_true", help=f"score again even if {RESCORE_FILE} exists")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for run_dir in args.runs:
        path = run_dir / RESCORE_FILE
        record = json.loads(path.read_text()) if path.is_file() else {}
        if args.force or record.get("per-source") != args.examples:
            reason = skip_reason(run_dir)
            if reason:
                print(f"{run_dir.name}: {reason}: skipped", flush=True)
                continue
            record = rescore(run_dir, args.examples, args.batch_size)
            path.write_text(json.dumps(record, indent=1) + "\n")
        report(run_dir, record)
