"""Peak server memory of one FedSpaLLM aggregation: every reply held, then aggregated (the baseline, what the
server did before replies were folded in as they arrive), against `FedSpaLLMStrategy`'s streaming `absorb`.

N clients each reply with `--layers` pruned SmolLM2 decoder layers (fp32 weights + bool masks, 50% random
masks). The baseline holds the N replies (as a grid's `send_and_receive` list does) and then takes numpy copies of
every reply's arrays per matrix for `l0_aggregate`; the streaming path builds each reply when it "arrives", folds
it in and drops it. Both give the same global weights (checked). Peak = tracemalloc's peak of what the
aggregation allocates (numpy and the records' bytes), after the train messages are built.

    .venv/bin/python tools/bench_aggregation_memory.py [--clients 16] [--layers 4]
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

from fedprune_app.core.config import RunConfig
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


def reply_to(msg: Message, seed: int) -> Message:
    """A client's reply: the sent weights, perturbed, pruned by a random 50% mask."""
    rng = np.random.default_rng(seed)
    payload = {}
    for key, array in msg.content.array_records["arrays"].items():
        w = array.numpy()
        keep = rng.random(w.shape, dtype=np.float32) > 0.5
        payload[key] = np.where(keep, w + np.float32(1e-3), 0).astype(np.float32)
        payload[key + MASK_SUFFIX] = keep
    content = RecordDict({"arrays": to_record(payload),
                          "metrics": MetricRecord({"num-examples": 32, "partition-id": seed})})
    return Message(content=content, reply_to=msg)


def hold_then_aggregate(strategy: FedSpaLLMStrategy, replies: list[Message]) -> None:
    """The baseline: all replies in memory, then numpy copies of every reply's arrays per matrix (Eq. 5–7)."""
    prune_cfg = strategy.cfg.section(FedSpaLLMConfig)
    by_key: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    for msg in replies:
        arrays = msg.content.array_records["arrays"]
        for key in arrays:
            if not key.endswith(MASK_SUFFIX):
                ws, ms = by_key.setdefault(key, ([], []))
                ws.append(arrays[key].numpy())
                ms.append(arrays[key + MASK_SUFFIX].numpy())
    for key, (ws, ms) in by_key.items():
        merged, pruned = l0_aggregate(ws, ms)
        strategy.global_state[key], _ = expand_masks(merged, pruned, len(ws), prune_cfg.sparsity)


def streaming(strategy: FedSpaLLMStrategy, sent: list[Message]) -> None:
    """Replies built as they "arrive" and handed to the strategy one by one (`accept_train` -> `absorb`)."""
    arriving: Iterator[Message] = (reply_to(m, i) for i, m in enumerate(sent))
    assert strategy.aggregate_train(1, arriving)[0] is not None


def hold_all(strategy: FedSpaLLMStrategy, sent: list[Message]) -> None:
    hold_then_aggregate(strategy, [reply_to(m, i) for i, m in enumerate(sent)])


def measure(run: Callable[[FedSpaLLMStrategy, list[Message]], None], clients: int, layers: int
            ) -> tuple[float, float, float, dict[str, np.ndarray]]:
    """(peak MB allocated while `run` aggregates, seconds, MB of one reply, the new global weights)."""
    strategy = FedSpaLLMStrategy(RunConfig.from_flower({"seed": 0, "fedspallm-resources": str(layers / 30)}))
    strategy.initial_arrays()
    sent = list(strategy.configure_train(1, to_record({}), ConfigRecord(), Nodes(clients)))
    reply_mb = record_bytes(reply_to(sent[0], 0).content) / 2**20
    tracemalloc.start()
    start = time.perf_counter()
    run(strategy, sent)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20, seconds, reply_mb, strategy.global_state


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--layers", type=int, default=4, help="decoder layers per client reply (SmolLM2 has 30)")
    args = parser.parse_args()
    if args.clients * args.layers < 30:
        parser.error("--clients x --layers must be >= 30: every SmolLM2 layer is sampled by some client (Eq. 8)")
    quiet_libraries()
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0  # Messages outside a Flower run
    base_peak, base_s, reply_mb, base_state = measure(hold_all, args.clients, args.layers)
    peak, seconds, _, state = measure(streaming, args.clients, args.layers)
    same = all(np.array_equal(v, state[k]) for k, v in base_state.items())
    print(json.dumps({"clients": args.clients, "layers-per-reply": args.layers, "reply MB": round(reply_mb, 1),
                      "same-global-weights": same,
                      "hold-then-aggregate peak MB": round(base_peak, 1), "streaming peak MB": round(peak, 1),
                      "hold-then-aggregate s": round(base_s, 2), "streaming s": round(seconds, 2),
                      "ratio (baseline / streaming)": round(base_peak / peak, 2)}, indent=2))


if __name__ == "__main__":
    main()
