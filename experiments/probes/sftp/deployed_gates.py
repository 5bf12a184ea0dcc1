"""Why an SFT-P client deploys the mask it does: its gate probabilities under the Θ it deploys.

Finding: In the mixed-budget run with the budget warm-up the 50% clients' e_k give almost the 20%
  clients' gates (mean π 0.69 against 0.71), so the budget rule cuts inside saturated gates (highest
  dropped π 0.999) and the mixed preset keeps no warm-up (conf/sftp-mixed.toml).
Record: docs/runs/sftp-diagnostics/mixed-w300-deployed-gates.json (and 7 more *.json there); quoted
  in docs/notes/2026-11-sftp-investigations.md.

For each client of a finished run (`--partial`: of the round a stopped or running run's checkpoint
holds): π = σ(h_Θ(e_k) + c) (Eq. 12) from the Θ the client deploys and its private e_k as its device
saved it (`<state-dir>/<run key>/partition-<k>/round-<last>.pb`, written by every Flower client of a
run with `checkpoint-every` > 0). The deployed (Θ, Φ) is the checkpoint's global pair, or under
`sftp-deploy-state = "local"` the client's own pair of its last local steps, also in its saved state
(`SFTPClient.deployed_pair`). Then how the budget rule (`deployed_gates`) cut it: the share of gates
with π > 0.5 / 0.9 / 0.99, the lowest π kept and the highest π dropped. When the highest dropped π
is near 1 the budget cut falls inside gates the generator holds fully open, so which of them are
dropped is not something the training chose. Also |e_k| and the clients' pairwise distances
|e_i − e_j| (none under NOC). `--score K` adds client K's answer NLL on its test questions
(`--examples`) for the deployed model, the same mask with the adapters off, and the deployed Φ under
each `--masks-from` run's mask for that client, each paired with the deployed model (nats, 95%
bootstrap interval over questions). `--fit` adds, for that client, what training reports against
what the deployed model does: the whole-sequence CLM (the loss Eq. 13 trains) and the answer NLL
(what the client is scored on), on its first `--examples` training and validation rows, under the
deployed mask, under masks sampled from π as in training (Eq. 12, one draw per batch of 4), and for
the untouched model (adapters off, no mask).

    python -m experiments.probes.sftp.deployed_gates \\
        outputs/grids/sftp-w300/20261128-140022-sftp-mixed-c-a \\
        --score 3 --masks-from docs/runs/sftp/20261128-082656-sftp-p50-c-a --out <record.json>
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

from experiments.grids.sftp.records import read_masks
from experiments.probes.sftp.trajectory import make_client, masked_answer_scores, message
from experiments.probes.sftp.trajectory_compare import nll_difference
from fedprune_app.core.checkpoint import STATE_FILE, client_state_dir
from fedprune_app.core.config import RunConfig
from fedprune_app.core.runtime import quiet_libraries
from fedprune_app.core.statefile import read_records, read_state
from fedprune_app.llm.data import collate, encode
from fedprune_app.methods.sftp.config import SFTPConfig
from fedprune_app.methods.sftp.generator import (
    MASK_NAMES,
    sampled_masks,
    stacked_masks,
)
from fedprune_app.methods.sftp.models import load_pair
from fedprune_app.structural.held import held_coordinates
from fedprune_app.structural.routing import masked, per_layer_masks


def gate_stats(pi: np.ndarray, deployed: np.ndarray) -> dict[str, float]:
    """Distribution of the gate probabilities `pi` and where the deployed 0/1 gates (same shape) cut
    it."""
    kept, dropped = pi[deployed], pi[~deployed]
    return {
        "mean-pi": float(pi.mean()),
        "above-0.5": float((pi > 0.5).mean()),
        "above-0.9": float((pi > 0.9).mean()),
        "above-0.99": float((pi > 0.99).mean()),
        "kept-share": float(deployed.mean()),
        "lowest-kept-pi": float(kept.min()) if kept.size else float("nan"),
        "highest-dropped-pi": float(dropped.max()) if dropped.size else float("nan"),
    }


def load_run(run: Path, partial: bool = False) -> tuple[RunConfig, ArrayRecord, int, str]:
    """The run's config and its last round's global arrays (Θ, Φ), round and run key from its
    checkpoint; with `partial`, the round the checkpoint holds (a run still going or stopped
    early)."""
    cfg = RunConfig.from_record(json.loads((run / "config.json").read_text()))
    path = run / "checkpoint" / STATE_FILE
    if not path.is_file():
        raise SystemExit(
            f"{run} has no checkpoint/{STATE_FILE}: the run must have been written with "
            "checkpoint-every > 0 (its outputs/ directory, not the archived records)"
        )
    state = read_state(path)
    if int(state["round"]) != cfg.num_server_rounds and not partial:
        raise SystemExit(
            f"{run}'s checkpoint is of round {state['round']}, not the last "
            f"({cfg.num_server_rounds})"
        )
    arrays = ArrayRecord({k: Array(np.asarray(v)) for k, v in state["arrays"].items()})
    return cfg, arrays, int(state["round"]), str(state["run-key"])


def count_partitions(run: Path, run_key: str, state_dir: str | None) -> int:
    """The run's clients: from its summary.json when finished, else the partitions whose private
    state was saved."""
    summary = run / "summary.json"
    if summary.is_file():
        return len(json.loads(summary.read_text())["clients"])
    return len(list(client_state_dir(state_dir, run_key, 0).parent.glob("partition-*")))


def client_at_end(
    cfg: RunConfig,
    arrays: ArrayRecord,
    last: int,
    run_key: str,
    state_dir: str | None,
    k: int,
    partitions: int,
) -> tuple[Any, Any, Any, Any, torch.Tensor]:
    """(client, model, tokenizer, generator, e_k) of client k with its saved private state after the
    last round; the model and generator of the (Θ, Φ) it deploys (the global pair or, under 'local',
    its own)."""
    client = make_client(cfg, k, partitions)
    saved = client_state_dir(state_dir, run_key, k) / f"round-{last}.pb"
    if not saved.is_file():
        raise SystemExit(
            f"client {k}'s private state {saved} is missing (pass --state-dir where its "
            "device kept it)"
        )
    client.context.state = read_records(saved)
    state = client.client_state()
    model, tokenizer, generator = load_pair(cfg, client.deployed_pair(message(arrays, last), state))
    embedding = state.embedding
    return client, model, tokenizer, generator, embedding


def sequence_nll(
    model: Any, tokenizer: Any, rows: list[Any], seq_len: int, masks: Any, batch_size: int = 4
) -> float:
    """Token-weighted whole-sequence CLM (every token a target, `encode(..., "sequence")`) of the
    routed model over `rows` in padded batches; `masks`: one mask for all batches, a callable
    drawing one per batch, or None."""
    total, count = 0.0, 0
    for i in range(0, len(rows), batch_size):
        batch = collate(
            [encode(tokenizer, r, seq_len, "sequence") for r in rows[i : i + batch_size]],
            tokenizer.pad_token_id,
        )
        n = int((batch["labels"][:, 1:] != -100).sum())
        routing = (
            nullcontext() if masks is None else masked(model, masks() if callable(masks) else masks)
        )  # None: the model as it is (a plain HF model too)
        with routing, torch.no_grad():
            total += float(model(**batch).loss) * n
        count += n
    return total / count


def fit(
    client: Any, model: Any, tokenizer: Any, generator: Any, e: Any, masks: Any, n: int
) -> dict[str, Any]:
    """{split: {model: {"sequence-clm", "answer-nll"}}} on the client's first `n` train / val rows,
    for the deployed mask, masks sampled from π as in training (seeded), and the untouched model
    (`--fit`)."""
    cfg, sftp_cfg = client.cfg, client.cfg.section(SFTPConfig)
    held, rng = held_coordinates(cfg, model, tokenizer), torch.Generator().manual_seed(0)

    def sampled() -> Any:
        with torch.no_grad():
            return sampled_masks(
                generator(e), sftp_cfg.sftp_gate_tau, sftp_cfg.sftp_gate_bias, held, rng
            )

    def scores(
        rows: list[Any], chosen: Any
    ) -> dict[str, float]:  # answers: one draw of a sampled mask for all
        answer = masked_answer_scores(
            model, tokenizer, rows, chosen() if callable(chosen) else chosen, cfg.seq_len
        )
        return {
            "sequence-clm": sequence_nll(model, tokenizer, rows, cfg.seq_len, chosen),
            "answer-nll": answer.mean_nll,
        }

    out: dict[str, Any] = {}
    for split, rows in (("train", list(client.data.train[:n])), ("val", list(client.data.val[:n]))):
        out[split] = {
            "deployed mask": scores(rows, masks),
            "sampled masks": scores(rows, sampled),
            "rows": len(rows),
        }
        with model.disable_adapter():
            out[split]["untouched"] = scores(rows, None)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "run", type=Path, help="a finished SFT-P run directory with checkpoint/ and masks.npz"
    )
    parser.add_argument(
        "--partial",
        action="store_true",
        help="read the round the checkpoint holds (a run still going or stopped early)",
    )
    parser.add_argument(
        "--state-dir", help="the clients' state-dir (default: the fedprune cache's client-state)"
    )
    parser.add_argument(
        "--score", type=int, help="also score this client's deployed model and its variants"
    )
    parser.add_argument(
        "--masks-from", type=Path, nargs="*", default=[], help="runs whose masks.npz to swap in"
    )
    parser.add_argument(
        "--examples",
        type=int,
        default=30,
        help="test questions scored, and with --fit train / val rows (default 30)",
    )
    parser.add_argument(
        "--fit",
        action="store_true",
        help="with --score K: training vs deployed losses of client K on its train and val rows",
    )
    parser.add_argument("--out", type=Path, help="write the record (JSON) here")
    args = parser.parse_args(argv)
    if args.fit and args.score is None:
        parser.error("--fit needs --score K (the client whose fit to measure)")
    quiet_libraries()
    start = time.perf_counter()
    cfg, arrays, last, run_key = load_run(args.run, args.partial)
    torch.set_num_threads(max(1, cfg.torch_threads))
    partitions = count_partitions(args.run, run_key, args.state_dir)
    bias = cfg.section(SFTPConfig).sftp_gate_bias
    given = sys.argv[1:] if argv is None else argv
    record: dict[str, Any] = {
        "command": "python -m experiments.probes.sftp.deployed_gates " + shlex.join(given),
        "run": args.run.name,
        "round": last,
        "clients": {},
    }
    embeddings: list[torch.Tensor] = []
    for k in range(partitions):
        client, model, tokenizer, generator, e = client_at_end(
            cfg, arrays, last, run_key, args.state_dir, k, partitions
        )
        with torch.no_grad():
            pi = torch.sigmoid(generator(e).float() + bias).cpu().numpy()  # (layers, 4, d)
            masks = client.own_masks(model, tokenizer, generator, e)
        deployed = np.stack([stacked_masks(masks)[n].bool().cpu().numpy() for n in MASK_NAMES], 1)
        if e is not None:  # NOC has no e_k
            embeddings.append(e.detach().float().cpu())
        stats = {
            "keep-target": client.keep_ratio,
            "embedding-norm": float(embeddings[-1].norm()) if e is not None else float("nan"),
            **gate_stats(pi, deployed),
        }
        record["clients"][str(k)] = stats
        print(
            f"client {k} (p {client.keep_ratio:g}): "
            + ", ".join(f"{key} {v:.3f}" for key, v in stats.items() if key != "keep-target"),
            flush=True,
        )
        if args.score != k:
            continue
        rows = list(client.data.test[: args.examples])
        phi = "own Φ" if cfg.section(SFTPConfig).sftp_deploy_state == "local" else "global Φ"
        base = masked_answer_scores(model, tokenizer, rows, masks, cfg.seq_len)
        variants = {f"deployed (its mask, {phi})": base}
        with model.disable_adapter():
            variants["its mask, adapters off"] = masked_answer_scores(
                model, tokenizer, rows, masks, cfg.seq_len
            )
        for other in args.masks_from:
            theirs = per_layer_masks(
                {n: m.astype(np.float32) for n, m in read_masks(other)[k].items()}
            )
            variants[f"{other.name}'s mask, {phi}"] = masked_answer_scores(
                model, tokenizer, rows, theirs, cfg.seq_len
            )
        scored = {}
        for name, s in variants.items():
            diff = nll_difference(s, base, 2000, 0)
            scored[name] = {
                "answer-nll": s.mean_nll,
                "minus-deployed": list(diff),
                "questions": len(s.nll),
            }
            print(
                f"  {name}: answer NLL {s.mean_nll:.3f}, − deployed {diff[0]:+.3f} "
                f"[{diff[1]:+.3f}, {diff[2]:+.3f}]",
                flush=True,
            )
        record["clients"][str(k)]["scored"] = scored
        if args.fit:
            record["clients"][str(k)]["fit"] = fitted = fit(
                client, model, tokenizer, generator, e, masks, args.examples
            )
            for split in ("train", "val"):
                print(
                    f"  {split} ({fitted[split]['rows']} rows): "
                    + "; ".join(
                        f"{name} CLM {v['sequence-clm']:.3f} answer {v['answer-nll']:.3f}"
                        for name, v in fitted[split].items()
                        if name != "rows"
                    ),
                    flush=True,
                )
    if embeddings:
        stacked = torch.stack(embeddings)
        record["embedding-distances"] = torch.cdist(stacked, stacked).round(decimals=3).tolist()
        print(
            "|e_i − e_j|: "
            + "; ".join(" ".join(f"{d:.2f}" for d in row) for row in record["embedding-distances"])
        )
    record["seconds"] = round(time.perf_counter() - start, 1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
