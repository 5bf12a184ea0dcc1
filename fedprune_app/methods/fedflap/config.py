"""fedflap's own run-config keys; its budget and held coordinates are the masked bus's
(`fedprune_app.structural.config.BusConfig`: `keep-ratios`, `hold-open`,
`massive-factor`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedprune_app.core.config import ConfigSection, RunConfig, key, recovery_advice


@dataclass(frozen=True)
class FedFLAPConfig(ConfigSection):
    """The federated FLAP-style baseline."""

    title: ClassVar[str] = "fedflap"

    fedflap_batches: int = key(
        8,
        "fedflap (federated FLAP-style baseline): training batches (batch-size x seq-len) "
        "each client runs through the dense model in round 1 to score the bus coordinates.",
        minimum=1,
    )

    def advice(self, cfg: RunConfig) -> list[str]:
        """One round is the post hoc cut alone (`recovery_advice`)."""
        return recovery_advice(cfg, "fedflap")
