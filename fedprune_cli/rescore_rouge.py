"""Re-score finished instruction-tuning runs (FedIT, FlexLoRA, FedTPA) on more held-out examples
than they evaluated in-run, so that tables built on a dozen test examples can be checked for noise.

For each run directory: its final model (base + saved adapter, `models.load_run`) generates greedy
answers (`gen-max-new-tokens` of the run) for `--examples` examples per data source that no split of
the run read (`data.unused_examples`: the seeded shuffle's tail after test | val | train, so the
same examples for every run with the same data keys); Rouge-L F1 per example goes to
`<run>/rescore.json` (with the answers). A run that already has a rescore.json of the same size is
skipped. Prints mean Rouge-L ×100 with a bootstrap 95% interval. The FedTPA grid renders these files
(paired intervals between runs) when they exist.

    fedprune rescore rouge outputs/grids/fedtpa/*-a0.5-* --examples 100
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from fedprune_app.core.config import RunConfig
from fedprune_app.llm.data import unused_examples
from fedprune_app.llm.evaluation import bootstrap_ci, generate, rouge_l_scores
from fedprune_app.llm.models import load_run


def rescore(run_dir: Path, examples: int, batch_size: int) -> dict:
    """Score one run's final model on `examples` unused examples per source; the record written to
    rescore.json."""
    cfg = RunConfig.from_record(json.loads((run_dir / "config.json").read_text()))
    held = unused_examples(cfg, examples)
    model, tokenizer = load_run(run_dir)
    start = time.perf_counter()
    answers = generate(
        model, tokenizer, [e["prompt"] for e in held], cfg.gen_max_new_tokens, batch_size
    )
    scores = rouge_l_scores(answers, [e["response"] for e in held])
    return {
        "examples": len(held),
        "per-source": examples,
        "rouge-l": sum(scores) / len(scores),
        "scores": scores,
        "answers": answers,
        "seconds": round(time.perf_counter() - start, 1),
    }


def report(run_dir: Path, record: dict) -> None:
    mean, lo, hi = bootstrap_ci(record["scores"])
    print(
        f"{run_dir.name}: Rouge-L ×100 {100 * mean:.2f} [{100 * lo:.2f}, {100 * hi:.2f}] on "
        f"{record['examples']} unused examples ({record['seconds']} s)",
        flush=True,
    )


def skip_reason(run: Path) -> str | None:
    """Why a directory cannot be re-scored (None when it can)."""
    return (
        None if (run / "adapter").is_dir() else "no adapter/ (not finished, or an archived record)"
    )


FLAGS: dict[str, str] = {}


def missing(record: dict, options: dict[str, bool]) -> bool:
    return False
