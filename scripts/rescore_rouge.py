"""Re-score finished instruction-tuning runs (FedIT, FlexLoRA, FedTPA) on more held-out examples than they
evaluated in-run, so that tables built on a dozen test examples can be checked for noise.

For each run directory: its final model (base + saved adapter, `models.load_run`) generates greedy answers
(`gen-max-new-tokens` of the run) for `--examples` examples per data source that no split of the run read
(`data.unused_examples`: the seeded shuffle's tail after test | val | train, so the same examples for every run
with the same data keys); Rouge-L F1 per example goes to `<run>/rescore.json` (with the answers). A run that
already has a rescore.json of the same size is skipped. Prints mean Rouge-L ×100 with a bootstrap 95% interval.
The FedTPA grid renders these files (paired intervals between runs) when they exist.

    .venv/bin/python scripts/rescore_rouge.py outputs/grids/fedtpa/*-a0.5-* --examples 100
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedprune_app.config import RunConfig  # noqa: E402
from fedprune_app.data import unused_examples  # noqa: E402
from fedprune_app.evaluation import bootstrap_ci, generate, rouge_l_scores  # noqa: E402
from fedprune_app.models import load_run  # noqa: E402
from fedprune_app.results import RESCORE_FILE  # noqa: E402


def rescore(run_dir: Path, examples: int, batch_size: int) -> dict:
    """Score one run's final model on `examples` unused examples per source; the record written to rescore.json."""
    cfg = RunConfig.from_flower(json.loads((run_dir / "config.json").read_text()))
    held = unused_examples(cfg, examples)
    model, tokenizer = load_run(run_dir)
    start = time.perf_counter()
    answers = generate(model, tokenizer, [e["prompt"] for e in held], int(cfg.gen_max_new_tokens), batch_size)
    scores = rouge_l_scores(answers, [e["response"] for e in held])
    return {"examples": len(held), "per-source": examples, "rouge-l": sum(scores) / len(scores), "scores": scores,
            "answers": answers, "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished run directories (config.json + adapter/)")
    parser.add_argument("--examples", type=int, default=100, help="unused examples per data source")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--force", action="store_true", help="score again even if rescore.json exists")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for run_dir in args.runs:
        path = run_dir / RESCORE_FILE
        old = json.loads(path.read_text()) if path.is_file() else {}
        if args.force or old.get("per-source") != args.examples:
            if not (run_dir / "adapter").is_dir():
                print(f"{run_dir.name}: no adapter/ (not finished, or an archived record): skipped")
                continue
            old = rescore(run_dir, args.examples, args.batch_size)
            path.write_text(json.dumps(old, indent=1) + "\n")
        mean, lo, hi = bootstrap_ci(old["scores"])
        print(f"{run_dir.name}: Rouge-L ×100 {100 * mean:.2f} [{100 * lo:.2f}, {100 * hi:.2f}] on {old['examples']} "
              f"unused examples ({old['seconds']} s)", flush=True)


if __name__ == "__main__":
    main()
