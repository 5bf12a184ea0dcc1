"""How many samples ITPA's mean feature needs: the spread of the clients' cosine distances (Eq. 3–4)
against the noise of estimating them from n samples, per data split.

Finding: At 16 samples per client the estimate's noise exceeds the clients' spread in every split
  (signal / noise 0.25–0.84), so conf/fedtpa.toml uses every training example
  (fedtpa-feature-examples = 0).
Record: docs/bench/fedtpa-itpa-samples.json; quoted in docs/notes/2026-11-fedtpa-investigations.md
  and docs/methods/fedtpa.md.

For each split of the FedTPA grid (α = inf: IID, 1 and 0.5: Dirichlet over the task categories; 5
clients, the `conf/fedtpa.toml` data), every client's per-sample features (the backbone's final
hidden state, mean-pooled over the sample's tokens: `clients.fedtpa.mean_feature` on one sample) are
computed once for up to `--pool` of its training examples. Then, per sample count n in `--counts`
and `--repeats` times: each client draws n of them (seeded, with replacement: a bootstrap of an
n-sample draw from its data), λ_i = their mean, d_i = `cosine_distances` (λ_g weighted by data size,
as the server does). Reported per (split, n):

- signal: the spread of the clients' distances, std over clients of their mean d_i over the repeats;
- noise: the mean over clients of d_i's std over the repeats (what the n-sample estimate adds);
- the split's mean distance over clients with a 95% interval over the repeats, to see whether the
  splits separate.

A count is enough when signal / noise is well above 1 (ITPA's Eq. 5 stretches whatever spread it
sees onto [β_m, 1], so at signal / noise ≈ 1 the initial β are noise). No training, no Flower.

    python -m experiments.probes.fedtpa.itpa_samples --counts 16,64,256 \\
        --out docs/bench/fedtpa-itpa-samples.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clients.fedtpa import mean_feature
from fedprune_app.core.config import RunConfig
from fedprune_app.core.runtime import quiet_libraries
from fedprune_app.llm.data import client_data
from fedprune_app.llm.models import load_base_model, load_tokenizer
from fedprune_app.methods.fedtpa.aggregation import cosine_distances
from fedprune_cli.launch import APP_DIR, merged_config

SPLITS = {
    "inf": 'partitioner="iid"',
    "1": 'partitioner="dirichlet" dirichlet-alpha=1.0',
    "0.5": 'partitioner="dirichlet" dirichlet-alpha=0.5',
}


def sample_features(model: Any, tokenizer: Any, examples: list[Any], seq_len: int) -> np.ndarray:
    """(samples, d): each example's mean-pooled final hidden state, as `mean_feature` computes it
    for one sample."""
    return np.stack([mean_feature(model, tokenizer, [e], seq_len, 1) for e in examples])


def spread(
    features: list[np.ndarray], sizes: list[float], n: int, repeats: int, seed: int
) -> dict[str, Any]:
    """Distances of `repeats` draws of n samples per client (each client's rows of `features`)."""
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(repeats):
        lams = [f[rng.choice(len(f), size=n, replace=True)].mean(0) for f in features]
        draws.append(cosine_distances(np.stack(lams), sizes))
    d = np.stack(draws)  # (repeats, clients)
    signal, noise = float(d.mean(0).std()), float(d.std(0).mean())
    means = d.mean(1)
    return {
        "n": n,
        "distances-mean-per-client": d.mean(0).tolist(),
        "signal": signal,
        "noise": noise,
        "signal-to-noise": signal / noise if noise > 0 else math.inf,
        "mean-distance": float(means.mean()),
        "mean-distance-95": [float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="conf/fedtpa.toml")
    p.add_argument("--splits", default="inf,1,0.5")
    p.add_argument("--clients", type=int, default=5)
    p.add_argument("--counts", default="16,64,256")
    p.add_argument(
        "--pool", type=int, default=256, help="examples per client whose features are computed"
    )
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    quiet_libraries()
    torch.set_num_threads(1)
    counts = [int(c) for c in args.counts.split(",")]
    start, load = time.perf_counter(), os.getloadavg()
    record: dict[str, Any] = {
        "command": "python -m experiments.probes.fedtpa.itpa_samples "
        + shlex.join(sys.argv[1:] if argv is None else argv),
        "load-average": {"start": list(load)},
        "splits": {},
    }
    model = tokenizer = None
    for split in args.splits.split(","):
        cfg = RunConfig.from_flower(merged_config(APP_DIR, [args.preset, SPLITS[split]]))
        if model is None:
            model, tokenizer = (
                load_base_model(cfg.model_name).eval(),
                load_tokenizer(cfg.model_name),
            )
        datas = [client_data(cfg, k, args.clients) for k in range(args.clients)]
        feats = [
            sample_features(model, tokenizer, d.train[: args.pool], cfg.seq_len) for d in datas
        ]
        sizes = [float(len(d.train)) for d in datas]
        rows = [spread(feats, sizes, n, args.repeats, args.seed) for n in counts]
        record["splits"][split] = {
            "train-examples": [len(d.train) for d in datas],
            "pooled": [len(f) for f in feats],
            "counts": rows,
        }
        for r in rows:
            print(
                f"α={split} n={r['n']}: mean d {r['mean-distance']:.4f} "
                f"[{r['mean-distance-95'][0]:.4f}, {r['mean-distance-95'][1]:.4f}]  signal "
                f"{r['signal']:.4f}  noise {r['noise']:.4f}  signal/noise "
                f"{r['signal-to-noise']:.2f}",
                flush=True,
            )
    record["seconds"] = round(time.perf_counter() - start, 1)
    record["load-average"]["end"] = list(os.getloadavg())
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return record


if __name__ == "__main__":
    main()
