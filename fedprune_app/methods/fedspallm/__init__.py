"""FedSpaLLM: local pruners, l0 aggregation, mask expansion, layer sampling."""

from fedprune_app.core.registry import register_method

register_method("fedspallm")
