"""SFT-P's LoRA learning rate by measurement: how far Φ moves and what loss it buys, per learning
rate.

Finding: At the paper's LoRA lr 2e-5, 150 steps move Φ by 0.06% of the weights and buy 0.34 nats of
  answer NLL against 2.27 at 2e-4 (5e-4: 2.60), so the presets raise the LoRA rate to 2e-4.
Record: docs/runs/sftp-trajectory/lora-lr.json; quoted in docs/notes/2026-11-sftp-investigations.md.

For each `--lrs` value, one client runs SFT-P's local training (`methods/sftp/local.py`
`local_round`: the recipe of the preset, cosine LoRA schedule over `--steps`) from the fresh
adapters with every gate held open (`hold-open='all'`), so only Φ decides the outcome. Reported
per learning rate: ‖ΔW‖_F / ‖W‖_F averaged over the adapted projections (ΔW = s·B·A, s = alpha / r),
the largest |ΔW_ij| relative to that projection's RMS weight, the mean CLM of the first and the last
10 steps, and the answer NLL of the client's first `--examples` test examples (untouched model
first). No Flower, no Ray.

    python -m experiments.probes.sftp.lora_lr --lrs 2e-5,1e-4,2e-4,5e-4 --steps 50 \\
        --out docs/runs/sftp-trajectory/lora-lr.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedprune_app.core.config import RunConfig
from fedprune_app.core.runtime import quiet_libraries
from fedprune_app.llm.data import client_data
from fedprune_app.llm.evaluation import mean_loss
from fedprune_app.llm.models import initial_adapter_state, set_adapter_state
from fedprune_app.methods.sftp.config import SFTPConfig
from fedprune_app.methods.sftp.generator import generator_for
from fedprune_app.methods.sftp.local import ClientState, RoundPlan, local_round
from fedprune_app.methods.sftp.models import routed_model
from fedprune_cli.launch import APP_DIR, merged_config


def adapter_movement(model: nn.Module) -> dict[str, float]:
    """Mean ‖ΔW‖_F/‖W‖_F over the LoRA-adapted projections and max |ΔW_ij| / RMS(W) (ΔW = s·B·A)."""
    rel, peak = [], 0.0
    for module in model.modules():
        if not (hasattr(module, "lora_A") and hasattr(module, "base_layer")) or not module.lora_A:
            continue
        name = next(iter(module.lora_A))
        with torch.no_grad():
            delta = (
                module.scaling[name]
                * module.lora_B[name].weight.float()
                @ module.lora_A[name].weight.float()
            )
            weight = module.base_layer.weight.float()
        rel.append(float(delta.norm() / weight.norm()))
        peak = max(peak, float(delta.abs().max() / weight.pow(2).mean().sqrt()))
    return {
        "delta-rel-fro": sum(rel) / max(len(rel), 1),
        "delta-max-over-rms": peak,
        "modules": len(rel),
    }


def measure(cfg: RunConfig, client: int, partitions: int, examples: int) -> dict[str, Any]:
    """One learning rate (cfg's sftp-lora-lr): train from fresh adapters, then score the dense model
    with Φ."""
    model, tokenizer = routed_model(cfg)
    set_adapter_state(model, initial_adapter_state(model))
    data = client_data(cfg, client, partitions)
    generator = generator_for(cfg, model.config, seed=cfg.seed)
    embedding = nn.Parameter(
        torch.randn(
            cfg.section(SFTPConfig).sftp_embed_dim,
            generator=torch.Generator().manual_seed(cfg.seed + client),
        )
    )
    report = local_round(
        cfg,
        model,
        tokenizer,
        generator,
        ClientState(embedding),
        data.train,
        RoundPlan(1, cfg.seed, 1.0),
    )
    with torch.no_grad():
        nll = mean_loss(model, tokenizer, data.test[:examples], cfg.seq_len)
    clm = report.values["clm"]
    return {
        "lora-lr": cfg.section(SFTPConfig).sftp_lora_lr,
        "answer-nll": nll,
        "clm-first": sum(clm[:10]) / len(clm[:10]),
        "clm-last": sum(clm[-10:]) / len(clm[-10:]),
        "train-seconds": report.seconds,
        **adapter_movement(model),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="conf/sftp.toml")
    parser.add_argument("--run-config", default="", help="'key=value ...' overrides (TOML values)")
    parser.add_argument("--lrs", default="2e-5,1e-4,2e-4,5e-4")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--client", type=int, default=0)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--examples", type=int, default=30)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    quiet_libraries()
    start, rows = time.perf_counter(), []
    base = [args.preset, *([args.run_config] if args.run_config else [])]
    configs = [
        RunConfig.from_flower(
            merged_config(
                APP_DIR,
                [
                    *base,
                    f"sftp-lora-lr={lr!r} hold-open='all' "
                    f"num-server-rounds=1 local-steps={args.steps}",
                ],
            )
        )
        for lr in [float(v) for v in args.lrs.split(",")]
    ]  # all resolved and checked before any training
    given = sys.argv[1:] if argv is None else argv

    def save() -> None:  # after every learning rate, so a stopped run keeps what it measured
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(
                json.dumps(
                    {
                        "command": "python -m experiments.probes.sftp.lora_lr " + shlex.join(given),
                        "client": args.client,
                        "steps": args.steps,
                        "examples": args.examples,
                        "seconds": round(time.perf_counter() - start, 1),
                        "rows": rows,
                    },
                    indent=1,
                )
            )

    for cfg in configs:
        torch.set_num_threads(cfg.torch_threads or 1)
        if not rows:
            model, tokenizer = routed_model(cfg)
            with torch.no_grad(), model.disable_adapter():
                untouched = mean_loss(
                    model.eval(),
                    tokenizer,
                    client_data(cfg, args.client, args.partitions).test[: args.examples],
                    cfg.seq_len,
                )
            rows.append({"lora-lr": 0.0, "answer-nll": untouched, "note": "untouched"})
        rows.append(measure(cfg, args.client, args.partitions, args.examples))
        r = rows[-1]
        print(
            f"lora lr {cfg.section(SFTPConfig).sftp_lora_lr:g}: |ΔW|/|W| {r['delta-rel-fro']:.4f}  "
            f"max|ΔW|/rms(W) {r['delta-max-over-rms']:.3f}  clm {r['clm-first']:.3f} -> "
            f"{r['clm-last']:.3f}  answer NLL {r['answer-nll']:.3f} (untouched "
            f"{rows[0]['answer-nll']:.3f})",
            flush=True,
        )
        save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
