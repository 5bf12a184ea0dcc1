"""Size and CPU speed of models side by side: SFT-P's compiled per-client models against the dense one.

Shared by `tools/bench_compiled.py` (random masks, the issue's speed goals) and the SFT-P run itself, which
reports its compiled client models in results.md. The models are timed round-robin (every repeat runs each model
once per task), so a change in machine load hits all of them alike, and the medians are compared:

- prefill: one forward over a `prefill`-token prompt, batch 1, with the KV cache and only the last token's logits
  (what `generate` does first);
- full-logits (optional): the same forward with logits for every token;
- generate: greedy decoding of `new_tokens` tokens with the KV cache after a 32-token prompt (tokens/s).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn


def weights(model: nn.Module) -> tuple[int, float]:
    """(parameters, MB of their storage); tied embeddings counted once."""
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params) / 2**20


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "thread": time.thread_time}


def _seconds(fn: Callable[[], object], clock: Callable[[], float]) -> float:
    start = clock()
    fn()
    return clock() - start


def speed_table(models: Mapping[str, nn.Module], vocab_size: int, eos_token_id: Any, prefill: int = 512,
                new_tokens: int = 32, repeats: int = 3, full_logits: bool = False, seed: int = 0,
                clock: str = "wall") -> dict[str, dict[str, float]]:
    """{model: {params, MB, prefill-ms, [full-logits-ms], generate-tok-s}} plus `*-speedup` against the first
    model (the reference, e.g. "dense"); medians of `repeats` round-robin runs after one warm-up. `clock`:
    "wall" (elapsed) or "thread" (CPU time of the calling thread: meaningful with one torch thread only, and
    close to idle figures on a loaded machine, where wall time with 2 threads mostly measures waiting)."""
    prompt = torch.randint(0, int(vocab_size), (1, prefill), generator=torch.Generator().manual_seed(seed))
    short = prompt[:, :32]
    tasks: dict[str, Callable[[nn.Module], object]] = {
        "prefill": lambda m: m(prompt, use_cache=True, logits_to_keep=1),
        "generate": lambda m: m.generate(short, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                         do_sample=False, pad_token_id=eos_token_id),
    }
    if full_logits:
        tasks["full-logits"] = lambda m: m(prompt, use_cache=False)
    times: dict[tuple[str, str], list[float]] = {(t, n): [] for t in tasks for n in models}
    with torch.inference_mode():
        for rep in range(repeats + 1):
            for task, fn in tasks.items():
                for name, model in models.items():
                    seconds = _seconds(lambda fn=fn, model=model: fn(model), CLOCKS[clock])
                    if rep:  # rep 0 is the warm-up
                        times[(task, name)].append(seconds)
    med = {key: statistics.median(v) for key, v in times.items()}
    reference = next(iter(models))
    out: dict[str, dict[str, float]] = {}
    for name, model in models.items():
        params, mb = weights(model)
        row = {"params": float(params), "MB": mb, "prefill-ms": 1000 * med[("prefill", name)],
               "prefill-speedup": med[("prefill", reference)] / med[("prefill", name)],
               "generate-tok-s": new_tokens / med[("generate", name)],
               "generate-speedup": med[("generate", reference)] / med[("generate", name)]}
        if full_logits:
            row["full-logits-ms"] = 1000 * med[("full-logits", name)]
            row["full-logits-speedup"] = med[("full-logits", reference)] / med[("full-logits", name)]
        out[name] = row
    return out
