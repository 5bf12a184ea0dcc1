"""How much of an SFT-P run's distance to its budget is the deterministic mask's rounding.

Training meets the budget in expectation over the sampled gates g ~ Bernoulli(π), π = σ(s + c) (Eq. 10–14:
the penalty sees T(g) of sampled gates); evaluation and compilation use the deterministic mask 1[π > 0.5].
While gates are not yet saturated the two differ: with p = 0.8 most unsaturated gates sit above 0.5 and round
up to 1. For each finished NOC run (its masks come from the saved global Θ alone; a +C run's masks also need
the private e_k, which never leaves its client) this prints the kept ratio of the prunable projections under
the deterministic mask and in expectation under sampling, and the share of gates with 0.1 < π < 0.9.

    .venv/bin/python tools/sftp_mask_rounding.py outputs/grids/sftp/*noc*
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from fedprune_app.llm.models import resolve_model_path
from fedprune_app.methods.sftp.generator import MaskGenerator, mask_rounding, set_generator_state


def rounding(run: Path) -> dict[str, float]:
    """`mask_rounding` of one NOC run's final global Θ (`<run>/generator/`)."""
    cfg = json.loads((run / "generator" / "config.json").read_text())
    if cfg["conditioning"]:
        raise SystemExit(f"{run}: a +C run's masks need the clients' private e_k; pass NOC runs")
    generator = MaskGenerator(cfg["num_layers"], cfg["hidden_size"], cfg["embed_dim"], cfg["hidden"], False)
    set_generator_state(generator, load_file(str(run / "generator" / "generator.safetensors")))
    model_name = str(json.loads((run / "config.json").read_text()).get("model-name", "embedded"))
    with torch.no_grad():
        return mask_rounding(generator(None), float(cfg["gate-bias"]),
                             AutoConfig.from_pretrained(resolve_model_path(model_name)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished SFT-P NOC run directories")
    args = parser.parse_args()
    print(f"{'run':<40} {'target':>6} {'deterministic':>13} {'expected':>8} {'0.1<π<0.9':>9}")
    for run in args.runs:
        target = json.loads((run / "config.json").read_text())["sftp-keep-ratios"]
        r = rounding(run)
        print(f"{run.name:<40} {target:>6} {r['deterministic']:>13.3f} {r['expected']:>8.3f} {r['unsaturated']:>9.3f}")


if __name__ == "__main__":
    main()
