"""FedSpaLLM: local pruners, l0 aggregation, mask expansion, layer sampling."""

from fedprune_app.core.registry import register_method
from fedprune_app.methods.fedspallm.config import FedSpaLLMConfig

register_method("fedspallm", config=FedSpaLLMConfig)
