"""How fast SFT-P's masks reach the budget: one client's Alg. 1 inner loop, round after round,
without averaging.

Finding: One client reaches p within 0.01 in 48 steps at the paper's λ 16 as at λ 64 (one 12-step
  round later), so the presets use λ 16; at 50%, +C's faster first cut (penalty 0.149 against NOC's
  0.426 at step 20) comes from e_k's size, not its movement.
Record: docs/bench/sftp-budget-lam64.json (and 10 more sftp-budget-*.json); quoted in
  docs/notes/2026-11-sftp-investigations.md.

Runs `local_round` (fedprune_app/methods/sftp/local.py: ReinMax gates of h_Θ(e_k), CLM + λ·R(T, pT),
AdamW on Θ, e_k and LoRA)
for `num-server-rounds` rounds of `local-steps` on one client's data, carrying Θ, e_k and e_k's
optimiser state from round to round as a client does (Θ is not averaged with other clients: a
single-client view), and prints per round the mean CLM loss, the budget penalty at the first and
last step (sampled gates; the record keeps both per step, `clm-steps`, `penalty-steps`) and the kept
ratio of the deterministic mask 1[σ(s + c) > 0.5] that evaluation and compilation use, beside the
kept ratio expected under sampled gates and the share of unsaturated gates (`mask_rounding`;
held-open gates count as kept). No Flower, no Ray. The record (settings, per-round figures, command,
machine, load average) goes to `--out`; `fedprune bench render` renders it (docs/methods/sftp.md).

    # conf/sftp.toml
    python -m experiments.probes.sftp.budget_trajectory --out docs/bench/sftp-budget-lam64.json
    python -m experiments.probes.sftp.budget_trajectory --run-config "sftp-lambda=16.0" \\
        --client 2 --out ''
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.render import finish_record, start_record
from fedprune_app.core.config import RunConfig
from fedprune_app.llm.data import client_data
from fedprune_app.methods.sftp.config import SFTPConfig
from fedprune_app.methods.sftp.generator import (
    deterministic_mask,
    generator_for,
    initial_embedding,
    layer_masks,
    mask_rounding,
)
from fedprune_app.methods.sftp.local import ClientState, RoundPlan, local_round
from fedprune_app.methods.sftp.models import routed_model
from fedprune_app.methods.sftp.schedules import keep_ratio_of
from fedprune_app.structural.held import force_open, held_coordinates
from fedprune_app.structural.routing import kept_parameters, prunable_parameters
from fedprune_cli.launch import APP_DIR, merged_config

SETTING_KEYS = (
    "sftp-lambda",
    "sftp-generator-lr",
    "sftp-gate-tau",
    "sftp-gate-bias",
    "sftp-conditioning",
    "sftp-adapters",
    "hold-open",
    "sftp-loss-on",
    "sftp-lora-lr",
    "sftp-embed-init-std",
    "sftp-embed-lr-scale",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="conf/sftp.toml")
    parser.add_argument("--run-config", default="", help="'key=value ...' overrides (TOML values)")
    parser.add_argument("--client", type=int, default=0, help="partition id (of 4)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--note", default="", help="free text stored in the record")
    parser.add_argument(
        "--out", default="", help="the JSON record (docs/bench/sftp-budget-<name>.json); '' = none"
    )
    args = parser.parse_args()
    record = start_record(
        "budget-trajectory", "experiments.probes.sftp.budget_trajectory", note=args.note
    )
    cfg = RunConfig.from_flower(
        merged_config(APP_DIR, [args.preset, *([args.run_config] if args.run_config else [])])
    )
    sftp_cfg = cfg.section(SFTPConfig)
    torch.set_num_threads(cfg.torch_threads)
    model, tokenizer = routed_model(cfg)
    data = client_data(cfg, args.client, args.partitions)
    generator = generator_for(cfg, model.config, seed=cfg.seed)
    state = ClientState(torch.nn.Parameter(initial_embedding(cfg, cfg.seed + args.client)))
    embedding = state.embedding
    p = keep_ratio_of(cfg, args.client, args.partitions)
    total = prunable_parameters(model.config)
    print(
        f"client {args.client}: p = {p}, lambda = {sftp_cfg.sftp_lambda}, "
        f"generator lr = {sftp_cfg.sftp_generator_lr}, tau = {sftp_cfg.sftp_gate_tau}, "
        f"{cfg.num_server_rounds} rounds x {cfg.local_steps} steps",
        flush=True,
    )
    record["settings"] = {
        "preset": args.preset,
        "run-config": args.run_config,
        "client": args.client,
        "partitions": args.partitions,
        "keep-ratio": p,
        "local-steps": cfg.local_steps,
        "batch-size": cfg.batch_size,
        "seq-len": cfg.seq_len,
        "torch-threads": cfg.torch_threads,
        **{k: getattr(sftp_cfg, k.replace("-", "_")) for k in SETTING_KEYS},
    }
    record["rounds"] = []
    for r in range(1, cfg.num_server_rounds + 1):
        report = local_round(
            cfg, model, tokenizer, generator, state, data.train, RoundPlan(r, cfg.seed + r, p)
        )
        clm, penalty = report.values["clm"], report.values["penalty"]
        with torch.no_grad():
            mask = layer_masks(
                force_open(
                    deterministic_mask(generator(embedding), sftp_cfg.sftp_gate_bias),
                    held_coordinates(cfg, model, tokenizer),
                )
            )
            kept = float(kept_parameters(model.config, mask)) / total
            logits, held = generator(embedding), held_coordinates(cfg, model, tokenizer)
            if held is not None:  # a held gate reads 1: its π is 1
                logits = torch.where(held.bool(), torch.full_like(logits, 1e4), logits)
            rounding = mask_rounding(logits, sftp_cfg.sftp_gate_bias, model.config)
        record["rounds"].append(
            {
                "round": r,
                "clm": sum(clm) / len(clm),
                "penalty-first": penalty[0],
                "penalty-last": penalty[-1],
                "seconds": report.seconds,
                "clm-steps": list(clm),
                "penalty-steps": list(penalty),
                **rounding,
            }
        )
        print(
            f"round {r}: clm {sum(clm) / len(clm):.3f}  penalty {penalty[0]:.3f} -> "
            f"{penalty[-1]:.3f}  deterministic kept {kept:.3f}  expected "
            f"{rounding['expected']:.3f}  unsaturated {rounding['unsaturated']:.3f}  "
            f"({report.seconds:.0f} s)",
            flush=True,
        )
    finish_record(record, args.out)


if __name__ == "__main__":
    main()
