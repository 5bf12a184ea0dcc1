"""llmpruner's run-config keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedprune_app.core.config import ConfigSection, RunConfig, key, recovery_advice

TAYLOR_MODES = ("param_first", "vectorize")


@dataclass(frozen=True)
class LLMPrunerConfig(ConfigSection):
    """LLM-Pruner federated: the budget, the calibration pass, the pruned layer range, the
    references."""

    title: ClassVar[str] = "llmpruner"

    llmpruner_keep_ratio: float = key(
        0.8,
        "llmpruner (LLM-Pruner, federated): keep ratio p in (0, 1] of the prunable projections "
        "(q/k/v/o/gate/up/down weights of every decoder layer; SFT-P's accounting, 0.8 = '20% "
        "pruning'). The cut keeps at most p of them.",
        minimum=1e-6,
        maximum=1.0,
    )
    llmpruner_batches: int = key(
        8,
        "llmpruner: calibration batches (batch-size x seq-len, whole-sequence LM loss) each client "
        "backpropagates through the dense model in round 1 for the Taylor importance.",
        minimum=1,
    )
    llmpruner_taylor: str = key(
        "param_first",
        "llmpruner: LLM-Pruner's importance estimator: 'param_first' = sum over a structure's "
        "weights of |w * dL/dw| (element-wise first order; LLM-Pruner's default and its LLaMA "
        "recipe); 'vectorize' = sum over its rows/columns of |sum(w * dL/dw)| (the vector-wise "
        "first order, exactly federable).",
        choices=TAYLOR_MODES,
    )
    llmpruner_layer_start: int = key(
        4,
        "llmpruner: first decoder layer whose heads and channels may be pruned (LLM-Pruner's "
        "block_*_layer_start; its LLaMA-7B recipe prunes layers 4..29 of 32). Negative: counted "
        "from the end.",
    )
    llmpruner_layer_end: int = key(
        -2,
        "llmpruner: end (exclusive) of the pruned layer range; <= 0 counts from the end (-2: the "
        "last 2 layers stay dense, as LLM-Pruner's block_*_layer_end 30 of 32).",
    )
    llmpruner_centralized: bool = key(
        True,
        "llmpruner: score two server-built references on the server's held-out text after the last "
        "round (simulation only): 'centralized' = the same cut from the Taylor importance of every "
        "client's calibration batches pooled, and 'federated-cut' = the federated cut; both "
        "without LoRA recovery.",
    )
    llmpruner_speed_prefill: int = key(
        0,
        "llmpruner: after the last round, time the dense and the pruned model on a prefill of this "
        "many tokens (batch 1) and 32 greedy tokens (medians of 3) for results.md's 'Compiled "
        "models' table; 0 = sizes only.",
        minimum=0,
    )

    def advice(self, cfg: RunConfig) -> list[str]:
        """One round is the post hoc cut alone (`recovery_advice`)."""
        return recovery_advice(cfg, "llmpruner")
