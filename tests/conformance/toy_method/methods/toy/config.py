"""toy's run-config keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedprune_app.core.config import ConfigSection, key


@dataclass(frozen=True)
class ToyConfig(ConfigSection):
    """toy: how far the global adapter moves toward the clients' average each round."""

    title: ClassVar[str] = "toy"

    toy_server_lr: float = key(
        0.5,
        "Server learning rate eta: global += eta * (FedAvg - global).",
        minimum=0.0,
        maximum=1.0,
    )
