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
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedprune_app.core.config import RunConfig, per_client, split_list
from fedprune_app.core.encoding import EncodingError, decode_sparse, encode_sparse
from fedprune_app.core.protocol import flat_metrics, spec_of
from fedprune_app.core.registry import register_strategy
from fedprune_app.core.replies import examples_problem, to_record
from fedprune_app.core.runtime import client_seed
from fedprune_app.core.strategy import FederatedStrategy, log
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


@register_strategy("fedspallm")
class FedSpaLLMStrategy(FederatedStrategy):
    dp_unsupported = (
        "its clients send SparseGPT-updated weights and masks of the layers they "
        "sampled, and the server's ℓ0-norm average and mask expansion are not a "
        "clipped mean of updates"
    )
    """Layer sampling down, pruned weights + masks up, ℓ0 aggregation + mask expansion."""

    def __init__(self, cfg: RunConfig, recorder: Any = None) -> None:
        super().__init__(cfg, recorder)
        self.global_state: dict[str, np.ndarray] = {}
        self.layer_prefix = ""
        self.num_layers = 0
        self.node_layers: dict[int, list[int]] = {}
        self.l0: dict[str, L0Sum] = {}  # this round's ℓ0 sums per matrix, filled by `absorb`
        self.payload_dtype = cfg.section(FedSpaLLMConfig).payload_dtype
        # ((node, id(reply)), decoded)
        self.checked: tuple[tuple[int, int], dict[str, Any]] | None = None

    def initial_arrays(self) -> ArrayRecord:
        """The server keeps the global weights itself (`global_state`); the loop carries a round
        counter."""
        self.global_state, self.layer_prefix, self.num_layers = prunable_weights(self.cfg)
        return to_record({ROUND_ARRAY: np.zeros(1, dtype=np.int64)})

    def checkpoint_spec(
        self, initial: ArrayRecord, arrays: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, tuple[tuple[int, ...], str]]:
        """The round counter, and the pruned weights of the state table `global-state` (those
        `initial_arrays` read from this config's model)."""
        weights = spec_of(self.global_state)
        return spec_of(initial) | {f"{STATE_TABLE}/{k}": v for k, v in weights.items()}

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

    def plan_round(self, server_round: int, node_ids: list[int]) -> None:
        """Eq. 8: k_i ∝ r_i layers per sampled node, every layer covered; nodes in partition
        order."""
        order = sorted(node_ids, key=self.partition_order)
        resources = self.resources_of(order)
        assignment = sample_layers(
            self.num_layers, layer_quota(self.num_layers, resources), self.rng
        )
        self.node_layers = dict(zip(order, assignment, strict=True))
        self.l0 = {}  # a fresh round (or a retried one) starts its sums afresh

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """No federated evaluation: the server scores the global model on held-out text of every
        domain (`server-eval-data`), as the paper reports WikiText-2/PTB/C4 perplexity of the global
        model."""
        return []

    def node_config(self, server_round: int, node_id: int) -> dict[str, Any]:
        return {"layers": json.dumps(self.node_layers.get(node_id, []))}

    def arrays_for(self, node_id: int, arrays: ArrayRecord) -> ArrayRecord:
        """The sampled layers' global weights, kept values + bit-packed masks (zeros = pruned) in
        payload-dtype."""
        layers = set(self.node_layers.get(node_id, []))
        return to_record(
            encode_sparse(
                {
                    k: v
                    for k, v in self.global_state.items()
                    if layer_of(k, self.layer_prefix) in layers
                },
                dtype=self.payload_dtype,
            )
        )

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

    def reply_problem(self, node_id: int, reply: RecordDict) -> str | None:
        if "arrays" not in reply.array_records:
            return "reply holds no 'arrays' record"
        if (problem := examples_problem(flat_metrics(reply))) is not None:
            return problem
        # exactly the kept values + packed masks of its sampled layers, in payload-dtype, finite
        try:
            decoded = self.decode(node_id, reply)
        except EncodingError as err:
            return f"reply {err}"
        if (problem := self.sparsity_problem(decoded)) is not None:
            return problem
        # `absorb` folds these in without decoding again
        self.checked = ((node_id, id(reply)), decoded)
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

    def absorb(self, node_id: int, reply: RecordDict) -> RecordDict:
        """Fold an accepted reply's pruned weights and masks into this round's ℓ0 sums (`L0Sum`,
        Eq. 5) as it arrives, and keep only its metrics: a 16-client round of SmolLM2 would
        otherwise hold every client's replies (and their numpy copies) in the server at once."""
        if self.checked is None or self.checked[0] != (node_id, id(reply)):
            self.checked = ((node_id, id(reply)), self.decode(node_id, reply))
        for key, (values, mask) in self.checked[1].items():
            self.l0.setdefault(key, L0Sum(mask.shape)).add_kept(values, mask)
        self.checked = None
        return RecordDict({name: record for name, record in reply.items() if name != "arrays"})

    def aggregate(self, server_round: int, replies: list[RecordDict]) -> ArrayRecord:
        """Eq. 5–7 per sampled matrix over the clients that sampled it (their arrays were folded in
        by `absorb`); matrices no accepted client sampled keep their previous global weights."""
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

    def reference_models(self) -> dict[str, Any]:
        """Server-built comparison models, per `fedspallm-references`:
        - `random` (the paper's baseline): the dense weights with a random mask at the target
          sparsity;
        - `centralized` (simulation only: the server rebuilds every partition's data from the
          embedded sources): the pruner on the pooled calibration data of all clients, i.e. every
          client's round-1 segments together — the upper reference a federation cannot run."""
        prune_cfg = self.cfg.section(FedSpaLLMConfig)
        refs: dict[str, Any] = {}
        names = split_list(prune_cfg.fedspallm_references)
        sparsity = prune_cfg.sparsity
        if "random" in names:

            def random_model() -> tuple[Any, Any]:
                rng = np.random.default_rng(self.cfg.seed)
                dense, _, _ = prunable_weights(self.cfg)
                return model_with_weights(
                    self.cfg, {k: random_prune(v, sparsity, rng) for k, v in dense.items()}
                )

            refs["random"] = random_model
        if "centralized" in names:
            refs["centralized"] = self.centralized_model
        return refs

    def centralized_model(self) -> tuple[Any, Any]:
        prune_cfg = self.cfg.section(FedSpaLLMConfig)
        model, tokenizer = dense_model(self.cfg)
        n = max(1, self.num_connected)
        batches = [
            b
            for pid in range(n)
            for b in calibration_batches(
                client_data(self.cfg, pid, n).train,
                tokenizer,
                prune_cfg.calib_segments,
                prune_cfg.calib_seq_len,
                client_seed(self.cfg.seed, 1, pid),
            )
        ]
        log.info(
            "[fedprune] reference centralized: pruning on the pooled calibration data "
            "of %d clients",
            n,
        )
        prune_sequentially(model, batches, range(self.num_layers), pruner_for(self.cfg))
        params = {
            k: p.detach().cpu().numpy()
            for k, p in model.named_parameters()
            if k in self.global_state
        }
        both = sum(int(((params[k] != 0) & (w != 0)).sum()) for k, w in self.global_state.items())
        share = both / max(1, sum(int((w != 0).sum()) for w in self.global_state.values()))
        log.info(
            "[fedprune] reference centralized: keeps %.4f of the weights the global mask keeps",
            share,
        )
        self.record({"phase": "fedspallm-mask-agreement", "global-vs-centralized": share})
        return model, tokenizer

    def client_references(self) -> list[str]:
        """`standalone` (the paper's baseline): each client prunes the whole model with its own data
        alone."""
        prune_cfg = self.cfg.section(FedSpaLLMConfig)
        return [name for name in split_list(prune_cfg.fedspallm_references) if name == "standalone"]

    def save_final(self, arrays: ArrayRecord, out_dir: Path) -> dict[str, str]:
        return save_pruned(self.cfg, self.global_state, out_dir)
