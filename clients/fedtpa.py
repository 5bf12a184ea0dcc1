"""FedTPA client (§III-C, III-D, III-E): the mean feature once, then warm-up → rank
pruning → fine-tuning.

- `query` (ITPA, Eq. 3): λ_i = the mean over up to `fedtpa-feature-examples` local samples (I ⊕ x ⊕
  y, i.e. prompt + ' ' + response, truncated like training) of the backbone's final hidden state
  (after the last norm), mean-pooled over each sample's tokens. The adapters are disabled: M_φ is
  the frozen pre-trained backbone.
- `train`: `fedtpa-warmup-steps` steps of ordinary LoRA training on the global rank-r_g adapter
  while gradient hooks update the EMA of |w·∂L/∂w| (Eq. 6); the top ⌊β·N·r_g⌋ dimensions over all
  layers are kept (§III-D2) and fine-tuned for the remaining `local-steps` (a fresh AdamW over the
  smaller adapters). The reply holds the kept dimensions only, the N×r_g pruning log, the per-layer
  scores (Eq. 7) of the warm-up EMA, train/val loss.
- Private: a round counter and, with `fedtpa-ema-scope = "run"`, the EMA (an ArrayRecord
  `fedtpa-ema` in context.state, carried over to the next round's warm-up); neither is ever part of
  a reply. The default "warmup" restarts Eq. 6 from zero every round, as §III-D1 reads ("the overall
  contribution score during the warm-up stage" of the global adapter just received: last round's
  scores describe weights the aggregation has since replaced).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch
from flwr.app import MetricRecord, RecordDict

from fedprune_app.core.lora import LoRAClient
from fedprune_app.core.protocol import to_record
from fedprune_app.core.registry import register_client
from fedprune_app.llm.data import Example, collate, encode
from fedprune_app.llm.evaluation import mean_loss
from fedprune_app.llm.lora import LORA_A, LORA_B
from fedprune_app.llm.models import get_adapter_state, model_device, peft_model_for
from fedprune_app.llm.training import train_steps
from fedprune_app.methods.fedtpa.config import FedTPAConfig
from fedprune_app.methods.fedtpa.rank_pruning import (
    ContributionTracker,
    layer_contributions,
    lora_modules,
    prune_log,
    pruned_adapters,
)

EMA_RECORD = "fedtpa-ema"


@torch.no_grad()
def mean_feature(
    model: Any, tokenizer: Any, examples: list[Example], seq_len: int, batch_size: int = 8
) -> np.ndarray:
    """Eq. 3: the mean over `examples` of each sample's token-averaged final hidden state of the
    backbone."""
    backbone = (
        model.get_base_model().base_model if hasattr(model, "get_base_model") else model.base_model
    )
    total, count, device = None, 0, model_device(model)
    ctx = model.disable_adapter() if hasattr(model, "disable_adapter") else torch.no_grad()
    with ctx:
        for i in range(0, len(examples), batch_size):
            batch = collate(
                [encode(tokenizer, e, seq_len) for e in examples[i : i + batch_size]],
                tokenizer.pad_token_id,
            )
            batch = {k: v.to(device) for k, v in batch.items()}
            hidden = backbone(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            ).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            per_sample = (hidden.float() * mask).sum(dim=1) / mask.sum(dim=1)
            total = per_sample.sum(dim=0) if total is None else total + per_sample.sum(dim=0)
            count += per_sample.shape[0]
    return (total / count).cpu().numpy().astype(np.float32)


@register_client("fedtpa")
class FedTPAClient(LoRAClient):
    """Adaptive-rank local training; evaluation as the LoRA base's (the global rank-r_g adapter)."""

    name = "fedtpa"
    dp_clips_on_client = False  # a rank-pruned adapter, not an update of the sent one

    def query(self, content: RecordDict) -> RecordDict:
        """ITPA (Eq. 3): the mean backbone feature of the local data, and the data size for λ_g's
        weights."""
        start = time.perf_counter()
        # its adapters are disabled below: the backbone alone
        model, tokenizer = peft_model_for(self.cfg)
        n = self.cfg.section(FedTPAConfig).fedtpa_feature_examples or len(self.data.train)
        examples = self.data.train[:n]
        lam = mean_feature(model, tokenizer, examples, self.cfg.seq_len, self.cfg.eval_batch_size)
        metrics = MetricRecord(
            {
                "num-examples": len(self.data.train),
                "partition-id": self.partition_id,
                "feature-examples": len(examples),
                "seconds": time.perf_counter() - start,
            }
        )
        return RecordDict({"features": to_record({"lambda": lam}), "metrics": metrics})

    def ema_state(self) -> dict[str, torch.Tensor]:
        rec = self.context.state.array_records.get(EMA_RECORD)
        return (
            {} if rec is None else {k: torch.from_numpy(v.numpy().copy()) for k, v in rec.items()}
        )

    def train(self, content: RecordDict) -> RecordDict:
        tpa_cfg = self.cfg.section(FedTPAConfig)
        config = content.config_records["config"]
        server_round, beta = int(config["server-round"]), float(config["beta"])
        model, tokenizer = self.load(content)
        modules = lora_modules(model)
        warmup = tpa_cfg.fedtpa_warmup_steps
        seed = self.seed(server_round)
        # warm-up: ordinary LoRA training while Eq. 6 accumulates
        carried = self.ema_state() if tpa_cfg.fedtpa_ema_scope == "run" else None
        tracker = ContributionTracker(modules, tpa_cfg.fedtpa_ema_decay, carried)
        with tracker:
            warm = train_steps(model, tokenizer, self.data.train, self.cfg, seed=seed, steps=warmup)
        if tpa_cfg.fedtpa_ema_scope == "run":
            self.context.state[EMA_RECORD] = to_record(
                {k: v.cpu().numpy() for k, v in tracker.ema.items()}
            )
        # pruning: global top-⌊β·N·r_g⌋ dimensions, the log, the per-layer scores (Eq. 7); on the
        # CPU (N×r_g)
        scores = tracker.scores().cpu()
        keep = prune_log(scores, beta)
        layer_scores = layer_contributions(scores, keep)
        # fine-tuning the reconfigured adapters for the remaining steps
        rest = self.cfg.local_steps - warmup
        with pruned_adapters(list(modules.values()), keep):
            trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
            fine = (
                train_steps(
                    model, tokenizer, self.data.train, self.cfg, seed=seed + 7919, steps=rest
                )
                if rest > 0
                else None
            )
        start = time.perf_counter()
        val_loss = (
            mean_loss(model, tokenizer, self.data.val, self.cfg.seq_len)
            if self.data.val
            else math.nan
        )
        state = get_adapter_state(model)
        kept: dict[str, np.ndarray] = {}
        for j, layer in enumerate(modules):
            kept[layer + LORA_A] = state[layer + LORA_A].numpy()[keep[j].numpy()]
            kept[layer + LORA_B] = state[layer + LORA_B].numpy()[:, keep[j].numpy()]
        self.private["rounds-trained"] = int(self.private.get("rounds-trained", 0)) + 1
        losses = warm.losses + (fine.losses if fine else [])
        train_seconds = warm.seconds + (fine.seconds if fine else 0.0)
        metrics = MetricRecord(
            {
                "train-loss": sum(losses) / len(losses),
                "val-loss": val_loss,
                "num-examples": len(self.data.train),
                "partition-id": self.partition_id,
                "beta": beta,
                "kept-dims": int(keep.sum()),
                "kept-fraction": float(keep.float().mean()),
                "trainable-params": int(trainable),
                "train-seconds": train_seconds,
                "seconds": train_seconds + time.perf_counter() - start,
            }
        )
        extra = to_record(
            {"pruning-log": keep.numpy(), "layer-scores": layer_scores.numpy().astype(np.float32)}
        )
        return RecordDict(
            {"arrays": to_record(kept), "fedtpa": extra, "metrics": metrics, "info": self.info()}
        )
