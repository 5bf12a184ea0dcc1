"""toy's client: FedIT's local LoRA training, unchanged."""

from __future__ import annotations

from clients.fedit import FedITClient
from fedprune_app.core.registry import register_client


@register_client("toy")
class ToyClient(FedITClient):
    name = "toy"
