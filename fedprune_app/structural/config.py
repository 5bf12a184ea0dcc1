"""The run-config keys of the masked-bus methods (SFT-P, fedflap): the budgets and the coordinates
held open.

Their names keep the `sftp-` prefix of the method that introduced them, so presets read the same for
both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedprune_app.core.config import ConfigError, ConfigSection, RunConfig, key, split_list


@dataclass(frozen=True)
class BusConfig(ConfigSection):
    """Masked-bus budgets and held coordinates (SFT-P, fedflap)."""

    title: ClassVar[str] = "masked bus (SFT-P, fedflap)"

    sftp_keep_ratios: str = key(
        "0.5",
        "SFT-P per-client target keep ratio p in (0, 1] of the prunable projections "
        "(0.8 = '20% pruning'); one value for all clients or one per partition, e.g. "
        "'0.8,0.8,0.5,0.5'. fedflap: its one global budget (a single value).",
    )
    sftp_hold_open: str = key(
        "massive",
        "SFT-P gates fixed at 1 in every mask (counted as kept by the budget): 'massive' = the "
        "residual bus's massive-activation coordinates (mean |h| above sftp-massive-factor x the "
        "median coordinate's on a fixed probe text: the model breaks without them, "
        "docs/methods/sftp.md); 'none' = the paper's gates on "
        "every coordinate; 'all' = every gate open: the dense model trained by the same recipe "
        "(the ceiling reference). fedflap's cut keeps them too.",
        choices=("massive", "none", "all"),
    )
    sftp_massive_factor: float = key(
        10.0,
        "SFT-P: a bus coordinate is massive when its mean |h| exceeds this many times the "
        "median's.",
        minimum=1.0,
    )

    def check(self, cfg: RunConfig) -> None:
        try:
            ratios = [float(v) for v in split_list(self.sftp_keep_ratios)]
        except ValueError:
            ratios = []
        if not ratios or not all(0 < r <= 1 for r in ratios):
            raise ConfigError(
                "run-config key 'sftp-keep-ratios' must be comma-separated keep ratios in (0, 1] "
                f"(one, or one per client), got {self.sftp_keep_ratios!r}"
            )
