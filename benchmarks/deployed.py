"""The deployed models of finished SFT-P grid runs against the dense model: size and CPU speed,
timed in one process, round-robin, away from the run.

In-run, each run times its compiled model(s) against the dense model at its end
(`speed.compiled_rows`, medians of 3, wall clock), on whatever the machine shares then: on these 2
cores a test suite or a second run beside it moves those figures by 10–60%. This tool loads each
run's deployed model (`rescore_accuracy.models_of`: SFT-P's per-client compiled models, LLM-Pruner's
pruned and SliceGPT's sliced model) and times every one of them and the dense base model in one
`speed.speed_table`, one torch thread, the thread's CPU time (`--clock thread`: close to idle
figures on a loaded machine), medians of `--repeats`. Each row also gives the FLOP ceiling of the
same workload, counted from the model's structure as the runs count it, and measured / ceiling.

    fedprune bench deployed docs/runs/sftp/*-p50-* --out docs/bench/deployed-speed-p50.json
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.render import finish_record, start_record
from fedprune_app.core.config import RunConfig
from fedprune_app.core.runtime import quiet_libraries
from fedprune_app.llm.models import load_base_model
from fedprune_app.structural.speed import (
    flop_ceiling,
    lane_widths,
    set_ceiling,
    speed_table,
    workload_flops,
)
from fedprune_cli.rescore_accuracy import models_of
from fedprune_cli.runfiles import read_config


def ceiling(method: str, run_dir: Path, dense: Any, model: Any, task: str, prefill: int) -> float:
    """FLOPs(dense) / FLOPs(deployed model) of `task` at this prompt length, from the model's
    structure: SFT-P's lanes (`speed.flop_ceiling`), LLM-Pruner's kept groups and channels
    (`structure.npz`, `pruned_ceiling`), SliceGPT's sliced widths (`sliced_flops`) — the counts the
    runs use for their own rows."""
    config = dense.config
    if method == "sftp":
        return flop_ceiling(config, lane_widths(model), task, prefill=prefill)
    if method == "llmpruner":
        from fedprune_app.methods.llmpruner.structure import pruned_ceiling

        with np.load(run_dir / "structure.npz") as keep:
            return pruned_ceiling(config, {k: keep[k] for k in keep.files}, task, prefill)
    from fedprune_app.methods.slicegpt.models import sliced_flops

    return workload_flops(config, None, task, prefill=prefill) / sliced_flops(
        config, list(model.config.slicegpt_dims), task, prefill=prefill
    )


def deployed(run_dir: Path) -> dict[str, Any]:
    """{label: model} of a run: `<tag> client k` for SFT-P, `<tag>` for one global model. Where the
    run holds the model it timed (the grid's archive keeps no weights), the run directory must be
    the one under outputs/."""
    cfg = RunConfig.from_flower(read_config(run_dir))
    tag = run_dir.name.split("-", 2)[-1]
    models = models_of(run_dir, cfg, list(range(4)))["final"]
    if cfg.method == "sftp":
        return {f"{tag} client {k}": m for k, m in models.items()}
    return {tag: models[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "runs", nargs="+", type=Path, help="finished run directories with compiled/"
    )
    parser.add_argument(
        "--prefill", type=int, default=512, help="prompt tokens of a prefill (default: %(default)s)"
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="round-robin repeats (default: %(default)s)"
    )
    parser.add_argument(
        "--clock",
        choices=("thread", "wall"),
        default="thread",
        help="the thread's CPU time or wall time (default: %(default)s)",
    )
    parser.add_argument("--out", type=Path, help="write the record here (docs/bench/*.json)")
    args = parser.parse_args(argv)
    record = start_record("deployed-speed", "benchmarks.deployed", argv)
    quiet_libraries()
    torch.set_num_threads(1)
    missing = [str(r) for r in args.runs if not (r / "compiled").is_dir()]
    if missing:
        raise SystemExit(
            f"no compiled/ in {', '.join(missing)} (the archive under docs/runs keeps no weights: "
            "pass the run directories under outputs/)"
        )
    cfg = RunConfig.from_flower(read_config(args.runs[0]))
    dense = load_base_model(cfg.model_name, cfg.model_dtype).eval()
    models: dict[str, Any] = {"dense": dense}
    limits: dict[str, dict[str, float]] = {}
    for run in args.runs:
        method = str(read_config(run)["method"])
        for label, model in deployed(run).items():
            models[label] = model.eval()
            limits[label] = {
                task: ceiling(method, run, dense, model, task, args.prefill)
                for task in ("prefill", "generate")
            }
    with torch.no_grad():
        table = speed_table(
            models,
            int(dense.config.vocab_size),
            dense.config.eos_token_id,
            prefill=args.prefill,
            repeats=args.repeats,
            clock=args.clock,
        )
    rows = []
    for label, row in table.items():
        out = {"model": label, **row, "params-ratio": row["params"] / table["dense"]["params"]}
        for task, value in limits.get(label, {}).items():
            set_ceiling(out, task, value)
        rows.append(out)
        print(
            f"{label}: {row['params'] / 1e6:.1f} M, prefill {row['prefill-speedup']:.2f}x"
            f" (ceiling {out.get('prefill-ceiling', 1.0):.2f}x), generate "
            f"{row['generate-speedup']:.2f}x (ceiling {out.get('generate-ceiling', 1.0):.2f}x)",
            flush=True,
        )
    record.update(
        {
            "prefill": args.prefill,
            "repeats": args.repeats,
            "clock": args.clock,
            "runs": [r.name for r in args.runs],
            "rows": rows,
        }
    )
    finish_record(record, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
