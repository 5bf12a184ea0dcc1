"""Peak server memory of one FedSpaLLM aggregation: every reply held, then aggregated (the baseline,
what the server did before replies were folded in as they arrive), against `FedSpaLLMStrategy`'s
streaming fold (`accept_reply`, `folds_replies`).

Finding: Folding each reply in as it arrives peaks at 1,541 MB against 3,583 MB for holding 16
  clients × 8 layers (2.33×), with the same global weights, so FedSpaLLMStrategy folds replies in
  one by one.
Record: docs/bench/aggregation-memory.json; quoted in docs/methods/fedspallm.md.

N clients each reply with `--layers` pruned SmolLM2 decoder layers (fp32 kept values + bit-packed
masks, 50% random masks). The baseline holds the N replies (as a grid's `send_and_receive` list
does) and then takes numpy copies of every reply's arrays per matrix for `l0_aggregate`; the
streaming path builds each reply when it "arrives", folds it in and drops it. Both give the same
global weights (checked). Peak = tracemalloc's peak of what the aggregation allocates (numpy and the
records' bytes), after the train messages are built.

Each `--runs` entry CxK is one measurement (C clients, K layers per reply). The record (figures,
command, machine, load average) goes to `--out`;
`fedprune bench render docs/bench/aggregation-memory.json` prints the table
docs/methods/fedspallm.md shows.

    .venv/bin/python -m experiments.benchmarks.aggregation_memory [--runs 8x4,16x8,16x15]
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
from collections.abc import Callable, Iterator

import numpy as np
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from benchmarks.render import finish_record, start_record
from fedprune_app.core.config import RunConfig
from fedprune_app.core.encoding import decode_dense, decode_sparse, encode_sparse, unpack_kept
from fedprune_app.core.protocol import record_bytes
from fedprune_app.core.replies import to_record
from fedprune_app.core.runtime import quiet_libraries
from fedprune_app.methods.fedspallm.aggregation import expand_masks, l0_aggregate
from fedprune_app.methods.fedspallm.config import FedSpaLLMConfig
from fedprune_app.methods.fedspallm.masks import MASK_SUFFIX
from strategies.fedspallm import FedSpaLLMStrategy


class Nodes:
    def __init__(self, n: int) -> None:
        self.n = n

    def get_node_ids(self) -> list[int]:
        return list(range(1, self.n + 1))


def reply_to(msg: Message, seed: int, shapes: dict[str, tuple[int, ...]]) -> Message:
    """A client's reply: the sent weights, perturbed, pruned by a random 50% mask (in the wire
    encoding)."""
    rng = np.random.default_rng(seed)
    arrays = {k: v.numpy() for k, v in msg.content.array_records["arrays"].items()}
    sent = decode_dense(arrays, {k: shapes[k] for k in arrays if not k.endswith(MASK_SUFFIX)})
    weights, masks = {}, {}
    for key, w in sent.items():
        masks[key] = rng.random(w.shape, dtype=np.float32) > 0.5
        weights[key] = np.where(masks[key], w + np.float32(1e-3), 0).astype(np.float32)
    content = RecordDict(
        {
            "arrays": to_record(encode_sparse(weights, masks)),
            "metrics": MetricRecord({"num-examples": 32, "partition-id": seed}),
        }
    )
    return Message(content=content, reply_to=msg)


def hold_then_aggregate(strategy: FedSpaLLMStrategy, replies: list[Message]) -> None:
    """The baseline: all replies in memory, then numpy copies of every reply's arrays per matrix
    (Eq. 5–7)."""
    prune_cfg = strategy.cfg.section(FedSpaLLMConfig)
    by_key: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    for msg in replies:
        arrays = {k: v.numpy() for k, v in msg.content.array_records["arrays"].items()}
        shapes = {k: strategy.global_state[k].shape for k in arrays if not k.endswith(MASK_SUFFIX)}
        for key, (values, mask) in decode_sparse(arrays, shapes).items():
            ws, ms = by_key.setdefault(key, ([], []))
            ws.append(unpack_kept(values, mask))
            ms.append(mask)
    for key, (ws, ms) in by_key.items():
        merged, pruned = l0_aggregate(ws, ms)
        strategy.global_state[key], _ = expand_masks(merged, pruned, len(ws), prune_cfg.sparsity)


def streaming(strategy: FedSpaLLMStrategy, sent: list[Message]) -> None:
    """Replies built as they "arrive" and handed to the strategy one by one
    (`collect_train` -> `accept_reply`)."""
    arriving: Iterator[Message] = (reply_to(m, i, shapes_of(strategy)) for i, m in enumerate(sent))
    assert strategy.aggregate_train(1, arriving)[0] is not None


def hold_all(strategy: FedSpaLLMStrategy, sent: list[Message]) -> None:
    hold_then_aggregate(strategy, [reply_to(m, i, shapes_of(strategy)) for i, m in enumerate(sent)])


def shapes_of(strategy: FedSpaLLMStrategy) -> dict[str, tuple[int, ...]]:
    return {k: v.shape for k, v in strategy.global_state.items()}


def measure(
    run: Callable[[FedSpaLLMStrategy, list[Message]], None], clients: int, layers: int
) -> tuple[float, float, float, dict[str, np.ndarray]]:
    """(peak MB allocated while `run` aggregates, seconds, MB of one reply, the new global
    weights)."""
    strategy = FedSpaLLMStrategy(
        RunConfig.from_flower({"seed": 0, "fedspallm-resources": str(layers / 30)})
    )
    strategy.initial_arrays()
    sent = list(strategy.configure_train(1, to_record({}), ConfigRecord(), Nodes(clients)))
    reply_mb = record_bytes(reply_to(sent[0], 0, shapes_of(strategy)).content) / 2**20
    tracemalloc.start()
    start = time.perf_counter()
    run(strategy, sent)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20, seconds, reply_mb, strategy.global_state


def run(clients: int, layers: int) -> dict[str, object]:
    """One CxK measurement: both paths' peaks and seconds, and whether they give the same global
    weights."""
    base_peak, base_s, reply_mb, base_state = measure(hold_all, clients, layers)
    peak, seconds, _, state = measure(streaming, clients, layers)
    same = all(np.array_equal(v, state[k]) for k, v in base_state.items())
    return {
        "clients": clients,
        "layers": layers,
        "reply-mb": reply_mb,
        "same-global-weights": same,
        "hold-peak-mb": base_peak,
        "stream-peak-mb": peak,
        "hold-seconds": base_s,
        "stream-seconds": seconds,
        "ratio": base_peak / peak,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--runs",
        default="8x4,16x8,16x15",
        help="comma-separated CxK: C clients each replying with K of SmolLM2's 30 decoder layers",
    )
    parser.add_argument("--note", default="", help="free text stored in the record")
    parser.add_argument(
        "--out", default="docs/bench/aggregation-memory.json", help="the JSON record; '' = none"
    )
    args = parser.parse_args()
    try:
        runs = [tuple(int(x) for x in r.split("x")) for r in args.runs.split(",")]
    except ValueError:
        parser.error(f"--runs: expected comma-separated CxK (e.g. 8x4,16x8), got {args.runs!r}")
    for clients, layers in runs:
        if clients * layers < 30:
            parser.error(
                f"--runs {clients}x{layers}: clients x layers must be >= 30: every SmolLM2 layer "
                "is sampled by some client (Eq. 8)"
            )
    record = start_record(
        "aggregation-memory", "experiments.benchmarks.aggregation_memory", note=args.note
    )
    quiet_libraries()
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = (
        1,
        1,
        0,
    )  # Messages outside a Flower run
    record["runs"] = []
    for clients, layers in runs:
        row = run(clients, layers)
        record["runs"].append(row)
        print(
            json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}),
            flush=True,
        )
    finish_record(record, args.out)


if __name__ == "__main__":
    main()
