"""Size and CPU speed of models side by side: SFT-P's compiled per-client models against the dense
one.

Shared by `benchmarks/compiled.py` (random masks, the speed goals of docs/claims.md) and the SFT-P
run itself, which reports its compiled client models in results.md. The models are timed round-robin
(every repeat runs each model once per task), so a change in machine load hits all of them alike; a
speed-up is the median over the repeats of the paired ratio (reference time / model time of the same
repeat), with a distribution-free 95% interval for that median from 6 repeats on
(`median_interval`):

- prefill: one forward over a `prefill`-token prompt, batch 1, with the KV cache and only the last
  token's logits (what `generate` does first);
- full-logits (optional): the same forward with logits for every token;
- generate: greedy decoding of `new_tokens` tokens with the KV cache after a 32-token prompt
  (tokens/s).

Beside each measured speed-up stands its ceiling: the speed-up the kept matmul FLOPs allow for
exactly that workload, FLOPs(dense) / FLOPs(compiled) (`workload_flops`, counted from the config and
the lanes), and the share of it reached, measured / ceiling. The LM head (vocab × d per logit token)
and attention's scores and values are not pruned, so the ceiling is below 1/keep: on SmolLM2 (vocab
49,152 × d 576 in the LM head, 28 M weights beside 106 M prunable ones) one decoding step at keep
0.8 cannot pass ~1.18×, at keep 0.5 ~1.64×.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from fedprune_app.core.config import split_list
from fedprune_app.llm.evaluation import held_out_text, perplexity_metrics, window_scores
from fedprune_app.llm.layers import decoder_layers
from fedprune_app.llm.models import model_device
from fedprune_app.report.tables import cell, interval_cell, legend
from fedprune_app.structural.routing import MASK_NAMES, CompiledDecoderLayer


def weights(model: nn.Module) -> tuple[int, float]:
    """(parameters, MB of their storage); tied embeddings counted once."""
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params) / 2**20


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "thread": time.thread_time}


def _seconds(fn: Callable[[], object], clock: Callable[[], float], device: torch.device) -> float:
    """`fn`'s time on `clock`; on a GPU the queued kernels are waited for before each reading (CUDA
    runs them asynchronously, so the call alone returns before the work is done)."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    sync()
    start = clock()
    fn()
    sync()
    return clock() - start


def median_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """The distribution-free interval for the median of independent draws: the order statistics
    x_(k) and x_(n+1−k) (1-based, sorted) with the largest k for which
    P(Binom(n, ½) ≤ k − 1) ≤ (1 − level)/2, so that it covers the population median with
    probability 1 − 2·P(Binom(n, ½) ≤ k − 1) ≥ `level` (Conover, Practical Nonparametric Statistics,
    §3.2). None when no k qualifies (at 95%: fewer than 6 values; 7 give min–max, 15 give
    x_(4)–x_(12))."""
    x, n = sorted(values), len(values)
    alpha, below, k = (1 - level) / 2, 0.0, 0
    while k < n and below + math.comb(n, k) / 2**n <= alpha:  # below = P(Binom(n, ½) ≤ k − 1)
        below += math.comb(n, k) / 2**n
        k += 1
    return (x[k - 1], x[n - k]) if k else None


def set_ceiling(row: dict[str, float], task: str, ceiling: float) -> None:
    """Put `ceiling` beside `row`'s measured speed-up on `task`: `*-ceiling`,
    `*-of-ceiling` = speed-up / ceiling and, where the speed-up has an interval (`*-speedup-lo`,
    `*-speedup-hi`), the same interval over the ceiling."""
    row[f"{task}-ceiling"] = ceiling
    row[f"{task}-of-ceiling"] = row[f"{task}-speedup"] / ceiling
    if f"{task}-speedup-lo" in row:
        row[f"{task}-of-ceiling-lo"] = row[f"{task}-speedup-lo"] / ceiling
        row[f"{task}-of-ceiling-hi"] = row[f"{task}-speedup-hi"] / ceiling


def speed_table(
    models: Mapping[str, nn.Module],
    vocab_size: int,
    eos_token_id: Any,
    prefill: int = 512,
    new_tokens: int = 32,
    repeats: int = 3,
    full_logits: bool = False,
    seed: int = 0,
    clock: str = "wall",
) -> dict[str, dict[str, float]]:
    """{model: {params, MB, prefill-ms, [full-logits-ms], generate-tok-s}} (medians of `repeats`
    round-robin runs after one warm-up) plus, per task, `*-speedup` against the first model (the
    reference, e.g. "dense"): the median of the per-repeat ratios reference time / model time,
    paired within a repeat, with its 95% interval `*-speedup-lo`, `*-speedup-hi` (`median_interval`,
    from 6 repeats on), `*-ceiling` (the speed-up its matmul FLOPs allow on the same workload,
    `workload_flops`) and `*-of-ceiling` (speed-up / ceiling, with the interval likewise,
    `set_ceiling`). `clock`: "wall" (elapsed) or "thread" (CPU time of the calling thread:
    meaningful with one torch thread only, and close to idle figures on a loaded machine, where wall
    time with 2 threads mostly measures waiting)."""
    prompt = torch.randint(
        0, int(vocab_size), (1, prefill), generator=torch.Generator().manual_seed(seed)
    )
    short = prompt[:, :32]
    devices = {name: model_device(model) for name, model in models.items()}
    inputs = {
        name: (prompt.to(at), short.to(at)) for name, at in devices.items()
    }  # copied once, outside the clock
    Task = Callable[
        [nn.Module, torch.Tensor, torch.Tensor], object
    ]  # (model, its prompt, its short prompt)
    tasks: dict[str, Task] = {
        "prefill": lambda m, p, _: m(p, use_cache=True, logits_to_keep=1),
        "generate": lambda m, _, s: m.generate(
            s,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=eos_token_id,
        ),
    }
    if full_logits:
        tasks["full-logits"] = lambda m, p, _: m(p, use_cache=False)
    times: dict[tuple[str, str], list[float]] = {(t, n): [] for t in tasks for n in models}
    with torch.inference_mode():
        for rep in range(repeats + 1):
            for task, fn in tasks.items():
                for name, model in models.items():
                    seconds = _seconds(
                        lambda fn=fn, model=model, x=inputs[name]: fn(model, *x),
                        CLOCKS[clock],
                        devices[name],
                    )
                    if rep:  # rep 0 is the warm-up
                        times[(task, name)].append(seconds)
    med = {key: statistics.median(v) for key, v in times.items()}
    reference = next(iter(models))
    config, ref_lanes = models[reference].config, lane_widths(models[reference])
    workload = {"prefill": prefill, "new_tokens": new_tokens, "prompt": short.shape[1]}
    out: dict[str, dict[str, float]] = {}
    for name, model in models.items():
        params, mb = weights(model)
        lanes = lane_widths(model)
        row = {
            "params": float(params),
            "MB": mb,
            "prefill-ms": 1000 * med[("prefill", name)],
            "generate-tok-s": new_tokens / med[("generate", name)],
        }
        if full_logits:
            row["full-logits-ms"] = 1000 * med[("full-logits", name)]
        for task in tasks:
            ratios = [
                r / t for r, t in zip(times[(task, reference)], times[(task, name)], strict=True)
            ]
            row[f"{task}-speedup"] = statistics.median(ratios)
            if (interval := median_interval(ratios)) is not None:
                row[f"{task}-speedup-lo"], row[f"{task}-speedup-hi"] = interval
            set_ceiling(row, task, flop_ceiling(config, lanes, task, ref_lanes, **workload))
        out[name] = row
    return out


# ---------------------------------------------------------------- FLOP ceiling

Lanes = Mapping[
    str, int
]  # kept width |π| of each of the four masks of one decoder layer (MASK_NAMES)


def lane_widths(source: Any) -> list[dict[str, int]] | None:
    """The kept lane widths per decoder layer of a model or a mask set; None = dense (every lane d
    wide).

    `source`: a model (a compiled one's layers carry their lanes π; a model without compiled layers
    is dense), a sequence of per-layer masks (`LayerMasks`, bool or 0/1, thresholded at 0.5 as
    `compile_model` does), or the stacked {mask name: (layers, d)} arrays of a client's final masks
    (numpy or torch)."""

    if isinstance(source, nn.Module):
        layers = decoder_layers(source)
        if not any(isinstance(layer, CompiledDecoderLayer) for layer in layers):
            return None
        d = int(source.config.hidden_size)
        return [
            {n: len(layer.routing[n]) for n in MASK_NAMES}
            if isinstance(layer, CompiledDecoderLayer)
            else dict.fromkeys(MASK_NAMES, d)
            for layer in layers
        ]
    if isinstance(source, Mapping):
        stacked = {n: torch.as_tensor(np.asarray(source[n])) for n in MASK_NAMES}
        return [
            {n: int((stacked[n][i].float() > 0.5).sum()) for n in MASK_NAMES}
            for i in range(stacked[MASK_NAMES[0]].shape[0])
        ]
    return [
        {n: int((torch.as_tensor(g[n]).detach().float() > 0.5).sum()) for n in MASK_NAMES}
        for g in source
    ]


def forward_flops(
    config: Any,
    lanes: Sequence[Lanes] | None,
    tokens: int,
    past: int = 0,
    logits: int = 1,
    attention: str = "full",
) -> int:
    """Matmul FLOPs (2 per multiply-add) of one batch-1 forward of `tokens` new tokens after `past`
    cached ones, with logits for the last `logits` tokens, of the LLaMA-family model `config` whose
    decoder layers keep the lane widths `lanes` (`lane_widths`; None = dense). Counted, as the
    compiled form runs them (Appx. A.1):

    - per layer with a live attention lane (|π_in| > 0 and |π_out| > 0): fused q/k/v,
      |π_in| × (q + k + v) per token, and o_proj, (heads·head_dim) × |π_out|; scores q·kᵀ and the
      weighted sum of values, 2·heads·head_dim multiply-adds per (query, key) pair: `full` = every
      new token against all past + tokens keys, what the CPU kernels execute (the eager kernel
      multiplies before it masks, and torch's SDPA CPU kernel takes as long with is_causal as
      without: docs/notes/2026-11-sftp-investigations.md); `causal` = only the
      pairs the mask keeps, past + i + 1 keys for the i-th new token (what GPU flash kernels
      compute). A skipped attention (empty lane) costs nothing; the bus masks never narrow the
      heads, so this term is the dense model's. One decoding token (tokens = 1) counts the same
      either way;
    - per layer with a live FFN lane: fused gate/up, |π_in| × 2·intermediate, and down,
      intermediate × |π_out|;
    - the LM head, hidden × vocab per logit token (not pruned, tied or not); the embedding lookup:
      none.

    Norms, activations, the rotary angles and products, softmax and the index_select / index_add_
    data moves are not matmuls (O(d) per token) and are not counted. With `full` this is the count
    of torch's FlopCounterMode over the same forward (tests/methods/sftp/test_speed.py)."""
    if attention not in ("causal", "full"):
        raise ValueError(f"attention must be 'causal' or 'full', got {attention!r}")
    d = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or d // heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    inter, vocab = int(config.intermediate_size), int(config.vocab_size)
    q_out, qkv_out = heads * head_dim, (heads + 2 * kv_heads) * head_dim
    keys = tokens * past + (
        tokens * (tokens + 1) // 2 if attention == "causal" else tokens * tokens
    )
    layers = [None] * int(config.num_hidden_layers) if lanes is None else list(lanes)
    macs = 0
    for widths in layers:
        w = (
            dict.fromkeys(("attn-in", "attn-out", "ffn-in", "ffn-out"), d)
            if widths is None
            else widths
        )
        if w["attn-in"] > 0 and w["attn-out"] > 0:
            macs += (
                tokens * (w["attn-in"] * qkv_out + q_out * w["attn-out"])
                + 2 * heads * head_dim * keys
            )
        if w["ffn-in"] > 0 and w["ffn-out"] > 0:
            macs += tokens * (w["ffn-in"] * 2 * inter + inter * w["ffn-out"])
    return 2 * (macs + d * vocab * logits)


def workload_flops(
    config: Any,
    lanes: Sequence[Lanes] | None,
    task: str,
    prefill: int = 512,
    new_tokens: int = 32,
    prompt: int = 32,
    attention: str = "full",
) -> int:
    """Matmul FLOPs (`forward_flops`) of one of `speed_table`'s timed tasks: `prefill` (one forward
    over `prefill` tokens, last-token logits), `full-logits` (the same, logits for every token) or
    `generate` (greedy `generate` of `new_tokens` tokens after a `prompt`-token prompt: one forward
    over the prompt with last-token logits, then new_tokens − 1 one-token steps with the KV
    cache)."""
    if task == "prefill":
        return forward_flops(config, lanes, prefill, 0, 1, attention)
    if task == "full-logits":
        return forward_flops(config, lanes, prefill, 0, prefill, attention)
    if task == "generate":
        return forward_flops(config, lanes, prompt, 0, 1, attention) + sum(
            forward_flops(config, lanes, 1, prompt + i, 1, attention) for i in range(new_tokens - 1)
        )
    raise ValueError(f"unknown task {task!r} (prefill, full-logits, generate)")


def flop_ceiling(
    config: Any,
    lanes: Sequence[Lanes] | None,
    task: str,
    reference: Sequence[Lanes] | None = None,
    **workload: Any,
) -> float:
    """The speed-up over `reference` (default: the dense model) that `lanes` can reach on `task` if
    time were proportional to matmul FLOPs: FLOPs(reference) / FLOPs(lanes) (`workload_flops`)."""
    return workload_flops(config, reference, task, **workload) / workload_flops(
        config, lanes, task, **workload
    )


# -------------------------------------------------------------- results.md's "Compiled models" rows


def compiled_rows(
    cfg: Any,
    models: Mapping[str, nn.Module],
    tokenizer: Any,
    kept: Mapping[str, float],
    prefill: int,
    ceiling: Callable[[str, str], float | None] | None = None,
) -> list[dict[str, Any]]:
    """One `phase: compiled` row per model (the first, "dense", is the reference): parameters, MB,
    params-ratio, the kept ratio of the prunable projections (`kept`, where given), the perplexity
    of the server's held-out text (`ppl/<source>` per `server-eval-data` source, scored as the
    per-round server evaluation does, with its windows `ppl-n/<source>` and 95% interval
    `ppl-lo/<source>`, `ppl-hi/<source>`; with a `tokenizer` and `eval-ppl-tokens` > 0) and, with
    `prefill` > 0, prefill latency and generation speed against the dense model (`speed_table`,
    timed round-robin in this process). `ceiling(model, task)` replaces `speed_table`'s lane-based
    FLOP ceiling for structures that lanes do not describe (LLM-Pruner's, SliceGPT's); None keeps
    it. Shared by SFT-P's, llmpruner's and slicegpt's strategies."""

    sources = (
        split_list(cfg.server_eval_data) if tokenizer is not None and cfg.eval_ppl_tokens else []
    )
    scores: dict[str, dict[str, float]] = {name: {} for name in models}
    for source in sources:
        text = held_out_text(source, cfg)
        for name, m in models.items():
            windows = window_scores(
                m, tokenizer, text, cfg.ppl_window, cfg.ppl_stride, cfg.eval_ppl_tokens
            )
            scored = perplexity_metrics(windows, cfg.ppl_bootstrap_iters, cfg.seed)
            scores[name] |= {f"{k}/{source}": v for k, v in scored.items() if k != "ppl-tokens"}
    dense = next(iter(models.values()))
    if prefill > 0:
        table = speed_table(
            models, int(dense.config.vocab_size), dense.config.eos_token_id, prefill=prefill
        )
        for name, row in table.items():
            for task in ("prefill", "generate"):
                value = None if ceiling is None else ceiling(name, task)
                if value is not None:
                    set_ceiling(row, task, value)
    else:
        table = {
            name: dict(zip(("params", "MB"), map(float, weights(m)), strict=True))
            for name, m in models.items()
        }
    reference = table[next(iter(models))]["params"]
    return [
        {
            "phase": "compiled",
            "model": name,
            "prefill-tokens": prefill,
            **row,
            "params-ratio": row["params"] / reference,
            **({"kept-ratio-prunable": kept[name]} if name in kept else {}),
            **scores[name],
        }
        for name, row in table.items()
    ]


def render_compiled(rows: list[dict[str, Any]]) -> str:
    """results.md's 'Compiled models' section from the `compiled` rows (`compiled_rows`): each
    deployable model against the dense one, its size and, when timed, prefill and generation, each
    speed-up beside its FLOP ceiling and the share of it reached; then, when scored, the server's
    perplexity of its held-out text for each of them (the models the clients deploy), with n and 95%
    interval. No rows: nothing."""
    if not rows:
        return ""
    timed = "prefill-ms" in rows[0]
    ceiling = timed and "prefill-ceiling" in rows[0]
    title = "Compiled models (each client's deployable model: LoRA merged, sliced by its mask)"
    if timed:
        title += (
            f"; prefill of {rows[0]['prefill-tokens']} tokens, batch 1, and 32 greedy "
            "tokens, medians of 3, timed round-robin in one process"
        )
    if ceiling:
        title += (
            "; ceiling = FLOPs(dense) / FLOPs(model) of the same workload (every matmul: "
            "pruned projections, attention, the unpruned LM head), of ceiling = speed-up / "
            "ceiling"
        )
    lines = ["", title + ":", ""]
    head, rule = "| model | params | params ratio | MB |", "|---|---|---|---|"
    if timed:
        head += " prefill ms | speed-up |" + (" ceiling | of ceiling |" if ceiling else "")
        head += " generation tok/s |"
        rule += "---|---|" + ("---|---|" if ceiling else "") + "---|"
        if ceiling:
            head += " speed-up | ceiling | of ceiling |"
            rule += "---|---|---|"
    lines += [head, rule]
    for r in rows:
        line = (
            f"| {r['model']} | {r['params'] / 1e6:.1f} M | {r['params-ratio']:.3f} |"
            f" {r['MB']:.1f} |"
        )
        if timed:
            line += f" {r['prefill-ms']:.0f} | {r['prefill-speedup']:.2f}× |"
            if ceiling:
                line += f" {r['prefill-ceiling']:.2f}× | {r['prefill-of-ceiling']:.2f} |"
            line += f" {r['generate-tok-s']:.1f} |"
            if ceiling:
                line += (
                    f" {r['generate-speedup']:.2f}× | {r['generate-ceiling']:.2f}× |"
                    f" {r['generate-of-ceiling']:.2f} |"
                )
        lines.append(line)
    terms = [
        "params: the model's parameters (M = million); params ratio: its parameters / the "
        "dense model's; MB: the size of its weights"
    ]
    if timed:
        terms.append(
            "prefill ms: time to process the prompt; generation tok/s: new tokens per "
            "second; speed-up: the dense model's time / this model's"
        )
    sources = list(dict.fromkeys(k[4:] for r in rows for k in r if k.startswith("ppl/")))
    if sources:
        lines += legend(terms)
        head = "| model | kept (prunable) |"
        for s in sources:
            n = next((int(r[f"ppl-n/{s}"]) for r in rows if r.get(f"ppl-n/{s}")), None)
            head += f" ppl `{s}`{f' (n = {n} windows)' if n else ''} | 95% interval |"
        lines += [
            "",
            "Server-side evaluation of the deployed models: the server's held-out text "
            "(the per-round evaluation's) scored by the dense base model and by each "
            "client's compiled model after the last round (perplexity):",
            "",
            head,
            "|---|---|" + "---|---|" * len(sources),
        ]
        for r in rows:
            cells = [str(r["model"]), cell(r.get("kept-ratio-prunable"))]
            for s in sources:
                lo, hi, n = r.get(f"ppl-lo/{s}"), r.get(f"ppl-hi/{s}"), r.get(f"ppl-n/{s}")
                cells += [cell(r.get(f"ppl/{s}")), interval_cell(lo, hi, n)]
            lines.append("| " + " | ".join(cells) + " |")
        terms = [
            "dense: the untouched base model",
            "kept (prunable): the share of the prunable weights the model keeps",
            "ppl: perplexity of the server's held-out text, exp(mean negative "
            "log-likelihood per token); lower is better; n: windows scored",
            "95% interval: a percentile bootstrap over the windows; – where none was recorded",
        ]
    return "\n".join(lines + legend(terms)) + "\n"


def compiled_section(records: Sequence[Mapping[str, Any]]) -> str:
    """The strategies' `results_sections` hook for the models they compile: `render_compiled` of
    the run's `compiled` rows."""
    return render_compiled([dict(r) for r in records if r.get("phase") == "compiled"])
