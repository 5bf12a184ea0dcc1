"""What FLAP's bias compensation would change on fedflap's post hoc cut: the measured half of "why
fedflap does not apply it".

Finding: FLAP's bias compensation would cut the 20% post hoc cut's answer perplexity 1.5–2.9× on
  three clients (×1.43 worse on goal_step_wikihow with in-lanes) and still leave every client 17–35×
  above the dense model, so fedflap does not apply it.
Record: docs/bench/fedflap-compensation.json; quoted in
  docs/notes/2026-11-llmpruner-investigations.md, docs/methods/fedflap.md and
  docs/methods/llmpruner.md.

For a finished fedflap run (its masks.npz is the global cut at the budget), the base model in
SFT-P's routed form is scored with those masks three ways, on each client's held-out questions (the
re-scoring set of `fedprune rescore accuracy`: its test split plus up to `--examples` unused
examples), as answer perplexity:

- `post-hoc`: the masked form as fedflap deploys it (no compensation; equals the compiled post hoc
  model);
- `comp-out`: + the compensation the compiled form could carry only with a new per-layer bus bias
  (out-lanes);
- `comp-in-out`: + the in-lane compensation as well (needs forced biases on q/k/v and gate/up).

The means come from each client's round-1 calibration batches (the batches its fedflap client
builds, seeded the same way), pooled over the clients' tokens (`compensation.pooled_means`). Per
client: each form's answer perplexity and its paired ratio to `post-hoc` with a bootstrap interval
over the answers; the dense model (the run's rescore.json `dense` row when there) for reference. No
recovery: this isolates the compensation.

    python -m experiments.probes.fedflap.compensation docs/runs/sftp/<fedflap run> \\
        --json docs/bench/fedflap-compensation.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedprune_app.core.config import RunConfig
from fedprune_app.core.runtime import client_seed
from fedprune_app.llm.data import client_data, training_batches
from fedprune_app.llm.evaluation import answer_scores
from fedprune_app.llm.intervals import TokenScores, paired_perplexity_interval
from fedprune_app.llm.models import load_base_model, load_tokenizer
from fedprune_app.methods.fedflap.compensation import compensated, pooled_means
from fedprune_app.methods.fedflap.config import FedFLAPConfig
from fedprune_app.methods.fedflap.importance import bus_moments
from fedprune_app.structural.routing import install_routing, per_layer_masks
from fedprune_cli.rescore_accuracy import evaluated_clients, held_out, num_partitions

FORMS = {"post-hoc": (), "comp-out": ("out",), "comp-in-out": ("in", "out")}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "run", type=Path, help="a finished fedflap run directory (config.json, masks.npz)"
    )
    p.add_argument(
        "--examples", type=int, default=100, help="unused examples per client beyond its test split"
    )
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--json", default="", help="record path ('' = none)")
    args = p.parse_args(argv)
    cfg = RunConfig.from_record(json.loads((args.run / "config.json").read_text()))
    if cfg.method != "fedflap" or not (args.run / "masks.npz").is_file():
        raise SystemExit(
            f"{args.run} is not a finished fedflap run (method {cfg.method!r}, masks.npz needed)"
        )
    start = time.perf_counter()
    tokenizer = load_tokenizer(cfg.model_name)
    model = load_base_model(cfg.model_name, cfg.model_dtype).eval()
    install_routing(model)
    masks = per_layer_masks(
        {k: np.asarray(v, np.float32) for k, v in np.load(args.run / "masks.npz").items()}
    )
    clients = evaluated_clients(args.run)
    partitions = num_partitions(args.run, cfg, clients)
    moments = []
    for k in clients:
        data = client_data(cfg, k, partitions)
        batches = list(
            training_batches(
                data.train,
                tokenizer,
                cfg.batch_size,
                cfg.section(FedFLAPConfig).fedflap_batches,
                cfg.seq_len,
                client_seed(cfg.seed, 1, k),
            )
        )
        moments.append(bus_moments(model, batches))
    means = pooled_means(moments)
    rescored = (
        json.loads((args.run / "rescore.json").read_text())
        if (args.run / "rescore.json").is_file()
        else {}
    )
    record: dict[str, Any] = {
        "command": "python -m experiments.probes.fedflap.compensation "
        + shlex.join(sys.argv[1:] if argv is None else argv),
        "run": str(args.run),
        "clients": {},
    }
    for k in clients:
        source, rows, _ = held_out(cfg, k, partitions, args.examples)
        scores = {}
        for form, lanes in FORMS.items():
            with torch.no_grad(), compensated(model, masks, means, lanes) as m:
                scores[form] = answer_scores(m, tokenizer, rows, cfg.seq_len, args.batch_size)
        row: dict[str, Any] = {"source": source, "examples": len(rows)}
        for form, s in scores.items():
            row[form] = {"ppl": s.perplexity}
            if form != "post-hoc":
                iv = paired_perplexity_interval(s, scores["post-hoc"], "ratio", seed=cfg.seed)
                row[form] |= {"ratio-to-post-hoc": iv.estimate, "lo": iv.lo, "hi": iv.hi}
        dense = rescored.get("models", {}).get("dense", {}).get(str(k))
        if dense and len(dense["nll"]) == len(rows):
            row["dense"] = {"ppl": TokenScores.of(dense["nll"], dense["tokens"]).perplexity}
        record["clients"][str(k)] = row
        print(
            f"client {k} ({source}, {len(rows)} answers): "
            + ", ".join(
                f"{f} {row[f]['ppl']:.1f}"
                + (
                    f" (×{row[f]['ratio-to-post-hoc']:.3f} [{row[f]['lo']:.3f}, "
                    f"{row[f]['hi']:.3f}])"
                    if f != "post-hoc"
                    else ""
                )
                for f in FORMS
            )
            + (f"; dense {row['dense']['ppl']:.1f}" if "dense" in row else ""),
            flush=True,
        )
    record["seconds"] = round(time.perf_counter() - start, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return record


if __name__ == "__main__":
    main()
