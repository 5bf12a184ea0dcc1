"""Does dropping a few residual-bus coordinates break the model? Answer NLL with single coordinates
masked out.

Finding: Dropping SmolLM2's bus coordinate 507 alone takes answer NLL from 2–6 to 14–17 nats (four
  random coordinates: at most 0.13), so SFT-P holds massive coordinates open
  (hold-open='massive').
Record: docs/runs/sftp-trajectory/bus-coordinates.json; quoted in
  docs/notes/2026-11-sftp-investigations.md (the figure also in docs/methods/sftp.md).

SFT-P's masks act on the d-wide residual bus (`Norm(x ⊙ g_in)`, `f(x_in) ⊙ g_out`). LLMs are known
to carry a few "massive activation" coordinates in the residual stream. This scores each client's
untouched model (answer NLL on its first `--examples` test examples) with one coordinate dropped
from every layer's four masks, for the `--top` coordinates of largest mean |hidden state| and for as
many random ones, and with the top ones dropped together. No training, no Flower.

    python -m experiments.probes.sftp.bus_coordinates \\
        --out docs/runs/sftp-trajectory/bus-coordinates.json
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
import time
from pathlib import Path

import torch

from fedprune_app.core.config import RunConfig
from fedprune_app.core.runtime import quiet_libraries
from fedprune_app.llm.data import client_data, collate, encode
from fedprune_app.llm.evaluation import mean_loss
from fedprune_app.llm.layers import decoder_layers
from fedprune_app.methods.sftp.models import routed_model
from fedprune_app.structural.routing import MASK_NAMES, masked
from fedprune_cli.launch import APP_DIR, merged_config


def masks_without(model: torch.nn.Module, coords: list[int]) -> list[dict[str, torch.Tensor]]:
    d = model.config.hidden_size
    keep = torch.ones(d)
    keep[coords] = 0.0
    return [{name: keep.clone() for name in MASK_NAMES} for _ in decoder_layers(model)]


def coordinate_magnitude(model: torch.nn.Module, tokenizer, examples, seq_len: int) -> torch.Tensor:
    """Mean |h| per bus coordinate over every layer's output and token (padding excluded)."""
    batch = collate([encode(tokenizer, e, seq_len) for e in examples], tokenizer.pad_token_id)
    with torch.no_grad():
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            output_hidden_states=True,
        )
    real = batch["attention_mask"].bool()
    return torch.stack([h[real].abs().mean(0) for h in out.hidden_states[1:]]).mean(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="conf/sftp.toml")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--examples", type=int, default=30)
    parser.add_argument("--top", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    cfg = RunConfig.from_flower(merged_config(APP_DIR, [args.preset]))
    quiet_libraries()
    start = time.perf_counter()
    model, tokenizer = routed_model(cfg)
    model.eval()
    rows = []
    for k in range(args.partitions):
        data = client_data(cfg, k, args.partitions)
        test = data.test[: args.examples]
        magnitude = coordinate_magnitude(model, tokenizer, data.train[:16], cfg.seq_len)
        top = magnitude.argsort(descending=True)[: args.top].tolist()
        rand = random.Random(k).sample(
            [c for c in range(model.config.hidden_size) if c not in top], args.top
        )

        def nll(coords: list[int], test: list = test) -> float:
            with masked(model, masks_without(model, coords) if coords else None), torch.no_grad():
                return mean_loss(model, tokenizer, test, cfg.seq_len)

        row = {
            "client": k,
            "data": data.eval_source,
            "untouched": nll([]),
            "top": [
                {"coordinate": c, "mean-abs": float(magnitude[c]), "nll": nll([c])} for c in top
            ],
            "random": [
                {"coordinate": c, "mean-abs": float(magnitude[c]), "nll": nll([c])} for c in rand
            ],
            "top-together": nll(top),
            "random-together": nll(rand),
        }
        rows.append(row)
        print(
            f"client {k}: untouched {row['untouched']:.3f}; top coords "
            f"{[r['coordinate'] for r in row['top']]} alone "
            f"{[round(r['nll'], 3) for r in row['top']]} together {row['top-together']:.3f}; "
            f"random {[round(r['nll'], 3) for r in row['random']]} together "
            f"{row['random-together']:.3f}",
            flush=True,
        )
    if args.out:
        given = sys.argv[1:] if argv is None else argv
        args.out.parent.mkdir(parents=True, exist_ok=True)
        command = "python -m experiments.probes.sftp.bus_coordinates " + shlex.join(given)
        args.out.write_text(
            json.dumps(
                {
                    "command": command,
                    "examples": args.examples,
                    "seconds": round(time.perf_counter() - start, 1),
                    "rows": rows,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
