"""FedTPA (Chen, Zhang & Ding; §III-C–F): adaptive LoRA keep-ratios for federated instruction
tuning.

- ITPA (Eq. 3–5), once before round 1 (`prepare`): every client sends the mean backbone feature λ_i
  of its samples (a `query` message); the server forms λ_g weighted by data size, the cosine
  distances d_i and the initial keep-ratios β_i¹ by the linear map into [β_m, 1]. λ_i is the only
  data-derived statistic that leaves a client. Switched off (`fedtpa-itpa = false`): no query,
  β¹ = 1 for every client.
- Each round a client receives the global rank-r_g adapter and its β_i, warms up, prunes to
  ⌊β_i·N·r_g⌋ dimensions, fine-tunes (clients/fedtpa.py) and replies with the kept dimensions, its
  N×r_g pruning log, its N per-layer contribution scores (Eq. 7) and its train/validation losses.
- LCWA (Eq. 8): every adapter is zero-padded back to r_g from its log, then each adapter layer is
  averaged with the clients' normalised scores of that layer (`fedtpa-lcwa = false`: FedAvg by
  num-examples).
- DAPR (Eq. 9): the next β_i from the loss trends, step δ, clipped to (0, 1] (`fedtpa-dapr = false`:
  fixed).

Server state (β per client, last losses) is keyed by the partition id the clients report, so it
survives node-id changes; the node → partition map is refreshed from every accepted reply.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedprune_app.core.config import RunConfig
from fedprune_app.core.lora import LoRAStrategy
from fedprune_app.core.protocol import flat_metrics, numpy_state, parse_partition_id
from fedprune_app.core.registry import register_strategy
from fedprune_app.core.replies import (
    MAX_ABS_VALUE,
    examples_problem,
    to_record,
    values_of_problem,
    weighted_average,
)
from fedprune_app.core.strategy import log
from fedprune_app.llm.lora import LORA_A, LORA_B, adapter_layers, factor_problem, keep_count
from fedprune_app.llm.models import peft_model_for
from fedprune_app.methods.fedtpa.aggregation import (
    cosine_distances,
    initial_betas,
    lcwa,
    next_beta,
    zero_pad,
)
from fedprune_app.methods.fedtpa.config import FedTPAConfig

# --- pure functions -------------------------------------------------------------------------------


# --- the strategy ---------------------------------------------------------------------------------


@register_strategy("fedtpa")
class FedTPAStrategy(LoRAStrategy):
    dp_release = None
    dp_unsupported = (
        "its aggregate is contribution-weighted and zero-padded by each client's "
        "pruning log, and the pruning logs, contribution scores and mean feature "
        "vector λ_i travel unclipped and unnoised"
    )
    """ITPA before round 1, per-client keep-ratios down, LCWA + DAPR on the pruned replies."""

    def __init__(self, cfg: RunConfig, recorder: Any = None) -> None:
        super().__init__(cfg, recorder)
        self.beta: dict[int, float] = {}  # partition id -> keep-ratio for its next round
        # partition id -> (train, val) loss of its last round
        self.losses: dict[int, tuple[float, float]] = {}
        self.sent_beta: dict[int, float] = {}  # node id -> β sent this round
        self.layers: list[str] = []
        self.rank = cfg.lora_rank
        self.hidden_size = 0

    def initial_arrays(self) -> ArrayRecord:

        arrays = super().initial_arrays()
        self.layers = adapter_layers(arrays.keys())
        self.hidden_size = int(peft_model_for(self.cfg)[0].get_base_model().config.hidden_size)
        return arrays

    # --- ITPA -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """β_i and the last (train, val) losses per partition (what DAPR's next step needs)."""
        return super().state_dict() | {"beta": dict(self.beta), "losses": dict(self.losses)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.beta, self.losses = dict(state["beta"]), dict(state["losses"])

    def prepare(self, grid: Grid, timeout: float) -> None:
        """Eq. 3–5: ask every connected node for its mean feature vector, set the initial β per
        partition (not again in a resumed run: its β come from the checkpoint)."""
        tpa_cfg = self.cfg.section(FedTPAConfig)
        if not tpa_cfg.fedtpa_itpa or self.beta:
            return
        nodes = self.sample(grid, 1.0)
        query = [
            Message(
                content=RecordDict({"config": ConfigRecord({"server-round": 0})}),
                message_type=MessageType.QUERY,
                dst_node_id=n,
            )
            for n in nodes
        ]
        feats, sizes, pids, rows = [], [], [], []
        for msg in grid.send_and_receive(query, timeout=timeout):
            node = msg.metadata.src_node_id
            row: dict[str, Any] = {"round": 0, "phase": "features", "node": node}
            problem = (
                f"client error: {msg.error.reason}"
                if msg.has_error()
                else self.common_problem(node, msg.content)[1]
                or self.safe_check(self.feature_problem, msg.content)
            )
            if problem:
                row.update(status="rejected", problem=problem[-600:])
                log.warning("features of node %d dropped: %s", node, problem[-300:])
            else:
                metrics = flat_metrics(msg.content)
                pid = int(metrics["partition-id"])
                self.node_partition[node] = pid
                feats.append(msg.content.array_records["features"]["lambda"].numpy())
                sizes.append(float(metrics["num-examples"]))
                pids.append(pid)
                row.update(
                    client=pid, status="accepted", **{"num-examples": metrics["num-examples"]}
                )
            rows.append(row)
        if feats:
            distances = cosine_distances(np.stack(feats), sizes)
            betas = initial_betas(distances, tpa_cfg.fedtpa_beta_min)
            for pid, d, b in zip(pids, distances, betas, strict=True):
                self.beta[pid] = float(b)
                next(r for r in rows if r.get("client") == pid).update(
                    distance=float(d), beta=float(b)
                )
            log.info(
                "[fedprune] FedTPA initial keep-ratios: %s",
                ", ".join(f"client {p}: {self.beta[p]:.3f}" for p in sorted(self.beta)),
            )
        for row in rows:
            self.record(row)

    def feature_problem(self, reply: RecordDict) -> str | None:
        """Why a feature reply cannot be used (no/ill-shaped/non-finite λ_i, bad num-examples or
        partition id)."""
        rec = reply.array_records.get("features")
        if rec is None or "lambda" not in rec:
            return "reply holds no 'features' record with 'lambda'"
        lam = rec["lambda"].numpy()
        if lam.shape != (self.hidden_size,) or not np.isfinite(lam).all() or not np.any(lam):
            return (
                f"lambda must be a finite non-zero vector of shape ({self.hidden_size},), "
                f"got {lam.shape}"
            )
        return self.metrics_problem(flat_metrics(reply), losses=False)

    # --- rounds -----------------------------------------------------------------------------------
    def configure_round(
        self, server_round: int, arrays: ArrayRecord, node_ids: list[int]
    ) -> dict[int, tuple[ArrayRecord, dict[str, Any]]]:
        """The global adapter and each node's keep-ratio; a node the server has not heard from yet
        trains the full adapter (β = 1)."""
        tasks = {}
        for node_id in node_ids:
            pid = self.node_partition.get(node_id)
            beta = self.beta.get(pid, 1.0) if pid is not None else 1.0
            self.sent_beta[node_id] = beta
            tasks[node_id] = (arrays, {"beta": beta})
        return tasks

    @staticmethod
    def metrics_problem(metrics: dict[str, Any], losses: bool = True) -> str | None:
        try:
            parse_partition_id(metrics.get("partition-id"))
        except ValueError as err:
            return f"reply metric {err}"
        if (problem := examples_problem(metrics)) is not None:
            return problem
        if losses:
            train, val = metrics.get("train-loss"), metrics.get("val-loss")
            if not isinstance(train, float | int) or not math.isfinite(train):
                return f"train-loss must be finite, got {train!r}"
            if not isinstance(val, float | int) or math.isinf(val):  # NaN = no validation data
                return f"val-loss must be a float (NaN without validation data), got {val!r}"
        return None

    def accept_reply(
        self, server_round: int, node_id: int, reply: RecordDict, phase: str
    ) -> str | None:
        """Reject train replies whose kept adapters do not match their pruning log (ranks beyond
        r_g included), whose keep count is not ⌊β·N·r_g⌋ for the β sent, or whose tensors, scores
        or losses are not finite."""
        if phase != "train":
            return None
        if "arrays" not in reply.array_records or "fedtpa" not in reply.array_records:
            return "reply holds no 'arrays' or no 'fedtpa' record"
        arrays, extra, sent = (
            reply.array_records["arrays"],
            reply.array_records["fedtpa"],
            self.sent[node_id],
        )
        if set(arrays) != set(sent):
            return f"reply holds {len(arrays)} adapter tensors, expected the {len(sent)} sent"
        if "pruning-log" not in extra or "layer-scores" not in extra:
            return "the 'fedtpa' record lacks 'pruning-log' or 'layer-scores'"
        keep, scores = extra["pruning-log"].numpy(), extra["layer-scores"].numpy()
        n_layers = len(self.layers)
        if keep.dtype != np.bool_ or keep.shape != (n_layers, self.rank):
            return (
                f"pruning-log must be bool of shape ({n_layers}, {self.rank}), got {keep.dtype} "
                f"{keep.shape}"
            )
        if (
            scores.shape != (n_layers,)
            or not np.isfinite(scores).all()
            or (scores < 0).any()
            or (scores > MAX_ABS_VALUE).any()  # two at 1e308 would sum to inf and zero a layer
        ):
            return f"layer-scores must be {n_layers} finite numbers in [0, {MAX_ABS_VALUE:g}]"
        expected = keep_count(self.sent_beta.get(node_id, 1.0), n_layers, self.rank)
        if int(keep.sum()) != expected:
            return (
                f"pruning log keeps {int(keep.sum())} dimensions, expected ⌊β·N·r_g⌋ = {expected}"
            )
        for j, layer in enumerate(self.layers):
            if (problem := factor_problem(layer, arrays, sent, int(keep[j].sum()))) is not None:
                return problem + " (the rank its pruning log keeps)"
        if (problem := values_of_problem(arrays, sent)) is not None:
            return problem
        problem = self.metrics_problem(flat_metrics(reply))
        if problem is None:
            self.node_partition[node_id] = int(flat_metrics(reply)["partition-id"])
        return problem

    def aggregate(self, server_round: int, replies: list[RecordDict]) -> ArrayRecord:
        """Zero-pad (§III-E), LCWA (Eq. 8) or FedAvg, then DAPR (Eq. 9) per reporting partition."""
        padded, scores, sizes = [], [], []
        for reply in replies:
            arrays, extra = (
                numpy_state(reply.array_records["arrays"]),
                reply.array_records["fedtpa"],
            )
            keep = extra["pruning-log"].numpy()
            state = {}
            for j, layer in enumerate(self.layers):
                state[layer + LORA_A], state[layer + LORA_B] = zero_pad(
                    arrays[layer + LORA_A], arrays[layer + LORA_B], keep[j]
                )
            padded.append(state)
            scores.append(extra["layer-scores"].numpy())
            sizes.append(float(flat_metrics(reply)["num-examples"]))
        if self.cfg.section(FedTPAConfig).fedtpa_lcwa:
            merged = lcwa(padded, np.stack(scores), self.layers, sizes)
        else:
            merged = weighted_average(padded, sizes)
        self.adjust_betas(replies)
        return to_record(merged)

    def adjust_betas(self, replies: list[RecordDict]) -> None:
        """Eq. 9 per partition, from this round's losses against its previous round's (β^t = the
        partition's state, which is what its node was sent unless the node was new)."""
        tpa_cfg = self.cfg.section(FedTPAConfig)
        delta = tpa_cfg.fedtpa_delta if tpa_cfg.fedtpa_dapr else 0.0
        for reply in replies:
            m = flat_metrics(reply)
            pid, train, val = int(m["partition-id"]), float(m["train-loss"]), float(m["val-loss"])
            beta = self.beta.get(pid, 1.0)
            if pid in self.losses:
                beta = next_beta(beta, train, self.losses[pid][0], val, self.losses[pid][1], delta)
            self.beta[pid], self.losses[pid] = beta, (train, val)
        log.info(
            "[fedprune] FedTPA next keep-ratios: %s",
            ", ".join(f"client {p}: {self.beta[p]:.3f}" for p in sorted(self.beta)),
        )
