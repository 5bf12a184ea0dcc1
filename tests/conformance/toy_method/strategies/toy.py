"""toy's server: the LoRA base's weighted average of the adapter tensors, applied with a server
learning rate."""

from __future__ import annotations

from typing import Any

import numpy as np
from fedprune_app.methods.toy.config import ToyConfig
from flwr.app import ArrayRecord, RecordDict

from fedprune_app.core.lora import LoRAStrategy
from fedprune_app.core.protocol import numpy_state, to_record
from fedprune_app.core.registry import register_strategy


@register_strategy("toy")
class ToyStrategy(LoRAStrategy):
    """global <- global + eta * (FedAvg(replies) - global)."""

    def initial_arrays(self) -> ArrayRecord:
        arrays = super().initial_arrays()
        self.current = numpy_state(arrays)
        return arrays

    def aggregate(self, server_round: int, replies: list[RecordDict]) -> ArrayRecord:
        mean = numpy_state(super().aggregate(server_round, replies))
        eta = self.cfg.section(ToyConfig).toy_server_lr
        self.current = {
            k: (v + eta * (mean[k] - v)).astype(v.dtype) for k, v in self.current.items()
        }
        return to_record(self.current)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "current": self.current}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.current = {k: np.asarray(v) for k, v in state["current"].items()}
