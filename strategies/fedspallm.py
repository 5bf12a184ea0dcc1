"""FedSpaLLM (Bai et al. 2024, §4, Alg. 1): federated unstructured pruning.

Each round the server samples k_i ∝ r_i decoder layers for client i (Eq. 8; every layer is sampled
by at least one client, the condition of Corollary 4.1) and sends those layers' current global
weights; the client prunes them with its own calibration data (SparseGPT by default) and returns the
kept weights and bit-packed masks (both ways in `payload-dtype`, fedprune_app.core.encoding). Per
weight matrix the server averages each weight over the clients that kept it (ℓ0-norm aggregation,
Eq. 5) and expands the mask to exactly the target sparsity, pruning first the positions most clients
pruned (Eq. 6–7). Matrices that no client sampled keep their previous global weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from fedprune_app.core.config import RunConfig, per_client, split_list
from fedprune_app.core.encoding import EncodingError, decode_sparse, encode_sparse
from fedprune_app.core.protocol import flat_metrics
from fedprune_app.core.registry import register_strategy
from fedprune_app.core.replies import examples_problem, to_record
from fedprune_app.core.runtime import client_seed
from fedprune_app.core.strategy import FederatedStrategy, MethodReport, log
from fedprune_app.llm.data import client_data
from fedprune_app.llm.layers import (
    calibration_batches,
    dense_model,
    model_with_weights,
    prunable_weights,
)
from fedprune_app.methods.fedspallm.aggregation import (
    L0Sum,
    expand_masks,
    kept_by,
    layer_of,
    layer_quota,
    random_prune,
    sample_layers,
)
from fedprune_app.methods.fedspallm.config import ROUND_ARRAY, STATE_TABLE, FedSpaLLMConfig
from fedprune_app.methods.fedspallm.masks import MASK_SUFFIX, save_pruned
from fedprune_app.methods.fedspallm.pruners import prune_sequentially, pruner_for

# --- pure helpers ---------------------------------------------------------------------------------


# --- the strategy ---------------------------------------------------------------------------------


class FedSpaLLMReport(MethodReport):
    """fedspallm's part of the run's report."""

    def reference_models(self) -> dict[str, Any]:
        """Server-built comparison models, per `fedspallm-references`:
        - `random` (the paper's baseline): the dense weights with a random mask at the target
          sparsity;
        - `centralized` (simulation only: the server rebuilds every partition's data from the
          embedded sources): the pruner on the pooled calibration data of all clients, i.e. every
          client's round-1 segments together — the upper reference a federation cannot run."""
        s = self.strategy
        prune_cfg = s.cfg.section(FedSpaLLMConfig)
        refs: dict[str, Any] = {}
        names = split_list(prune_cfg.fedspallm_references)
        sparsity = prune_cfg.sparsity
        if "random" in names:

            def random_model() -> tuple[Any, Any]:
                rng = np.random.default_rng(s.cfg.seed)
                dense, _, _ = prunable_weights(s.cfg)
                return model_with_weights(
                    s.cfg, {k: random_prune(v, sparsity, rng) for k, v in dense.items()}
                )

            refs["random"] = random_model
        if "centralized" in names:
            refs["centralized"] = self.centralized_model
        return refs

    def centralized_model(self) -> tuple[Any, Any]:
        s = self.strategy
        prune_cfg = s.cfg.section(FedSpaLLMConfig)
        model, tokenizer = dense_model(s.cfg)
        n = max(1, s.num_connected)
        batches = [
            b
            for pid in range(n)
            for b in calibration_batches(
                client_data(s.cfg, pid, n).train,
                tokenizer,
                prune_cfg.calib_segments,
                prune_cfg.calib_seq_len,
                client_seed(s.cfg.seed, 1, pid),
            )
        ]
        log.info(
            "[fedprune] reference centralized: pruning on the pooled calibration data "
            "of %d clients",
            n,
        )
        prune_sequentially(model, batches, range(s.num_layers), pruner_for(s.cfg))
        params = {
            k: p.detach().cpu().numpy() for k, p in model.named_parameters() if k in s.global_state
        }
        both = sum(int(((params[k] != 0) & (w != 0)).sum()) for k, w in s.global_state.items())
        share = both / max(1, sum(int((w != 0).sum()) for w in s.global_state.values()))
        log.info(
            "[fedprune] reference centralized: keeps %.4f of the weights the global mask keeps",
            share,
        )
        s.record({"phase": "fedspallm-mask-agreement", "global-vs-centralized": share})
        return model, tokenizer

    def client_references(self) -> list[str]:
        """`standalone` (the paper's baseline): each client prunes the whole model with its own data
        alone."""
        s = self.strategy
        prune_cfg = s.cfg.section(FedSpaLLMConfig)
        return [name for name in split_list(prune_cfg.fedspallm_references) if name == "standalone"]

    def save_final(self, arrays: ArrayRecord, out_dir: Path) -> dict[str, str]:
        s = self.strategy
        return save_pruned(s.cfg, s.global_state, out_dir)


@register_strategy("fedspallm")
class FedSpaLLMStrategy(FederatedStrategy):
    dp_unsupported = (
        "its clients send SparseGPT-updated weights and masks of the layers they "
        "sampled, and the server's ℓ0-norm average and mask expansion are not a "
        "clipped mean of updates"
    )
    """Layer sampling down, pruned weights + masks up, ℓ0 aggregation + mask expansion."""

    report_class = FedSpaLLMReport
    folds_replies = True  # `accept_reply` adds each reply to the round's ℓ0 sums
    # no federated evaluation: the server scores the global model on held-out text of every domain
    # (`server-eval-data`), as the paper reports WikiText-2/PTB/C4 perplexity of the global model
    federated_evaluation = False

    def __init__(self, cfg: RunConfig, recorder: Any = None) -> None:
        super().__init__(cfg, recorder)
        self.global_state: dict[str, np.ndarray] = {}
        self.layer_prefix = ""
        self.num_layers = 0
        self.node_layers: dict[int, list[int]] = {}
        self.l0: dict[str, L0Sum] = {}  # this round's ℓ0 sums per matrix (`accept_reply`)
        self.payload_dtype = cfg.section(FedSpaLLMConfig).payload_dtype

    def initial_arrays(self) -> ArrayRecord:
        """The server keeps the global weights itself (`global_state`); the loop carries a round
        counter."""
        self.global_state, self.layer_prefix, self.num_layers = prunable_weights(self.cfg)
        return to_record({ROUND_ARRAY: np.zeros(1, dtype=np.int64)})

    def state_dict(self) -> dict[str, Any]:
        """The current pruned weights (zeros = the current masks) beside the sampling RNG."""
        return super().state_dict() | {STATE_TABLE: self.global_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.global_state = dict(state[STATE_TABLE])

    def resources_of(self, node_ids: list[int]) -> list[float]:
        """r_i per node: its node-config `resources` when it set one (learnt by `identify`), else
        `fedspallm-resources` (one value for all, or one per partition id; by position among the
        sampled nodes when a node did not say its id)."""
        configured = self.cfg.section(FedSpaLLMConfig).fedspallm_resources
        n_items = len(split_list(configured))
        out = []
        for position, node in enumerate(node_ids):
            partition, own = self.node_partition.get(node), self.node_resources.get(node, 0.0)
            if own > 0:
                out.append(own)
            elif n_items == 1:
                out.append(float(configured))
            else:
                index = partition if partition is not None and partition < n_items else position
                out.append(
                    per_client(configured, n_items, float, "fedspallm-resources")[index % n_items]
                )
        return out

    def configure_round(
        self, server_round: int, arrays: ArrayRecord, node_ids: list[int]
    ) -> dict[int, tuple[ArrayRecord, dict[str, Any]]]:
        """Eq. 8: k_i ∝ r_i layers per sampled node, every layer covered (nodes in partition
        order); each node gets its layers' global weights, kept values + bit-packed masks (zeros =
        pruned) in payload-dtype, and their ids."""
        order = sorted(node_ids, key=self.partition_order)
        resources = self.resources_of(order)
        assignment = sample_layers(
            self.num_layers, layer_quota(self.num_layers, resources), self.rng
        )
        self.node_layers = dict(zip(order, assignment, strict=True))
        self.l0 = {}  # a fresh round (or a retried one) starts its sums afresh
        tasks = {}
        for node_id in node_ids:
            layers = self.node_layers.get(node_id, [])
            sampled = set(layers)
            weights = {
                k: v
                for k, v in self.global_state.items()
                if layer_of(k, self.layer_prefix) in sampled
            }
            payload = to_record(encode_sparse(weights, dtype=self.payload_dtype))
            tasks[node_id] = (payload, {"layers": json.dumps(layers)})
        return tasks

    def decode(self, node_id: int, reply: RecordDict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """{name: (kept values as float32, bool mask)} of a train reply; EncodingError unless it
        holds exactly the encoded matrices the node was sent
        (fedprune_app.core.encoding.decode_sparse)."""
        shapes = {
            k: self.global_state[k].shape for k in self.sent[node_id] if not k.endswith(MASK_SUFFIX)
        }
        return decode_sparse(
            {k: v.numpy() for k, v in reply.array_records["arrays"].items()},
            shapes,
            self.payload_dtype,
        )

    def accept_reply(
        self, server_round: int, node_id: int, reply: RecordDict, phase: str
    ) -> str | None:
        """A train reply holds exactly the kept values + packed masks of its sampled layers, in
        payload-dtype, finite, pruned to the target sparsity; it is then folded into this round's
        ℓ0 sums (`L0Sum`, Eq. 5) at once (`folds_replies`: the runner keeps its metrics only), so
        a round never holds every client's pruned weights in the server at once."""
        if phase != "train":
            return None
        if "arrays" not in reply.array_records:
            return "reply holds no 'arrays' record"
        if (problem := examples_problem(flat_metrics(reply))) is not None:
            return problem
        try:
            decoded = self.decode(node_id, reply)
        except EncodingError as err:
            return f"reply {err}"
        if (problem := self.sparsity_problem(decoded)) is not None:
            return problem
        for key, (values, mask) in decoded.items():
            self.l0.setdefault(key, L0Sum(mask.shape)).add_kept(values, mask)
        return None

    def sparsity_problem(self, decoded: dict[str, tuple[np.ndarray, np.ndarray]]) -> str | None:
        """Why a reply's masks are not pruned to the target sparsity s (a client prunes each sampled
        matrix to it; a mask that keeps more would pull the ℓ0 average towards dense), or None. One
        weight per row of slack for the pruner's rounding."""
        prune_cfg = self.cfg.section(FedSpaLLMConfig)
        # N:M: n/m
        target = prune_cfg.prune_n / prune_cfg.prune_m if prune_cfg.prune_n else prune_cfg.sparsity
        for key, (_values, mask) in decoded.items():
            kept, allowed = int(mask.sum()), (1.0 - target) * mask.size + mask.shape[0]
            if kept > allowed:
                return (
                    f"reply's mask of {key} keeps {kept / mask.size:.3f} of its weights, more than "
                    f"the {1 - target:.3f} that sparsity {target:g} leaves"
                )
        return None

    def aggregate(self, server_round: int, replies: list[RecordDict]) -> ArrayRecord:
        """Eq. 5–7 per sampled matrix over the clients that sampled it (their arrays were folded in
        by `accept_reply`); matrices no accepted client sampled keep their previous global
        weights."""
        prune_cfg = self.cfg.section(FedSpaLLMConfig)
        n, m = prune_cfg.prune_n, prune_cfg.prune_m
        agreement: dict[int, np.ndarray] = {}
        for key, acc in self.l0.items():
            merged, pruned_count = acc.merged(self.global_state[key].dtype)
            self.global_state[key], kept = expand_masks(
                merged, pruned_count, acc.clients, prune_cfg.sparsity, n, m
            )
            counts = kept_by(acc.kept, kept, acc.clients)
            agreement[acc.clients] = agreement.get(acc.clients, 0) + counts
        self.l0 = {}
        self.record(
            {
                "round": server_round,
                "phase": "server-aggregate",
                "global-kept-by": {
                    str(clients): (counts / max(1, counts.sum())).round(6).tolist()
                    for clients, counts in agreement.items()
                },
            }
        )
        return to_record({ROUND_ARRAY: np.array([server_round], dtype=np.int64)})

    def global_model(self, arrays: ArrayRecord) -> tuple[Any, Any]:
        return model_with_weights(self.cfg, self.global_state)
