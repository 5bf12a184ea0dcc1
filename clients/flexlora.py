"""FlexLoRA client: LoRA at this client's own rank r_i (`flexlora-ranks`, indexed by partition id).

The server sends SVD factors at some rank r_s (the client's own once it knows it, else r_max).
`fit_rank` brings them to r_i: their first r_i dimensions (B rescaled so that peft's α/r_i scaling
reproduces the same ΔW, `truncate_factors`) or, should r_s < r_i, the factors plus fresh dimensions
(A rows Kaiming-initialised as peft does, B columns zero: ΔW unchanged). Training and the reply are
the LoRA base's (`core.lora`), at rank r_i; evaluation loads the global factors at their own rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.app import RecordDict

from fedprune_app.core.config import per_client
from fedprune_app.core.lora import LoRAClient
from fedprune_app.core.registry import register_client
from fedprune_app.llm.lora import lora_rank
from fedprune_app.llm.models import peft_model_for, set_adapter_state
from fedprune_app.methods.flexlora.config import FlexLoRAConfig
from fedprune_app.methods.flexlora.svd import fit_rank


@register_client("flexlora")
class FlexLoRAClient(LoRAClient):
    """Heterogeneous-rank LoRA; the reply also reports the rank."""

    name = "flexlora"
    dp_clips_on_client = False  # its factors are at its own rank: the server clips its ΔW

    def rank(self) -> int:
        ranks = per_client(
            self.cfg.section(FlexLoRAConfig).flexlora_ranks,
            self.num_partitions,
            int,
            "flexlora-ranks",
        )
        return int(ranks[self.partition_id])

    def model_at(self, state: dict[str, np.ndarray], rank: int) -> tuple[Any, Any]:
        model, tokenizer = peft_model_for(self.cfg, rank=rank)
        set_adapter_state(
            model, {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}
        )
        return model, tokenizer

    def load(self, content: RecordDict) -> tuple[Any, Any]:
        """The received factors at their own rank (evaluation of the global model)."""
        state = {k: v.numpy() for k, v in content.array_records["arrays"].items()}
        return self.model_at(state, lora_rank(state))

    def train(self, content: RecordDict) -> RecordDict:
        server_round = int(content.config_records["config"]["server-round"])
        rank = self.rank()
        received = {k: v.numpy() for k, v in content.array_records["arrays"].items()}
        model, tokenizer = self.model_at(fit_rank(received, rank, self.seed(server_round)), rank)
        return self.local_round(model, tokenizer, server_round, rank=rank)
