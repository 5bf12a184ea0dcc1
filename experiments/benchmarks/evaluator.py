"""Multiple-choice scoring speed: the fast evaluator (`fast_eval.PackedChoicesLM`) against lm-eval's
stock `HFLM`, on the same examples in one run, with the proof that both give the same scores.

Finding: PackedChoicesLM scores 2.96× faster than HFLM with the same scores (max |Δ log-likelihood|
  6.5e-05), 91% of the 3.25× FLOP ceiling of encoding each question once, so that technique cannot
  reach 5× on these tasks.
Record: docs/bench/evaluator.json and docs/bench/evaluator-ceiling.json; quoted in
  docs/models-and-data.md.

Per task (default: the four BIG-bench tasks of the default `client-data`, `--examples` test examples
each, as the app builds them: `local_mc_task` over the source's test split), lm-eval's
`simple_evaluate` runs twice, zero-shot, on the embedded SmolLM2-135M: once with the stock `HFLM` at
the app's `eval-batch-size` (8), once with `PackedChoicesLM`. The two runs of a task follow each
other, so a change in machine load hits both alike. Timed: the log-likelihood computation
(`_loglikelihood_tokens`, where the two differ) and the whole `simple_evaluate` call (task building
included), both as wall-clock seconds and as CPU seconds of the one scoring thread (`--threads 1`:
on a shared machine wall time mostly measures waiting for a core). Checked: every request's
log-likelihood (max |difference| <= 1e-4), every greedy flag, each document's acc/acc_norm and the
task accuracies. Beside each speed-up stands its ceiling, `flop_ceiling`: the matmul FLOPs of the
stock path over those of the shared-context path on the same requests, the most that encoding each
question once can save (measured / ceiling is the figure to push toward 1).

    # 100 examples per task -> docs/bench/evaluator.json
    python -m experiments.benchmarks.evaluator
    python -m experiments.benchmarks.evaluator --examples 20 --json ''  # a quick look, no record
    # FLOPs only
    python -m experiments.benchmarks.evaluator --ceiling-only \\
        --json docs/bench/evaluator-ceiling.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch

from fedprune_app.core.config import DEFAULT_CLIENT_DATA, split_list
from fedprune_app.llm.data import source_splits
from fedprune_app.llm.evaluation import local_mc_task
from fedprune_app.llm.fast_eval import PackedChoicesLM
from fedprune_app.llm.models import load_base_model, load_tokenizer
from fedprune_app.structural.speed import forward_flops


def timed(cls: type) -> type:
    """`cls` with its `_loglikelihood_tokens` timed (wall and this thread's CPU seconds, summed over
    calls)."""

    class Timed(cls):  # type: ignore[misc, valid-type]
        wall = cpu = 0.0
        requests = 0
        shapes: list[tuple[tuple[int, ...], int]] = []

        def _loglikelihood_tokens(self, requests, disable_tqdm=False, override_bs=None):
            w, c = time.perf_counter(), time.thread_time()
            out = super()._loglikelihood_tokens(requests, True, override_bs)
            self.wall += time.perf_counter() - w
            self.cpu += time.thread_time() - c
            self.requests += len(requests)
            self.shapes = self.shapes + [(tuple(ctx), len(cont)) for _, ctx, cont in requests]
            return out

    return Timed


def flop_ceiling(config: Any, shapes: list[tuple[tuple[int, ...], int]]) -> dict[str, float]:
    """Matmul FLOPs (`speed.forward_flops`, batch 1, no padding) of scoring the requests (context
    ids, continuation length) the stock way and the shared-context way, and their ratio, the
    speed-up ceiling: stock = per request one forward over (context + continuation)[:-1] with logits
    at every position (HFLM's `_model_call` returns them all); shared = per distinct context one
    forward over context[:-1] without logits, plus per request its continuation's tokens after that
    prefix with logits for them (`PackedChoicesLM` runs context + each continuation but its last
    token: one token per choice fewer, the same logits). Padding is left out of both, so the ceiling
    is what sharing the context saves, not what batching costs."""
    stock = sum(
        forward_flops(config, None, len(ctx) + n - 1, logits=len(ctx) + n - 1) for ctx, n in shapes
    )
    shared = sum(
        forward_flops(config, None, len(ctx) - 1, logits=0) for ctx in {ctx for ctx, _ in shapes}
    )
    shared += sum(forward_flops(config, None, n, past=len(ctx) - 1, logits=n) for ctx, n in shapes)
    return {
        "flops-stock": float(stock),
        "flops-shared": float(shared),
        "flop-ceiling": stock / shared,
    }


def requests_only(cls: type) -> type:
    """`cls` that records the requests lm-eval builds and scores nothing (log-likelihood 0): the
    FLOP ceiling without running the model."""

    class Recorder(timed(cls)):  # type: ignore[misc, valid-type]
        def _loglikelihood_tokens(self, requests, disable_tqdm=False, override_bs=None):
            self.shapes = self.shapes + [(tuple(ctx), len(cont)) for _, ctx, cont in requests]
            self.requests += len(requests)
            return [(0.0, False)] * len(requests)

    return Recorder


def run_task(lm: Any, task: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """simple_evaluate as the app runs it (zero-shot, no bootstrap), samples logged; (samples by
    doc, timings)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    w, c = time.perf_counter(), time.thread_time()
    res = lm_eval.simple_evaluate(
        model=lm,
        tasks=[task],
        task_manager=TaskManager(include_defaults=False),
        num_fewshot=0,
        log_samples=True,
        bootstrap_iters=0,
        verbosity="ERROR",
    )
    times = {
        "total-wall-s": time.perf_counter() - w,
        "total-cpu-s": time.thread_time() - c,
        "score-wall-s": lm.wall,
        "score-cpu-s": lm.cpu,
        "requests": lm.requests,
    }
    (samples,) = res["samples"].values()
    return {int(s["doc_id"]): s for s in samples}, times


def lls(sample: dict[str, Any]) -> list[tuple[float, bool]]:
    """The (log-likelihood, greedy) of each choice of one logged document."""
    return [(float(r[0][0]), bool(r[0][1])) for r in sample["resps"]]


def compare(stock: dict[int, Any], fast: dict[int, Any]) -> dict[str, Any]:
    """Max |Δ log-likelihood|, greedy flags and per-document acc/acc_norm equal, accuracies of
    both."""
    assert stock.keys() == fast.keys()
    diff = max(
        abs(a[0] - b[0]) for d in stock for a, b in zip(lls(stock[d]), lls(fast[d]), strict=True)
    )
    return {
        "max-abs-loglik-diff": diff,
        "greedy-equal": all(
            [g for _, g in lls(stock[d])] == [g for _, g in lls(fast[d])] for d in stock
        ),
        "per-doc-equal": all(stock[d][m] == fast[d][m] for d in stock for m in ("acc", "acc_norm")),
        **{
            f"{m}/{k}": sum(float(s[m]) for s in v.values()) / len(v)
            for k, v in (("stock", stock), ("fast", fast))
            for m in ("acc", "acc_norm")
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="embedded")
    p.add_argument(
        "--sources", default=DEFAULT_CLIENT_DATA, help="comma-separated multiple-choice sources"
    )
    p.add_argument("--examples", type=int, default=100, help="test examples per task")
    p.add_argument(
        "--batch-size", type=int, default=8, help="HFLM batch size (the app's eval-batch-size)"
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="docs/bench/evaluator.json", help="record path ('' = none)")
    p.add_argument(
        "--ceiling-only", action="store_true", help="only the FLOP ceiling per task (no model runs)"
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tok = load_base_model(args.model).eval(), load_tokenizer(args.model)
    from lm_eval.models.huggingface import HFLM

    record: dict[str, Any] = {
        "command": "python -m experiments.benchmarks.evaluator "
        + shlex.join(sys.argv[1:] if argv is None else argv),
        "model": args.model,
        "examples-per-task": args.examples,
        "hflm-batch-size": args.batch_size,
        "threads": args.threads,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "loadavg-start": os.getloadavg(),
        },
        "tasks": {},
    }
    for source in split_list(args.sources):
        splits = source_splits(source, args.seed, args.examples, 20, 1000)
        task = local_mc_task(
            "bench_" + "".join(ch if ch.isalnum() else "_" for ch in source), splits.test_path
        )
        if args.ceiling_only:
            lm = requests_only(HFLM)(
                pretrained=model, tokenizer=tok, batch_size=args.batch_size, device="cpu"
            )
            run_task(lm, task)
            row = {
                "documents": args.examples,
                "requests": lm.requests,
                **flop_ceiling(model.config, lm.shapes),
            }
            record["tasks"][source] = row
            print(
                f"{source}: {lm.requests} requests, FLOP ceiling {row['flop-ceiling']:.2f}x",
                flush=True,
            )
            continue
        stock_lm = timed(HFLM)(
            pretrained=model, tokenizer=tok, batch_size=args.batch_size, device="cpu"
        )
        fast_lm = timed(PackedChoicesLM)(
            pretrained=model, tokenizer=tok, batch_size=args.batch_size, device="cpu"
        )
        if not fast_lm.uses_packing:
            raise SystemExit(f"the fast evaluator fell back to HFLM: {fast_lm.fallback_reason}")
        load = os.getloadavg()[0]
        stock, t_stock = run_task(stock_lm, task)
        fast, t_fast = run_task(fast_lm, task)
        row = {
            "documents": len(stock),
            "loadavg-1min": [load, os.getloadavg()[0]],
            "stock": t_stock,
            "fast": t_fast,
            **compare(stock, fast),
        }
        row["speedup-score-cpu"] = t_stock["score-cpu-s"] / t_fast["score-cpu-s"]
        row["speedup-score-wall"] = t_stock["score-wall-s"] / t_fast["score-wall-s"]
        row |= flop_ceiling(model.config, fast_lm.shapes)
        row["of-ceiling"] = row["speedup-score-cpu"] / row["flop-ceiling"]
        record["tasks"][source] = row
        n = row["documents"]
        print(
            f"{source}: {n} docs, {t_stock['requests']} requests | stock "
            f"{n / t_stock['score-cpu-s']:.2f} docs/s, fast {n / t_fast['score-cpu-s']:.2f} docs/s "
            f"(scoring CPU) = {row['speedup-score-cpu']:.2f}x (wall "
            f"{row['speedup-score-wall']:.2f}x; FLOP ceiling {row['flop-ceiling']:.2f}x) | "
            f"max |dLL| {row['max-abs-loglik-diff']:.1e}, acc {row['acc/stock']:.3f} vs "
            f"{row['acc/fast']:.3f}, per-doc equal {row['per-doc-equal']}, load {load:.1f}",
            flush=True,
        )
    rows = record["tasks"].values()
    if args.ceiling_only:
        record["total"] = {
            "flop-ceiling": sum(r["flops-stock"] for r in rows)
            / sum(r["flops-shared"] for r in rows)
        }
        print(f"total FLOP ceiling {record['total']['flop-ceiling']:.2f}x")
        if args.json:
            Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
        return record
    docs = sum(r["documents"] for r in rows)
    tot = {
        f"{k}-{t}": sum(r[k][t] for r in rows)
        for k in ("stock", "fast")
        for t in ("score-cpu-s", "score-wall-s", "total-cpu-s", "total-wall-s")
    }
    record["total"] = {
        "documents": docs,
        **tot,
        "docs-per-s/stock-score-cpu": docs / tot["stock-score-cpu-s"],
        "docs-per-s/fast-score-cpu": docs / tot["fast-score-cpu-s"],
        "speedup-score-cpu": tot["stock-score-cpu-s"] / tot["fast-score-cpu-s"],
        "flop-ceiling": sum(r["flops-stock"] for r in rows) / sum(r["flops-shared"] for r in rows),
        "speedup-score-wall": tot["stock-score-wall-s"] / tot["fast-score-wall-s"],
        "speedup-total-wall": tot["stock-total-wall-s"] / tot["fast-total-wall-s"],
        "max-abs-loglik-diff": max(r["max-abs-loglik-diff"] for r in rows),
        "scores-equal": all(
            r["greedy-equal"] and r["per-doc-equal"] and r["max-abs-loglik-diff"] <= 1e-4
            for r in rows
        ),
    }
    record["machine"]["loadavg-end"] = os.getloadavg()
    t = record["total"]
    print(
        f"total: {docs} docs | scoring {t['docs-per-s/stock-score-cpu']:.2f} -> "
        f"{t['docs-per-s/fast-score-cpu']:.2f} docs/s = {t['speedup-score-cpu']:.2f}x CPU "
        f"({t['speedup-score-wall']:.2f}x wall; FLOP ceiling {t['flop-ceiling']:.2f}x); whole "
        f"simple_evaluate {t['speedup-total-wall']:.2f}x wall | scores equal: {t['scores-equal']} "
        f"(max |dLL| {t['max-abs-loglik-diff']:.1e})"
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return record


if __name__ == "__main__":
    main()
