"""FlexLoRA's run-config keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedprune_app.core.config import ConfigError, ConfigSection, RunConfig, key, split_list


@dataclass(frozen=True)
class FlexLoRAConfig(ConfigSection):
    """FlexLoRA: per-client ranks."""

    title: ClassVar[str] = "FlexLoRA"

    flexlora_ranks: str = key(
        "8,16,32,64",
        "FlexLoRA per-client LoRA ranks (resources), one for all or one per "
        "partition id; the server redistributes the averaged dW by truncated SVD at each rank.",
    )

    def check(self, cfg: RunConfig) -> None:
        try:
            ranks = [int(v) for v in split_list(self.flexlora_ranks)]
        except ValueError:
            ranks = []
        if not ranks or min(ranks) < 1:
            raise ConfigError(
                "run-config key 'flexlora-ranks' must be comma-separated positive ints (one, or "
                f"one per client), got {self.flexlora_ranks!r}"
            )
