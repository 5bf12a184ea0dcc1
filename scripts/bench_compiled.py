"""SFT-P compiled model (Appx. A.1) vs the dense model: size and CPU speed on SmolLM2 (embedded).

Random masks with exactly round(keep·d) active coordinates per mask (all four masks of every layer), compiled
with `fedprune_app.routing.compile_model`. Measured in one process, with the models timed round-robin so a
change in machine load hits all of them alike:
  prefill   — one forward over a `--prefill`-token prompt, batch 1, with the KV cache and the last token's
              logits only (what `generate` does); `full-logits` — the same forward with logits for every token;
  generate  — greedy decoding of `--new-tokens` tokens with the KV cache after a 32-token prompt (tokens/s);
  medians of `--repeats` runs after one warm-up; parameters (whole model, prunable projections) and weight MB.
A check line compares the compiled model's logits with the masked (training-form) model on a short input.

    .venv/bin/python scripts/bench_compiled.py            # --keeps 0.5,0.8 --prefill 512 --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
for _k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_k, "1")

from fedprune_app.models import load_base_model  # noqa: E402
from fedprune_app.routing import (  # noqa: E402
    MASK_NAMES,
    LayerMasks,
    compile_model,
    install_routing,
    kept_parameters,
    prunable_parameters,
    set_masks,
)


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


def weights(model: nn.Module) -> tuple[int, float]:
    """(parameters, MB) — tied embeddings counted once."""
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params) / 2**20


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--keeps", default="0.5,0.8", help="keep ratios per mask, comma-separated")
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"command: {' '.join(sys.argv)}   torch threads {args.threads}   load average {os.getloadavg()}")

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

    tasks: dict[str, Callable[[nn.Module], object]] = {
        "prefill": lambda m: m(prompt, use_cache=True, logits_to_keep=1),
        "full-logits": lambda m: m(prompt, use_cache=False),
        "generate": lambda m: m.generate(short, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                         do_sample=False, pad_token_id=config.eos_token_id),
    }
    times: dict[tuple[str, str], list[float]] = {(t, n): [] for t in tasks for n in models}
    with torch.inference_mode():
        for rep in range(args.repeats + 1):
            for task, fn in tasks.items():
                for name, model in models.items():
                    seconds = timed(lambda fn=fn, model=model: fn(model))
                    if rep:  # rep 0 is the warm-up
                        times[(task, name)].append(seconds)

    total_dense, mb_dense = weights(dense)
    prunable = prunable_parameters(config)
    print(f"\n{'model':<10} {'params':>11} {'ratio':>6} {'prunable':>11} {'ratio':>6} {'MB':>7} "
          f"{'prefill ms':>10} {'speed-up':>8} {'full ms':>8} {'speed-up':>8} {'gen tok/s':>9} {'speed-up':>8}")
    med = {key: statistics.median(v) for key, v in times.items()}
    for name, model in models.items():
        total, mb = weights(model)
        kept = prunable if name == "dense" else int(kept_parameters(config, masks_of[name]))
        tok_s = args.new_tokens / med[("generate", name)]
        print(f"{name:<10} {total:>11,} {total / total_dense:>6.3f} {kept:>11,} {kept / prunable:>6.3f} {mb:>7.1f} "
              f"{1000 * med[('prefill', name)]:>10.0f} {med[('prefill', 'dense')] / med[('prefill', name)]:>7.2f}x "
              f"{1000 * med[('full-logits', name)]:>8.0f} "
              f"{med[('full-logits', 'dense')] / med[('full-logits', name)]:>7.2f}x "
              f"{tok_s:>9.1f} {med[('generate', 'dense')] / med[('generate', name)]:>7.2f}x")
    print(f"\nprefill = {args.prefill} tokens, batch 1; generate = {args.new_tokens} new tokens after 32; "
          f"medians of {args.repeats} after a warm-up; load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
