"""FedIT (Zhang et al. 2024; FedTPA §IV-A3, ref. [14]): homogeneous LoRA, FedAvg weighted by
num-examples.

Every client trains the same LoRA adapters (rank `lora-rank`, `lora-target-modules`) for
`local-steps` steps; the server averages each adapter tensor weighted by the client's number of
training examples: `core.lora.LoRAStrategy` as it is. The final adapter is saved with peft's
`save_pretrained` in `<run>/adapter` and loads with
`PeftModel.from_pretrained(base_model, "<run>/adapter")` (or `fedprune_app.llm.models.load_run`).
"""

from __future__ import annotations

from fedprune_app.core.lora import LoRAStrategy
from fedprune_app.core.registry import register_strategy


@register_strategy("fedit")
class FedITStrategy(LoRAStrategy):
    """FedAvg over LoRA adapter tensors."""
