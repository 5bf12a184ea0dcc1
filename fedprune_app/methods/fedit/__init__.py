"""FedIT: homogeneous LoRA averaged by FedAvg."""

from fedprune_app.core.registry import register_method
from fedprune_app.llm.shapes import lora_spec

register_method("fedit", default=True, checkpoint_spec=lora_spec)
