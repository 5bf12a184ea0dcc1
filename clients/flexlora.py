"""FlexLoRA client: LoRA at this client's own rank r_i (`flexlora-ranks`, indexed by partition id).

The server sends SVD factors at some rank r_s (the client's own once it knows it, else r_max). `fit_rank`
brings them to r_i: their first r_i dimensions (B rescaled so that peft's α/r_i scaling reproduces the same
ΔW, `truncate_factors`) or, should r_s < r_i, the factors plus fresh dimensions (A rows Kaiming-initialised as
peft does, B columns zero: ΔW unchanged). Training and the reply are FedIT's, at rank r_i; evaluation loads
the global factors at their own rank.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from flwr.app import RecordDict

from clients.fedit import FedITClient
from fedprune_app.config import per_client
from fedprune_app.models import peft_model_for, set_adapter_state
from strategies.lora_utils import LORA_A, LORA_B, adapter_layers, lora_rank, truncate_factors


def fit_rank(state: dict[str, np.ndarray], rank: int, seed: int) -> dict[str, np.ndarray]:
    """The adapter `state` (any rank r_s) as a rank-`rank` adapter with the same ΔW where r_s ≥ rank allows it
    (then the best rank-`rank` approximation of SVD factors)."""
    r_s = lora_rank(state)
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, np.ndarray] = {}
    for layer in adapter_layers(state):
        b, a = state[layer + LORA_B], state[layer + LORA_A]
        if r_s >= rank:
            b, a = truncate_factors(b, a, rank)
        else:
            fresh = torch.empty(rank - r_s, a.shape[1])
            bound = 1.0 / math.sqrt(a.shape[1])  # kaiming_uniform_(a=√5), peft's LoRA-A init
            fresh.uniform_(-bound, bound, generator=gen)
            b = np.concatenate([b * (rank / r_s), np.zeros((b.shape[0], rank - r_s), b.dtype)], axis=1)
            a = np.concatenate([a, fresh.numpy().astype(a.dtype)], axis=0)
        out[layer + LORA_B], out[layer + LORA_A] = b, a
    return out


class FlexLoRAClient(FedITClient):
    """Heterogeneous-rank LoRA; the reply also reports the rank."""

    name = "flexlora"

    def rank(self) -> int:
        ranks = per_client(str(self.cfg.flexlora_ranks), self.num_partitions, int, "flexlora-ranks")
        return int(ranks[self.partition_id])

    def model_at(self, state: dict[str, np.ndarray], rank: int) -> tuple[Any, Any]:
        model, tokenizer = peft_model_for(self.cfg.replace(lora_rank=rank))
        set_adapter_state(model, {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()})
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
