"""FedSpaLLM: local pruners, l0 aggregation, mask expansion, layer sampling."""

from fedprune_app.core.registry import register_method
from fedprune_app.methods.fedspallm.config import FedSpaLLMConfig, checkpoint_spec

register_method("fedspallm", config=FedSpaLLMConfig, checkpoint_spec=checkpoint_spec)
