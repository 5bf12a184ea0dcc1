"""slicegpt's compiled model as a self-contained Hugging Face model (configuration + modeling files
that `save_pretrained` copies next to the weights). Importing this package registers the classes for
the Auto classes' `auto_map` (`register_for_auto_class`), nothing else: a directory still needs
`trust_remote_code=True` to load through `AutoModelForCausalLM`, or
`fedprune_app.methods.slicegpt.sliced.load_sliced`."""

from fedprune_app.methods.slicegpt.hf.configuration_fedprune_sliced_llama import (
    FedpruneSlicedLlamaConfig,
)
from fedprune_app.methods.slicegpt.hf.modeling_fedprune_sliced_llama import (
    FedpruneSlicedLlamaForCausalLM,
)

FedpruneSlicedLlamaConfig.register_for_auto_class()
FedpruneSlicedLlamaForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = ["FedpruneSlicedLlamaConfig", "FedpruneSlicedLlamaForCausalLM"]
