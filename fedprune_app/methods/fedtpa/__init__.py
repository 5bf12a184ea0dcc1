"""FedTPA: rank pruning (client) and ITPA / LCWA / DAPR (server)."""

from fedprune_app.core.registry import register_method
from fedprune_app.llm.shapes import lora_spec
from fedprune_app.methods.fedtpa.config import FedTPAConfig

register_method("fedtpa", config=FedTPAConfig, checkpoint_spec=lora_spec)
