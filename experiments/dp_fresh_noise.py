"""Fresh DP noise on the embedded model: two DP runs with the same seed and config release different
adapters; the same pair without noise releases identical ones.

    python -m experiments.dp_fresh_noise [--out docs/runs/dp-fresh-noise]

Four `fedprune run`s of the smoke preset (FedIT, 1 round, 4 SuperNodes, SmolLM2-135M-Instruct) with
client-level DP at C = 0.1: two with σ = 1.0, two with σ = 0, every other key (the seed included)
the same. Each adapter is compared with its pair's and with the noise-free one: a release minus the
noise-free release is its noise, whose standard deviation should be σ·C/m. Writes
`<out>/record.json` (commands, adapter sha256, differences, noise std, ε, seconds) and keeps each
run's config.json, summary.json, results.md and privacy-ledger.json under `<out>/<run>/`; the run
directories themselves go to `outputs/dp-fresh-noise/`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "outputs" / "dp-fresh-noise"
C, SIGMA = 0.1, 1.0
KEPT = ("config.json", "summary.json", "results.md", "privacy-ledger.json")


def command(tag: str, sigma: float) -> list[str]:
    overrides = (
        f"dp-clipping-norm={C} dp-noise-multiplier={sigma} seed=0 run-tag='{tag}' "
        f"output-dir='{RUNS}'"
    )
    return [
        str(Path(sys.executable).with_name("fedprune")),
        "run",
        "--run-config",
        "conf/smoke.toml",
        "--run-config",
        overrides,
    ]


def adapter(run: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(run / "adapter" / "adapter_model.safetensors"))


def difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate(
        [(a[k].astype(np.float64) - b[k].astype(np.float64)).ravel() for k in sorted(a)]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "runs" / "dp-fresh-noise")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, Any]] = {}
    for tag, sigma in (("dp-a", SIGMA), ("dp-b", SIGMA), ("nonoise-a", 0.0), ("nonoise-b", 0.0)):
        before = set(RUNS.iterdir()) if RUNS.exists() else set()
        started = time.time()
        proc = subprocess.run(command(tag, sigma), cwd=ROOT)
        (run,) = sorted(set(RUNS.iterdir()) - before)
        summary = json.loads((run / "summary.json").read_text())
        runs[tag] = {
            "command": " ".join(command(tag, sigma)[1:]),
            "exit": proc.returncode,
            "status": summary["status"],
            "seconds": round(time.time() - started, 1),
            "run": run.name,
            "sigma": sigma,
            "epsilon": (summary.get("privacy") or {}).get("epsilon"),
            "adapter-sha256": hashlib.sha256(
                (run / "adapter" / "adapter_model.safetensors").read_bytes()
            ).hexdigest(),
        }
        (args.out / run.name).mkdir(exist_ok=True)
        for name in KEPT:
            if (run / name).is_file():
                shutil.copy(run / name, args.out / run.name / name)
        print(json.dumps(runs[tag]), flush=True)
    states = {tag: adapter(RUNS / r["run"]) for tag, r in runs.items()}
    m = 4  # the smoke preset: 4 SuperNodes, fraction-train 1
    noise = {tag: difference(states[tag], states["nonoise-a"]) for tag in ("dp-a", "dp-b")}
    record = {
        "machine": {"cpu": platform.processor() or platform.machine(), "python": sys.version},
        "runs": runs,
        "noise-free pair identical": bool(
            np.array_equal(difference(states["nonoise-a"], states["nonoise-b"]), 0 * noise["dp-a"])
        ),
        "dp pair max |difference|": float(np.abs(difference(states["dp-a"], states["dp-b"])).max()),
        "noise std, expected σ·C/m": SIGMA * C / m,
        "noise std, measured": {tag: float(n.std()) for tag, n in noise.items()},
        "noise correlation dp-a vs dp-b": float(np.corrcoef(noise["dp-a"], noise["dp-b"])[0, 1]),
        "entries": int(noise["dp-a"].size),
    }
    (args.out / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "runs"}, indent=1))
    return 0 if all(r["exit"] == 0 for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
