"""How much of an SFT-P run's distance to its budget is the deterministic mask's rounding.

Finding: The 0.5-rounded mask kept 0.855–0.865 at a 0.8 target (0.511–0.519 at 0.5), about 0.03 of
  it from unsaturated gates rounding up, so the deployed mask now fills the budget
  (sftp-deploy-mask='budget').
Record: docs/bench/sftp-mask-rounding.json (beside docs/bench/sftp-budget-p80-noc.json); quoted in
  docs/notes/2026-11-sftp-investigations.md.

Training meets the budget in expectation over the sampled gates g ~ Bernoulli(π), π = σ(s + c) (Eq.
10–14: the penalty sees T(g) of sampled gates); evaluation and compilation use the deterministic
mask 1[π > 0.5]. While gates are not yet saturated the two differ: with p = 0.8 most unsaturated
gates sit above 0.5 and round up to 1. For each finished NOC run (its masks come from the saved
global Θ alone; a +C run's masks also need the private e_k, which never leaves its client) this
prints the kept ratio of the prunable projections under the deterministic mask and in expectation
under sampling, and the share of gates with 0.1 < π < 0.9. An archived run (docs/runs/sftp/: no
`generator/`, the model files are not committed) gives only the deterministic kept ratio, from its
`masks.npz`. The record (rows, command, machine, load average) goes to `--out`;
`fedprune bench render docs/bench/sftp-mask-rounding.json` prints the table docs/methods/sftp.md
shows.

    python -m experiments.probes.sftp.mask_rounding outputs/grids/sftp/*noc*
    python -m experiments.probes.sftp.mask_rounding docs/runs/sftp/*noc* \\
        --out docs/bench/sftp-mask-rounding.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from benchmarks.render import finish_record, start_record
from fedprune_app.core.config import with_current_names
from fedprune_app.llm.models import resolve_model_path
from fedprune_app.methods.sftp.generator import MaskGenerator, mask_rounding, set_generator_state
from fedprune_app.structural.routing import MASK_NAMES, kept_parameters, prunable_parameters


def model_config(run: Path) -> object:
    model_name = str(json.loads((run / "config.json").read_text()).get("model-name", "embedded"))
    return AutoConfig.from_pretrained(resolve_model_path(model_name))


def saved_kept(run: Path) -> float:
    """The deterministic kept ratio of a NOC run's saved masks (`masks.npz`, client-<k>/<mask> of
    shape (layers, d); under NOC every client's masks are the same, checked)."""
    masks = np.load(run / "masks.npz")
    clients = sorted({k.split("/")[0] for k in masks.files})
    for client in clients[1:]:
        if any(
            not np.array_equal(masks[f"{client}/{n}"], masks[f"{clients[0]}/{n}"])
            for n in MASK_NAMES
        ):
            raise SystemExit(f"{run}: clients' masks differ, so this is not a NOC run")
    stacked = {n: torch.from_numpy(masks[f"{clients[0]}/{n}"]).float() for n in MASK_NAMES}
    layers = [
        {n: stacked[n][i] for n in MASK_NAMES} for i in range(stacked[MASK_NAMES[0]].shape[0])
    ]
    config = model_config(run)
    return float(kept_parameters(config, layers)) / prunable_parameters(config)


def rounding(run: Path) -> dict[str, float | None]:
    """`mask_rounding` of one NOC run's final global Θ (`<run>/generator/`); without it (an archived
    run) only the deterministic kept ratio of its saved masks."""
    if not (run / "generator").is_dir():
        return {"deterministic": saved_kept(run), "expected": None, "unsaturated": None}
    cfg = json.loads((run / "generator" / "config.json").read_text())
    if cfg["conditioning"]:
        raise SystemExit(f"{run}: a +C run's masks need the clients' private e_k; pass NOC runs")
    generator = MaskGenerator(
        cfg["num_layers"], cfg["hidden_size"], cfg["embed_dim"], cfg["hidden"], False
    )
    set_generator_state(generator, load_file(str(run / "generator" / "generator.safetensors")))
    with torch.no_grad():
        return mask_rounding(generator(None), float(cfg["gate-bias"]), model_config(run))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished SFT-P NOC run directories")
    parser.add_argument("--note", default="", help="free text stored in the record")
    parser.add_argument(
        "--out", default="", help="the JSON record (docs/bench/sftp-mask-rounding.json); '' = none"
    )
    args = parser.parse_args()
    record = start_record("mask-rounding", "experiments.probes.sftp.mask_rounding", note=args.note)
    record["runs"] = []
    print(f"{'run':<40} {'target':>6} {'deterministic':>13} {'expected':>8} {'0.1<π<0.9':>9}")
    for run in args.runs:
        target = with_current_names(json.loads((run / "config.json").read_text()))["keep-ratios"]
        r = rounding(run)
        record["runs"].append(
            {
                "run": run.name,
                "target": target,
                "source": "generator" if r["expected"] is not None else "masks.npz",
                **r,
            }
        )
        cells = [f"{r[k]:.3f}" if r[k] is not None else "-" for k in ("expected", "unsaturated")]
        print(f"{run.name:<40} {target:>6} {r['deterministic']:>13.3f} {cells[0]:>8} {cells[1]:>9}")
    finish_record(record, args.out)


if __name__ == "__main__":
    main()
