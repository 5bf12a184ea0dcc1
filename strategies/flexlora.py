"""FlexLoRA (Bai et al., NeurIPS 2024; FedTPA's baseline [15]): heterogeneous LoRA ranks, ΔW
averaging, SVD.

Client i trains LoRA at its own rank r_i (`flexlora-ranks`, by partition id: its resources). The
server forms every client's full ΔW_i = (α/r_i)·B_i·A_i per adapter layer, averages them by data
size, ΔW = Σ_i p_i ΔW_i (p_i ∝ num-examples), and gives each client its own rank back by truncated
SVD: B = U_r·S_r/(α/r), A = V_rᵀ (the FederatedScope FlexLoRA split: the singular values go to B, A
stays orthonormal; peft then applies α/r and reproduces U_r S_r V_rᵀ, the best rank-r approximation,
Eckart–Young).

The global arrays the loop carries (and that federated evaluation, server evaluation and the saved
adapter use) are the factors at the largest configured rank r_max; a node of known rank r is sent
their first r dimensions (`truncate_factors`, identical to the rank-r SVD). A node not heard from
yet gets the r_max factors and truncates them itself. The share of ‖ΔW‖²_F that rank r_max keeps is
logged each round (`svd-energy`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict

from fedprune_app.core.config import RunConfig
from fedprune_app.core.lora import LoRAReport, LoRAStrategy
from fedprune_app.core.privacy import private_mean
from fedprune_app.core.protocol import flat_metrics, numpy_state, parse_partition_id
from fedprune_app.core.registry import register_strategy
from fedprune_app.core.replies import examples_problem, to_record, values_of_problem
from fedprune_app.core.strategy import log
from fedprune_app.llm.lora import LORA_A, LORA_B, adapter_layers, factor_problem, truncate_factors
from fedprune_app.llm.models import peft_model_for, save_adapter, set_adapter_state
from fedprune_app.methods.flexlora.config import max_rank
from fedprune_app.methods.flexlora.svd import average_deltas, lora_delta, svd_factors

# --- pure functions -------------------------------------------------------------------------------


# --- the strategy ---------------------------------------------------------------------------------


class FlexLoRAReport(LoRAReport):
    """flexlora's part of the run's report."""

    def save_final(self, arrays: ArrayRecord, out_dir: Path) -> dict[str, str]:
        """`adapter/`: the global factors at r_max (the LoRA base's `save_final`);
        `client-adapters/client-<k>/`: client k's final model, the global factors truncated to its
        rank r_k (what it trains on, see `configure_round`), a PEFT directory at rank r_k (α
        unchanged, so α/r_k scales it); with `save-merged` also `client-merged/client-<k>/`."""
        s = self.strategy
        artefacts = super().save_final(arrays, out_dir)
        state = numpy_state(arrays)
        for pid, rank in sorted(s.partition_rank.items()):
            model, tokenizer = peft_model_for(s.cfg, rank=rank)
            set_adapter_state(
                model, {k: torch.from_numpy(v) for k, v in s.at_rank(state, rank).items()}
            )
            merged = out_dir / "client-merged" / f"client-{pid}" if s.cfg.save_merged else None
            save_adapter(model, out_dir / "client-adapters" / f"client-{pid}", merged, tokenizer)
            artefacts[f"adapter-client-{pid}"] = f"client-adapters/client-{pid}"
            if merged is not None:
                artefacts[f"merged-client-{pid}"] = f"client-merged/client-{pid}"
        return artefacts


@register_strategy("flexlora")
class FlexLoRAStrategy(LoRAStrategy):
    """Per-node ranks down, heterogeneous adapters up, ΔW average + truncated SVD."""

    dp_release = (
        "ΔW of every adapted layer: each client's change of (α/r_i)·B_i A_i from the "
        "global ΔW, all layers jointly, clipped on the server"
    )
    report_class = FlexLoRAReport

    def __init__(self, cfg: RunConfig, recorder: Any = None) -> None:
        super().__init__(cfg.replace(lora_rank=max_rank(cfg)), recorder)
        self.r_max = max_rank(cfg)
        self.alpha = cfg.lora_alpha
        self.partition_rank: dict[int, int] = {}  # partition id -> the rank its last reply reported
        self.layers: list[str] = []

    def initial_arrays(self) -> ArrayRecord:
        """Fresh LoRA at r_max (A seeded, B = 0: ΔW = 0); a rank-r client starts from its first r
        rows of A."""
        arrays = super().initial_arrays()
        self.layers = adapter_layers(arrays.keys())
        return arrays

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"partition-rank": dict(self.partition_rank)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.partition_rank = dict(state["partition-rank"])

    def rank_of(self, node_id: int) -> int:
        """The rank the node's partition reported last (r_max before its first reply)."""
        return self.partition_rank.get(self.node_partition.get(node_id, -1), self.r_max)

    def configure_round(
        self, server_round: int, arrays: ArrayRecord, node_ids: list[int]
    ) -> dict[int, tuple[ArrayRecord, dict[str, Any]]]:
        """Each node gets the global factors truncated to its rank (`at_rank`) and that rank."""
        tasks = {}
        for node_id in node_ids:
            rank = self.rank_of(node_id)
            payload = (
                arrays if rank == self.r_max else to_record(self.at_rank(numpy_state(arrays), rank))
            )
            tasks[node_id] = (payload, {"rank": rank})
        return tasks

    def at_rank(self, state: dict[str, np.ndarray], rank: int) -> dict[str, np.ndarray]:
        """The global factors truncated to `rank` (`truncate_factors`: the rank-r SVD of the same
        ΔW)."""
        out: dict[str, np.ndarray] = {}
        for layer in adapter_layers(state):
            out[layer + LORA_B], out[layer + LORA_A] = truncate_factors(
                state[layer + LORA_B], state[layer + LORA_A], rank
            )
        return out

    def accept_reply(
        self, server_round: int, node_id: int, reply: RecordDict, phase: str
    ) -> str | None:
        """Reject train replies with missing/extra tensors, a rank outside [1, r_max] or not the
        same in every layer (and as reported), shapes that do not fit the layers, non-finite values
        or bad metrics."""
        if phase != "train":
            return None
        if "arrays" not in reply.array_records:
            return "reply holds no 'arrays' record"
        arrays, sent = reply.array_records["arrays"], self.sent[node_id]
        if set(arrays) != set(sent):
            return f"reply holds {len(arrays)} adapter tensors, expected the {len(sent)} sent"
        metrics = flat_metrics(reply)
        rank = metrics.get("rank")
        if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= self.r_max:
            return f"reply reports rank {rank!r}, expected an int in [1, {self.r_max}]"
        for layer in self.layers:
            if (problem := factor_problem(layer, arrays, sent, rank)) is not None:
                return problem
        if (problem := values_of_problem(arrays, sent)) is not None:
            return problem
        if (problem := examples_problem(metrics)) is not None:
            return problem
        try:
            self.partition_rank[parse_partition_id(metrics.get("partition-id"))] = rank
        except ValueError as err:
            return f"reply metric {err}"
        return None

    def aggregate(self, server_round: int, replies: list[RecordDict]) -> ArrayRecord:
        states = [numpy_state(r.array_records["arrays"]) for r in replies]
        metrics = [flat_metrics(r) for r in replies]
        deltas = average_deltas(
            states,
            [int(m["rank"]) for m in metrics],
            [float(m["num-examples"]) for m in metrics],
            self.layers,
            self.alpha,
        )
        return self.factors(server_round, deltas)

    def dp_aggregate(
        self, server_round: int, replies: list[RecordDict], arrays: ArrayRecord, sampled: int
    ) -> ArrayRecord:
        """DP-FedAvg on ΔW (McMahan et al. 2018, on the products, not the factors), with the public
        reference ΔW_g = (α/r_max)·B A of the global factors (the last release, post-processed):
        ΔW = ΔW_g + (1/m)·Σ_i clip_C(ΔW_i − ΔW_g) + N(0, (σ·C/m)²) on the dense matrices
        (`private_mean`), ΔW_i = (α/r_i)·B_i A_i over all layers jointly, then the truncated SVD
        (post-processing). Adding or removing one client moves the sum by at most C whatever the
        ranks: nothing but the clipped terms depends on who replied. A rank-r client's change
        includes ΔW_g's part beyond rank r, which it was never sent (it spends clipping budget).
        Clipped here, on the server: factors at a client's own rank are no update of the sent
        ones, and clipping B and A does not bound their product. With σ = 0, every client
        replying and none clipped: FlexLoRA's uniform-weight mean."""

        dp, state = self.dp, numpy_state(arrays)
        reference = {
            layer: lora_delta(state[layer + LORA_B], state[layer + LORA_A], self.alpha, self.r_max)
            for layer in self.layers
        }
        products = []
        for reply in replies:
            scale = {"alpha": self.alpha, "rank": int(flat_metrics(reply)["rank"])}
            local = numpy_state(reply.array_records["arrays"])
            products.append(
                {
                    layer: lora_delta(b=local[layer + LORA_B], a=local[layer + LORA_A], **scale)
                    for layer in self.layers
                }
            )
        released, norms = private_mean(
            reference,
            products,
            self.layers,
            dp.dp_clipping_norm,
            dp.dp_noise_multiplier,
            sampled,
            self.dp_noise(server_round) if dp.dp_noise_multiplier > 0 else None,
        )
        self.dp_account(server_round, sampled, replies, norms)
        return self.factors(server_round, released)

    def factors(self, server_round: int, deltas: dict[str, np.ndarray]) -> ArrayRecord:
        """The global factors at r_max: the truncated SVD of each layer's averaged ΔW (and the
        share of ‖ΔW‖²_F it keeps, logged)."""
        out: dict[str, np.ndarray] = {}
        energy = []
        for layer, delta in deltas.items():
            out[layer + LORA_B], out[layer + LORA_A], kept = svd_factors(
                delta, self.r_max, self.alpha
            )
            energy.append(kept)
        share = float(np.mean(energy))
        self.record({"round": server_round, "phase": "server-aggregate", "svd-energy": share})
        log.info(
            "[fedprune] FlexLoRA round %d: rank %d keeps %.4f of ||dW||^2 (mean over layers)",
            server_round,
            self.r_max,
            share,
        )
        return to_record(out)
