"""FedTPA's run-config keys (ITPA, DAPR, LCWA and the rank pruning's warm-up)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedprune_app.core.config import ConfigError, ConfigSection, RunConfig, key


@dataclass(frozen=True)
class FedTPAConfig(ConfigSection):
    """FedTPA: §III-C to §III-E."""

    title: ClassVar[str] = "FedTPA"

    fedtpa_beta_min: float = key(
        0.25,
        "FedTPA beta_m: initial keep-ratio of the client closest to the global "
        "features (Eq. 5); 1 = no heterogeneous initialisation.",
        minimum=1e-3,
        maximum=1.0,
    )
    fedtpa_delta: float = key(
        0.1,
        "FedTPA delta: step of the keep-ratio adjustment by loss trend (Eq. 9).",
        minimum=0.0,
        maximum=0.99,
    )
    fedtpa_ema_decay: float = key(
        0.85,
        "FedTPA eta: decay of the EMA of |w * dL/dw| (Eq. 6; AdaLoRA's 0.85).",
        minimum=0.0,
        maximum=0.999,
    )
    fedtpa_ema_scope: str = key(
        "warmup",
        "FedTPA: the span of Eq. 6's EMA. 'warmup' = restarted from zero at every round's warm-up "
        "(§III-D1: 'the overall contribution score during the warm-up stage', of the global "
        "adapter just received); 'run' = carried over from the client's previous warm-ups.",
        choices=("warmup", "run"),
    )
    fedtpa_warmup_steps: int = key(
        3,
        "FedTPA warm-up steps (of local-steps, which must be larger) before rank "
        "pruning; the remaining steps fine-tune the pruned adapters (§III-D).",
        minimum=1,
    )
    fedtpa_feature_examples: int = key(
        64,
        "FedTPA: local examples whose mean backbone feature lambda_i a client "
        "uploads once before round 1 (Eq. 3); 0 = all.",
        minimum=0,
    )
    fedtpa_itpa: bool = key(
        True,
        "FedTPA ITPA: initial keep-ratios from feature divergence (Eq. 3-5); false = "
        "beta = 1 for every client and no feature upload.",
    )
    fedtpa_dapr: bool = key(
        True,
        "FedTPA DAPR: adjust each keep-ratio by its loss trend every round (Eq. 9); false = fixed.",
    )
    fedtpa_lcwa: bool = key(
        True,
        "FedTPA LCWA: layer-wise contribution-weighted aggregation (Eq. 8); false = FedAvg by "
        "num-examples.",
    )

    def check(self, cfg: RunConfig) -> None:
        if cfg.method == "fedtpa" and self.fedtpa_warmup_steps >= cfg.local_steps:
            raise ConfigError(
                f"run-config key 'fedtpa-warmup-steps' must be < local-steps "
                f"({cfg.local_steps}), got {self.fedtpa_warmup_steps}"
            )
