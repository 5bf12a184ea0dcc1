"""FedIT client (Zhang et al. 2024): the plain LoRA round (`core.lora.LoRAClient`) as it is."""

from __future__ import annotations

from fedprune_app.core.lora import LoRAClient
from fedprune_app.core.registry import register_client


@register_client("fedit")
class FedITClient(LoRAClient):
    """Homogeneous LoRA; the reply holds the adapter tensors and training metrics."""

    name = "fedit"
