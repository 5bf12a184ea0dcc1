"""Packed against padded training rows (`pack-sequences`), timed in one process on the same steps.

Finding: Packed rows speed SFT-P's step 1.19× over the four clients (1.04–1.41×) with CLM losses
  equal to 3e-06, so training packs rows by default (pack-sequences = true).
Record: docs/bench/packing.json (and docs/bench/packing-20261128.json, the same command on another
  day); quoted in docs/running.md and docs/notes/2026-11-sftp-investigations.md.

For each client of the preset's data, SFT-P's local training (`methods/sftp/local.py` `local_round`:
the real step, gates, penalty and LoRA) runs `--steps` steps from the same Θ, e_k, Φ and gate seed,
once on padded rows and once on packed rows, alternating `--repeats` times (round-robin, so load on
a shared machine hits both alike). Reported per client: seconds per step (CPU time of this process's
one torch thread, `time.thread_time`, or wall time), the tokens a step computes (padded: rows × the
longest example; packed: the real tokens), the speed-up, and the largest difference between the two
runs' per-step CLM losses (packing must not change what is trained).

    python -m experiments.benchmarks.packing --steps 6 --repeats 2 --out docs/bench/packing.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.render import finish_record, start_record
from fedprune_app.core.config import RunConfig
from fedprune_app.core.runtime import quiet_libraries
from fedprune_app.llm.data import client_data, training_batches
from fedprune_app.llm.models import initial_adapter_state, set_adapter_state
from fedprune_app.methods.sftp.config import SFTPConfig
from fedprune_app.methods.sftp.generator import generator_for
from fedprune_app.methods.sftp.local import ClientState, RoundPlan, local_round
from fedprune_app.methods.sftp.models import routed_model
from fedprune_cli.launch import APP_DIR, merged_config


def step_tokens(cfg: RunConfig, examples: list, tokenizer: Any, packed: bool) -> float:
    """Mean tokens one step feeds the model: rows × width (padded) or the row's length (packed)."""
    batches = training_batches(
        examples,
        tokenizer,
        cfg.batch_size,
        cfg.local_steps,
        cfg.seq_len,
        cfg.seed,
        targets=cfg.section(SFTPConfig).sftp_loss_on,
        packed=packed,
    )
    return statistics.mean(float(b["input_ids"].numel()) for b in batches)


def one_run(
    cfg: RunConfig, model: nn.Module, tokenizer: Any, examples: list, client: int, clock: Any
) -> tuple[float, list[float]]:
    """(seconds per step, per-step CLM) of `local-steps` steps from the same starting state."""
    set_adapter_state(model, initial_adapter_state(model))
    generator = generator_for(cfg, model.config, seed=cfg.seed)
    embedding = nn.Parameter(
        torch.randn(
            cfg.section(SFTPConfig).sftp_embed_dim,
            generator=torch.Generator().manual_seed(cfg.seed + client),
        )
    )
    keep = float(str(cfg["keep-ratios"]).split(",")[0])
    start = clock()
    report = local_round(
        cfg,
        model,
        tokenizer,
        generator,
        ClientState(embedding),
        examples,
        RoundPlan(1, cfg.seed, keep),
    )
    return (clock() - start) / cfg.local_steps, report.values["clm"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="conf/sftp.toml")
    parser.add_argument("--run-config", default="", help="'key=value ...' overrides (TOML values)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--clients", default="0,1,2,3")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--clock", choices=("thread", "wall"), default="thread")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    record = start_record("packing", "experiments.benchmarks.packing", argv)
    quiet_libraries()
    torch.set_num_threads(1)
    base = [args.preset, *([args.run_config] if args.run_config else []), "lora-dropout=0.0"]
    configs = {
        packed: RunConfig.from_flower(
            merged_config(
                APP_DIR,
                [
                    *base,
                    f"local-steps={args.steps} num-server-rounds=1 "
                    f"pack-sequences={str(packed).lower()}",
                ],
            )
        )
        for packed in (False, True)
    }
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    model, tokenizer = routed_model(configs[False])
    rows = []
    for client in (int(c) for c in args.clients.split(",")):
        examples = client_data(configs[False], client, args.partitions).train
        seconds: dict[bool, list[float]] = {False: [], True: []}
        losses: dict[bool, list[float]] = {}
        for _ in range(args.repeats):
            for packed in (False, True):
                s, clm = one_run(configs[packed], model, tokenizer, examples, client, clock)
                seconds[packed].append(s)
                losses[packed] = clm
        padded, packed_s = statistics.median(seconds[False]), statistics.median(seconds[True])
        row = {
            "client": client,
            "data": examples[0]["source"] if examples else "",
            "padded-s-per-step": padded,
            "packed-s-per-step": packed_s,
            "speed-up": padded / packed_s,
            "padded-tokens-per-step": step_tokens(configs[False], examples, tokenizer, False),
            "packed-tokens-per-step": step_tokens(configs[True], examples, tokenizer, True),
            "max-clm-difference": max(
                abs(a - b) for a, b in zip(losses[False], losses[True], strict=True)
            ),
        }
        rows.append(row)
        print(
            f"client {client} ({row['data']}): padded {padded:.3f} s/step "
            f"({row['padded-tokens-per-step']:.0f} tokens), packed {packed_s:.3f} s/step "
            f"({row['packed-tokens-per-step']:.0f} tokens): {row['speed-up']:.2f}x; max |ΔCLM| "
            f"{row['max-clm-difference']:.1e}",
            flush=True,
        )
    total = {m: sum(r[f"{m}-s-per-step"] for r in rows) for m in ("padded", "packed")}
    print(f"all clients: {total['padded'] / total['packed']:.2f}x (sum of seconds per step)")
    record.update(
        {
            "clock": args.clock,
            "steps": args.steps,
            "repeats": args.repeats,
            "preset": args.preset,
            "rows": rows,
            "speed-up-all": total["padded"] / total["packed"],
        }
    )
    finish_record(record, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
