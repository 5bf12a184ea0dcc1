"""SFT-P round by round: each client's kept ratio and its deployed model's answer NLL, federated
beside alone.

Finding: It chose the presets' schedule: with the massive coordinates held open every federated
  client at keep 0.8 ends below the untouched model from round 4 on (round 6: −0.17 to −1.21 nats),
  where without them one of four did.
Record: docs/runs/sftp-trajectory/keep08-lam16-glr3e-2-tau1-lora2e-4-massive.json (and 31 more
  keep*.json there); quoted in docs/notes/2026-11-sftp-investigations.md and
  docs/notes/2026-11-claims-history.md.

Two runs of the real client (clients/sftp.py) and strategy (strategies/sftp.py) code, in this
process (no Flower messaging, no Ray):

- federated: every client trains from the global (Θ, Φ) each round, the server averages them (Eq.
  15);
- alone: each chosen client trains by itself with the same settings and seed (its (Θ, Φ) carried
  round to round, nothing averaged): what that client would reach without the federation.

After every round, each client's deployed model (`SFTPClient.own_masks`: by default the top-π gates
of h_Θ(e_k) that fit its budget, on the (Θ, Φ) it deploys: the global pair, or under
`sftp-deploy-state = "local"` its own pair of its last local steps (`SFTPClient.deployed_pair`); the
structure the server compiles) is scored by the mean answer NLL over its first `--eval-examples`
test examples, and `--unused-examples` more of its task that no split of the run reads
(`data.unused_tail`, as `fedprune rescore accuracy` adds them: 30 test questions resolve ~0.3 nats
at best); round 0 is the untouched dense model. Also per round: the kept share of the prunable
projections, the mean CLM loss and penalty of the local steps, and ‖Φ − Φ_0‖ (how far the adapters
moved).

    python -m experiments.probes.sftp.trajectory \\
        --run-config "keep-ratios='0.8' num-server-rounds=8 local-steps=25" \\
        --out docs/runs/sftp-trajectory/keep08.json
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict

from clients.sftp import SFTPClient
from fedprune_app.core.config import RunConfig
from fedprune_app.core.protocol import flat_metrics, numpy_state
from fedprune_app.core.runtime import quiet_libraries
from fedprune_app.llm.data import Example, unused_tail
from fedprune_app.llm.evaluation import answer_scores
from fedprune_app.llm.intervals import TokenScores
from fedprune_app.llm.models import model_device
from fedprune_app.methods.sftp.generator import GENERATOR_PREFIX
from fedprune_app.structural.routing import masked, model_kept_ratios
from fedprune_cli.launch import APP_DIR, merged_config
from fedprune_cli.rescore_accuracy import question_digest
from strategies.sftp import SFTPStrategy


def message(arrays: ArrayRecord, server_round: int) -> RecordDict:
    return RecordDict({"arrays": arrays, "config": ConfigRecord({"server-round": server_round})})


def make_client(cfg: RunConfig, partition: int, partitions: int) -> SFTPClient:
    context = Context(
        run_id=1,
        node_id=partition + 1,
        node_config={"partition-id": partition, "num-partitions": partitions},
        state=RecordDict(),
        run_config=cfg.to_dict(),
    )
    return SFTPClient(cfg, context)


def adapter_shift(arrays: ArrayRecord, initial: dict[str, np.ndarray]) -> float:
    """‖Φ − Φ_0‖ over the LoRA tensors (0 under NOA)."""
    state = numpy_state(arrays)
    keys = [k for k in state if not k.startswith(GENERATOR_PREFIX)]
    return float(
        math.sqrt(sum(float(((state[k] - initial[k]).astype(np.float64) ** 2).sum()) for k in keys))
    )


def scored_questions(client: SFTPClient, examples: int, unused: int) -> list[Example]:
    """The client's first `examples` test questions, then up to `unused` of its task that no split
    reads."""
    tail = unused_tail(client.cfg, client.data.eval_source, unused) if unused else []
    return list(client.data.test[:examples]) + tail


def masked_answer_scores(
    model: Any, tokenizer: Any, rows: list[Example], masks: Any, seq_len: int
) -> TokenScores:
    """Per-question answer NLL and token counts of the routed model under `masks` (None = dense)."""
    with masked(model, masks), torch.no_grad():
        return answer_scores(model, tokenizer, rows, seq_len)


def deployed(
    client: SFTPClient, arrays: ArrayRecord, server_round: int, rows: list[Example]
) -> dict[str, Any]:
    """Answer NLL and kept ratio of the client's deployed model (dense at round 0) on `rows`, each
    question's summed answer NLL and token count (`example-nll`, `example-tokens`) and the
    questions' digest: two records scored on the same questions (one client, seed and question
    counts) can be paired by `probes.sftp.trajectory_compare`."""
    model, tokenizer, generator = client.load(message(arrays, server_round))
    masks = (
        None
        if server_round == 0
        else client.own_masks(
            model, tokenizer, generator, client.client_state(model_device(model)).embedding
        )
    )
    scores = masked_answer_scores(model, tokenizer, rows, masks, client.cfg.seq_len)
    return {
        "answer-nll": scores.mean_nll,
        "questions": question_digest(rows),
        "kept": model_kept_ratios(model, masks)["kept-ratio-prunable"],
        "example-nll": [round(float(v), 5) for v in scores.nll],
        "example-tokens": scores.tokens.tolist(),
    }


def trajectory(
    cfg: RunConfig,
    partitions: int,
    alone: list[int],
    examples: int,
    log: Any = print,
    on_round: Any = None,
    federate: bool = True,
    unused: int = 0,
) -> list[dict[str, Any]]:
    """The rows: one per (mode, client, round), each scored on
    `scored_questions(client, examples, unused)`; `on_round(rows)` after every round (to save what
    is done). `federate=False` runs only the `alone` clients (and their untouched round 0): a client
    alone beside a federated trajectory already recorded, at a fraction of the time."""
    rows: list[dict[str, Any]] = []
    server = SFTPStrategy(cfg)
    initial = server.initial_arrays()
    phi0 = numpy_state(initial)
    federated = [make_client(cfg, k, partitions) for k in range(partitions)] if federate else []
    by_itself = {k: make_client(cfg, k, partitions) for k in alone}
    own = {k: initial for k in alone}
    servers = {k: SFTPStrategy(cfg) for k in alone}
    questions = {
        c.partition_id: scored_questions(c, examples, unused)
        for c in [*federated, *by_itself.values()]
    }

    def add(
        mode: str, client: SFTPClient, rnd: int, arrays: ArrayRecord, reply: RecordDict | None
    ) -> None:
        row: dict[str, Any] = {
            "mode": mode,
            "client": client.partition_id,
            "round": rnd,
            "data": client.data.eval_source,
            "keep-target": client.keep_ratio,
            **deployed(client, arrays, rnd, questions[client.partition_id]),
            "adapter-shift": adapter_shift(arrays, phi0),
        }
        if reply is not None:
            metrics = flat_metrics(reply)
            row |= {
                "clm-loss": metrics["clm-loss"],
                "penalty": metrics["penalty"],
                "train-seconds": metrics["train-seconds"],
            }
        rows.append(row)
        log(
            f"{mode:9s} client {row['client']} round {rnd:2d}: kept {row['kept']:.3f}  answer NLL "
            f"{row['answer-nll']:.3f}  |Φ-Φ0| {row['adapter-shift']:.3f}"
            + (
                f"  clm {row['clm-loss']:.3f} penalty {row['penalty']:.3f}"
                if reply is not None
                else ""
            )
        )

    for client in federated or list(by_itself.values()):
        add("untouched", client, 0, initial, None)
    arrays = initial
    for rnd in range(1, cfg.num_server_rounds + 1):
        if federated:
            replies = [client.train(message(arrays, rnd)) for client in federated]
            arrays = server.aggregate(rnd, replies)
            for client, reply in zip(
                federated, replies, strict=True
            ):  # the pair it deploys: global or its own
                pair = client.deployed_pair(message(arrays, rnd), client.client_state())
                add("federated", client, rnd, ArrayRecord(pair), reply)
        for k, client in by_itself.items():
            reply = client.train(message(own[k], rnd))
            own[k] = servers[k].aggregate(rnd, [reply])
            add("alone", client, rnd, own[k], reply)
        if on_round is not None:
            on_round(rows)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Answer NLL (kept) per client and round: untouched, federated, alone side by side."""
    clients = sorted({r["client"] for r in rows})
    rounds = sorted({r["round"] for r in rows if r["round"] > 0})
    cell = {(r["mode"], r["client"], r["round"]): r for r in rows}
    head = "| round | " + " | ".join(f"client {c} fed | client {c} alone" for c in clients) + " |"
    out = [head, "|---|" + "---|---|" * len(clients)]
    out.append(
        "| 0 (untouched) | "
        + " | ".join(f"{cell[('untouched', c, 0)]['answer-nll']:.3f} | " for c in clients)
        + " |"
    )
    for rnd in rounds:
        parts = []
        for c in clients:
            for mode in ("federated", "alone"):
                r = cell.get((mode, c, rnd))
                parts.append("" if r is None else f"{r['answer-nll']:.3f} ({r['kept']:.3f})")
        out.append(f"| {rnd} | " + " | ".join(parts) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="conf/sftp.toml")
    parser.add_argument("--run-config", default="", help="'key=value ...' overrides (TOML values)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--alone", default="all", help="clients also run alone: 'all', 'none' or '0,2'"
    )
    parser.add_argument(
        "--federated",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="--no-federated: run only the --alone clients",
    )
    parser.add_argument(
        "--eval-examples", type=int, default=60, help="test examples scored per client"
    )
    parser.add_argument(
        "--unused-examples",
        type=int,
        default=0,
        help="and up to this many unused examples of the client's task (rescore_accuracy's 100)",
    )
    parser.add_argument("--out", type=Path, help="write the rows (and the settings) as JSON here")
    args = parser.parse_args(argv)
    cfg = RunConfig.from_flower(
        merged_config(APP_DIR, [args.preset, *([args.run_config] if args.run_config else [])])
    )
    quiet_libraries()
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    alone = (
        list(range(args.partitions))
        if args.alone == "all"
        else []
        if args.alone == "none"
        else [int(v) for v in args.alone.split(",")]
    )
    start = time.perf_counter()
    given = sys.argv[1:] if argv is None else argv

    def save(rows: list[dict[str, Any]], done: bool = False) -> None:
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            command = "python -m experiments.probes.sftp.trajectory " + shlex.join(given)
            record = {
                "command": command,
                "config": cfg.to_dict(),
                "partitions": args.partitions,
                "alone": alone,
                "federated": args.federated,
                "eval-examples": args.eval_examples,
                "unused-examples": args.unused_examples,
                "finished": done,
                "seconds": round(time.perf_counter() - start, 1),
                "rows": rows,
            }
            args.out.write_text(json.dumps(record, indent=1))

    if not args.federated and not alone:
        parser.error("--no-federated needs at least one --alone client")
    rows = trajectory(
        cfg,
        args.partitions,
        alone,
        args.eval_examples,
        on_round=save,
        federate=args.federated,
        unused=args.unused_examples,
    )
    save(rows, done=True)
    print(table(rows))
    print(f"{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
