"""FedSpaLLM's run-config keys: the local pruner, its calibration and the comparison models."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from fedprune_app.core.config import ConfigError, ConfigSection, RunConfig, key, split_list
from fedprune_app.core.encoding import PAYLOAD_DTYPES
from fedprune_app.llm.shapes import Spec, decoder_linear_shapes

ROUND_ARRAY = "global-round"  # the one global array: a round counter (weights stay on the server)
STATE_TABLE = "global-state"  # the strategy state's table of the server's pruned weights

FEDSPALLM_REFERENCES = ("random", "standalone", "centralized")


@dataclass(frozen=True)
class FedSpaLLMConfig(ConfigSection):
    """The pruning keys (FedSpaLLM; `sparsity` and the pruner also serve any unstructured pruning
    run)."""

    title: ClassVar[str] = "FedSpaLLM"

    sparsity: float = key(
        0.5,
        "Target unstructured sparsity of every pruned weight matrix.",
        minimum=0.0,
        maximum=0.99,
    )
    pruner: str = key("sparsegpt", "Local pruner.", choices=("sparsegpt", "wanda", "magnitude"))
    prune_n: int = key(0, "N of N:M semi-structured sparsity (0 = unstructured).", minimum=0)
    prune_m: int = key(0, "M of N:M semi-structured sparsity.", minimum=0)
    calib_segments: int = key(32, "Calibration segments per client.", minimum=1)
    calib_seq_len: int = key(256, "Tokens per calibration segment (the paper: 2048).", minimum=8)
    sparsegpt_blocksize: int = key(128, "SparseGPT column block size.", minimum=1)
    sparsegpt_percdamp: float = key(
        0.01, "SparseGPT Hessian dampening (fraction of the mean diagonal).", minimum=0.0
    )
    payload_dtype: str = key(
        "float32",
        "dtype of the weights FedSpaLLM sends each way (kept values only, masks bit-packed): "
        "'float32' is exact; 'float16' / 'bfloat16' halve the values' bytes "
        "(docs/methods/fedspallm.md#payloads).",
        choices=PAYLOAD_DTYPES,
    )
    fedspallm_references: str = key(
        "random",
        "Comparison models scored beside the global one at the end "
        "(comma-separated): 'random' (a random mask at the target sparsity per matrix), "
        "'standalone' (each client prunes the whole model with its own data; the mean is "
        "reported), 'centralized' (simulation only: the pruner on all clients' calibration data "
        "pooled); empty = none.",
    )
    fedspallm_resources: str = key(
        "1.0",
        "Per-client r_i in (0, 1]: the share of decoder layers a client prunes per "
        "round (Eq. 8); one value for all or one per partition id. A SuperNode's node-config "
        "`resources` overrides it for that node.",
    )

    def check(self, cfg: RunConfig) -> None:
        if self.prune_n and not 0 < self.prune_n < self.prune_m:
            raise ConfigError(
                f"run-config keys 'prune-n'/'prune-m' must satisfy 0 < n < m (e.g. 2:4), "
                f"got {self.prune_n}:{self.prune_m}"
            )
        bad_refs = set(split_list(self.fedspallm_references)) - set(FEDSPALLM_REFERENCES)
        if bad_refs:
            raise ConfigError(
                f"run-config key 'fedspallm-references' accepts {', '.join(FEDSPALLM_REFERENCES)} "
                f"(comma-separated), got {sorted(bad_refs)}"
            )


def checkpoint_spec(cfg: RunConfig, config: Mapping[str, Any]) -> Spec | None:
    """The round counter, and the server's pruned weights in the state table `STATE_TABLE`: every
    linear layer's weight of the decoder layers, float32 (`llm.layers.prunable_weights`)."""
    shapes = decoder_linear_shapes(config)
    if shapes is None:
        return None
    weights: Spec = {
        f"{STATE_TABLE}/{name}.weight": (shape, "float32") for name, shape in shapes.items()
    }
    return {ROUND_ARRAY: ((1,), "int64")} | weights
