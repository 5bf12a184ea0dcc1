"""fedflap: FLAP-style importance over the routed bus coordinates, one global cut."""

from fedprune_app.core.registry import register_method
from fedprune_app.methods.fedflap.config import FedFLAPConfig
from fedprune_app.methods.fedflap.shapes import checkpoint_spec
from fedprune_app.structural.config import BusConfig

register_method(
    "fedflap",
    config=(FedFLAPConfig, BusConfig),
    checkpoint_spec=checkpoint_spec,
    architectures=("llama", "mistral", "qwen2", "qwen3"),
)
