"""LLM-Pruner, federated (Ma et al. 2023): Taylor importance on each client's data, one global cut
by the server, then FedAvg LoRA recovery (`core.lora`'s local round) on the really pruned model.

Round 1 (`importance`): the client backpropagates `llmpruner-batches` batches of its training texts
(whole-sequence LM loss) through the dense model and replies, per decoder layer and projection, one
number per row (q/k/v/gate/up) or column (o/down): Σ|w·∂L/∂w| (`param_first`) or Σ w·∂L/∂w
(`vectorize`), with `num-examples` = the number of target tokens it scored (the weight of its
mean-loss gradient in the pooled one). No text, no token ids, no activations. Rounds 2..R: the
arrays carry the global structure (`llmpruner-keep.heads` (layers, kv) and `llmpruner-keep.channels`
(layers, intermediate), bool) beside the LoRA tensors; the client builds the pruned model (heads and
channels removed), trains LoRA `local-steps` steps and replies LoRA only. Evaluation: round 0 the
dense model; later the pruned model with the global LoRA (round 1 = zero LoRA: "post hoc, no
recovery").
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np

from fedprune_app.core.lora import LoRAClient
from fedprune_app.core.recovery import Recovery, StatisticsThenRecoveryClient
from fedprune_app.core.registry import register_client
from fedprune_app.llm.data import training_batches
from fedprune_app.llm.models import cached_peft_model, peft_model_for, set_adapter_state
from fedprune_app.methods.llmpruner.config import LLMPrunerConfig
from fedprune_app.methods.llmpruner.importance import IMPORTANCE_PREFIX, client_importance
from fedprune_app.methods.llmpruner.models import dense_model, keep_from_arrays, pruned_model_for
from fedprune_app.methods.llmpruner.structure import KEEP_PREFIX, kept_parameters
from fedprune_app.structural.routing import prunable_parameters


@register_client("llmpruner")
class LLMPrunerClient(StatisticsThenRecoveryClient, LoRAClient):
    """Round 1: Taylor rows of the dense model on the client's data; later: the plain LoRA round on
    the pruned model."""

    name = "llmpruner"
    structure_prefix = KEEP_PREFIX

    def recovery_model(self, arrays: dict[str, Any]) -> AbstractContextManager[Recovery]:
        """The pruned (or, without a structure, dense) LoRA model with the message's adapter loaded,
        and its kept ratio of the prunable projections."""
        keep = keep_from_arrays(arrays)
        if keep is None:
            model, tokenizer = peft_model_for(self.cfg)
            kept = 1.0
        else:
            # the dense LoRA model of round 0 is no longer needed in this process
            cached_peft_model.cache_clear()
            model, tokenizer = pruned_model_for(self.cfg, keep)
            kept = kept_parameters(model.config, keep) / prunable_parameters(model.config)
        set_adapter_state(model, {k: v for k, v in arrays.items() if not k.startswith(KEEP_PREFIX)})
        return nullcontext(
            Recovery(model, tokenizer, {"kept-ratio-prunable": float(kept)}, keep is not None)
        )

    def statistics(self, server_round: int) -> tuple[dict[str, np.ndarray], dict[str, float | int]]:
        """Round 1: the Taylor rows and the token count (as num-examples); nothing else about the
        data."""
        section = self.cfg.section(LLMPrunerConfig)
        cached_peft_model.cache_clear()  # one dense model (+ its gradients) in memory, not two
        model, tokenizer = dense_model(self.cfg)
        batches = list(
            training_batches(
                self.data.train,
                tokenizer,
                self.cfg.batch_size,
                section.llmpruner_batches,
                self.cfg.seq_len,
                self.seed(server_round),
                targets="sequence",
            )
        )
        rows, tokens = client_importance(model, batches, section.llmpruner_taylor)
        del model
        return {IMPORTANCE_PREFIX + k: v.astype(np.float32) for k, v in rows.items()}, {
            "num-examples": tokens
        }
