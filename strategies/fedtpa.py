"""FedTPA (Chen, Zhang & Ding; §III-C–F): adaptive LoRA keep-ratios for federated instruction tuning.

- ITPA (Eq. 3–5), once before round 1 (`prepare`): every client sends the mean backbone feature λ_i of its
  samples (a `query` message); the server forms λ_g weighted by data size, the cosine distances d_i and the
  initial keep-ratios β_i¹ by the linear map into [β_m, 1]. λ_i is the only data-derived statistic that
  leaves a client. Switched off (`fedtpa-itpa = false`): no query, β¹ = 1 for every client.
- Each round a client receives the global rank-r_g adapter and its β_i, warms up, prunes to ⌊β_i·N·r_g⌋
  dimensions, fine-tunes (clients/fedtpa.py) and replies with the kept dimensions, its N×r_g pruning log,
  its N per-layer contribution scores (Eq. 7) and its train/validation losses.
- LCWA (Eq. 8): every adapter is zero-padded back to r_g from its log, then each adapter layer is averaged
  with the clients' normalised scores of that layer (`fedtpa-lcwa = false`: FedAvg by num-examples).
- DAPR (Eq. 9): the next β_i from the loss trends, step δ, clipped to (0, 1] (`fedtpa-dapr = false`: fixed).

Server state (β per client, last losses) is keyed by the partition id the clients report, so it survives
node-id changes; the node → partition map is refreshed from every accepted reply.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedprune_app.config import RunConfig
from strategies.base import log
from strategies.fedit import FedITStrategy
from strategies.lora_utils import LORA_A, LORA_B, adapter_layers, factor_problem, keep_count
from strategies.utils import flat_metrics, numpy_state, to_record, weighted_average

# --- pure functions -------------------------------------------------------------------------------------

def cosine_distances(features: np.ndarray, sizes: Sequence[float]) -> np.ndarray:
    """Eq. 3–4: λ_g = Σ n_i λ_i / Σ n_i (weighted by data size), d_i = 1 − cos(λ_i, λ_g)."""
    feats = np.asarray(features, dtype=np.float64)
    w = np.asarray(sizes, dtype=np.float64)
    global_feature = (w[:, None] * feats).sum(axis=0) / w.sum()
    cos = feats @ global_feature / (np.linalg.norm(feats, axis=1) * np.linalg.norm(global_feature))
    return 1.0 - cos


def initial_betas(distances: np.ndarray, beta_min: float) -> np.ndarray:
    """Eq. 5: β_i¹ = (1 − β_m)(d_i − d_min)/(d_max − d_min) + β_m, so the farthest client keeps every dimension
    and the closest keeps β_m. When all distances are equal (e.g. one client) nothing tells the clients apart:
    every β is 1 (the farthest client's value)."""
    d = np.asarray(distances, dtype=np.float64)
    spread = d.max() - d.min()
    if not spread > 1e-12:
        return np.ones_like(d)
    return (1.0 - beta_min) * (d - d.min()) / spread + beta_min


def next_beta(beta: float, train_loss: float, prev_train_loss: float, val_loss: float, prev_val_loss: float,
              delta: float) -> float:
    """Eq. 9: (1+δ)β if the training loss rose; (1−δ)β if it did not but the validation loss rose (overfitting);
    else β. Clipped to (0, 1] (δ < 1 keeps it positive). A NaN loss (no previous round, no validation data)
    never triggers its branch."""
    if train_loss > prev_train_loss:
        beta = (1.0 + delta) * beta
    elif train_loss <= prev_train_loss and val_loss > prev_val_loss:
        beta = (1.0 - delta) * beta
    return min(1.0, beta)


def zero_pad(a_kept: np.ndarray, b_kept: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """§III-E: an adapter layer's kept dimensions (A: k×l, B: d×k) back at their positions of the rank-r_g
    layer (r_g = len(keep)); pruned dimensions are zero."""
    a = np.zeros((keep.size, a_kept.shape[1]), dtype=a_kept.dtype)
    b = np.zeros((b_kept.shape[0], keep.size), dtype=b_kept.dtype)
    a[keep], b[:, keep] = a_kept, b_kept
    return a, b


def lcwa(states: Sequence[dict[str, np.ndarray]], layer_scores: np.ndarray, layers: Sequence[str],
         fallback: Sequence[float]) -> dict[str, np.ndarray]:
    """Eq. 8: per adapter layer j, M_g^j = Σ_i h̃_i^j M_i^j with h̃_i^j = h_i^j / Σ_k h_k^j (the zero-padded
    adapters of all clients, A and B alike). As the paper zero-pads before averaging, a dimension a client
    pruned enters as 0 with that client's layer weight. A layer whose scores sum to 0 (e.g. pruned by every
    client) falls back to the `fallback` weights (num-examples)."""
    scores = np.asarray(layer_scores, dtype=np.float64)
    out: dict[str, np.ndarray] = {}
    for j, layer in enumerate(layers):
        w = scores[:, j] if scores[:, j].sum() > 0 else np.asarray(fallback, dtype=np.float64)
        for key in (layer + LORA_A, layer + LORA_B):
            out[key] = weighted_average([{key: s[key]} for s in states], list(w))[key]
    return out


# --- the strategy ---------------------------------------------------------------------------------------

class FedTPAStrategy(FedITStrategy):
    """ITPA before round 1, per-client keep-ratios down, LCWA + DAPR on the pruned replies."""

    def __init__(self, cfg: RunConfig, recorder: Any = None) -> None:
        super().__init__(cfg, recorder)
        self.beta: dict[int, float] = {}                       # partition id -> keep-ratio for its next round
        self.losses: dict[int, tuple[float, float]] = {}       # partition id -> (train, val) loss of its last round
        self.sent_beta: dict[int, float] = {}                  # node id -> β sent this round
        self.layers: list[str] = []
        self.rank = int(cfg.lora_rank)
        self.hidden_size = 0

    def initial_arrays(self) -> ArrayRecord:
        from fedprune_app.models import peft_model_for

        arrays = super().initial_arrays()
        self.layers = adapter_layers(arrays.keys())
        self.hidden_size = int(peft_model_for(self.cfg)[0].get_base_model().config.hidden_size)
        return arrays

    # --- ITPA ---------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """β_i and the last (train, val) losses per partition (what DAPR's next step needs)."""
        return super().state_dict() | {"beta": dict(self.beta), "losses": dict(self.losses)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.beta, self.losses = dict(state["beta"]), dict(state["losses"])

    def prepare(self, grid: Grid, timeout: float) -> None:
        """Eq. 3–5: ask every connected node for its mean feature vector, set the initial β per partition
        (not again in a resumed run: its β come from the checkpoint)."""
        if not bool(self.cfg.fedtpa_itpa) or self.beta:
            return
        nodes = self.sample(grid, 1.0)
        query = [Message(content=RecordDict({"config": ConfigRecord({"server-round": 0})}),
                         message_type=MessageType.QUERY, dst_node_id=n) for n in nodes]
        feats, sizes, pids, rows = [], [], [], []
        for msg in grid.send_and_receive(query, timeout=timeout):
            node = msg.metadata.src_node_id
            row: dict[str, Any] = {"round": 0, "phase": "features", "node": node}
            problem = f"client error: {msg.error.reason}" if msg.has_error() else self.feature_problem(msg.content)
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
                row.update(client=pid, status="accepted", **{"num-examples": metrics["num-examples"]})
            rows.append(row)
        if feats:
            distances = cosine_distances(np.stack(feats), sizes)
            betas = initial_betas(distances, float(self.cfg.fedtpa_beta_min))
            for pid, d, b in zip(pids, distances, betas, strict=True):
                self.beta[pid] = float(b)
                next(r for r in rows if r.get("client") == pid).update(distance=float(d), beta=float(b))
            log.info("[fedprune] FedTPA initial keep-ratios: %s",
                     ", ".join(f"client {p}: {self.beta[p]:.3f}" for p in sorted(self.beta)))
        for row in rows:
            self.record(row)

    def feature_problem(self, reply: RecordDict) -> str | None:
        """Why a feature reply cannot be used (no/ill-shaped/non-finite λ_i, bad num-examples or partition id)."""
        rec = reply.array_records.get("features")
        if rec is None or "lambda" not in rec:
            return "reply holds no 'features' record with 'lambda'"
        lam = rec["lambda"].numpy()
        if lam.shape != (self.hidden_size,) or not np.isfinite(lam).all() or not np.any(lam):
            return f"lambda must be a finite non-zero vector of shape ({self.hidden_size},), got {lam.shape}"
        return self.metrics_problem(flat_metrics(reply), losses=False)

    # --- rounds -------------------------------------------------------------------------------------------
    def node_config(self, server_round: int, node_id: int) -> dict[str, Any]:
        """The node's keep-ratio; a node the server has not heard from yet trains the full adapter (β = 1)."""
        pid = self.node_partition.get(node_id)
        beta = self.beta.get(pid, 1.0) if pid is not None else 1.0
        self.sent_beta[node_id] = beta
        return {"beta": beta}

    @staticmethod
    def metrics_problem(metrics: dict[str, Any], losses: bool = True) -> str | None:
        pid, n = metrics.get("partition-id"), metrics.get("num-examples")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid < 0:
            return "reply lacks a non-negative int 'partition-id' metric"
        if not isinstance(n, int | float) or not n > 0:
            return "reply lacks a positive 'num-examples' metric"
        if losses:
            train, val = metrics.get("train-loss"), metrics.get("val-loss")
            if not isinstance(train, float | int) or not math.isfinite(train):
                return f"train-loss must be finite, got {train!r}"
            if not isinstance(val, float | int) or math.isinf(val):  # NaN = no validation data
                return f"val-loss must be a float (NaN without validation data), got {val!r}"
        return None

    def reply_problem(self, node_id: int, reply: RecordDict) -> str | None:
        """Reject replies whose kept adapters do not match their pruning log (ranks beyond r_g included), whose
        keep count is not ⌊β·N·r_g⌋ for the β sent, or whose tensors, scores or losses are not finite."""
        if "arrays" not in reply.array_records or "fedtpa" not in reply.array_records:
            return "reply holds no 'arrays' or no 'fedtpa' record"
        arrays, extra, sent = reply.array_records["arrays"], reply.array_records["fedtpa"], self.sent[node_id]
        if set(arrays) != set(sent):
            return f"reply holds {len(arrays)} adapter tensors, expected the {len(sent)} sent"
        if "pruning-log" not in extra or "layer-scores" not in extra:
            return "the 'fedtpa' record lacks 'pruning-log' or 'layer-scores'"
        keep, scores = extra["pruning-log"].numpy(), extra["layer-scores"].numpy()
        n_layers = len(self.layers)
        if keep.dtype != np.bool_ or keep.shape != (n_layers, self.rank):
            return f"pruning-log must be bool of shape ({n_layers}, {self.rank}), got {keep.dtype} {keep.shape}"
        if scores.shape != (n_layers,) or not np.isfinite(scores).all() or (scores < 0).any():
            return f"layer-scores must be {n_layers} finite non-negative numbers"
        expected = keep_count(self.sent_beta.get(node_id, 1.0), n_layers, self.rank)
        if int(keep.sum()) != expected:
            return f"pruning log keeps {int(keep.sum())} dimensions, expected ⌊β·N·r_g⌋ = {expected}"
        for j, layer in enumerate(self.layers):
            if (problem := factor_problem(layer, arrays, sent, int(keep[j].sum()))) is not None:
                return problem + " (the rank its pruning log keeps)"
        problem = self.metrics_problem(flat_metrics(reply))
        if problem is None:
            self.node_partition[node_id] = int(flat_metrics(reply)["partition-id"])
        return problem

    def aggregate(self, server_round: int, replies: list[RecordDict]) -> ArrayRecord:
        """Zero-pad (§III-E), LCWA (Eq. 8) or FedAvg, then DAPR (Eq. 9) per reporting partition."""
        padded, scores, sizes = [], [], []
        for reply in replies:
            arrays, extra = numpy_state(reply.array_records["arrays"]), reply.array_records["fedtpa"]
            keep = extra["pruning-log"].numpy()
            state = {}
            for j, layer in enumerate(self.layers):
                state[layer + LORA_A], state[layer + LORA_B] = zero_pad(arrays[layer + LORA_A],
                                                                        arrays[layer + LORA_B], keep[j])
            padded.append(state)
            scores.append(extra["layer-scores"].numpy())
            sizes.append(float(flat_metrics(reply)["num-examples"]))
        if bool(self.cfg.fedtpa_lcwa):
            merged = lcwa(padded, np.stack(scores), self.layers, sizes)
        else:
            merged = weighted_average(padded, sizes)
        self.adjust_betas(replies)
        return to_record(merged)

    def adjust_betas(self, replies: list[RecordDict]) -> None:
        """Eq. 9 per partition, from this round's losses against its previous round's (β^t = the partition's
        state, which is what its node was sent unless the node was new)."""
        delta = float(self.cfg.fedtpa_delta) if bool(self.cfg.fedtpa_dapr) else 0.0
        for reply in replies:
            m = flat_metrics(reply)
            pid, train, val = int(m["partition-id"]), float(m["train-loss"]), float(m["val-loss"])
            beta = self.beta.get(pid, 1.0)
            if pid in self.losses:
                beta = next_beta(beta, train, self.losses[pid][0], val, self.losses[pid][1], delta)
            self.beta[pid], self.losses[pid] = beta, (train, val)
        log.info("[fedprune] FedTPA next keep-ratios: %s",
                 ", ".join(f"client {p}: {self.beta[p]:.3f}" for p in sorted(self.beta)))
