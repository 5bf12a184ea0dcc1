"""Can SFT-P's conditioned generator give each client its own mask under FedAvg? Alg. 1's mask side,
with the LM replaced by a loss whose optimum is known ("is e_k's pull on the generator too weak, do
the clients' masks converge to one compromise?").

Finding: On a loss with known optima, 150 steps of FedAvg'd Θ deploy one mask whatever the clients
  prefer (captured −0.19 to 0.09 at ρ 0.25, cuts 99% shared) while the 50% preset's 600 steps
  capture 0.59–0.79, so the 50% cells' 99.9% shared cuts mean the tasks differ little per bus
  coordinate.
Record: docs/bench/sftp-conditioning-p80.json (and 7 more sftp-conditioning-*.json); quoted in
  docs/notes/2026-11-sftp-investigations.md.

In the grid, the four clients' deployed masks share 98% (keep 0.8) to 99.9% (keep 0.5) of their
cuts. That can mean two things: the tasks really prefer the same bus coordinates, or Alg. 1 at our
schedule cannot express a difference the tasks do have. This tool separates them. Each client k pays
w_k[l, m, i] ≥ 0 for dropping bus coordinate i of mask m in layer l (a linear stand-in for L_CLM,
`surrogate_loss`), with log w_k = a shared part + a client part whose share of the variance is
`--specific` (`surrogate_importance`). So every client has a known best cut at its budget
(`best_cut`: the lowest w per parameter, filled to p · T_total) and there is a best single cut for
all (the same fill on Σ_k w_k). Everything else is the app's own code: the real `MaskGenerator` (Eq.
10–11) of the model's shape, ReinMax gates (Eq. 12), T(g) and the budget penalty (Eq. 13–14), AdamW
on (Θ, e_k) with the gradient clipped, a fresh optimiser for Θ each round and e_k's moments kept
(clients/sftp.py), FedAvg of Θ with equal weights (Eq. 15), the deployed mask filled to the budget
(`deployed_gates`).

Three ways to train, same seeds: `fed` (+C: Alg. 1), `noc` (NOC: the generator reads a zero vector,
one mask for all) and `alone` (+C, each client its own Θ, nothing averaged). Per round and client
the record holds `captured`: (L_k(best single cut) − L_k(deployed)) / (L_k(best single
cut) − L_k(own best cut)), the share of the gain a personal mask can buy that the deployed mask buys
(1 = the client's own best cut, 0 = no better than the best shared cut, < 0 = worse than it); and
the cuts' `shared-cut` (`routing.mask_statistics`).

    # conf/sftp.toml
    python -m experiments.probes.sftp.conditioning --out docs/bench/sftp-conditioning-p80.json
    python -m experiments.probes.sftp.conditioning --preset conf/sftp-50.toml --out ''
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from transformers import AutoConfig

from benchmarks.render import finish_record, start_record
from fedprune_app.core.config import RunConfig
from fedprune_app.llm.models import resolve_model_path
from fedprune_app.methods.sftp.config import SFTPConfig
from fedprune_app.methods.sftp.generator import (
    MaskGenerator,
    deployed_gates,
    layer_masks,
    reinmax_binary,
)
from fedprune_app.methods.sftp.objective import sftp_objective
from fedprune_app.structural.routing import (
    MASK_NAMES,
    coordinate_costs,
    fill_budget,
    kept_parameters,
    mask_statistics,
    prunable_parameters,
)
from fedprune_cli.launch import APP_DIR, merged_config

MODES = ("fed", "noc", "alone")


def cost_tensor(config: Any) -> Tensor:
    """(layers, 4, d): the parameters each bus coordinate of each mask keeps
    (`coordinate_costs`)."""
    costs = coordinate_costs(config)
    row = torch.tensor([float(costs[n]) for n in MASK_NAMES])
    return (
        row.view(1, -1, 1)
        .expand(int(config.num_hidden_layers), -1, int(config.hidden_size))
        .clone()
    )


def surrogate_importance(
    config: Any, clients: int, specific: float, lam: float, seed: int, layer_share: float = 0.0
) -> list[Tensor]:
    """w_k = cost · (λ / T_total) · exp(x_k), x_k = √(1 − ρ) z + √ρ z_k with z, z_k ~ N(0, I) per
    (mask, bus coordinate), the same in every layer (the residual bus is one basis for all layers: a
    coordinate that matters matters throughout, as the massive ones do), plus, with `layer_share`
    s > 0, a layer-by-layer part: x_k = √(1 − s) x_k + √s ε_k, ε_k ~ N(0, I) over (layers, 4, d),
    split shared/own by ρ likewise. The log-importance per parameter is standard normal for every
    client, a share ρ = `specific` of its variance the client's own. The scale puts the median
    coordinate where the penalty's pull λ·cost/T balances its loss, so the budget, not the loss
    scale, decides how much is cut."""
    for name, value in (("--specific", specific), ("--layer-share", layer_share)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    rng = torch.Generator().manual_seed(seed)
    cost = cost_tensor(config)
    layers, masks, d = tuple(cost.shape)

    def mixed(shape: tuple[int, ...], common: Tensor) -> Tensor:
        return (1 - specific) ** 0.5 * common + specific**0.5 * torch.randn(shape, generator=rng)

    bus, per_layer = (
        torch.randn((1, masks, d), generator=rng),
        torch.randn((layers, masks, d), generator=rng),
    )
    scale = cost * lam / prunable_parameters(config)
    return [
        scale
        * torch.exp(
            (1 - layer_share) ** 0.5 * mixed((1, masks, d), bus)
            + layer_share**0.5 * mixed((layers, masks, d), per_layer)
        )
        for _ in range(clients)
    ]


def surrogate_loss(w: Tensor, gates: Tensor) -> Tensor:
    """L_k(g) = Σ w_k · (1 − g): what client k loses by the coordinates g drops (linear in each
    gate)."""
    return (w * (1 - gates)).sum()


def best_cut(w: Tensor, config: Any, keep_ratio: float) -> Tensor:
    """The gates (layers, 4, d) that minimise Σ w (1 − g) at T(g) ≤ p · T_total, to one coordinate
    (the highest w per parameter first, `fill_budget`)."""
    per_param = (w / cost_tensor(config)).numpy()
    kept = fill_budget(
        {n: per_param[:, i] for i, n in enumerate(MASK_NAMES)},
        coordinate_costs(config),
        keep_ratio * prunable_parameters(config),
    )
    return torch.from_numpy(np.stack([kept[n] for n in MASK_NAMES], axis=1)).float()


def captured(w: Tensor, deployed: Tensor, own: Tensor, common: Tensor) -> float:
    """(L(common) − L(deployed)) / (L(common) − L(own)): the share of the personal mask's gain over
    the best shared one that `deployed` buys (nan when the two best cuts cost the same)."""
    gain = float(surrogate_loss(w, common) - surrogate_loss(w, own))
    return (
        float(surrogate_loss(w, common) - surrogate_loss(w, deployed)) / gain
        if gain > 0
        else float("nan")
    )


def local_steps(
    generator: MaskGenerator,
    embedding: nn.Parameter,
    embedding_state: dict[str, Tensor],
    w: Tensor,
    config: Any,
    keep_ratio: float,
    settings: Mapping[str, Any],
    rng: torch.Generator,
) -> None:
    """One round of a client on Θ and e_k as `methods/sftp/local.py` `local_round` runs it (no Φ, no
    held gates): ReinMax gates, Eq. 13 with the surrogate in place of L_CLM, AdamW, the joint
    gradient clipped. `noise` σ > 0 stands in for the minibatch: each step sees w · exp(σ ε − σ²/2),
    ε ~ N(0, I) (the same w in expectation)."""
    groups: list[dict[str, Any]] = [
        {"params": list(generator.parameters())},
        {"params": [embedding]},
    ]
    opt = torch.optim.AdamW(groups, lr=settings["lr"], weight_decay=settings["weight-decay"])
    if embedding_state:
        opt.state[embedding] = {k: v.clone() for k, v in embedding_state.items()}
    params = [p for g in groups for p in g["params"]]
    total, noise = prunable_parameters(config), float(settings.get("noise", 0.0))
    for _ in range(settings["steps"]):
        gates = reinmax_binary(generator(embedding), settings["tau"], settings["bias"], rng)
        step_w = (
            w
            if noise == 0
            else w * torch.exp(noise * torch.randn(w.shape, generator=rng) - noise**2 / 2)
        )
        loss, _ = sftp_objective(
            surrogate_loss(step_w, gates),
            kept_parameters(config, layer_masks(gates)),
            keep_ratio,
            total,
            settings["lambda"],
        )
        loss.backward()
        if settings["max-grad-norm"] > 0:
            nn.utils.clip_grad_norm_(params, settings["max-grad-norm"])
        opt.step()
        opt.zero_grad(set_to_none=True)
    embedding_state.clear()
    embedding_state.update({k: v.detach().clone() for k, v in opt.state[embedding].items()})


def average(states: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """Eq. 15 with equal weights (the app's `sftp-aggregation = "equal"`)."""
    return {k: torch.stack([s[k] for s in states]).mean(0) for k in states[0]}


def train(
    mode: str,
    w: Sequence[Tensor],
    config: Any,
    keep_ratio: float,
    settings: Mapping[str, Any],
    seed: int,
) -> list[dict[str, Any]]:
    """R rounds of `mode` ('fed', 'noc', 'alone'); per round the clients' deployed masks scored
    against their best cuts. Θ starts from `seed` as the server's does; e_k ~ N(0, I) seeded per
    client as the client's is."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    clients = len(w)
    torch.manual_seed(seed)
    start = MaskGenerator(
        int(config.num_hidden_layers),
        int(config.hidden_size),
        settings["embed-dim"],
        settings["hidden"],
        conditioning=mode != "noc",
    )
    generators = [copy.deepcopy(start) for _ in range(clients if mode == "alone" else 1)]
    embeddings = [
        nn.Parameter(
            settings.get("embed-std", 1.0)
            * torch.randn(settings["embed-dim"], generator=torch.Generator().manual_seed(seed + k))
        )
        for k in range(clients)
    ]
    moments: list[dict[str, Tensor]] = [{} for _ in range(clients)]
    rngs = [torch.Generator().manual_seed(seed * 1000 + k) for k in range(clients)]
    own = [best_cut(wk, config, keep_ratio) for wk in w]
    common = best_cut(torch.stack(list(w)).sum(0), config, keep_ratio)
    rounds = []
    for _ in range(settings["rounds"]):
        trained = []
        for k in range(clients):
            local = copy.deepcopy(generators[k if mode == "alone" else 0])
            local_steps(
                local, embeddings[k], moments[k], w[k], config, keep_ratio, settings, rngs[k]
            )
            trained.append(local)
        generators = trained if mode == "alone" else [copy.deepcopy(start)]
        if mode != "alone":
            generators[0].load_state_dict(average([g.state_dict() for g in trained]))
        with torch.no_grad():
            deployed = [
                deployed_gates(
                    generators[k if mode == "alone" else 0](embeddings[k]),
                    settings["bias"],
                    None,
                    config,
                    keep_ratio,
                )
                for k in range(clients)
            ]
        stats = mask_statistics(
            {
                k: {n: deployed[k][:, i].numpy() > 0.5 for i, n in enumerate(MASK_NAMES)}
                for k in range(clients)
            }
        )
        rounds.append(
            {
                "captured": [
                    round(captured(w[k], deployed[k], own[k], common), 4) for k in range(clients)
                ],
                "shared-cut": [stats["shared-cut"][str(k)] for k in range(clients)],
                "kept": [
                    round(
                        float(kept_parameters(config, layer_masks(g)))
                        / prunable_parameters(config),
                        4,
                    )
                    for g in deployed
                ],
            }
        )
    return rounds


def best_cuts_overlap(w: Sequence[Tensor], config: Any, keep_ratio: float) -> list[float]:
    """`shared-cut` of the clients' own best cuts: how different the surrogate makes the clients."""
    cuts = {
        k: {
            n: best_cut(wk, config, keep_ratio)[:, i].numpy() > 0.5
            for i, n in enumerate(MASK_NAMES)
        }
        for k, wk in enumerate(w)
    }
    return [mask_statistics(cuts)["shared-cut"][str(k)] for k in range(len(w))]


def settings_of(cfg: RunConfig, rounds: int | None, steps: int | None) -> dict[str, Any]:
    s = cfg.section(SFTPConfig)
    return {
        "rounds": rounds or cfg.num_server_rounds,
        "steps": steps or cfg.local_steps,
        "lr": s.sftp_generator_lr,
        "weight-decay": s.sftp_generator_weight_decay,
        "tau": s.sftp_gate_tau,
        "bias": s.sftp_gate_bias,
        "lambda": s.sftp_lambda,
        "embed-dim": s.sftp_embed_dim,
        "hidden": s.sftp_generator_hidden,
        "max-grad-norm": cfg.max_grad_norm,
        "keep-ratio": float(str(cfg["keep-ratios"]).split(",")[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="conf/sftp.toml")
    parser.add_argument("--run-config", default="", help="'key=value ...' overrides (TOML values)")
    parser.add_argument(
        "--specific",
        default="0.25,0.5",
        help="comma-separated shares ρ of client-specific log-importance variance",
    )
    parser.add_argument(
        "--layer-share",
        type=float,
        default=0.0,
        help="share of the log-importance that "
        "varies layer by layer (0 = one importance per bus coordinate and mask in every layer)",
    )
    parser.add_argument(
        "--rounds", type=int, default=0, help="default: num-server-rounds of the preset"
    )
    parser.add_argument("--steps", type=int, default=0, help="default: local-steps of the preset")
    parser.add_argument(
        "--embed-std",
        type=float,
        default=1.0,
        help="e_k ~ N(0, std² I) at the start (the client's: 1)",
    )
    parser.add_argument(
        "--noise",
        type=float,
        default=0.0,
        help="σ of the per-step multiplicative lognormal "
        "noise on w (a minibatch's view of the importance; 0 = exact)",
    )
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--note", default="")
    parser.add_argument("--out", default="", help="the JSON record; '' = none")
    args = parser.parse_args()
    record = start_record(
        "sftp-conditioning", "experiments.probes.sftp.conditioning", note=args.note
    )
    cfg = RunConfig.from_flower(
        merged_config(APP_DIR, [args.preset, *([args.run_config] if args.run_config else [])])
    )
    torch.set_num_threads(1)
    config = AutoConfig.from_pretrained(resolve_model_path(cfg.model_name))
    settings = {
        **settings_of(cfg, args.rounds, args.steps),
        "embed-std": args.embed_std,
        "noise": args.noise,
    }
    record["settings"] = {
        **settings,
        "model": cfg.model_name,
        "clients": args.clients,
        "seed": args.seed,
        "layer-share": args.layer_share,
    }
    record["cells"] = []
    for specific in (float(x) for x in args.specific.split(",")):
        w = surrogate_importance(
            config, args.clients, specific, settings["lambda"], args.seed, args.layer_share
        )
        cell = {
            "specific": specific,
            "best-cuts-shared-cut": best_cuts_overlap(w, config, settings["keep-ratio"]),
        }
        for mode in args.modes.split(","):
            cell[mode] = train(mode, w, config, settings["keep-ratio"], settings, args.seed)
            last = cell[mode][-1]
            print(
                f"ρ {specific:g} {mode:>5}: captured {last['captured']}, shared-cut "
                f"{last['shared-cut']}, kept {last['kept']}",
                flush=True,
            )
        record["cells"].append(cell)
    finish_record(record, args.out)


if __name__ == "__main__":
    main()
