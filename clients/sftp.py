"""SFT-P client (Alg. 1; §3.2–3.3): E local steps on Eq. 13 with hard masks from the shared generator h_Θ
conditioned on the client's private embedding e_k, then Θ (and LoRA Φ with adapters) back to the server.

Private state (`context.state`, never sent): ArrayRecord `sftp-embedding` = e_k and its AdamW moments, and
the ConfigRecord `sftp` (AdamW step of e_k, rounds trained); under `sftp-deploy-state = "local"` also ArrayRecord
`sftp-local-state` = the (Θ_k, Φ_k) of its last local training (a copy of what it uploaded). Θ's and Φ's optimiser
state is fresh each round.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from torch import Tensor, nn

from fedprune_app.core.client import FederatedClient
from fedprune_app.core.config import RunConfig
from fedprune_app.core.protocol import to_record
from fedprune_app.core.registry import register_client
from fedprune_app.llm.data import Example, training_batches
from fedprune_app.llm.evaluation import evaluate_client, mean_loss
from fedprune_app.llm.models import get_adapter_state, model_device
from fedprune_app.llm.training import optimizer_step, packed_training, to_device
from fedprune_app.methods.sftp.config import SFTPConfig
from fedprune_app.methods.sftp.generator import (
    MaskGenerator,
    cosine_lr,
    deployed_gates,
    get_generator_state,
    held_open,
    highest_keep_ratio,
    hold_open,
    initial_embedding,
    keep_ratio_of,
    layer_masks,
    model_kept_ratios,
    ramped_keep_ratio,
    routed_model_with,
    sampled_masks,
    sftp_objective,
    stacked_masks,
)
from fedprune_app.methods.sftp.routing import LayerMasks, kept_parameters, prunable_parameters, set_masks

EMBEDDING_RECORD = "sftp-embedding"
LOCAL_STATE_RECORD = "sftp-local-state"


@dataclass
class LocalReport:
    """Per-step CLM loss and penalty of one round of local training."""

    clm: list[float] = field(default_factory=list)
    penalty: list[float] = field(default_factory=list)
    objective: list[float] = field(default_factory=list)
    seconds: float = 0.0


def local_training(model: nn.Module, tokenizer: Any, generator: MaskGenerator, embedding: nn.Parameter | None,
                   embedding_state: dict[str, Tensor], examples: list[Example], cfg: RunConfig, keep_ratio: float,
                   seed: int, server_round: int, fixed_masks: list[LayerMasks] | None = None) -> LocalReport:
    """Alg. 1's inner loop: per step, g = ReinMax gates of h_Θ(e_k) (Eq. 10–12), L = CLM + λ·R(T(g), p·T_total)
    (Eq. 13–14, `sftp_objective`; p ramped over the first `sftp-budget-warmup-steps` global steps from 1 or, with
    `sftp-budget-warmup-start` 'gap', from 1 − (p_max − p), `ramped_keep_ratio`, not in the paper, default off),
    one AdamW step on (Θ, e_k, Φ) with the gradient clipped jointly to `max-grad-norm`. Gates held open by
    `sftp-hold-open` read 1 in every sampled mask (`hold_open`).

    LoRA dropout is seeded by `seed` too, so a client's round is the same whatever ran before it in the process.

    `fixed_masks` (a recovery round, `sftp-recovery-rounds`; not in Alg. 1): every step runs these masks and
    AdamW steps Φ alone on L_CLM; Θ and e_k do not move (the penalty of the fixed mask is reported, not trained).

    AdamW lr `sftp-generator-lr`, wd `sftp-generator-weight-decay` for Θ and e_k (constant; e_k's lr times
    `sftp-embed-lr-scale`, 1 = the paper's one rate, and its wd `sftp-embed-weight-decay`); LoRA lr
    `sftp-lora-lr` cosine-annealed over all rounds' steps (step (round−1)·E + t of R·E), wd `weight-decay`.
    `embedding_state` holds e_k's AdamW moments/step ({} at first) and is updated in place.
    """
    sftp_cfg = cfg.section(SFTPConfig)
    steps, total_steps = cfg.local_steps, cfg.num_server_rounds * cfg.local_steps
    lora = [p for p in model.parameters() if p.requires_grad]
    recovery = fixed_masks is not None
    if recovery and not lora:
        raise ValueError("a recovery round (fixed masks) trains Φ only: it needs adapters (sftp-adapters)")
    groups: list[dict[str, Any]] = [] if recovery else [{"params": list(generator.parameters())}]
    if embedding is not None and not recovery:
        groups.append({"params": [embedding], "lr": sftp_cfg.sftp_embed_lr_scale * sftp_cfg.sftp_generator_lr,
                       "weight_decay": sftp_cfg.sftp_embed_weight_decay})
    if lora:
        groups.append({"params": lora, "lr": sftp_cfg.sftp_lora_lr, "weight_decay": cfg.weight_decay})
    opt = torch.optim.AdamW(groups, lr=sftp_cfg.sftp_generator_lr,
                            weight_decay=sftp_cfg.sftp_generator_weight_decay)
    if embedding is not None and embedding_state and not recovery:
        opt.state[embedding] = {k: v.clone() for k, v in embedding_state.items()}
    params = [p for g in groups for p in g["params"]]
    config, total = model.config, prunable_parameters(model.config)
    tau, bias, lam = sftp_cfg.sftp_gate_tau, sftp_cfg.sftp_gate_bias, sftp_cfg.sftp_lambda
    gate_rng = torch.Generator().manual_seed(seed)  # CPU: the same gates for a seed on any device
    device = model_device(model)
    held = held_open(cfg, model, tokenizer)
    highest = highest_keep_ratio(cfg)
    set_masks(model, None)  # the packing probe runs the dense model
    packed = packed_training(model, tokenizer, cfg)
    report, start = LocalReport(), time.perf_counter()
    model.train()
    generator.train()
    torch.manual_seed(seed)  # LoRA dropout draws from the global generator: the same round for a seed, as FedIT's
    try:
        for t, batch in enumerate(training_batches(examples, tokenizer, cfg.batch_size, steps, cfg.seq_len,
                                                   seed, targets=sftp_cfg.sftp_loss_on, packed=packed)):
            step = (server_round - 1) * steps + t
            if lora:
                groups[-1]["lr"] = cosine_lr(sftp_cfg.sftp_lora_lr, step, total_steps)
            masks = fixed_masks if recovery else sampled_masks(generator(embedding), tau, bias, held, gate_rng)
            set_masks(model, masks)
            clm = model(**to_device(batch, device)).loss
            target = ramped_keep_ratio(keep_ratio, step, sftp_cfg.sftp_budget_warmup_steps, highest)
            loss, penalty = sftp_objective(clm, kept_parameters(config, masks), target, total, lam)
            if recovery:
                loss = clm  # the fixed mask's penalty is a constant: reported, not trained
            optimizer_step(loss, params, opt, cfg.max_grad_norm, "sftp-generator-lr")
            report.clm.append(clm.item())
            report.penalty.append(penalty.item())
            report.objective.append(loss.item())
    finally:
        set_masks(model, None)
        model.eval()
        generator.eval()
    if embedding is not None and not recovery:
        embedding_state.clear()
        embedding_state.update({k: v.detach().clone() for k, v in opt.state[embedding].items()})
    report.seconds = time.perf_counter() - start
    return report


def expected_kept(model: nn.Module, tokenizer: Any, generator: MaskGenerator, embedding: nn.Parameter | None,
                  cfg: RunConfig) -> float:
    """E[T(g)]/T_total under the sampled gates g ~ Bernoulli(π) (held gates at 1): T is linear in each gate, so
    this is T(π)/T_total, the kept ratio Eq. 14's penalty drives to p (Fig. 4b's curve)."""
    pi = torch.sigmoid(generator(embedding).detach().float() + cfg.section(SFTPConfig).sftp_gate_bias)
    kept = kept_parameters(model.config, layer_masks(hold_open(pi, held_open(cfg, model, tokenizer))))
    return float(kept) / prunable_parameters(model.config)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@register_client("sftp")
class SFTPClient(FederatedClient):
    """Trains Θ (+Φ) and its private e_k; evaluates its own deterministic mask on its own task."""

    name = "sftp"
    dp_clips_on_client = True  # the reply is the sent (Θ, Φ) after local steps; e_k is not in it

    @property
    def keep_ratio(self) -> float:
        return keep_ratio_of(self.cfg, self.partition_id, self.num_partitions)

    def load(self, content: RecordDict) -> tuple[nn.Module, Any, MaskGenerator]:
        """The routed model with the message's Φ loaded, and h_Θ with its Θ."""
        return routed_model_with(self.cfg, content.array_records["arrays"].to_torch_state_dict())

    def deployed_state(self, content: RecordDict) -> ArrayRecord:
        """The (Θ, Φ) this client deploys (`sftp-deploy-state`): the message's (the global ones), or under 'local'
        the (Θ_k, Φ_k) its last local training left, once it has trained."""
        if self.cfg.section(SFTPConfig).sftp_deploy_state == "local" and \
                LOCAL_STATE_RECORD in self.context.state.array_records:
            return self.context.state.array_records[LOCAL_STATE_RECORD]
        return content.array_records["arrays"]

    def load_deployed(self, content: RecordDict) -> tuple[nn.Module, Any, MaskGenerator]:
        """The routed model and h_Θ of `deployed_state`."""
        return routed_model_with(self.cfg, self.deployed_state(content).to_torch_state_dict())

    def embedding(self, device: torch.device | str = "cpu") -> tuple[nn.Parameter | None, dict[str, Tensor]]:
        """(e_k, its AdamW state) from `context.state`, on `device` (the model's); e_k^(0) from
        `initial_embedding`, seeded by (seed, partition), at first use. None under NOC (no private conditioning)."""
        sftp_cfg = self.cfg.section(SFTPConfig)
        if not sftp_cfg.sftp_conditioning:
            return None, {}
        if EMBEDDING_RECORD not in self.context.state.array_records:
            init = initial_embedding(self.cfg, self.seed(0))
            self.context.state[EMBEDDING_RECORD] = ArrayRecord({"embedding": init})
        stored = self.context.state.array_records[EMBEDDING_RECORD].to_torch_state_dict()
        state = {k: v.to(device) for k, v in stored.items() if k != "embedding"}
        if state:
            state["step"] = torch.tensor(float(self.private["embedding-step"]))  # AdamW keeps it on the CPU
        return nn.Parameter(stored["embedding"].to(device, copy=True)), state

    def store_embedding(self, embedding: nn.Parameter, state: dict[str, Tensor]) -> None:
        arrays = {"embedding": embedding.detach().to("cpu", copy=True), "exp_avg": state["exp_avg"].cpu(),
                  "exp_avg_sq": state["exp_avg_sq"].cpu()}
        self.context.state[EMBEDDING_RECORD] = ArrayRecord(arrays)
        self.private["embedding-step"] = float(state["step"])

    def own_masks(self, model: nn.Module, tokenizer: Any, generator: MaskGenerator,
                  embedding: nn.Parameter | None) -> list[LayerMasks]:
        """This client's deployed mask of h_Θ(e_k) (`deployed_gates`: by default the top-π gates that fit its
        budget p, the `sftp-hold-open` gates at 1), one LayerMasks per decoder layer."""
        sftp_cfg = self.cfg.section(SFTPConfig)
        held = held_open(self.cfg, model, tokenizer)
        with torch.no_grad():
            return layer_masks(deployed_gates(generator(embedding), sftp_cfg.sftp_gate_bias, held, model.config,
                                              self.keep_ratio, sftp_cfg.sftp_deploy_mask))

    def train(self, content: RecordDict) -> RecordDict:
        start = time.perf_counter()
        server_round = int(content.config_records["config"]["server-round"])
        model, tokenizer, generator = self.load(content)
        embedding, state = self.embedding(model_device(model))
        recovery = server_round > self.cfg.num_server_rounds - self.cfg.section(SFTPConfig).sftp_recovery_rounds
        fixed = self.own_masks(model, tokenizer, generator, embedding) if recovery else None
        report = local_training(model, tokenizer, generator, embedding, state, self.data.train, self.cfg,
                                self.keep_ratio, self.seed(server_round), server_round, fixed_masks=fixed)
        if embedding is not None and not recovery:
            self.store_embedding(embedding, state)
        self.private["rounds-trained"] = int(self.private.get("rounds-trained", 0)) + 1
        masks = fixed or self.own_masks(model, tokenizer, generator, embedding)  # a recovery round left Θ, e_k as is
        with torch.no_grad():
            expected = expected_kept(model, tokenizer, generator, embedding, self.cfg)
            set_masks(model, masks)
            try:
                val_loss = mean_loss(model, tokenizer, self.data.val, self.cfg.seq_len) if self.data.val \
                    else math.nan
            finally:
                set_masks(model, None)
        arrays = get_generator_state(generator)
        if self.cfg.section(SFTPConfig).sftp_adapters:
            arrays |= get_adapter_state(model)
        if self.cfg.section(SFTPConfig).sftp_deploy_state == "local":
            self.context.state[LOCAL_STATE_RECORD] = ArrayRecord(arrays)
        metrics = MetricRecord({
            "num-examples": len(self.data.train), "partition-id": self.partition_id, "keep-target": self.keep_ratio,
            "train-loss": _mean(report.objective), "clm-loss": _mean(report.clm), "penalty": _mean(report.penalty),
            "val-loss": val_loss, **model_kept_ratios(model, masks), "kept-expected": expected,
            "train-seconds": report.seconds,
            "seconds": time.perf_counter() - start,
        })
        return RecordDict({"arrays": ArrayRecord(arrays), "metrics": metrics, "info": self.info()})

    def evaluate(self, content: RecordDict) -> RecordDict:
        """Round 0: the dense model. Later: the client's deployed mask (`own_masks`) on the routed model, both of the
        (Θ, Φ) it deploys (`load_deployed`: the global pair, or under 'local' its own last-trained one). At the
        last round the reply also carries that mask as bool arrays `masks` {name: (layers, d)}:
        the structure the server compiles and deploys for this client. It is all the server learns about the
        client beyond Θ/Φ and the metrics (e_k itself never leaves)."""
        start = time.perf_counter()
        server_round = int(content.config_records["config"]["server-round"])
        model, tokenizer, generator = self.load(content) if server_round == 0 else self.load_deployed(content)
        masks = None
        if server_round > 0:
            masks = self.own_masks(model, tokenizer, generator, self.embedding(model_device(model))[0])
        set_masks(model, masks)
        try:
            with torch.no_grad():
                scores = evaluate_client(model, tokenizer, self.data, self.cfg, self.num_partitions)
        finally:
            set_masks(model, None)
        metrics = MetricRecord({**scores, **model_kept_ratios(model, masks), "num-examples": len(self.data.test),
                                "partition-id": self.partition_id, "keep-target": self.keep_ratio,
                                "seconds": time.perf_counter() - start})
        reply = RecordDict({"metrics": metrics, "info": self.info()})
        if masks is not None and server_round == self.cfg.num_server_rounds:
            reply["masks"] = to_record({k: v.bool().cpu().numpy() for k, v in stacked_masks(masks).items()})
        return reply
