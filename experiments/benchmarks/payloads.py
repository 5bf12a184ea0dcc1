"""FedSpaLLM's bytes per client per round before / after its wire encodings (`core.encoding`), and
what 16-bit payloads cost in perplexity.

Finding: Kept values + bit-packed masks cut a SmolLM2 client's upload to 0.425× of fp32
  weights + bool masks (16-bit: 0.225×), and bfloat16 costs +1.90 [−1.03, +4.88] perplexity
  (unresolved), so fp32 stays the default.
Record: docs/bench/payloads.json; quoted in docs/methods/fedspallm.md,
  docs/notes/2026-11-fedspallm-investigations.md and docs/scale.md.

Bytes: for every distinct weight shape of the model's decoder linears, a random matrix pruned to
exactly ⌈s·d⌉ zeros is put on the wire both ways and measured with `record_bytes` (tensor bytes;
headers not counted): before = fp32 weights + bool masks up, fp32 weights down (the earlier format);
after = `core.encoding`'s kept values + bit-packed masks in each payload dtype. Round 1 sends the
dense global weights down (every position kept); later rounds the pruned ones. Figures are for a
client that samples every decoder layer (r_i = 1); they scale with r_i. Shapes: the embedded
SmolLM2-135M's config and LLaMA-7B's (hidden 4096, MLP 11008, 32 heads, 32 layers), instantiated on
the meta device (no weights). Also the bool masks other methods send (SFT-P's final masks, fedflap's
and LLM-Pruner's global structure: 4 or 2 bus-sized masks per layer, kilobytes) for scale.

Perplexity (`--ppl`): one FedSpaLLM round on SmolLM2-135M, in process (the strategy's messages
answered by the ClientApp, as tests/local_grid.py does), once per payload dtype with everything else
equal: `--clients` clients each prune every layer (r_i = 1) with SparseGPT on
`--calib-segments` × `--calib-seq-len` tokens of its own domain; the server aggregates. Each global
model is scored on the same held-out windows (back-to-back windows of `--window` tokens,
`--eval-tokens` per domain over the 4 embedded text domains; the archived record ran on BIG-bench's
4 squad_shifts domains); the 16-bit minus fp32 perplexity difference
gets a paired bootstrap 95% interval over windows.

    .venv/bin/python -m experiments.benchmarks.payloads [--ppl] [--out docs/bench/payloads.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedprune_app.core.encoding import MASK_SUFFIX, PAYLOAD_DTYPES, encode_sparse
from fedprune_app.core.protocol import record_bytes, to_record
from fedprune_app.methods.fedspallm.masks import target_count

SOURCES = ("text:wikipedia", "text:fiction", "text:papers", "text:howto")
LLAMA_7B = {
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "num_hidden_layers": 32,
    "vocab_size": 32000,
}


def linear_shapes(config: Any) -> list[tuple[int, ...]]:
    """The shape of every prunable decoder weight matrix of a model config (meta device: no
    memory)."""
    from transformers import AutoModelForCausalLM

    from fedprune_app.llm.layers import prunable_names

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = dict(model.named_parameters())
    return [tuple(params[name].shape) for name in prunable_names(model)]


def matrix_bytes(
    shape: tuple[int, ...], sparsity: float, rng: np.random.Generator
) -> dict[str, int]:
    """Measured wire bytes of one matrix of `shape` at `sparsity`, each way, before and after."""
    size = int(np.prod(shape))
    weight = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
    pruned = weight.copy()
    pruned.flat[rng.permutation(size)[: target_count(sparsity, size)]] = 0
    mask = pruned != 0
    out = {
        "before up": record_bytes(to_record({"w": pruned, "w" + MASK_SUFFIX: mask})),
        "before down dense": record_bytes(to_record({"w": weight})),
        "before down pruned": record_bytes(to_record({"w": pruned})),
    }
    for dtype in PAYLOAD_DTYPES:
        out[f"{dtype} up"] = record_bytes(
            to_record(encode_sparse({"w": pruned}, {"w": mask}, dtype))
        )
        out[f"{dtype} down dense"] = record_bytes(
            to_record(encode_sparse({"w": weight}, dtype=dtype))
        )
        out[f"{dtype} down pruned"] = record_bytes(
            to_record(encode_sparse({"w": pruned}, dtype=dtype))
        )
    return out


def model_bytes(shapes: list[tuple[int, ...]], sparsity: float, seed: int = 0) -> dict[str, Any]:
    """Bytes per client per round (every layer sampled) before and after, and the after / before
    ratios."""
    rng = np.random.default_rng(seed)
    totals: Counter[str] = Counter()
    for shape, count in Counter(shapes).items():
        for key, value in matrix_bytes(shape, sparsity, rng).items():
            totals[key] += value * count
    weights = sum(int(np.prod(s)) for s in shapes)
    rows: dict[str, Any] = {"prunable weights": weights, "sparsity": sparsity}
    before_up, before_down = totals["before up"], totals["before down dense"]
    rows["before"] = {
        "up MB": before_up / 1e6,
        "down round 1 MB": before_down / 1e6,
        "down later MB": totals["before down pruned"] / 1e6,
    }
    for dtype in PAYLOAD_DTYPES:
        rows[dtype] = {
            "up MB": totals[f"{dtype} up"] / 1e6,
            "up ratio": totals[f"{dtype} up"] / before_up,
            "down round 1 MB": totals[f"{dtype} down dense"] / 1e6,
            "down round 1 ratio": totals[f"{dtype} down dense"] / before_down,
            "down later MB": totals[f"{dtype} down pruned"] / 1e6,
            "down later ratio": totals[f"{dtype} down pruned"] / totals["before down pruned"],
        }
    return rows


def other_masks(config: Any) -> dict[str, Any]:
    """Bool bytes of the structural masks other methods send (not re-encoded: see
    docs/methods/fedspallm.md)."""
    layers, hidden, inter = config.num_hidden_layers, config.hidden_size, config.intermediate_size
    sftp = (
        4 * layers * hidden
    )  # SFT-P: attn-in/out, ffn-in/out bus masks per layer, once (final round)
    return {
        "sftp final masks (bool) KB": sftp / 1e3,
        "sftp final masks packed KB": math.ceil(sftp / 8) / 1e3,
        "fedflap masks (bool, down) KB": sftp / 1e3,
        "llmpruner keep masks (bool, down) KB": layers * (config.num_attention_heads + inter) / 1e3,
    }


# --- perplexity of 16-bit payloads ----------------------------------------------------------------


class InProcessGrid:
    """Nodes that are ClientApp calls in this process (as tests/local_grid.py), for one round."""

    def __init__(self, cfg: Any, partitions: int) -> None:
        from flwr.app import Context, RecordDict

        self.contexts = {
            p + 1: Context(
                run_id=1,
                node_id=p + 1,
                state=RecordDict(),
                run_config=cfg.to_dict(),
                node_config={"partition-id": p, "num-partitions": partitions},
            )
            for p in range(partitions)
        }

    def get_node_ids(self) -> list[int]:
        return sorted(self.contexts)

    def send_and_receive(self, messages: Any, timeout: float | None = None) -> list[Any]:
        from fedprune_app.client_app import app

        return [app(m, self.contexts[m.metadata.dst_node_id]) for m in messages]


def one_round(cfg: Any, partitions: int) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """FedSpaLLM round 1 on `partitions` in-process clients: the global weights and the measured
    bytes."""
    from flwr.app import ConfigRecord

    from strategies.fedspallm import FedSpaLLMStrategy

    strategy = FedSpaLLMStrategy(cfg)
    handle = strategy.initial_arrays()
    grid = InProcessGrid(cfg, partitions)
    strategy.identify(grid)
    sent = list(strategy.configure_train(1, handle, ConfigRecord(), grid))
    start = time.perf_counter()
    replies = grid.send_and_receive(sent)
    seconds = time.perf_counter() - start
    assert not any(r.has_error() for r in replies), [
        r.error.reason for r in replies if r.has_error()
    ]
    assert strategy.aggregate_train(1, replies)[0] is not None
    sizes = {
        "down MB per client": float(np.mean([record_bytes(m.content) for m in sent])) / 1e6,
        "up MB per client": float(np.mean([record_bytes(r.content) for r in replies])) / 1e6,
        "client seconds": seconds / partitions,
    }
    return {k: v.copy() for k, v in strategy.global_state.items()}, sizes


def window_nll(model: Any, windows: torch.Tensor, batch: int = 8) -> tuple[np.ndarray, int]:
    """Summed NLL of every window's tokens after its first (each window scored on its own), and
    tokens per window."""
    sums = []
    with torch.no_grad():
        for chunk in windows.split(batch):
            logits = model(input_ids=chunk).logits[:, :-1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(2, chunk[:, 1:, None])[..., 0]
            sums.append(-logp.sum(dim=1).double())
    return torch.cat(sums).numpy(), windows.shape[1] - 1


def paired_bootstrap(
    base: np.ndarray, other: np.ndarray, tokens: int, draws: int = 4000, seed: int = 0
) -> dict[str, float]:
    """PPL(other) − PPL(base) over the windows, and its percentile 95% interval resampling windows
    (paired)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(base), size=(draws, len(base)))
    n = len(base) * tokens
    ppl_a, ppl_b = math.exp(base.sum() / n), math.exp(other.sum() / n)
    diffs = np.exp(other[idx].sum(1) / n) - np.exp(base[idx].sum(1) / n)
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return {
        "ppl fp32": ppl_a,
        "ppl": ppl_b,
        "difference": ppl_b - ppl_a,
        "ci95 low": float(lo),
        "ci95 high": float(hi),
        "relative difference": (ppl_b - ppl_a) / ppl_a,
    }


def perplexity_study(args: argparse.Namespace) -> dict[str, Any]:
    from fedprune_app.core.config import RunConfig
    from fedprune_app.llm.evaluation import held_out_text
    from fedprune_app.llm.layers import model_with_weights

    settings = {
        "method": "fedspallm",
        "client-data": ",".join(SOURCES[: args.clients]),
        "partitioner": "by-source",
        "server-eval-data": "",
        "fedspallm-references": "",
        "fedspallm-resources": "1.0",
        "calib-segments": args.calib_segments,
        "calib-seq-len": args.calib_seq_len,
        "sparsity": args.sparsity,
        "test-examples": args.test_examples,
        "num-server-rounds": 1,
        "seed": 0,
    }
    states, sizes = {}, {}
    for dtype in args.dtypes.split(","):
        cfg = RunConfig.from_flower({**settings, "payload-dtype": dtype})
        print(f"[bench_payloads] one round, payload-dtype {dtype} ...", file=sys.stderr, flush=True)
        states[dtype], sizes[dtype] = one_round(cfg, args.clients)
    cfg = RunConfig.from_flower({**settings, "payload-dtype": "float32"})
    model, tokenizer = model_with_weights(cfg, states["float32"])
    ids = torch.cat(
        [
            tokenizer(held_out_text(s, cfg), return_tensors="pt")["input_ids"][0][
                : args.eval_tokens
            ]
            for s in SOURCES
        ]
    )
    usable = len(ids) - len(ids) % args.window
    windows = ids[:usable].reshape(-1, args.window)
    nll = {}
    for dtype, state in states.items():
        print(
            f"[bench_payloads] scoring {len(windows)} windows, payload-dtype {dtype} ...",
            file=sys.stderr,
            flush=True,
        )
        model, _ = model_with_weights(cfg, state)
        nll[dtype], tokens = window_nll(model.eval(), windows)
    same_masks = {
        d: all(np.array_equal(states[d][k] != 0, v != 0) for k, v in states["float32"].items())
        for d in states
    }
    return {
        "settings": settings,
        "eval": {
            "sources": list(SOURCES),
            "tokens per source": args.eval_tokens,
            "window": args.window,
            "windows": len(windows),
            "scored tokens": int(len(windows) * tokens),
        },
        "measured bytes": sizes,
        "same global mask as fp32": same_masks,
        "perplexity": {
            d: paired_bootstrap(nll["float32"], nll[d], tokens) for d in states if d != "float32"
        }
        | {"float32": math.exp(nll["float32"].sum() / (len(windows) * tokens))},
    }


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sparsity", type=float, default=0.5)
    parser.add_argument(
        "--ppl", action="store_true", help="also run the 16-bit perplexity study (minutes)"
    )
    parser.add_argument("--dtypes", default="float32,float16,bfloat16")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--calib-segments", type=int, default=8)
    parser.add_argument("--calib-seq-len", type=int, default=256)
    parser.add_argument("--test-examples", type=int, default=200)
    parser.add_argument(
        "--eval-tokens", type=int, default=8192, help="held-out tokens per domain (4 domains)"
    )
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--out", type=Path, default=None, help="write the JSON record here too")
    args = parser.parse_args()
    from transformers import AutoConfig, LlamaConfig

    from fedprune_app.core.runtime import quiet_libraries
    from fedprune_app.llm.assets import embedded_model_dir

    quiet_libraries()
    torch.manual_seed(0)
    smol = AutoConfig.from_pretrained(embedded_model_dir())
    llama = LlamaConfig(**LLAMA_7B)
    record: dict[str, Any] = {
        "command": "python -m experiments.benchmarks.payloads " + " ".join(sys.argv[1:]),
        "bytes": "tensor bytes per client per round with every decoder layer sampled (r_i = 1;"
        " scale by r_i), MB = 1e6 bytes",
    }
    for name, config in (("SmolLM2-135M", smol), ("LLaMA-7B", llama)):
        record[name] = model_bytes(linear_shapes(config), args.sparsity) | {
            "other methods' masks": other_masks(config)
        }
    if args.ppl:
        from flwr.supercore.task_identity import TaskIdentity

        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = (
            1,
            1,
            0,
        )  # Messages outside a Flower run
        start = time.perf_counter()
        record["16-bit perplexity"] = perplexity_study(args)
        record["16-bit perplexity"]["seconds"] = round(time.perf_counter() - start, 1)
    text = json.dumps(_rounded(record), indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
