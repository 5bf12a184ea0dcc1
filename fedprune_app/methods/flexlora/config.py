"""FlexLoRA's run-config keys."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from fedprune_app.core.config import ConfigError, ConfigSection, RunConfig, key, split_list
from fedprune_app.llm.shapes import Spec, lora_spec


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


def max_rank(cfg: RunConfig) -> int:
    """r_max: the largest rank in `flexlora-ranks` (the global adapter's rank)."""
    return max(int(v) for v in split_list(cfg.section(FlexLoRAConfig).flexlora_ranks))


def checkpoint_spec(cfg: RunConfig, config: Mapping[str, Any]) -> Spec | None:
    """The global LoRA at r_max (`llm.shapes.lora_spec`): what every round's SVD gives back."""
    return lora_spec(cfg, config, rank=max_rank(cfg))
