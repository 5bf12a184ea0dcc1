"""LLaMA-7B scale by simulation: each method's client step and server aggregation on 7B-shaped
decoder layers, measured one layer at a time on a small CPU machine, extrapolated to 32 layers and
4 / 16 / 100 clients.

The model is a LlamaForCausalLM with LLaMA-7B's layer shapes (hidden 4096, MLP 11008, 32 heads),
`--layers` decoder layers (1 by default), a small vocabulary (`--vocab`) and random weights (fp32),
so one layer's full working set fits a 24 GiB machine. Calibration / training input: one sequence of
`--seq-len` random token ids.
- fedspallm: SparseGPT on every linear of the layers (the client's sequential loop,
  `prune_sequentially`); the reply encoded as the client encodes it (`core.encoding.encode_sparse`,
  fp32 and bf16); the server folds `--clients` replies (the real one and random-mask copies) into
  `L0Sum` (decode + add_kept) and expands the masks (Eq. 5–7), as
  `FedSpaLLMStrategy.accept_reply` / `aggregate` do.
- sftp: mask generator h_Θ(e_k) → ReinMax gates → routed forward/backward (`masked`) with LoRA, Eq.
  13's objective, one AdamW step; server: FedAvg of `--clients` generator + LoRA states.
- fedit / fedtpa / flexlora: one LoRA step (`add_lora`, the run-config defaults: rank 16 on q_proj,
  v_proj); server: FedAvg (fedit), LCWA (fedtpa, Eq. 8), Σ p_i·ΔW_i + SVD back to rank 16 per
  adapted matrix (flexlora).
Bytes: `record_bytes` of what travels (tensor bytes, headers not counted), per client per round.
Memory: peak process RSS above the RSS just before the step (psutil, sampled every 5 ms), i.e. what
the step adds on top of the model (client) or of the replies already received (server). Seconds:
wall time of the step on this machine.

    .venv/bin/fedprune bench llama7b [--layers 1] [--seq-len 64] [--clients 4] \\
        [--out docs/bench/scale-7b.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psutil
import torch

from fedprune_app.core.config import RunConfig
from fedprune_app.core.encoding import decode_sparse, encode_sparse
from fedprune_app.core.protocol import record_bytes, to_record
from fedprune_app.core.replies import weighted_average
from fedprune_app.methods.fedspallm.aggregation import L0Sum, expand_masks
from fedprune_app.methods.fedspallm.masks import target_count
from fedprune_app.methods.fedspallm.pruners import make_pruner, prune_sequentially

LLAMA_7B = {
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "num_hidden_layers": 32,
    "vocab_size": 32000,
}
MB = 1e6


def measure(step: Callable[[], Any]) -> tuple[Any, float, float]:
    """(what `step` returns, seconds, peak RSS MB above the RSS before it), RSS sampled every 5
    ms."""
    proc = psutil.Process()
    base = peak = proc.memory_info().rss
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, proc.memory_info().rss)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    try:
        out = step()
    finally:
        seconds = time.perf_counter() - start
        done.set()
        sampler.join()
    return out, seconds, (max(peak, proc.memory_info().rss) - base) / MB


def layer_model(hidden: int, inter: int, heads: int, layers: int, vocab: int, seed: int = 0) -> Any:
    """A random fp32 LlamaForCausalLM of the given shapes (eval mode)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=inter,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        num_hidden_layers=layers,
        vocab_size=vocab,
        max_position_embeddings=4096,
    )
    return LlamaForCausalLM(config).eval()


def bench_cfg(method: str) -> RunConfig:
    return RunConfig.from_flower({"method": method})


# --- fedspallm ------------------------------------------------------------------------------------


def fedspallm(model: Any, ids: torch.Tensor, clients: int, sparsity: float = 0.5) -> dict[str, Any]:
    """Client: SparseGPT on every layer; server: `clients` encoded replies folded into L0Sum + mask
    expansion."""
    params = dict(model.named_parameters())
    dense = None

    def client() -> dict[str, np.ndarray]:
        masks = prune_sequentially(
            model, [ids], range(model.config.num_hidden_layers), make_pruner("sparsegpt", sparsity)
        )
        return {
            name: (params[name].detach().numpy().copy(), m.numpy()) for name, m in masks.items()
        }

    dense = {
        n: params[n].detach().numpy().copy()
        for n in params
        if n.startswith("model.layers.") and n.endswith("_proj.weight")
    }
    pruned, client_s, client_mb = measure(client)
    shapes = {k: w.shape for k, (w, _) in pruned.items()}
    up = {
        d: record_bytes(
            to_record(
                encode_sparse(
                    {k: w for k, (w, _) in pruned.items()},
                    {k: m for k, (_, m) in pruned.items()},
                    d,
                )
            )
        )
        for d in ("float32", "bfloat16")
    }
    down = {
        d: record_bytes(to_record(encode_sparse(dense, dtype=d))) for d in ("float32", "bfloat16")
    }
    before_up = sum(w.nbytes + m.nbytes for w, m in pruned.values())
    rng = np.random.default_rng(0)
    replies = [
        encode_sparse(
            {k: w for k, (w, _) in pruned.items()}, {k: m for k, (_, m) in pruned.items()}
        )
    ]
    for _ in range(
        clients - 1
    ):  # the other clients: the dense weights under an independent random mask
        masks = {}
        for k, w in dense.items():
            keep = np.ones(w.size, dtype=bool)
            keep[rng.permutation(w.size)[: target_count(sparsity, w.size)]] = False
            masks[k] = keep.reshape(w.shape)
        replies.append(encode_sparse(dense, masks))

    def server() -> int:
        sums = {k: L0Sum(s) for k, s in shapes.items()}
        for reply in replies:  # accept_reply: decode + add, one reply at a time
            for k, (values, mask) in decode_sparse(reply, shapes).items():
                sums[k].add_kept(values, mask)
        for acc in sums.values():  # aggregate: Eq. 5-7
            merged, count = acc.merged(np.float32)
            expand_masks(merged, count, acc.clients, sparsity)
        return len(sums)

    _, server_s, server_mb = measure(server)
    return {
        "client seconds": client_s,
        "client peak MB": client_mb,
        "server seconds": server_s,
        "server peak MB": server_mb,
        "up bytes": up,
        "down bytes round 1": down,
        "up bytes, dense fp32 + bool masks": before_up,
        "weights": int(sum(w.size for w in dense.values())),
    }


# --- LoRA methods and SFT-P -----------------------------------------------------------------------


def lora_step(
    model: Any, ids: torch.Tensor, method: str
) -> tuple[Any, dict[str, np.ndarray], float, float]:
    """One AdamW step of LoRA (and for sftp the generator + e_k through the routed forward): (peft
    model, the reply's state, seconds, peak MB)."""
    from fedprune_app.llm.models import add_lora, get_adapter_state

    cfg = bench_cfg(method)
    peft_model = add_lora(model, cfg, seed=0)
    generator = embedding = None
    if method == "sftp":
        from fedprune_app.methods.sftp.generator import (
            generator_for,
            get_generator_state,
            layer_masks,
            reinmax_binary,
        )
        from fedprune_app.methods.sftp.objective import sftp_objective
        from fedprune_app.structural.routing import (
            install_routing,
            kept_parameters,
            masked,
            prunable_parameters,
        )

        install_routing(peft_model)
        generator = generator_for(cfg, model.config, seed=0)
        embedding = torch.nn.Parameter(torch.randn(generator.embed_dim) * 0.1)

    def step() -> dict[str, np.ndarray]:
        trainable = [p for p in peft_model.parameters() if p.requires_grad]
        extra = [] if generator is None else [*generator.parameters(), embedding]
        opt = torch.optim.AdamW(trainable + extra, lr=1e-4)
        peft_model.train()
        if generator is not None:
            gates = reinmax_binary(generator(embedding), 1.0, 3.0, torch.Generator().manual_seed(0))
            masks = layer_masks(gates)
            with masked(peft_model, masks):
                clm = peft_model(input_ids=ids, labels=ids).loss
            loss, _ = sftp_objective(
                clm,
                kept_parameters(model.config, masks),
                0.5,
                prunable_parameters(model.config),
                16.0,
            )
        else:
            loss = peft_model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        peft_model.eval()
        state = {k: v.numpy() for k, v in get_adapter_state(peft_model).items()}
        if generator is not None:
            state |= {k: v.numpy() for k, v in get_generator_state(generator).items()}
        return state

    state, seconds, peak = measure(step)
    return peft_model, state, seconds, peak


def lora_server(method: str, states: list[dict[str, np.ndarray]]) -> Any:
    """The server's aggregation of `states` for `method`."""
    from fedprune_app.llm.lora import LORA_A, adapter_layers

    weights = [1.0] * len(states)
    if method in ("fedit", "sftp"):
        return weighted_average(states, weights)
    layers = adapter_layers(states[0])
    if method == "fedtpa":
        from fedprune_app.methods.fedtpa.aggregation import lcwa

        scores = np.random.default_rng(0).random((len(states), len(layers)))
        return lcwa(states, scores, layers, weights)
    from fedprune_app.methods.flexlora.svd import average_deltas, svd_factors

    rank, alpha = states[0][layers[0] + LORA_A].shape[0], float(bench_cfg("flexlora").lora_alpha)
    deltas = average_deltas(states, [rank] * len(states), weights, layers, alpha)
    return {layer: svd_factors(delta, rank, alpha) for layer, delta in deltas.items()}


def lora_method(model: Any, ids: torch.Tensor, method: str, clients: int) -> dict[str, Any]:
    _, state, client_s, client_mb = lora_step(model, ids, method)
    rng = np.random.default_rng(1)
    states = [state] + [
        {k: (v + rng.normal(scale=1e-3, size=v.shape)).astype(v.dtype) for k, v in state.items()}
        for _ in range(clients - 1)
    ]
    _, server_s, server_mb = measure(lambda: lora_server(method, states))
    nbytes = record_bytes(to_record(state))
    out = {
        "client seconds": client_s,
        "client peak MB": client_mb,
        "server seconds": server_s,
        "server peak MB": server_mb,
        "up bytes": nbytes,
        "down bytes": nbytes,
    }
    if method == "sftp":
        final_masks = (
            4 * model.config.num_hidden_layers * model.config.hidden_size
        )  # bool, the last round only
        out["final-round masks bytes"] = final_masks
        # h_Θ's size does not grow with the layers (but for a 16-float layer embedding each): not
        # extrapolated
        out["generator bytes"] = record_bytes(
            to_record({k: v for k, v in state.items() if k.startswith("mask-gen")})
        )
    return out


def run(
    hidden: int,
    inter: int,
    heads: int,
    layers: int,
    vocab: int,
    seq_len: int,
    clients: int,
    methods: tuple[str, ...] = ("fedspallm", "fedit", "fedtpa", "flexlora", "sftp"),
) -> dict[str, Any]:
    """Every method on one model of the given shapes; figures per measured model (of `layers`
    layers)."""
    torch.manual_seed(0)
    ids = torch.randint(0, vocab, (1, seq_len))
    out: dict[str, Any] = {}
    for method in methods:
        print(f"[bench_7b] {method} ...", file=sys.stderr, flush=True)
        model = layer_model(
            hidden, inter, heads, layers, vocab
        )  # fresh: pruning and LoRA change it
        out[method] = (
            fedspallm(model, ids, clients)
            if method == "fedspallm"
            else lora_method(model, ids, method, clients)
        )
        del model
    return out


def extrapolate(measured: dict[str, Any], layers: int, clients: int) -> dict[str, Any]:
    """Per method: bytes per client per round, client seconds and server seconds for 32 layers, and
    the server seconds / traffic for 4, 16, 100 clients (linear in layers; the server's per-reply
    work linear in clients, FlexLoRA's SVD once per round)."""
    scale = LLAMA_7B["num_hidden_layers"] / layers
    weights_7b = 6_738_415_616  # LLaMA-7B parameters (fp32 model: 4 bytes each)
    out: dict[str, Any] = {}
    for method, m in measured.items():
        fixed = m.get("generator bytes", 0)
        up = (
            m["up bytes"]["float32"] if method == "fedspallm" else m["up bytes"] - fixed
        ) * scale + fixed
        # SparseGPT works one layer at a time; a LoRA step keeps every layer's activations for the
        # backward pass
        working = m["client peak MB"] * MB * (1 if method == "fedspallm" else scale)
        row: dict[str, Any] = {
            "up MB per client per round": up / MB,
            "client seconds (fedspallm: a round; others: one step)": m["client seconds"] * scale,
            "client peak GB (fp32 7B weights + working set)": (weights_7b * 4 + working) / 1e9,
        }
        if method == "fedspallm":
            row["up MB per client per round (bf16)"] = m["up bytes"]["bfloat16"] * scale / MB
            row["down MB round 1"] = m["down bytes round 1"]["float32"] * scale / MB
            dense_up = m["up bytes, dense fp32 + bool masks"]
            row["up MB, dense fp32 + bool masks"] = dense_up * scale / MB
            row["server L0 sums GB (10 B per sampled weight)"] = 10 * m["weights"] * scale / 1e9
        per_client = m["server seconds"] / clients  # measured with `clients` replies
        for n in (4, 16, 100):
            # FlexLoRA's server time is its one SVD per module and round (at r_max; every client's
            # factors are truncations of it): the same for any number of clients. The others' work
            # is per reply.
            server = m["server seconds"] if method == "flexlora" else per_client * n
            row[f"server seconds, {n} clients"] = server * scale
            row[f"server traffic up GB, {n} clients"] = up * n / 1e9
        out[method] = row
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--layers",
        type=int,
        default=1,
        help="7B-shaped decoder layers built (default: %(default)s)",
    )
    parser.add_argument(
        "--seq-len",
        type=int,
        default=64,
        help="tokens of the input sequence (default: %(default)s)",
    )
    parser.add_argument(
        "--clients",
        type=int,
        default=4,
        help="clients whose replies are aggregated (default: %(default)s)",
    )
    parser.add_argument(
        "--vocab",
        type=int,
        default=256,
        help="vocabulary of the random model (default: %(default)s)",
    )
    parser.add_argument(
        "--methods",
        default="fedspallm,fedit,fedtpa,flexlora,sftp",
        help="comma-separated methods to measure (default: %(default)s)",
    )
    parser.add_argument("--out", default=None, help="write the record here (docs/bench/*.json)")
    parser.add_argument(
        "--from",
        dest="source",
        default=None,
        help="re-extrapolate the measured figures of this earlier record (no measuring)",
    )
    args = parser.parse_args(argv)
    from fedprune_app.core.runtime import quiet_libraries

    quiet_libraries()
    if args.source:
        with open(args.source) as f:
            record = json.load(f)
        got = record["measured"]
        record["extrapolated to LLaMA-7B (32 layers)"] = extrapolate(
            got["methods"], got["layers"], got["clients"]
        )
        record["re-extrapolated by"] = "fedprune bench llama7b " + " ".join(sys.argv[1:])
        text = json.dumps(record, indent=2, default=float)
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text + "\n")
        return
    start = time.perf_counter()
    measured = run(
        LLAMA_7B["hidden_size"],
        LLAMA_7B["intermediate_size"],
        LLAMA_7B["num_attention_heads"],
        args.layers,
        args.vocab,
        args.seq_len,
        args.clients,
        tuple(args.methods.split(",")),
    )
    record = {
        "command": "fedprune bench llama7b " + " ".join(sys.argv[1:]),
        "machine": f"{psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB "
        f"RAM, load {psutil.getloadavg()[0]:.1f} at the end",
        "measured": {
            "layers": args.layers,
            "seq-len": args.seq_len,
            "clients": args.clients,
            "memory": "peak process RSS above the RSS before the step (psutil, 5 ms sampling)",
            "methods": measured,
        },
        "extrapolated to LLaMA-7B (32 layers)": extrapolate(measured, args.layers, args.clients),
        "seconds": time.perf_counter() - start,
    }
    text = json.dumps(record, indent=2, default=float)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
