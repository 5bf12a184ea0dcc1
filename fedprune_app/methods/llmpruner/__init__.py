"""llmpruner: LLM-Pruner (Ma et al. 2023) federated: first-order Taylor importance of coupled
structures (kv head groups, MLP channels) per client, averaged, one global cut, FedAvg LoRA
recovery."""

from fedprune_app.core.registry import register_method
from fedprune_app.methods.llmpruner.config import LLMPrunerConfig
from fedprune_app.methods.llmpruner.shapes import checkpoint_spec

register_method(
    "llmpruner",
    config=LLMPrunerConfig,
    spec_from_checkpoint=checkpoint_spec,
    architectures=("llama", "mistral", "qwen2"),
)
