"""SFT-P compiled model (Appx. A.1) vs the dense model: size and CPU speed on SmolLM2 (embedded).

Random masks with exactly round(keep·d) active coordinates per mask (all four masks of every layer),
compiled with `fedprune_app.structural.routing.compile_model`. Measured in one process, with the
models timed round-robin so a change in machine load hits all of them alike:
  prefill   — one forward over a `--prefill`-token prompt, batch 1, with the KV cache and the
              last token's logits only (what `generate` does); `full-logits` — the same forward
              with logits for every token;
  generate  — greedy decoding of `--new-tokens` tokens with the KV cache after a 32-token prompt
  (tokens/s); medians of `--repeats` runs after one warm-up; parameters (whole model, prunable
  projections) and weight MB.
Each speed-up is the median of the paired per-repeat ratios dense time / model time, with its
distribution-free 95% interval (`speed.median_interval`; the default 15 repeats give the 4th to 12th
of the sorted ratios), and so is measured / ceiling: a goal such as ≥ 0.95 of the ceiling is met
only when the whole interval clears it. Beside each speed-up: its ceiling,
FLOPs(dense) / FLOPs(compiled) for the same workload (every matmul: the pruned projections,
attention scores and values, the unpruned LM head; `speed.workload_flops`), and measured / ceiling,
the share of the ceiling reached. The record goes to `--json` (the command included);
`fedprune bench render docs/bench/compiled-speed.json --kind compiled-speed` prints its markdown
table. `keep 1` (all-ones masks: the dense model in compiled form, ceiling 1.00) separates what the
compiled layer's implementation gains at no pruning from what pruning gains. `--before-after` adds,
per keep, the same compiled model in the earlier compiled layout ("before": every projection weight
(out, in) row-major as nn.Linear keeps it, gate/up one product at every length), timed against the
current one (input-major fused q/k/v and gate/up weights, `routing._input_major`; gate and up as two
products from `SPLIT_GATE_UP_ROWS` tokens) in the same run. A check line compares the compiled
model's logits with the masked (training-form) model on a short input. On a loaded machine
wall-clock times with 2 threads mostly measure waiting for a core (each parallel region waits for
its slowest thread); `--threads 1 --clock thread` times the CPU time of the one thread instead,
which stays close to the idle figures.

    .venv/bin/python benchmarks/compiled.py            # --keeps 1,0.8,0.5 --prefill 512 --threads 2
    .venv/bin/python benchmarks/compiled.py --threads 1 --clock thread   # loaded machine
    .venv/bin/python benchmarks/compiled.py --json ''   # no JSON record
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import shlex
import sys
import time
import types
from pathlib import Path

import torch
from torch import nn

for _k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_k, "1")

from fedprune_app.llm.models import load_base_model  # noqa: E402
from fedprune_app.structural.routing import (  # noqa: E402
    MASK_NAMES,
    CompiledMLP,
    LayerMasks,
    compile_model,
    install_routing,
    kept_parameters,
    masked,
    prunable_parameters,
)
from fedprune_app.structural.speed import (  # noqa: E402
    CLOCKS,
    flop_ceiling,
    lane_widths,
    speed_table,
)

TASKS = (("prefill", "prefill"), ("full-logits", "all logits"), ("generate", "generate"))


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


def _fused_gate_up_forward(self: CompiledMLP, x: torch.Tensor, owned: bool) -> torch.Tensor:
    """CompiledMLP.forward in the earlier layout: one fused gate/up product at every length."""
    gate, up = self.gate_up_proj(self.lane_input(x)).chunk(2, dim=-1)
    return self.write_back(x, self.act_fn(gate).mul_(up), self.down_proj, owned)


def before_fix(model: nn.Module) -> nn.Module:
    """A copy of a compiled model in the earlier compiled layout: every projection weight (out, in)
    row-major (no `routing._input_major`) and gate/up as one product also for prefill. Same
    values."""
    model = copy.deepcopy(model)
    for module in model.modules():
        if isinstance(module, nn.Linear) and module is not model.get_output_embeddings():
            module.weight = nn.Parameter(module.weight.detach().contiguous(), requires_grad=False)
        if isinstance(module, CompiledMLP):
            module.forward = types.MethodType(_fused_gate_up_forward, module)
    return model


BREAKDOWN = ("projections", "attention", "gather/scatter", "LM head", "other")


def _category(op: str, shapes: list[list[int]], vocab: int) -> str:
    """Where one profiled aten op of a prefill belongs (`BREAKDOWN`)."""
    if op in ("aten::mm", "aten::addmm"):
        return "LM head" if shapes and shapes[-1] and shapes[-1][-1] == vocab else "projections"
    if "scaled_dot_product" in op or op in ("aten::bmm", "aten::baddbmm", "aten::_softmax"):
        return "attention"
    if op in ("aten::index_select", "aten::index_add_", "aten::index_add", "aten::scatter_add_"):
        return "gather/scatter"
    return "other"


def time_breakdown(
    models: dict[str, nn.Module], prompt: torch.Tensor, repeats: int
) -> dict[str, dict[str, float]]:
    """Per model, where one prefill's time goes: the ops' self time (ms, torch profiler, mean of
    `repeats` profiled runs after an unprofiled one, the models interleaved) in the `BREAKDOWN`
    categories, and `projections GF/s`, the pruned projections' matmul FLOPs (2·m·k·n of each
    product, from the recorded shapes) per second of their time: how fast the narrower products run
    against the dense ones. The profiler adds a little time per op."""
    from torch.profiler import ProfilerActivity, profile

    vocab = int(next(iter(models.values())).config.vocab_size)
    out = {name: dict.fromkeys([*BREAKDOWN, "projections GFLOP"], 0.0) for name in models}
    with torch.inference_mode():
        for _ in range(repeats):
            for name, model in models.items():
                model(prompt, use_cache=True, logits_to_keep=1)
                with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                    model(prompt, use_cache=True, logits_to_keep=1)
                for event in prof.key_averages(group_by_input_shape=True):
                    shapes = [list(s) for s in event.input_shapes if s]
                    category = _category(event.key, shapes, vocab)
                    out[name][category] += event.self_cpu_time_total / 1e3 / repeats
                    if category == "projections":
                        (m, k), (_, n) = shapes[-2], shapes[-1]
                        out[name]["projections GFLOP"] += (
                            2 * m * k * n * event.count / 1e9 / repeats
                        )
    for row in out.values():
        row["total"] = sum(row[c] for c in BREAKDOWN)
        row["projections GF/s"] = row.pop("projections GFLOP") / (row["projections"] / 1e3)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default="embedded", help="model name or path (default: %(default)s)"
    )
    parser.add_argument(
        "--keeps", default="1,0.8,0.5", help="keep ratios per mask, comma-separated"
    )
    parser.add_argument(
        "--prefill", type=int, default=512, help="prompt tokens of a prefill (default: %(default)s)"
    )
    parser.add_argument(
        "--new-tokens",
        type=int,
        default=32,
        help="greedy tokens generated after a 32-token prompt (default: %(default)s)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=15,
        help="round-robin repeats; from 6 on each speed-up has a 95%% interval (15: x_(4)..x_(12))",
    )
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads (default: %(default)s)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the random masks (default: %(default)s)"
    )
    parser.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default="wall",
        help="wall: elapsed time; thread: CPU time of the calling thread (needs --threads 1)",
    )
    parser.add_argument(
        "--before-after",
        action="store_true",
        help="also time each compiled model with its weights (out, in) row-major (the old layout)",
    )
    parser.add_argument(
        "--breakdown",
        type=int,
        default=0,
        metavar="N",
        help="also profile N prefills per model: where the time goes (`time_breakdown`)",
    )
    parser.add_argument(
        "--note", default="", help="free text stored in the record (e.g. what else ran)"
    )
    parser.add_argument(
        "--json",
        default="docs/bench/compiled-speed.json",
        help="write the record (command, machine, table) here; '' = do not",
    )
    args = parser.parse_args(argv)
    if args.clock == "thread" and args.threads != 1:
        parser.error("--clock thread counts one thread's CPU time: use it with --threads 1")
    torch.set_num_threads(args.threads)
    command = shlex.join(["python", "-m", "benchmarks.compiled", *sys.argv[1:]])
    load_start, start = os.getloadavg(), time.perf_counter()
    print(
        f"command: {command}   torch threads {args.threads}   clock {args.clock}   load average "
        f"{load_start}"
    )

    dense = load_base_model(args.model)
    config, d = dense.config, int(dense.config.hidden_size)
    gen = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(0, int(config.vocab_size), (1, args.prefill), generator=gen)
    short = prompt[:, :32]
    models: dict[str, nn.Module] = {"dense": dense}
    masks_of: dict[str, list[LayerMasks]] = {}
    for keep in (float(k) for k in args.keeps.split(",")):
        name = f"keep {keep:g}"
        masks_of[name] = random_masks(int(config.num_hidden_layers), d, keep, args.seed)
        models[name] = compile_model(dense, masks_of[name])
        if args.before_after:
            masks_of[f"{name} before"] = masks_of[name]
            models[f"{name} before"] = before_fix(models[name])

    install_routing(dense)  # the check: masked form vs compiled form on the short prompt
    for name, masks in masks_of.items():
        if name.endswith(" before"):
            continue
        with torch.no_grad(), masked(dense, masks):
            routed = dense(short).logits
        with torch.no_grad():
            diff = (models[name](short).logits - routed).abs().max().item()
        print(
            f"check {name}: max |compiled - masked| logits = {diff:.2e} (|logits| max "
            f"{routed.abs().max():.1f})"
        )

    table = speed_table(
        models,
        int(config.vocab_size),
        config.eos_token_id,
        prefill=args.prefill,
        new_tokens=args.new_tokens,
        repeats=args.repeats,
        full_logits=True,
        seed=args.seed,
        clock=args.clock,
    )
    breakdown = (
        time_breakdown(
            {n: m for n, m in models.items() if not n.endswith(" before")}, prompt, args.breakdown
        )
        if args.breakdown
        else {}
    )
    prunable = prunable_parameters(config)
    print(f"\n{'model':<15} {'params':>11} {'ratio':>6} {'prunable':>11} {'ratio':>6} {'MB':>7}")
    for name, row in table.items():
        kept = prunable if name == "dense" else int(kept_parameters(config, masks_of[name]))
        row["prunable"], row["prunable-ratio"] = float(kept), kept / prunable
        row["params-ratio"] = row["params"] / table["dense"]["params"]
        for (
            task,
            _,
        ) in (
            TASKS
        ):  # for reference: the ceiling if attention skipped the masked pairs (GPU kernels)
            row[f"{task}-ceiling-causal"] = flop_ceiling(
                config,
                lane_widths(models[name]),
                task,
                attention="causal",
                prefill=args.prefill,
                new_tokens=args.new_tokens,
                prompt=short.shape[1],
            )
        print(
            f"{name:<15} {int(row['params']):>11,} {row['params-ratio']:>6.3f} {kept:>11,} "
            f"{kept / prunable:>6.3f} {row['MB']:>7.1f}"
        )
    print(
        f"\n{'model':<15} {'task':<11} {'ms':>8} {'speed-up':>9} {'ceiling':>8} "
        f"{'measured/ceiling':>17} {'95% interval':>15}"
    )
    for name, row in table.items():
        for task, label in TASKS:
            ms = (
                row[f"{task}-ms"]
                if task != "generate"
                else 1000 * args.new_tokens / row["generate-tok-s"]
            )
            interval = (
                f"[{row[f'{task}-of-ceiling-lo']:.3f}, {row[f'{task}-of-ceiling-hi']:.3f}]"
                if f"{task}-of-ceiling-lo" in row
                else "(< 6 repeats)"
            )
            print(
                f"{name:<15} {label:<11} {ms:>8.0f} {row[f'{task}-speedup']:>8.2f}x "
                f"{row[f'{task}-ceiling']:>7.2f}x {row[f'{task}-of-ceiling']:>17.3f} {interval:>15}"
            )
    if breakdown:
        print(f"\nwhere one prefill's time goes (ms, torch profiler, mean of {args.breakdown}):")
        print(
            f"{'model':<15} "
            + " ".join(f"{c:>14}" for c in (*BREAKDOWN, "total", "projections GF/s"))
        )
        for name, row in breakdown.items():
            print(
                f"{name:<15} "
                + " ".join(f"{row[c]:>14.1f}" for c in (*BREAKDOWN, "total", "projections GF/s"))
            )
    load_end = os.getloadavg()
    tok_s = ", ".join(f"{n} {r['generate-tok-s']:.1f}" for n, r in table.items())
    print(
        f"\nprefill = {args.prefill} tokens, batch 1; generate = {args.new_tokens} new tokens "
        f"after 32 ({tok_s} tok/s); medians of {args.repeats} after a warm-up; load average at the "
        f"end {load_end}"
    )
    if args.json:
        record = {
            "kind": "compiled-speed",
            "command": command,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "note": args.note,
            "threads": args.threads,
            "clock": args.clock,
            "prefill": args.prefill,
            "new-tokens": args.new_tokens,
            "prompt-for-generate": min(32, args.prefill),
            "repeats": args.repeats,
            "seed": args.seed,
            "masks": "random, exactly round(keep * d) kept coordinates per mask",
            "model": args.model,
            "speed-up": "median over the repeats of the paired ratio dense time / model time; "
            "'*-lo', '*-hi': its distribution-free 95% interval (order statistics, "
            "speed.median_interval)",
            "before": "'<keep> before': the same compiled model in the earlier compiled layout "
            "(weights (out, in) row-major, one fused gate/up product at every length)",
            "load-average": {"start": load_start, "end": load_end},
            "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "ceiling": "FLOPs(dense) / FLOPs(compiled) of the same workload, every matmul counted "
            "(fedprune_app.structural.speed.workload_flops; attention 'full': every query against "
            "every key, as the CPU kernels run it; '*-ceiling-causal': only the pairs the causal "
            "mask keeps)",
            "seconds": round(time.perf_counter() - start, 1),
            "models": table,
        }
        if breakdown:
            record["breakdown"] = {"profiled-prefills": args.breakdown, "models": breakdown}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
        print(f"record: {args.json}")


if __name__ == "__main__":
    main()
