"""How fast SFT-P's masks reach the budget: one client's Alg. 1 inner loop, round after round, without averaging.

Runs `local_training` (clients/sftp.py: ReinMax gates of h_Θ(e_k), CLM + λ·R(T, pT), AdamW on Θ, e_k and LoRA)
for `num-server-rounds` rounds of `local-steps` on one client's data, carrying Θ, e_k and e_k's optimiser state
from round to round as a client does (Θ is not averaged with other clients: a single-client view), and prints per
round the mean CLM loss, the budget penalty at the first and last step (sampled gates) and the kept ratio of the
deterministic mask 1[σ(s + c) > 0.5] that evaluation and compilation use. No Flower, no Ray.

    .venv/bin/python tools/sftp_budget_trajectory.py                                   # conf/sftp.toml, client 0
    .venv/bin/python tools/sftp_budget_trajectory.py --run-config "sftp-lambda=16.0" --client 2
"""

from __future__ import annotations

import argparse

import torch

from clients.sftp import local_training
from fedprune_app.core.config import RunConfig
from fedprune_app.llm.data import client_data
from fedprune_app.methods.sftp.config import SFTPConfig
from fedprune_app.methods.sftp.generator import (
    deterministic_mask,
    generator_for,
    keep_ratio_of,
    layer_masks,
    routed_model_for,
)
from fedprune_app.methods.sftp.routing import kept_parameters, prunable_parameters
from tools.launch import APP_DIR, merged_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="conf/sftp.toml")
    parser.add_argument("--run-config", default="", help="'key=value ...' overrides (TOML values)")
    parser.add_argument("--client", type=int, default=0, help="partition id (of 4)")
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    cfg = RunConfig.from_flower(merged_config(APP_DIR, [args.preset, *([args.run_config] if args.run_config else [])]))
    sftp_cfg = cfg.section(SFTPConfig)
    torch.set_num_threads(cfg.torch_threads)
    model, tokenizer = routed_model_for(cfg)
    data = client_data(cfg, args.client, args.partitions)
    generator = generator_for(cfg, model.config, seed=cfg.seed)
    embedding = torch.nn.Parameter(torch.randn(sftp_cfg.sftp_embed_dim,
                                               generator=torch.Generator().manual_seed(cfg.seed + args.client)))
    state: dict[str, torch.Tensor] = {}
    p = keep_ratio_of(cfg, args.client, args.partitions)
    total = prunable_parameters(model.config)
    print(f"client {args.client}: p = {p}, lambda = {sftp_cfg.sftp_lambda}, "
          f"generator lr = {sftp_cfg.sftp_generator_lr}, tau = {sftp_cfg.sftp_gate_tau}, "
          f"{cfg.num_server_rounds} rounds x {cfg.local_steps} steps", flush=True)
    for r in range(1, cfg.num_server_rounds + 1):
        report = local_training(model, tokenizer, generator, embedding, state, data.train, cfg, p, cfg.seed + r, r)
        with torch.no_grad():
            mask = layer_masks(deterministic_mask(generator(embedding), sftp_cfg.sftp_gate_bias))
            kept = float(kept_parameters(model.config, mask)) / total
        print(f"round {r}: clm {sum(report.clm) / len(report.clm):.3f}  penalty {report.penalty[0]:.3f} -> "
              f"{report.penalty[-1]:.3f}  deterministic kept {kept:.3f}  ({report.seconds:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
