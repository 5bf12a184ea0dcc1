"""The size of the updates DP-FedAvg clips: each client's first update, measured with DP off.

    python -m experiments.dp_norms [--methods fedit,sftp] [--out docs/bench/dp-update-norms.json]

For each method, its DP preset (`conf/<method>-dp.toml`) with DP off: every default client's
round-1 train message from the initial global state, and the L2 norm of its update Δ = θ_k − θ
over the tensors the method releases under DP (`dp_release_keys`, the norm that `clip_update`
clips), whole and per group (SFT-P: the mask generator Θ and LoRA Φ). Beside it the preset's
`dp-clipping-norm` C and the factor min(1, C/‖Δ‖) that clipping would scale the update by. A C far
below the typical norm turns DP-FedAvg into a much smaller learning rate; the usual start is C
near the median norm (Andrew et al. 2021 adapt C to that quantile). Round 1 only: later rounds'
updates may be smaller, and measuring them on private data is itself a release, so a deployment
measures on proxy data or adapts C privately.
"""

from __future__ import annotations

import argparse
import statistics
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.render import dp_norms, finish_record, start_record

ROOT = Path(__file__).resolve().parents[1]


def group_of(key: str) -> str:
    """The tensor group a released key belongs to: LoRA Φ ('lora'), anything else by its first
    dotted name (SFT-P's generator Θ: 'mask-generator')."""
    return "lora" if "lora_" in key else key.split(".", 1)[0]


def update_norms(
    local: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], keys: Sequence[str]
) -> dict[str, float]:
    """‖θ_k − θ‖₂ over `keys` ('all', in float64, as `clip_update` measures it) and per
    `group_of` group."""
    squares: dict[str, float] = {}
    for k in keys:
        d = np.asarray(local[k], np.float64) - np.asarray(reference[k], np.float64)
        squares[group_of(k)] = squares.get(group_of(k), 0.0) + float(np.sum(d * d))
    return {"all": sum(squares.values()) ** 0.5} | {g: s**0.5 for g, s in sorted(squares.items())}


def preset_values(method: str) -> tuple[dict[str, Any], float]:
    """`conf/<method>-dp.toml` with DP off (C, σ and the budget 0), and the preset's C."""
    values = tomllib.loads((ROOT / "conf" / f"{method}-dp.toml").read_text())
    off = {"dp-clipping-norm": 0.0, "dp-noise-multiplier": 0.0, "dp-max-epsilon": 0.0}
    return values | off, float(values["dp-clipping-norm"])


def measure(method: str, clients: int = 4) -> list[dict[str, Any]]:
    """One row per client: its round-1 update norms over the DP release keys, the preset's C and
    clipping's scale factor."""
    import torch

    from benchmarks.precision import first_message
    from fedprune_app.core import registry
    from fedprune_app.core.config import RunConfig
    from fedprune_app.core.protocol import numpy_state

    values, clipping = preset_values(method)
    cfg = RunConfig.from_flower(values, methods=registry.names())
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    strategy = registry.strategy_class(cfg.method)(cfg)
    initial = strategy.initial_arrays()
    reference = numpy_state(initial)
    keys = strategy.dp_release_keys(1, reference)
    rows = []
    for partition in range(clients):
        client, content = first_message(cfg, partition, strategy, initial, clients)
        reply = client.train(content)
        norms = update_norms(numpy_state(reply.array_records["arrays"]), reference, keys)
        norm = norms.pop("all")
        rows.append(
            {
                "method": method,
                "client": partition,
                "entries": int(sum(np.size(reference[k]) for k in keys)),
                "norm": norm,
                "groups": norms,
                "preset-clipping-norm": clipping,
                "scale": min(1.0, clipping / norm) if norm > 0 else 1.0,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="fedit,sftp", help="comma-separated DP presets")
    parser.add_argument("--out", default="", help="the JSON record (docs/bench/...)")
    args = parser.parse_args(argv)
    record = start_record("dp-norms", "experiments.dp_norms", argv)
    record["rows"] = [row for m in args.methods.split(",") for row in measure(m.strip())]
    record["median"] = {
        m: statistics.median(r["norm"] for r in record["rows"] if r["method"] == m)
        for m in dict.fromkeys(r["method"] for r in record["rows"])
    }
    finish_record(record, args.out)
    print(dp_norms([record]))


if __name__ == "__main__":
    main()
