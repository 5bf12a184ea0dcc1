"""The run-config keys of the masked residual bus that SFT-P and fedflap share
(`fedprune_app.structural`): the budgets and the bus coordinates held open in every mask.

The keys were `sftp-keep-ratios`, `sftp-hold-open` and `sftp-massive-factor` until the library had
a second user; the old names are refused with a line naming the new one (`renamed`), and run
directories written under them still load (`RunConfig.from_record`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedprune_app.core.config import ConfigError, ConfigSection, RunConfig, key, split_list


@dataclass(frozen=True)
class BusConfig(ConfigSection):
    """Masked-bus budgets and held coordinates (SFT-P, fedflap)."""

    title: ClassVar[str] = "masked bus (SFT-P, fedflap)"
    renamed: ClassVar[dict[str, str]] = {
        "sftp-keep-ratios": "keep-ratios",
        "sftp-hold-open": "hold-open",
        "sftp-massive-factor": "massive-factor",
    }

    keep_ratios: str = key(
        "0.5",
        "Target keep ratio p in (0, 1] of the prunable projections (0.8 = '20% pruning'): SFT-P "
        "takes one value for all clients or one per partition, e.g. '0.8,0.8,0.5,0.5'; fedflap "
        "its one global budget (a single value).",
    )
    hold_open: str = key(
        "massive",
        "Bus coordinates whose gates are fixed at 1 in every mask (counted as kept by the "
        "budget): 'massive' = the residual bus's massive-activation coordinates (mean |h| above "
        "massive-factor x the median coordinate's on a fixed probe text; why: "
        "docs/methods/sftp.md); 'none' = gates on every coordinate, as in the SFT-P paper; 'all' "
        "= every gate open: the dense model trained by the same recipe (the ceiling reference).",
        choices=("massive", "none", "all"),
    )
    massive_factor: float = key(
        10.0,
        "A bus coordinate is massive when its mean |h| exceeds this many times the median's.",
        minimum=1.0,
    )

    def check(self, cfg: RunConfig) -> None:
        try:
            ratios = [float(v) for v in split_list(self.keep_ratios)]
        except ValueError:
            ratios = []
        if not ratios or not all(0 < r <= 1 for r in ratios):
            raise ConfigError(
                "run-config key 'keep-ratios' must be comma-separated keep ratios in (0, 1] "
                f"(one, or one per client), got {self.keep_ratios!r}"
            )
