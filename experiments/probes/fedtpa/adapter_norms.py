"""How large the global LoRA update of a finished FedTPA / FedIT / FlexLoRA run is, and which of its
dimensions zero-padding has killed for good.

Finding: FedTPA's global update is 0.60× FedIT's at α = 1 (46 of 960 dimensions dead) and FedAvg's
  0.40×, yet the FedAvg runs score no lower, so the update's size does not explain FedTPA's deficit
  to FedIT.
Record: docs/bench/fedtpa-adapter-norms.json; quoted in docs/notes/2026-11-fedtpa-investigations.md
  and docs/methods/fedtpa.md.

§III-E zero-pads each client's pruned adapter back to r_g before Eq. 8 averages it, so a dimension a
client pruned enters the average as 0: the global A row and B column of a dimension kept by a weight
fraction f of the clients shrink by f, its rank-one part of ΔW by about f². A dimension that every
client pruned in one round comes back as A row = 0 and B column = 0, and LoRA's bilinear form then
gives both zero gradient (∂L/∂A_k carries B_k, ∂L/∂B_k carries A_k), so it never trains again. This
tool reads each run's final global adapter (`<run>/adapter`, PEFT format) and reports, per run:

- `update-norm`: the mean over adapted layers of ‖(α/r)·B·A‖_F, the update the adapter adds to each
  weight;
- `dead-dims` / `dims`: rank dimensions whose A row and B column are both exactly zero;
  `dead-layers`: layers with every dimension dead.

    python -m experiments.probes.fedtpa.adapter_norms outputs/grids/fedtpa-15/<run> [<run> ...] \
        --out docs/bench/fedtpa-adapter-norms.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.render import finish_record, start_record
from experiments.grids.fedtpa.cells import alpha_name
from fedprune_app.llm.lora import LORA_A, LORA_B, adapter_layers


def adapter_figures(
    a: dict[str, np.ndarray], b: dict[str, np.ndarray], scaling: float
) -> dict[str, Any]:
    """`a` / `b`: layer → A (r×in) / B (out×r). The mean scaled update norm, dead dimensions and
    layers."""
    if set(a) != set(b) or not a:
        raise ValueError("every adapted layer needs both its lora_A and lora_B tensor")
    norms, dead, dims, dead_layers = [], 0, 0, 0
    for layer in sorted(a):
        A, B = a[layer].astype(np.float64), b[layer].astype(np.float64)
        if A.shape[0] != B.shape[1]:
            raise ValueError(f"{layer}: A has rank {A.shape[0]}, B has rank {B.shape[1]}")
        norms.append(float(np.linalg.norm(scaling * (B @ A))))
        gone = ~np.any(A != 0, axis=1) & ~np.any(B != 0, axis=0)
        dead, dims, dead_layers = (
            dead + int(gone.sum()),
            dims + gone.size,
            dead_layers + int(gone.all()),
        )
    return {
        "layers": len(norms),
        "update-norm": float(np.mean(norms)),
        "dims": dims,
        "dead-dims": dead,
        "dead-layers": dead_layers,
    }


def read_adapter(adapter_dir: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], float]:
    """A PEFT adapter folder: its A and B tensors by layer and its scaling α/r (one rank for every
    layer)."""
    from safetensors.numpy import load_file

    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    if config.get("rank_pattern") or config.get("use_rslora"):
        raise ValueError(
            f"{adapter_dir}: per-layer ranks or rsLoRA scaling are not read by this tool"
        )
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    layers = adapter_layers(tensors)
    scaling = float(config["lora_alpha"]) / float(config["r"])
    return (
        {n: tensors[n + LORA_A] for n in layers},
        {n: tensors[n + LORA_B] for n in layers},
        scaling,
    )


def run_figures(run: Path) -> dict[str, Any]:
    """One run: what it was (method, tag, Dirichlet α: "inf" for the IID split, FedTPA's switches)
    and its adapter's figures."""
    config = json.loads((run / "config.json").read_text())
    alpha = alpha_name(
        math.inf if config.get("partitioner") == "iid" else float(config["dirichlet-alpha"])
    )
    row = {
        "run": run.name,
        "method": config["method"],
        "run-tag": config.get("run-tag", ""),
        "alpha": alpha,
        "rank": config.get("lora-rank"),
    }
    if config["method"] == "fedtpa":
        row.update({k: config.get(k) for k in ("fedtpa-itpa", "fedtpa-dapr", "fedtpa-lcwa")})
    return row | adapter_figures(*read_adapter(run / "adapter"))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "runs", nargs="+", type=Path, help="finished run directories holding adapter/"
    )
    parser.add_argument("--out", default="", help="write the record here (JSON)")
    args = parser.parse_args(argv)
    missing = [str(r) for r in args.runs if not (r / "adapter" / "adapter_config.json").exists()]
    if missing:
        raise SystemExit(f"no final adapter (adapter/adapter_config.json) in: {', '.join(missing)}")
    record = start_record("fedtpa-adapter-norms", "experiments.probes.fedtpa.adapter_norms", argv)
    record["runs"] = [run_figures(r) for r in args.runs]
    for row in record["runs"]:
        print(
            f"{row['run']}: update norm {row['update-norm']:.4f}, dead dims "
            f"{row['dead-dims']}/{row['dims']}, dead layers {row['dead-layers']}/{row['layers']}"
        )
    return finish_record(record, args.out)


if __name__ == "__main__":
    main()
