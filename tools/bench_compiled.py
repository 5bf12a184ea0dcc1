"""SFT-P compiled model (Appx. A.1) vs the dense model: size and CPU speed on SmolLM2 (embedded).

Random masks with exactly round(keep·d) active coordinates per mask (all four masks of every layer), compiled
with `fedprune_app.methods.sftp.routing.compile_model`. Measured in one process, with the models timed round-robin so a
change in machine load hits all of them alike:
  prefill   — one forward over a `--prefill`-token prompt, batch 1, with the KV cache and the last token's
              logits only (what `generate` does); `full-logits` — the same forward with logits for every token;
  generate  — greedy decoding of `--new-tokens` tokens with the KV cache after a 32-token prompt (tokens/s);
  medians of `--repeats` runs after one warm-up; parameters (whole model, prunable projections) and weight MB.
A check line compares the compiled model's logits with the masked (training-form) model on a short input.
On a loaded machine wall-clock times with 2 threads mostly measure waiting for a core (each parallel region waits
for its slowest thread); `--threads 1 --clock thread` times the CPU time of the one thread instead, which stays
close to the idle figures.

    .venv/bin/python tools/bench_compiled.py            # --keeps 0.5,0.8 --prefill 512 --threads 2
    .venv/bin/python tools/bench_compiled.py --threads 1 --clock thread   # loaded machine
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn

for _k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_k, "1")

from fedprune_app.llm.models import load_base_model  # noqa: E402
from fedprune_app.methods.sftp.routing import (  # noqa: E402
    MASK_NAMES,
    LayerMasks,
    compile_model,
    install_routing,
    kept_parameters,
    prunable_parameters,
    set_masks,
)
from fedprune_app.methods.sftp.speed import CLOCKS, speed_table  # noqa: E402


def random_masks(layers: int, d: int, keep: float, seed: int) -> list[LayerMasks]:
    gen = torch.Generator().manual_seed(seed)
    k = round(keep * d)
    out = []
    for _ in range(layers):
        masks = {}
        for name in MASK_NAMES:
            g = torch.zeros(d, dtype=torch.bool)
            g[torch.randperm(d, generator=gen)[:k]] = True
            masks[name] = g
        out.append(masks)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--keeps", default="0.5,0.8", help="keep ratios per mask, comma-separated")
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall",
                        help="wall: elapsed time; thread: CPU time of the calling thread (needs --threads 1)")
    args = parser.parse_args()
    if args.clock == "thread" and args.threads != 1:
        parser.error("--clock thread counts one thread's CPU time: use it with --threads 1")
    torch.set_num_threads(args.threads)
    print(f"command: {' '.join(sys.argv)}   torch threads {args.threads}   clock {args.clock}   "
          f"load average {os.getloadavg()}")

    dense = load_base_model(args.model)
    config, d = dense.config, int(dense.config.hidden_size)
    gen = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(0, int(config.vocab_size), (1, args.prefill), generator=gen)
    short = prompt[:, :32]
    models: dict[str, nn.Module] = {"dense": dense}
    masks_of: dict[str, list[LayerMasks]] = {}
    for keep in (float(k) for k in args.keeps.split(",")):
        masks_of[f"keep {keep:g}"] = random_masks(int(config.num_hidden_layers), d, keep, args.seed)
        models[f"keep {keep:g}"] = compile_model(dense, masks_of[f"keep {keep:g}"])

    install_routing(dense)  # the check: masked form vs compiled form on the short prompt
    for name, masks in masks_of.items():
        set_masks(dense, masks)
        with torch.no_grad():
            masked = dense(short).logits
            diff = (models[name](short).logits - masked).abs().max().item()
        print(f"check {name}: max |compiled - masked| logits = {diff:.2e} (|logits| max {masked.abs().max():.1f})")
    set_masks(dense, None)

    table = speed_table(models, int(config.vocab_size), config.eos_token_id, prefill=args.prefill,
                        new_tokens=args.new_tokens, repeats=args.repeats, full_logits=True, seed=args.seed,
                        clock=args.clock)
    prunable = prunable_parameters(config)
    print(f"\n{'model':<10} {'params':>11} {'ratio':>6} {'prunable':>11} {'ratio':>6} {'MB':>7} "
          f"{'prefill ms':>10} {'speed-up':>8} {'full ms':>8} {'speed-up':>8} {'gen tok/s':>9} {'speed-up':>8}")
    for name, row in table.items():
        kept = prunable if name == "dense" else int(kept_parameters(config, masks_of[name]))
        print(f"{name:<10} {int(row['params']):>11,} {row['params'] / table['dense']['params']:>6.3f} {kept:>11,} "
              f"{kept / prunable:>6.3f} {row['MB']:>7.1f} {row['prefill-ms']:>10.0f} {row['prefill-speedup']:>7.2f}x "
              f"{row['full-logits-ms']:>8.0f} {row['full-logits-speedup']:>7.2f}x "
              f"{row['generate-tok-s']:>9.1f} {row['generate-speedup']:>7.2f}x")
    print(f"\nprefill = {args.prefill} tokens, batch 1; generate = {args.new_tokens} new tokens after 32; "
          f"medians of {args.repeats} after a warm-up; load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
