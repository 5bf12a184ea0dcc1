"""SliceGPT's run-config keys (Ashkboos et al. 2024, "SliceGPT: Compress Large Language Models by
Deleting Rows and Columns"), ported to the federation: covariance sums from the clients, one
rotation, FedAvg LoRA recovery."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedprune_app.core.config import (
    ConfigError,
    ConfigSection,
    RunConfig,
    key,
    recovery_advice,
    split_list,
)

SLICEGPT_REFERENCES = ("centralized",)


@dataclass(frozen=True)
class SliceGPTConfig(ConfigSection):
    """SliceGPT (rotate the residual stream by its principal components, slice it) + FedAvg LoRA
    recovery."""

    title: ClassVar[str] = "slicegpt"

    slicegpt_keep_ratio: float = key(
        0.8,
        "slicegpt: the budget as SFT-P counts it, kept parameters / SFT-P's prunable parameters "
        "(q/k/v/o/gate/up/down of every layer). The sliced width d_small is the one whose "
        "projections plus SliceGPT's two shortcut matrices per layer come nearest to it "
        "(docs/methods/slicegpt.md#budget).",
        minimum=0.01,
        maximum=1.0,
    )
    slicegpt_batches: int = key(
        8,
        "slicegpt: training batches (batch-size x seq-len) each client runs through the dense "
        "model in round 1 to sum its residual-stream covariances.",
        minimum=1,
    )
    slicegpt_references: str = key(
        "",
        "slicegpt: comma-separated server-built comparison models scored at the end. 'centralized' "
        "(simulation only): the reference SliceGPT, sequential (each rotation computed on the "
        "already sliced model), on the pooled calibration batches of all clients, no recovery.",
        allowed_text="'' or 'centralized'",
    )
    slicegpt_speed_prefill: int = key(
        512,
        "slicegpt: prompt tokens of the prefill timing of the compiled model against the dense one "
        "at the end (0 = sizes only, no timing).",
        minimum=0,
    )

    def check(self, cfg: RunConfig) -> None:
        bad = set(split_list(self.slicegpt_references)) - set(SLICEGPT_REFERENCES)
        if bad:
            raise ConfigError(
                f"run-config key 'slicegpt-references' accepts {', '.join(SLICEGPT_REFERENCES)} "
                f"(comma-separated) or '', got {sorted(bad)}"
            )

    def advice(self, cfg: RunConfig) -> list[str]:
        """One round is the post hoc cut alone (`recovery_advice`)."""
        return recovery_advice(cfg, "slicegpt")
