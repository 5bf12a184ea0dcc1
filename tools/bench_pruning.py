"""Seconds to prune the whole embedded SmolLM2 with SparseGPT, Wanda and magnitude, in one run.

Same calibration for all three (one client's default: `calib-segments` x `calib-seq-len` tokens of Wikipedia
paragraphs), the same 2 threads; printed per layer and in total, with calibration tokens per second and the
held-out Wikipedia perplexity of each pruned model beside the dense one.

    .venv/bin/python tools/bench_pruning.py [--sparsity 0.5] [--segments 32] [--seq-len 256]
"""

from __future__ import annotations

import argparse
import time

import torch

from fedprune_app.core.config import RunConfig
from fedprune_app.core.runtime import quiet_libraries
from fedprune_app.llm.data import client_data
from fedprune_app.llm.evaluation import held_out_text, perplexity
from fedprune_app.llm.layers import calibration_batches, dense_model
from fedprune_app.methods.fedspallm.pruners import PRUNERS, make_pruner, prune_sequentially


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sparsity", type=float, default=0.5)
    parser.add_argument("--segments", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    quiet_libraries()
    torch.set_num_threads(args.threads)
    cfg = RunConfig.from_flower({"client-data": "squad_shifts:squaddev", "test-examples": 40})
    data = client_data(cfg, 0, 1)
    text = held_out_text("squad_shifts:squaddev", cfg)
    model, tokenizer = dense_model(cfg)
    tokens = args.segments * args.seq_len
    print(f"SmolLM2-135M, {args.threads} threads, calibration {args.segments} x {args.seq_len} = {tokens} tokens, "
          f"sparsity {args.sparsity}", flush=True)
    dense_ppl = perplexity(model, tokenizer, text, 256, 256, 2048)
    print("\n| pruner | total s | mean s / layer | slowest layer s | calibration tokens / s | Wikipedia ppl |")
    print("|---|---|---|---|---|---|")
    print(f"| dense | – | – | – | – | {dense_ppl:.2f} |", flush=True)
    for kind in PRUNERS:
        model, tokenizer = dense_model(cfg)
        batches = calibration_batches(data.train, tokenizer, args.segments, args.seq_len, seed=0)
        per_layer: list[float] = []
        start = time.perf_counter()
        prune_sequentially(model, batches, range(model.config.num_hidden_layers),
                           make_pruner(kind, args.sparsity), on_layer=lambda _j, s, acc=per_layer: acc.append(s))
        total = time.perf_counter() - start
        ppl = perplexity(model, tokenizer, text, 256, 256, 2048)
        print(f"| {kind} | {total:.1f} | {sum(per_layer) / len(per_layer):.2f} | {max(per_layer):.2f} "
              f"| {tokens / total:.0f} | {ppl:.2f} |", flush=True)


if __name__ == "__main__":
    main()
