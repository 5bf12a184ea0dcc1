"""`fedprune rescore`: score finished runs again on more held-out examples than they evaluated
in-run.

    fedprune rescore accuracy outputs/<run> [outputs/<run> ...] --examples 100 [--dense]
    fedprune rescore rouge outputs/<run> ... --examples 100

`accuracy` (multiple-choice data, every method): each client's deployed model on its own task's test
split plus up to `--examples` unused examples of that task; per example the lm-eval correctness and
the answer's NLL, so that `fedprune compare` pairs two runs question by question. `rouge`
(instruction data: FedIT, FlexLoRA, FedTPA): greedy answers of the final model, Rouge-L F1 per
example. Both write `<run>/rescore.json`; a run whose record has the same `--examples` is skipped
unless `--force`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESCORE_FILE = "rescore.json"
KINDS = {
    "accuracy": (
        "fedprune_cli.rescore_accuracy",
        "multiple-choice accuracy and answer NLL per example (every method)",
        "unused examples per client's task, at most",
    ),
    "rouge": (
        "fedprune_cli.rescore_rouge",
        "Rouge-L of greedy answers (instruction data: FedIT, FlexLoRA, FedTPA)",
        "unused examples per data source",
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `fedprune rescore`: one sub-command per score."""
    kinds = parser.add_subparsers(dest="kind", required=True, metavar="{accuracy,rouge}")
    for kind, (_, text, examples_help) in KINDS.items():
        sub = kinds.add_parser(kind, help=text, description=text)
        sub.add_argument(
            "runs", nargs="+", type=Path, metavar="RUN", help="finished run directories"
        )
        sub.add_argument(
            "--examples", type=int, default=100, help=f"{examples_help} (default: %(default)s)"
        )
        sub.add_argument(
            "--batch-size", type=int, default=8, help="evaluation batch (default: %(default)s)"
        )
        sub.add_argument(
            "--threads", type=int, default=2, help="torch threads (default: %(default)s)"
        )
        sub.add_argument(
            "--force", action="store_true", help=f"score again even if {RESCORE_FILE} exists"
        )
        if kind == "accuracy":
            sub.add_argument(
                "--dense",
                action="store_true",
                help="also score the untouched base model (row `dense`), e.g. for "
                "`fedprune compare RUN RUN --b-model dense`",
            )


def run(args: argparse.Namespace) -> int:
    """Re-score every run given: write `<run>/rescore.json` where it is missing or stale, print the
    result."""
    import importlib

    import torch

    from fedprune_app.core.runtime import quiet_libraries

    quiet_libraries()  # no lm-eval info lines or progress bars between the results
    scorer = importlib.import_module(KINDS[args.kind][0])
    options = {name: bool(getattr(args, name, False)) for name in scorer.FLAGS}
    torch.set_num_threads(args.threads)
    for run_dir in args.runs:
        path = run_dir / RESCORE_FILE
        record = json.loads(path.read_text()) if path.is_file() else {}
        stale = record.get("per-source") != args.examples or scorer.missing(record, options)
        if args.force or stale:
            reason = scorer.skip_reason(run_dir)
            if reason:
                print(f"{run_dir.name}: {reason}: skipped", flush=True)
                continue
            record = scorer.rescore(run_dir, args.examples, args.batch_size, **options)
            path.write_text(json.dumps(record, indent=1) + "\n")
        scorer.report(run_dir, record)
    return 0
