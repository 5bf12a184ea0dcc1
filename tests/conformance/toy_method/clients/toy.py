"""toy's client: the plain LoRA round (`core.lora`), unchanged."""

from __future__ import annotations

from fedprune_app.core.lora import LoRAClient
from fedprune_app.core.registry import register_client


@register_client("toy")
class ToyClient(LoRAClient):
    name = "toy"
