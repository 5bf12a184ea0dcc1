"""Which embedded multiple-choice tasks `make run` can use: the untouched model's zero-shot accuracy
on each candidate beside chance, and how long its training examples are.

Finding: Social IQa (acc_norm), CommonsenseQA, ARC-Easy, MMLU miscellaneous and PIQA are above
  chance for the untouched SmolLM2-135M and short per training example; HellaSwag WikiHow is above
  chance but three times as long (a `make run` round took ~97 s instead of ~65); HellaSwag
  ActivityNet, ARC-Challenge and OpenBookQA are at or below chance. With PIQA's long answers broken
  by 20% pruning in `make run`, it chose conf/sftp.toml's four clients.
Record: docs/bench/untouched-candidates.json; quoted in docs/models-and-data.md and
  docs/notes/2026-12-06-embedded-data.md.

Per source: the first `--examples` items of its seeded shuffle (the run's test split comes from the
same order) scored by lm-eval (`lm_eval_accuracy`, the run's own evaluator), each accuracy with its
Wilson 95% interval; chance = mean of 1 / number of choices; the mean and largest number of tokens
of a training item (`data.encode` at seq-len 256, what a local step trains on).

    python -m experiments.probes.data.untouched_accuracy --examples 300 \\
        --out docs/bench/untouched-candidates.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

CANDIDATES = (
    "olmo:social_iqa",
    "olmo:commonsense_qa",
    "olmo:arc_easy",
    "olmo:mmlu/miscellaneous",
    "olmo:piqa",
    "olmo:hellaswag/wikihow",
    "olmo:hellaswag/activitynet",
    "olmo:arc_challenge",
    "olmo:openbookqa",
)


def wilson(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    return (centre - half, centre + half)


def probe(
    sources: list[str], model_name: str, examples: int, seed: int = 0
) -> list[dict[str, Any]]:
    from fedprune_app.llm.data import encode, load_source, seeded_shuffle, write_jsonl
    from fedprune_app.llm.evaluation import lm_eval_accuracy, local_mc_task
    from fedprune_app.llm.models import load_base_model, load_tokenizer

    model, tok = load_base_model(model_name), load_tokenizer(model_name)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, source in enumerate(sources):
            items = seeded_shuffle(load_source(source), seed)[:examples]
            path = write_jsonl(Path(tmp) / f"{i}.jsonl", items)
            start = time.perf_counter()
            (acc,) = lm_eval_accuracy(model, tok, [local_mc_task(f"probe_{i}", path)]).values()
            tokens = [len(encode(tok, e, 256)[0]) for e in items]
            n = len(items)
            rows.append(
                {
                    "source": source,
                    "n": n,
                    "chance": statistics.mean(1 / len(e["choices"]) for e in items),
                    **{
                        m: {"value": acc[m], "wilson95": list(wilson(acc[m] * n, n))}
                        for m in ("acc", "acc_norm")
                    },
                    "train-tokens-mean": statistics.mean(tokens),
                    "train-tokens-max": max(tokens),
                    "eval-seconds": time.perf_counter() - start,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", default=",".join(CANDIDATES))
    parser.add_argument("--model-name", default="embedded")
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    rows = probe(args.sources.split(","), args.model_name, args.examples)
    for r in rows:
        lo, hi = r["acc"]["wilson95"]
        print(
            f"{r['source']:28s} acc {r['acc']['value']:.3f} [{lo:.3f}, {hi:.3f}] "
            f"acc_norm {r['acc_norm']['value']:.3f} chance {r['chance']:.3f} "
            f"tokens {r['train-tokens-mean']:.1f} (max {r['train-tokens-max']})"
        )
    if args.out:
        record = {
            "command": f"python -m experiments.probes.data.untouched_accuracy --examples "
            f"{args.examples} --out {args.out}",
            "model": args.model_name,
            "cpu": platform.processor() or platform.machine(),
            "rows": rows,
        }
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
