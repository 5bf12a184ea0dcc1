"""FedIT: homogeneous LoRA averaged by FedAvg."""

from fedprune_app.core.registry import register_method

register_method("fedit", default=True)
