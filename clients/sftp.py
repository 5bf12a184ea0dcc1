"""SFT-P client (Alg. 1; §3.2–3.3): E local steps on Eq. 13 with hard masks from the shared
generator h_Θ conditioned on the client's private embedding e_k, then Θ (and LoRA Φ with adapters)
back to the server.

One round, top to bottom: `train` loads the global pair (`load_pair`) and this client's
`ClientState`, runs `local_round` (fedprune_app/methods/sftp/local.py), keeps the state and replies;
`evaluate` scores the deployed mask (`own_masks`) of the pair it deploys (`deployed_pair`).

Private state (`context.state`, never sent): ArrayRecord `sftp-embedding` = e_k and its AdamW
moments, and the ConfigRecord `sftp` (AdamW step of e_k, rounds trained); under `sftp-deploy-state =
"local"` also ArrayRecord `sftp-local-state` = the (Θ_k, Φ_k) of its last local training (a copy of
what it uploaded). Θ's and Φ's optimiser state is fresh each round.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from torch import nn

from fedprune_app.core.client import FederatedClient
from fedprune_app.core.protocol import to_record
from fedprune_app.core.registry import register_client
from fedprune_app.llm.evaluation import evaluate_client, mean_loss
from fedprune_app.llm.models import get_adapter_state, model_device
from fedprune_app.methods.sftp.config import SFTPConfig
from fedprune_app.methods.sftp.generator import (
    MaskGenerator,
    deployed_gates,
    get_generator_state,
    initial_embedding,
    layer_masks,
    stacked_masks,
)
from fedprune_app.methods.sftp.local import ClientState, RoundPlan, local_round
from fedprune_app.methods.sftp.models import load_pair
from fedprune_app.methods.sftp.objective import expected_kept
from fedprune_app.methods.sftp.schedules import keep_ratio_of
from fedprune_app.structural.held import held_coordinates
from fedprune_app.structural.routing import LayerMasks, masked, model_kept_ratios

EMBEDDING_RECORD = "sftp-embedding"
LOCAL_STATE_RECORD = "sftp-local-state"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@register_client("sftp")
class SFTPClient(FederatedClient):
    """Trains Θ (+Φ) and its private e_k; evaluates its own deployed mask on its own task."""

    name = "sftp"
    dp_clips_on_client = True  # the reply is the sent (Θ, Φ) after local steps; e_k is not in it

    @property
    def keep_ratio(self) -> float:
        return keep_ratio_of(self.cfg, self.partition_id, self.num_partitions)

    # --- a round's training -------------------------------------------------------------
    def train(self, content: RecordDict) -> RecordDict:
        start = time.perf_counter()
        server_round = int(content.config_records["config"]["server-round"])
        # 1. the global (Θ, Φ) in the routed model and h_Θ; this client's e_k and its moments
        model, tokenizer, generator = self.load(content)
        state = self.client_state(model_device(model))
        # 2. E local steps on Eq. 13 (a recovery round: Φ alone, on the deployed mask held fixed)
        sftp_cfg = self.cfg.section(SFTPConfig)
        recovery = server_round > self.cfg.num_server_rounds - sftp_cfg.sftp_recovery_rounds
        fixed = self.own_masks(model, tokenizer, generator, state.embedding) if recovery else None
        plan = RoundPlan(server_round, self.seed(server_round), self.keep_ratio, fixed)
        report = local_round(self.cfg, model, tokenizer, generator, state, self.data.train, plan)
        # 3. the deployed mask after the round, its kept ratio and validation loss
        masks = fixed or self.own_masks(model, tokenizer, generator, state.embedding)
        with torch.no_grad():
            expected = expected_kept(model, tokenizer, generator, state.embedding, self.cfg)
            with masked(model, masks):
                val = self.data.val
                val_loss = mean_loss(model, tokenizer, val, self.cfg.seq_len) if val else math.nan
        # 4. the reply: Θ (+Φ); the client keeps e_k (after a trained round) and, under 'local'
        #    deployment, a copy of the pair
        arrays = get_generator_state(generator)
        if sftp_cfg.sftp_adapters:
            arrays |= get_adapter_state(model)
        if sftp_cfg.sftp_deploy_state == "local":
            state.deployed = arrays
        self.keep(state, embedding_trained=not recovery)
        metrics = MetricRecord(
            {
                "num-examples": len(self.data.train),
                "partition-id": self.partition_id,
                "keep-target": self.keep_ratio,
                "train-loss": _mean(report.losses),
                "clm-loss": _mean(report.values.get("clm", [])),
                "penalty": _mean(report.values.get("penalty", [])),
                "val-loss": val_loss,
                **model_kept_ratios(model, masks),
                "kept-expected": expected,
                "train-seconds": report.seconds,
                "seconds": time.perf_counter() - start,
            }
        )
        return RecordDict({"arrays": ArrayRecord(arrays), "metrics": metrics, "info": self.info()})

    # --- a round's evaluation -----------------------------------------------------------
    def evaluate(self, content: RecordDict) -> RecordDict:
        """Round 0: the dense model. Later: the client's deployed mask (`own_masks`) on the routed
        model, both of the (Θ, Φ) it deploys (`deployed_pair`: the global pair, or under 'local' its
        own last-trained one). At the last round the reply also carries that mask as bool arrays
        `masks` {name: (layers, d)}: the structure the server compiles and deploys for this client.
        It is all the server learns about the client beyond Θ/Φ and the metrics (e_k itself never
        leaves)."""
        start = time.perf_counter()
        server_round = int(content.config_records["config"]["server-round"])
        if server_round == 0:
            model, tokenizer, generator = self.load(content)
            masks = None
        else:
            state = self.client_state()
            model, tokenizer, generator = load_pair(self.cfg, self.deployed_pair(content, state))
            embedding = None if state.embedding is None else state.embedding.to(model_device(model))
            masks = self.own_masks(model, tokenizer, generator, embedding)
        with masked(model, masks), torch.no_grad():
            scores = evaluate_client(model, tokenizer, self.data, self.cfg, self.num_partitions)
        metrics = MetricRecord(
            {
                **scores,
                **model_kept_ratios(model, masks),
                "num-examples": len(self.data.test),
                "partition-id": self.partition_id,
                "keep-target": self.keep_ratio,
                "seconds": time.perf_counter() - start,
            }
        )
        reply = RecordDict({"metrics": metrics, "info": self.info()})
        if masks is not None and server_round == self.cfg.num_server_rounds:
            stacked = stacked_masks(masks)
            reply["masks"] = to_record({k: v.bool().cpu().numpy() for k, v in stacked.items()})
        return reply

    # --- the models and masks -----------------------------------------------------------
    def load(self, content: RecordDict) -> tuple[nn.Module, Any, MaskGenerator]:
        """The routed model with the message's Φ loaded, and h_Θ with its Θ."""
        return load_pair(self.cfg, content.array_records["arrays"].to_torch_state_dict())

    def deployed_pair(self, content: RecordDict, state: ClientState) -> dict[str, torch.Tensor]:
        """The (Θ, Φ) this client deploys (`sftp-deploy-state`): the message's (the global ones), or
        under 'local' the (Θ_k, Φ_k) its last local training left (`state.deployed`), once it has
        trained."""
        if self.cfg.section(SFTPConfig).sftp_deploy_state == "local" and state.deployed is not None:
            return state.deployed
        return content.array_records["arrays"].to_torch_state_dict()

    def own_masks(
        self,
        model: nn.Module,
        tokenizer: Any,
        generator: MaskGenerator,
        embedding: torch.Tensor | None,
    ) -> list[LayerMasks]:
        """This client's deployed mask of h_Θ(e_k) (`deployed_gates`: by default the top-π gates
        that fit its budget p, the `hold-open` gates at 1), one LayerMasks per decoder
        layer."""
        sftp_cfg = self.cfg.section(SFTPConfig)
        held = held_coordinates(self.cfg, model, tokenizer)
        with torch.no_grad():
            gates = deployed_gates(
                generator(embedding),
                sftp_cfg.sftp_gate_bias,
                held,
                model.config,
                self.keep_ratio,
                sftp_cfg.sftp_deploy_mask,
            )
        return layer_masks(gates)

    # --- the private state --------------------------------------------------------------
    def client_state(self, device: torch.device | str = "cpu") -> ClientState:
        """e_k and its AdamW moments from `context.state`, on `device` (the model's); e_k^(0) from
        `initial_embedding`, seeded by (seed, partition), at first use. No e_k under NOC (no private
        conditioning). `deployed`: the (Θ_k, Φ_k) kept under 'local' deployment, if any."""
        deployed = self.context.state.array_records.get(LOCAL_STATE_RECORD)
        deployed_state = None if deployed is None else deployed.to_torch_state_dict()
        if not self.cfg.section(SFTPConfig).sftp_conditioning:
            return ClientState(None, {}, deployed_state)
        if EMBEDDING_RECORD not in self.context.state.array_records:
            init = initial_embedding(self.cfg, self.seed(0))
            self.context.state[EMBEDDING_RECORD] = ArrayRecord({"embedding": init})
        stored = self.context.state.array_records[EMBEDDING_RECORD].to_torch_state_dict()
        moments = {k: v.to(device) for k, v in stored.items() if k != "embedding"}
        if moments:
            # AdamW keeps the step on the CPU
            moments["step"] = torch.tensor(float(self.private["embedding-step"]))
        embedding = nn.Parameter(stored["embedding"].to(device, copy=True))
        return ClientState(embedding, moments, deployed_state)

    def keep(self, state: ClientState, embedding_trained: bool) -> None:
        """`state` back in `context.state` after a round: e_k and its AdamW moments (and step) when
        this round trained them, the deployed pair when there is one, and the count of rounds
        trained."""
        if state.embedding is not None and embedding_trained:
            arrays = {
                "embedding": state.embedding.detach().to("cpu", copy=True),
                **{k: state.moments[k].cpu() for k in ("exp_avg", "exp_avg_sq")},
            }
            self.context.state[EMBEDDING_RECORD] = ArrayRecord(arrays)
            self.private["embedding-step"] = float(state.moments["step"])
        if state.deployed is not None:
            self.context.state[LOCAL_STATE_RECORD] = ArrayRecord(state.deployed)
        self.private["rounds-trained"] = int(self.private.get("rounds-trained", 0)) + 1
