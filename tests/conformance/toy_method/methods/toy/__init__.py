"""toy: FedIT's LoRA with a server learning rate (docs/architecture.md's "Adding a method", proved
by a test)."""

from fedprune_app.methods.toy.config import ToyConfig

from fedprune_app.core.registry import register_method

register_method("toy", config=ToyConfig)
