"""FlexLoRA: full dW averaging and SVD back to each client's rank."""

from fedprune_app.core.registry import register_method

register_method("flexlora")
