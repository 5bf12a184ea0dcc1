"""llmpruner's compiled model as a self-contained Hugging Face model (configuration + modeling files
that `save_pretrained` copies next to the weights). Importing this package registers the classes for
the Auto classes' `auto_map` (`register_for_auto_class`), nothing else: a directory still needs
`trust_remote_code=True` to load through `AutoModelForCausalLM`, or
`fedprune_app.methods.llmpruner.structure.load_pruned`."""

from fedprune_app.methods.llmpruner.hf.configuration_fedprune_pruned_llama import (
    FedprunePrunedLlamaConfig,
)
from fedprune_app.methods.llmpruner.hf.modeling_fedprune_pruned_llama import (
    FedprunePrunedLlamaForCausalLM,
)

FedprunePrunedLlamaConfig.register_for_auto_class()
FedprunePrunedLlamaForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = ["FedprunePrunedLlamaConfig", "FedprunePrunedLlamaForCausalLM"]
