"""Moved from fedprune_app.core.rundir in the re-layout."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESCORE_FILE = "rescore.json"  # written by tools/rescore_rouge.py and tools/rescore_accuracy.py


def rescore_runs(description: str, examples_help: str, skip_reason: Callable[[Path], str | None],
                 rescore: Callable[..., dict[str, Any]],
                 report: Callable[[Path, dict[str, Any]], None],
                 flags: dict[str, str] | None = None,
                 missing: Callable[[dict[str, Any], dict[str, bool]], bool] | None = None) -> None:
    """The command line of the re-scoring scripts: for each run directory given, `rescore(run, examples,
    batch_size, **flags)` writes `<run>/rescore.json` unless one with the same `--examples` exists (or `--force`,
    or `missing(record, flags)` says the record lacks what a flag asks for), a run `skip_reason` names is skipped,
    and `report(run, record)` prints the result. `flags`: {name: help} of boolean options (`--<name>`), passed to
    `rescore` as keyword arguments (dashes as underscores)."""
    import torch

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("runs", nargs="+", type=Path, help="finished run directories")
    parser.add_argument("--examples", type=int, default=100, help=examples_help)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--force", action="store_true", help=f"score again even if {RESCORE_FILE} exists")
    for name, text in (flags or {}).items():
        parser.add_argument(f"--{name}", action="store_true", help=text)
    args = parser.parse_args()
    options = {name.replace("-", "_"): bool(getattr(args, name.replace("-", "_"))) for name in flags or {}}
    torch.set_num_threads(args.threads)
    for run_dir in args.runs:
        path = run_dir / RESCORE_FILE
        record = json.loads(path.read_text()) if path.is_file() else {}
        stale = record.get("per-source") != args.examples or (missing is not None and missing(record, options))
        if args.force or stale:
            reason = skip_reason(run_dir)
            if reason:
                print(f"{run_dir.name}: {reason}: skipped", flush=True)
                continue
            record = rescore(run_dir, args.examples, args.batch_size, **options)
            path.write_text(json.dumps(record, indent=1) + "\n")
        report(run_dir, record)
