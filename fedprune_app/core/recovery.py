"""One statistics round, then FedAvg LoRA recovery: the protocol of the one-shot structural
baselines.

Round 1: the server sends nothing; each sampled client measures its data on the dense model and
replies statistics (importance rows, covariance sums, ...) of fixed shapes. The server folds them
into ONE global structure (masks, kept heads/channels, bases) and a fresh LoRA for the smaller
model. Rounds 2..R: FedAvg over LoRA (the plain LoRA round) on that model; the structure travels
beside the LoRA as arrays whose names start with `structure_prefix` and never changes. The core
knows no method: a strategy fills in `statistics_shapes`, `cut` and `structure_arrays`; a client
fills in `statistics` and `recovery_model`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, ClassVar, NamedTuple

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from fedprune_app.core.client import FederatedClient
from fedprune_app.core.config import RunConfig
from fedprune_app.core.protocol import flat_metrics, numpy_state, to_record
from fedprune_app.core.replies import weighted_average
from fedprune_app.core.runtime import client_seed
from fedprune_app.core.strategy import FederatedStrategy, Recorder
from fedprune_app.llm.data import client_data, training_batches
from fedprune_app.llm.evaluation import evaluate_client

Spec = dict[str, tuple[tuple[int, ...], str]]


def without_prefix(state: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The entries of `state` whose names do not start with `prefix` (the LoRA tensors beside a
    structure)."""
    return {k: v for k, v in state.items() if not k.startswith(prefix)}


class StatisticsThenRecovery(FederatedStrategy):
    """Round 1 statistics → one global structure; rounds 2..R FedAvg over LoRA with the structure
    fixed.

    Subclasses set `structure_prefix` (names of the structure arrays), `structure_name` (for
    errors), `array_state` / `json_state` (attributes a checkpoint holds: arrays kept by reference,
    JSON-able values copied), and implement `statistics_shapes`, `cut` and `structure_arrays`."""

    structure_prefix: ClassVar[str]
    structure_name: ClassVar[str] = "global structure"
    statistics_name: ClassVar[str] = "statistics"
    array_state: ClassVar[tuple[str, ...]] = ()
    json_state: ClassVar[tuple[str, ...]] = ()
    dp_release = "rounds 2..R: the LoRA on the fixed structure, one update per client"
    # round 1's model too: the structured model before any LoRA training, the "post hoc" reference
    evaluate_round_1 = True

    def __init__(self, cfg: RunConfig, recorder: Recorder | None = None) -> None:
        super().__init__(cfg, recorder)
        self.round = 0

    # --- hooks ------------------------------------------------------------------------------------
    def statistics_shapes(self) -> Spec:
        """{key: (shape, dtype)} of a round-1 reply (the statistics of the dense model)."""
        raise NotImplementedError

    def cut(
        self, states: list[dict[str, np.ndarray]], replies: list[RecordDict]
    ) -> dict[str, np.ndarray]:
        """Round 1: set the global structure from the clients' statistics; return the fresh LoRA of
        the structured model (what rounds 2..R start from)."""
        raise NotImplementedError

    def structure_arrays(self) -> dict[str, np.ndarray] | None:
        """The structure as it travels (names prefixed by `structure_prefix`); None before round
        1."""
        raise NotImplementedError

    @classmethod
    def dp_refusal(cls, cfg: RunConfig) -> str | None:
        """Round 1's statistics are a one-shot release that is neither clipped nor noised: the run
        is not differentially private even though rounds 2..R could be (`dp_release_keys`)."""
        return (
            f"round 1 sends the dense model's {cls.statistics_name} (one-shot statistics), "
            "neither clipped nor noised (only its LoRA recovery rounds are a clipped mean)"
        )

    def dp_release_keys(self, server_round: int, reference: Mapping[str, Any]) -> list[str]:
        """Rounds 2..R release the LoRA tensors; the structure rides along unchanged."""
        return [
            k
            for k in super().dp_release_keys(server_round, reference)
            if not k.startswith(self.structure_prefix)
        ]

    # --- the protocol -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The base state plus `array_state` (as arrays) and `json_state` (as JSON values)."""
        state = {name: getattr(self, name) for name in self.array_state}
        return (
            super().state_dict()
            | state
            | {name: json.loads(json.dumps(getattr(self, name))) for name in self.json_state}
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        super().load_state_dict(state)
        for name in self.array_state:
            setattr(self, name, state[name])
        for name in self.json_state:
            setattr(self, name, dict(state[name]))

    def configure_round(
        self, server_round: int, arrays: ArrayRecord, node_ids: list[int]
    ) -> dict[int, tuple[ArrayRecord, dict[str, Any]]]:
        """Round 1 sends nothing (the clients measure the dense model); later the global LoRA + the
        structure."""
        self.round = server_round
        payload = ArrayRecord() if server_round == 1 else arrays
        return {node_id: (payload, {}) for node_id in node_ids}

    def accept_reply(
        self, server_round: int, node_id: int, reply: RecordDict, phase: str
    ) -> str | None:
        """A train reply holds, in round 1, `statistics_shapes`; later the LoRA tensors that were
        sent (the structure excluded)."""
        if phase != "train":
            return None
        sent = self.sent[node_id]
        expected = without_prefix(sent, self.structure_prefix) if sent else self.statistics_shapes()
        return self.reply_arrays_problem(reply, expected)

    def pooled_batches(self, tokenizer: Any, steps: int, targets: str = "answer") -> list[Any]:
        """Round 1's calibration batches of every partition pooled, as each client drew them (its
        data rebuilt from the run's sources, its round-1 seed): what a centralized reference
        computes on. Simulation only: a deployment's data never reaches the server."""
        n = max(1, self.num_connected)
        return [
            b
            for pid in range(n)
            for b in training_batches(
                client_data(self.cfg, pid, n).train,
                tokenizer,
                self.cfg.batch_size,
                steps,
                self.cfg.seq_len,
                client_seed(self.cfg.seed, 1, pid),
                targets=targets,
            )
        ]

    def lora_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The LoRA tensors of a global state (the structure arrays left out)."""
        return without_prefix(state, self.structure_prefix)

    def aggregate(self, server_round: int, replies: list[RecordDict]) -> ArrayRecord:
        """Round 1: `cut`; later FedAvg of the LoRA by num-examples. Either way the structure rides
        along."""
        states = [numpy_state(r.array_records["arrays"]) for r in replies]
        if server_round == 1:
            lora = self.cut(states, replies)
        else:
            lora = weighted_average(
                states, [float(flat_metrics(r)["num-examples"]) for r in replies]
            )
        structure = self.structure_arrays()
        if structure is None:
            raise RuntimeError(
                f"{self.cfg.method} has no {self.structure_name}: round 1 ({self.statistics_name}) "
                "did not complete"
            )
        return to_record(lora | structure)


class Recovery(NamedTuple):
    """A client's model for a message: the structured model with the global LoRA (or the dense one),
    and the metrics it reports with it (kept ratios)."""

    model: Any
    tokenizer: Any
    metrics: dict[str, float]
    structured: bool


class StatisticsThenRecoveryClient(FederatedClient):
    """The client side: round 1 `statistics` of the dense model on the client's data; later a plain
    LoRA `local_round` on `recovery_model`. Mix in before `core.lora.LoRAClient`, which provides
    `local_round`."""

    structure_prefix: ClassVar[str]
    structure_name: ClassVar[str] = "the global structure"
    local_round: Callable[..., RecordDict]  # provided by the LoRA client this class is mixed into

    def statistics(self, server_round: int) -> tuple[dict[str, np.ndarray], dict[str, float | int]]:
        """Round 1: (arrays, metrics with `num-examples`) measured on the dense model. No text, no
        activations."""
        raise NotImplementedError

    def recovery_model(self, arrays: dict[str, Any]) -> AbstractContextManager[Recovery]:
        """The model for a message's arrays (structure + LoRA); leaving the context undoes any state
        it set on a cached model."""
        raise NotImplementedError

    def message_arrays(self, content: RecordDict) -> dict[str, Any]:
        """The message's arrays as torch tensors ({} when it carries none: round 1)."""
        record = content.array_records.get("arrays")
        return record.to_torch_state_dict() if record is not None and len(record) else {}

    def train(self, content: RecordDict) -> RecordDict:
        """Round 1: the statistics of the dense model; later: `local_round` on `recovery_model`."""
        server_round = int(content.config_records["config"]["server-round"])
        if server_round == 1:
            start = time.perf_counter()
            arrays, metrics = self.statistics(server_round)
            self.private["rounds-trained"] = int(self.private.get("rounds-trained", 0)) + 1
            record = MetricRecord(
                {
                    **metrics,
                    "partition-id": self.partition_id,
                    "seconds": time.perf_counter() - start,
                }
            )
            return RecordDict({"arrays": to_record(arrays), "metrics": record, "info": self.info()})
        with self.recovery_model(self.message_arrays(content)) as loaded:
            if not loaded.structured:
                raise ValueError(
                    f"{self.name} recovery round without {self.structure_name} "
                    f"({self.structure_prefix}*) in the arrays"
                )
            return self.local_round(loaded.model, loaded.tokenizer, server_round, **loaded.metrics)

    def evaluate(self, content: RecordDict) -> RecordDict:
        """The client's own task on the dense model (no structure yet) or the structured one with
        the global LoRA."""
        start = time.perf_counter()
        with self.recovery_model(self.message_arrays(content)) as loaded:
            scores = evaluate_client(
                loaded.model, loaded.tokenizer, self.data, self.cfg, self.num_partitions
            )
        metrics = MetricRecord(
            {
                **scores,
                **loaded.metrics,
                "num-examples": len(self.data.test),
                "partition-id": self.partition_id,
                "seconds": time.perf_counter() - start,
            }
        )
        return RecordDict({"metrics": metrics, "info": self.info()})
