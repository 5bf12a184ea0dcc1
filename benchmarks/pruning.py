"""Seconds to prune the whole embedded SmolLM2 with SparseGPT, Wanda and magnitude, in one run.

Same calibration for all three (one client's default: `calib-segments` x `calib-seq-len` tokens of
Wikipedia paragraphs), the same 2 threads; printed per layer and in total, with calibration tokens
per second and the held-out Wikipedia perplexity of each pruned model beside the dense one. Wall
seconds and the process's CPU seconds (on a loaded machine the second stays close to the idle figure
when `--threads 1`). The record (figures, command, machine, load average) goes to `--out`;
`fedprune bench render docs/bench/pruning.json` prints the table docs/methods/fedspallm.md shows.

    .venv/bin/fedprune bench pruning [--sparsity 0.5] [--segments 32] [--seq-len 256] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.render import finish_record, start_record
from fedprune_app.core.config import RunConfig
from fedprune_app.core.runtime import quiet_libraries
from fedprune_app.llm.data import client_data
from fedprune_app.llm.evaluation import held_out_text, perplexity
from fedprune_app.llm.layers import calibration_batches, dense_model
from fedprune_app.methods.fedspallm.pruners import PRUNERS, make_pruner, prune_sequentially


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--sparsity", type=float, default=0.5, help="target sparsity (default: %(default)s)"
    )
    parser.add_argument(
        "--segments", type=int, default=32, help="calibration segments (default: %(default)s)"
    )
    parser.add_argument(
        "--seq-len", type=int, default=256, help="tokens per segment (default: %(default)s)"
    )
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads (default: %(default)s)"
    )
    parser.add_argument(
        "--note", default="", help="free text stored in the record (e.g. what else ran)"
    )
    parser.add_argument(
        "--out", default="docs/bench/pruning.json", help="the JSON record; '' = none"
    )
    args = parser.parse_args(argv)
    record = start_record("pruning", "benchmarks.pruning", note=args.note)
    quiet_libraries()
    torch.set_num_threads(args.threads)
    cfg = RunConfig.from_flower({"client-data": "text:wikipedia", "test-examples": 40})
    data = client_data(cfg, 0, 1)
    text = held_out_text("text:wikipedia", cfg)
    model, tokenizer = dense_model(cfg)
    tokens = args.segments * args.seq_len
    print(
        f"SmolLM2-135M, {args.threads} threads, calibration {args.segments} x {args.seq_len} = "
        f"{tokens} tokens, sparsity {args.sparsity}",
        flush=True,
    )
    dense_ppl = perplexity(model, tokenizer, text, 256, 256, 2048)
    print(
        "\n| pruner | total s | CPU s | mean s / layer | slowest layer s | calibration tokens / s "
        "| Wikipedia ppl |"
    )
    print("|---|---|---|---|---|---|---|")
    print(f"| dense | – | – | – | – | – | {dense_ppl:.2f} |", flush=True)
    record.update(
        {
            "threads": args.threads,
            "segments": args.segments,
            "seq-len": args.seq_len,
            "sparsity": args.sparsity,
            "model": cfg.model_name,
            "dense-ppl": dense_ppl,
            "pruners": [],
        }
    )
    for kind in PRUNERS:
        model, tokenizer = dense_model(cfg)
        batches = calibration_batches(data.train, tokenizer, args.segments, args.seq_len, seed=0)
        per_layer: list[float] = []
        start, cpu_start = time.perf_counter(), time.process_time()
        prune_sequentially(
            model,
            batches,
            range(model.config.num_hidden_layers),
            make_pruner(kind, args.sparsity),
            on_layer=lambda _j, s, acc=per_layer: acc.append(s),
        )
        total, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        ppl = perplexity(model, tokenizer, text, 256, 256, 2048)
        row = {
            "pruner": kind,
            "seconds": total,
            "cpu-seconds": cpu,
            "mean-layer-seconds": sum(per_layer) / len(per_layer),
            "slowest-layer-seconds": max(per_layer),
            "tokens-per-second": tokens / total,
            "ppl": ppl,
            "layer-seconds": per_layer,
        }
        record["pruners"].append(row)
        print(
            f"| {kind} | {total:.1f} | {cpu:.1f} | {row['mean-layer-seconds']:.2f} | "
            f"{max(per_layer):.2f} | {tokens / total:.0f} | {ppl:.2f} |",
            flush=True,
        )
    finish_record(record, args.out)


if __name__ == "__main__":
    main()
