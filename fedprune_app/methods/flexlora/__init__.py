"""FlexLoRA: full dW averaging and SVD back to each client's rank."""

from fedprune_app.core.registry import register_method
from fedprune_app.methods.flexlora.config import FlexLoRAConfig, checkpoint_spec

register_method("flexlora", config=FlexLoRAConfig, checkpoint_spec=checkpoint_spec)
