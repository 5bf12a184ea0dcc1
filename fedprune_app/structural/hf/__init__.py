"""SFT-P's compiled model as a self-contained Hugging Face model (configuration + modeling files
that `save_pretrained` copies next to the weights). Importing this package registers the classes for
the Auto classes' `auto_map` (`register_for_auto_class`), nothing else: a directory still needs
`trust_remote_code=True` to load through `AutoModelForCausalLM`, or
`fedprune_app.structural.routing.load_compiled`."""

from fedprune_app.structural.hf.configuration_fedprune_routed_llama import FedpruneRoutedLlamaConfig
from fedprune_app.structural.hf.modeling_fedprune_routed_llama import FedpruneRoutedLlamaForCausalLM

FedpruneRoutedLlamaConfig.register_for_auto_class()
FedpruneRoutedLlamaForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = ["FedpruneRoutedLlamaConfig", "FedpruneRoutedLlamaForCausalLM"]
