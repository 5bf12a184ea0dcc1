"""FedIT (Zhang et al. 2024; FedTPA §IV-A3, ref. [14]): homogeneous LoRA, FedAvg weighted by num-examples.

Every client trains the same LoRA adapters (rank `lora-rank`, `lora-target-modules`) for `local-steps`
steps; the server averages each adapter tensor weighted by the client's number of training examples
(the base `aggregate`). The final adapter is saved with peft's `save_pretrained` in `<run>/adapter` and
loads with `PeftModel.from_pretrained(base_model, "<run>/adapter")` (or `fedprune_app.llm.models.load_run`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord

from fedprune_app.core.registry import register_strategy
from fedprune_app.core.strategy import FederatedStrategy
from fedprune_app.llm.models import initial_adapter_state, peft_model_for, save_adapter, set_adapter_state


@register_strategy("fedit")
class FedITStrategy(FederatedStrategy):
    """FedAvg over LoRA adapter tensors."""

    dp_release = "the LoRA adapter (every A and B), one update per client, clipped on the client"

    def initial_arrays(self) -> ArrayRecord:
        """Fresh LoRA (A seeded, B = 0): round 0 evaluates exactly the untouched model."""
        model, _ = peft_model_for(self.cfg)
        return ArrayRecord(initial_adapter_state(model))

    def global_model(self, arrays: ArrayRecord) -> tuple[Any, Any]:
        model, tokenizer = peft_model_for(self.cfg)
        set_adapter_state(model, arrays.to_torch_state_dict())
        return model, tokenizer

    def save_final(self, arrays: ArrayRecord, out_dir: Path) -> dict[str, str]:
        """`adapter/`: the global adapter (PEFT directory at `lora-rank`); with `save-merged`, `merged/` too."""
        model, tokenizer = self.global_model(arrays)
        save_adapter(model, out_dir / "adapter", out_dir / "merged" if self.cfg.save_merged else None, tokenizer)
        return {"adapter": "adapter"} | ({"merged": "merged"} if self.cfg.save_merged else {})
