"""Federated FLAP-style structural baseline: importance on each client's data, one global mask cut
by the server at the SFT-P budget, then FedAvg LoRA recovery (`core.lora`'s local round) on the
routed model.

Round 1 (`importance`): the client runs `fedflap-batches` batches of its training texts through the
dense model (adapters off, no masks) and replies one float importance per bus coordinate for each of
SFT-P's four masks per layer (`importance_scores`), plus `num-examples`. Rounds 2..R (`recovery`):
the global arrays carry the server's bool masks (`fedflap-mask.<name>`, layers × d) next to the LoRA
tensors; the client sets the masks (it never changes them), trains LoRA for `local-steps` and
replies LoRA only. Evaluation: round 0 the dense model; later the masked model with the global LoRA
(round 1 = masks and the zero LoRA: "post hoc, no training").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from fedprune_app.core.lora import LoRAClient
from fedprune_app.core.recovery import Recovery, StatisticsThenRecoveryClient
from fedprune_app.core.registry import register_client
from fedprune_app.llm.data import training_batches
from fedprune_app.llm.models import model_device, set_adapter_state
from fedprune_app.methods.fedflap.config import FedFLAPConfig
from fedprune_app.methods.fedflap.importance import (
    IMPORTANCE_PREFIX,
    MASK_PREFIX,
    fedflap_model_for,
    importance_scores,
    masks_from_arrays,
)
from fedprune_app.structural.routing import masked, model_kept_ratios


@register_client("fedflap")
class FedFLAPClient(StatisticsThenRecoveryClient, LoRAClient):
    """Round 1: FLAP importance of the bus coordinates on the client's data; later rounds: the
    plain LoRA round on the routed model with the server's fixed global masks."""

    name = "fedflap"
    structure_prefix = MASK_PREFIX
    structure_name = "the global masks"

    @contextmanager
    def recovery_model(self, arrays: dict[str, Any]) -> Iterator[Recovery]:
        """The routed model with the message's LoRA loaded, routed by its masks (none: dense)
        inside the block."""
        model, tokenizer = fedflap_model_for(self.cfg)
        model.eval()
        set_adapter_state(model, {k: v for k, v in arrays.items() if not k.startswith(MASK_PREFIX)})
        masks = masks_from_arrays(arrays, model_device(model))
        with masked(model, masks):
            yield Recovery(model, tokenizer, model_kept_ratios(model, masks), masks is not None)

    def statistics(self, server_round: int) -> tuple[dict[str, np.ndarray], dict[str, float | int]]:
        """Round 1: the importance arrays and num-examples (no activations, no text)."""
        model, tokenizer = fedflap_model_for(self.cfg)
        model.eval()
        batches = list(
            training_batches(
                self.data.train,
                tokenizer,
                self.cfg.batch_size,
                self.cfg.section(FedFLAPConfig).fedflap_batches,
                self.cfg.seq_len,
                self.seed(server_round),
            )
        )
        scores = importance_scores(model, batches)
        return {IMPORTANCE_PREFIX + k: v for k, v in scores.items()}, {
            "num-examples": len(self.data.train)
        }
