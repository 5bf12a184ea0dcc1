"""slicegpt client (strategies/slicegpt.py): round 1 the residual-stream covariance sums of its own
data on the dense model, sent once; later rounds the plain LoRA round (`core.lora`) on the sliced
model built from the server's bases.

Round 1 (`covariances`): `slicegpt-batches` batches of the client's training texts through the dense
model (no adapters); the reply is Σ x xᵀ per point (float64 d × d,
`fedprune_app.methods.slicegpt.pca`), `num-examples` and `calibration-tokens`: no activations, no
text. Rounds 2..R (`recovery`): the arrays carry the bases (`slicegpt-basis.<p>`, never changed by
the client) next to the LoRA tensors; the client trains LoRA for `local-steps` and replies LoRA
only. Evaluation: the dense model while no bases exist, then the sliced model with the global LoRA
(round 1 = zero LoRA: "post hoc").
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
from torch import nn

from fedprune_app.core.lora import LoRAClient
from fedprune_app.core.recovery import Recovery, StatisticsThenRecoveryClient
from fedprune_app.core.registry import register_client
from fedprune_app.llm.data import training_batches
from fedprune_app.llm.layers import dense_model
from fedprune_app.llm.models import set_adapter_state
from fedprune_app.methods.slicegpt.config import SliceGPTConfig
from fedprune_app.methods.slicegpt.models import bases_from_arrays, sliced_model_for
from fedprune_app.methods.slicegpt.pca import BASIS_PREFIX, COVARIANCE_PREFIX, covariance_sums
from fedprune_app.methods.slicegpt.sliced import sliced_parameters
from fedprune_app.structural.routing import prunable_parameters


@register_client("slicegpt")
class SliceGPTClient(StatisticsThenRecoveryClient, LoRAClient):
    """Round 1: covariance sums of the client's data; later rounds: LoRA on the server's sliced
    model."""

    name = "slicegpt"
    structure_prefix = BASIS_PREFIX
    structure_name = "the server's bases"

    def recovery_model(self, arrays: dict[str, Any]) -> AbstractContextManager[Recovery]:
        """The sliced model with the message's LoRA, or the dense model while there are no bases."""
        dense, tokenizer = dense_model(self.cfg)
        bases = bases_from_arrays(arrays, dense.config)
        if bases is None:
            return nullcontext(Recovery(dense, tokenizer, {"kept-ratio-prunable": 1.0}, False))
        model, tokenizer = sliced_model_for(self.cfg, bases)
        set_adapter_state(
            model, {k: v for k, v in arrays.items() if not k.startswith(BASIS_PREFIX)}
        )
        model.eval()
        return nullcontext(Recovery(model, tokenizer, self.kept(model), True))

    def kept(self, model: nn.Module) -> dict[str, float]:
        """The sliced model's kept ratio under SFT-P's accounting
        (projections + shortcuts / prunable)."""
        config = model.config
        counts = sliced_parameters(config, list(config.slicegpt_dims))
        return {
            "kept-ratio-prunable": (counts["projections"] + counts["shortcuts"])
            / prunable_parameters(config)
        }

    def statistics(self, server_round: int) -> tuple[dict[str, np.ndarray], dict[str, float | int]]:
        """Round 1: Σ x xᵀ per point of the dense model on this client's batches, num-examples,
        token count."""
        model, tokenizer = dense_model(self.cfg)
        batches = training_batches(
            self.data.train,
            tokenizer,
            self.cfg.batch_size,
            self.cfg.section(SliceGPTConfig).slicegpt_batches,
            self.cfg.seq_len,
            self.seed(server_round),
        )
        sums, tokens = covariance_sums(model, batches)
        arrays = {f"{COVARIANCE_PREFIX}{p}": c.numpy() for p, c in sums.items()}
        return arrays, {"num-examples": len(self.data.train), "calibration-tokens": tokens}
