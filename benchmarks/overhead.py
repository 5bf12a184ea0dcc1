"""Flower's overhead: the same FedIT work through `flwr run` and as a plain in-process loop, on
SmolLM2.

Same clients (the 4 default BIG-bench tasks), same local steps, batch, seeds and FedAvg; no
evaluation in either (it is the same code on both sides and would only dilute the difference). Both
sides get the same 2 threads: the simulation runs one client at a time in a 2-CPU actor
(`client-resources-num-cpus=2`), the plain loop runs the clients one after another. Printed: wall
time of both and their ratio, the fixed start-up cost of the simulation (SuperLink + Ray + ServerApp
up to its first line), and the steady-state per-round time (rounds 2..R, after the actors have
loaded the model) with Flower's per-round overhead. The record (figures, command, machine, load
average, flwr version) goes to `--out`; `fedprune bench render docs/bench/overhead.json` prints the
table docs/scale.md shows.

    make bench-overhead  # or: .venv/bin/python benchmarks/overhead.py --rounds 3 --steps 5
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.render import finish_record, start_record
from fedprune_app.core.config import RunConfig
from fedprune_app.core.replies import weighted_average
from fedprune_app.core.runtime import quiet_libraries
from fedprune_app.llm.data import client_data
from fedprune_app.llm.models import get_adapter_state, peft_model_for, set_adapter_state
from fedprune_app.llm.training import train_steps
from fedprune_cli import launch

ROOT = Path(__file__).resolve().parent.parent


def plain_loop(cfg: RunConfig, clients: int) -> dict[str, object]:
    """FedIT without Flower: for each round, each client trains from the global adapter; FedAvg."""
    torch.set_num_threads(cfg.torch_threads)
    start = time.perf_counter()
    model, tokenizer = peft_model_for(cfg)
    data = [client_data(cfg, i, clients) for i in range(clients)]
    global_state = get_adapter_state(model)
    setup = time.perf_counter() - start
    rounds = []
    for server_round in range(1, cfg.num_server_rounds + 1):
        t0 = time.perf_counter()
        states, weights = [], []
        for pid, d in enumerate(data):
            set_adapter_state(model, global_state)
            seed = cfg.seed * 1_000_003 + server_round * 1009 + pid  # as FederatedClient.seed
            train_steps(model, tokenizer, d.train, cfg, seed=seed)
            states.append({k: v.numpy() for k, v in get_adapter_state(model).items()})
            weights.append(len(d.train))
        global_state = {
            k: torch.from_numpy(v) for k, v in weighted_average(states, weights).items()
        }
        rounds.append(time.perf_counter() - t0)
    return {"total": time.perf_counter() - start, "setup": setup, "rounds": rounds}


def flower_run(overrides: str, clients: int, cpus: int) -> dict[str, object]:
    start = time.time()
    launched = launch.launch(
        [str(ROOT / "conf" / "fedit.toml"), overrides],
        f"num-supernodes={clients} client-resources-num-cpus={cpus}",
        quiet=True,
    )
    total = time.time() - start
    if launched.code != 0 or launched.run_dir is None:
        raise RuntimeError(f"flwr run failed: {launched.status}")
    summary = json.loads((launched.run_dir / "summary.json").read_text())
    rows = [
        json.loads(line) for line in (launched.run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    ends = {}
    for r in rows:
        if r["phase"] == "train":
            ends[r["round"]] = r["time"]
    ready = summary["initial-state-seconds"]
    marks = [ready] + [ends[k] for k in sorted(ends)]
    rounds = [b - a for a, b in zip(marks[:-1], marks[1:], strict=True)]
    return {"total": total, "startup": summary["started-at"] - start, "rounds": rounds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--rounds", type=int, default=3, help="FedIT rounds on both sides (default: %(default)s)"
    )
    parser.add_argument(
        "--steps", type=int, default=5, help="local steps per round (default: %(default)s)"
    )
    parser.add_argument("--clients", type=int, default=4, help="clients (default: %(default)s)")
    parser.add_argument(
        "--cpus-per-client",
        type=int,
        default=2,
        help="CPUs of each simulated client and threads of the plain loop (default: %(default)s)",
    )
    parser.add_argument("--note", default="", help="free text stored in the record")
    parser.add_argument(
        "--out", default="docs/bench/overhead.json", help="the JSON record; '' = none"
    )
    args = parser.parse_args(argv)
    record = start_record("overhead", "benchmarks.overhead", note=args.note)
    quiet_libraries()
    values = {
        "num-server-rounds": args.rounds,
        "local-steps": args.steps,
        "val-examples": 0,
        "fraction-evaluate": 0.0,
        "server-eval-data": "",
        "torch-threads": 2,
        "run-tag": "bench-overhead",
    }
    cfg = RunConfig.from_flower(
        launch.merged_config(ROOT, [str(ROOT / "conf" / "fedit.toml")]) | values
    )
    overrides = " ".join(f"{k}={json.dumps(v)}" for k, v in values.items())
    print(
        f"FedIT work: {args.clients} clients x {args.rounds} rounds x {args.steps} steps x batch "
        f"{cfg.batch_size}, SmolLM2-135M, 2 threads each side",
        flush=True,
    )
    fl = flower_run(overrides, args.clients, args.cpus_per_client)
    pl = plain_loop(cfg, args.clients)
    steady_fl = sum(fl["rounds"][1:]) / max(1, len(fl["rounds"]) - 1)
    steady_pl = sum(pl["rounds"][1:]) / max(1, len(pl["rounds"]) - 1)
    print("\n| | flwr run (simulation) | plain loop | ratio |\n|---|---|---|---|")
    print(
        f"| wall time, whole job | {fl['total']:.1f} s | {pl['total']:.1f} s | "
        f"{fl['total'] / pl['total']:.2f} |"
    )
    print(f"| start-up (SuperLink + Ray + ServerApp) | {fl['startup']:.1f} s | – | |")
    print(
        f"| round 1 (actors load the model) | {fl['rounds'][0]:.1f} s | {pl['rounds'][0]:.1f} s "
        f"| {fl['rounds'][0] / pl['rounds'][0]:.2f} |"
    )
    print(
        f"| steady round (mean of rounds 2..{args.rounds}) | {steady_fl:.1f} s | {steady_pl:.1f} s "
        f"| {steady_fl / steady_pl:.2f} |"
    )
    print(
        f"\nper-round overhead of Flower: {100 * (steady_fl / steady_pl - 1):+.1f}% "
        "(goal: within 15%)"
    )
    print(
        f"rounds (s): flwr {[round(x, 1) for x in fl['rounds']]}, plain "
        f"{[round(x, 1) for x in pl['rounds']]}"
    )
    from importlib.metadata import version

    record.update(
        {
            "clients": args.clients,
            "rounds": args.rounds,
            "steps": args.steps,
            "batch-size": cfg.batch_size,
            "cpus-per-client": args.cpus_per_client,
            "torch-threads": cfg.torch_threads,
            "model": cfg.model_name,
            "flwr": version("flwr"),
            "flower": fl,
            "plain": pl,
            "steady-round": {"flower": steady_fl, "plain": steady_pl},
            "overhead-percent": 100 * (steady_fl / steady_pl - 1),
        }
    )
    finish_record(record, args.out)


if __name__ == "__main__":
    main()
