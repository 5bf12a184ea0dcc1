"""FedAvg over LoRA adapter tensors: the plain LoRA round that methods subclass.

`LoRAClient` loads the global adapter, trains it `local-steps` steps on the local data and replies
the adapter with its training metrics; `LoRAStrategy` starts from a fresh adapter, averages the
replies by `num-examples` (the base `aggregate`), scores and saves the global adapter. A subclass
overrides what its method changes (the payload, the rank, the model the adapter sits on).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, MetricRecord, RecordDict

from fedprune_app.core.client import FederatedClient
from fedprune_app.core.strategy import FederatedStrategy, MethodReport
from fedprune_app.llm.evaluation import evaluate_client, mean_loss
from fedprune_app.llm.models import (
    get_adapter_state,
    initial_adapter_state,
    peft_model_for,
    save_adapter,
    set_adapter_state,
)
from fedprune_app.llm.training import train_steps


class LoRAClient(FederatedClient):
    """Homogeneous LoRA; the reply holds the adapter tensors and training metrics."""

    dp_clips_on_client = True  # the reply is the sent adapter after local steps

    def load(self, content: RecordDict) -> tuple[Any, Any]:
        """(model, tokenizer) with the message's adapter loaded."""
        model, tokenizer = peft_model_for(self.cfg)
        set_adapter_state(model, content.array_records["arrays"].to_torch_state_dict())
        return model, tokenizer

    def train(self, content: RecordDict) -> RecordDict:
        """`local_round` from the message's adapter."""
        server_round = int(content.config_records["config"]["server-round"])
        model, tokenizer = self.load(content)
        return self.local_round(model, tokenizer, server_round)

    def local_round(
        self, model: Any, tokenizer: Any, server_round: int, **extra: float | int
    ) -> RecordDict:
        """`local-steps` of LoRA training from the loaded adapter, the validation loss, and the
        reply (adapter tensors + metrics, `extra` metrics added)."""
        report = train_steps(
            model, tokenizer, self.data.train, self.cfg, seed=self.seed(server_round)
        )
        start = time.perf_counter()
        val_loss = (
            mean_loss(model, tokenizer, self.data.val, self.cfg.seq_len)
            if self.data.val
            else math.nan
        )
        self.private["rounds-trained"] = int(self.private.get("rounds-trained", 0)) + 1
        metrics = MetricRecord(
            {
                "train-loss": report.mean_loss,
                "val-loss": val_loss,
                "num-examples": len(self.data.train),
                "partition-id": self.partition_id,
                "train-seconds": report.seconds,
                **extra,
                "seconds": report.seconds + time.perf_counter() - start,
            }
        )
        return RecordDict(
            {
                "arrays": ArrayRecord(get_adapter_state(model)),
                "metrics": metrics,
                "info": self.info(),
            }
        )

    def evaluate(self, content: RecordDict) -> RecordDict:
        """The client's scores on its own test split with the message's adapter loaded."""
        start = time.perf_counter()
        model, tokenizer = self.load(content)
        scores = evaluate_client(model, tokenizer, self.data, self.cfg, self.num_partitions)
        metrics = MetricRecord(
            {
                **scores,
                "num-examples": len(self.data.test),
                "partition-id": self.partition_id,
                "seconds": time.perf_counter() - start,
            }
        )
        return RecordDict({"metrics": metrics, "info": self.info()})


class LoRAReport(MethodReport):
    """The LoRA methods' final artefacts."""

    def save_final(self, arrays: ArrayRecord, out_dir: Path) -> dict[str, str]:
        """`adapter/`: the global adapter (PEFT directory at `lora-rank`); with `save-merged`,
        `merged/` too."""
        s = self.strategy
        model, tokenizer = s.global_model(arrays)
        merged = out_dir / "merged" if s.cfg.save_merged else None
        save_adapter(model, out_dir / "adapter", merged, tokenizer)
        return {"adapter": "adapter"} | ({"merged": "merged"} if s.cfg.save_merged else {})


class LoRAStrategy(FederatedStrategy):
    """FedAvg over LoRA adapter tensors."""

    dp_release = "the LoRA adapter (every A and B), one update per client, clipped on the client"
    report_class = LoRAReport

    def initial_arrays(self) -> ArrayRecord:
        """Fresh LoRA (A seeded, B = 0): round 0 evaluates exactly the untouched model."""
        model, _ = peft_model_for(self.cfg)
        return ArrayRecord(initial_adapter_state(model))

    def global_model(self, arrays: ArrayRecord) -> tuple[Any, Any]:
        """The base model with the global adapter loaded."""
        model, tokenizer = peft_model_for(self.cfg)
        set_adapter_state(model, arrays.to_torch_state_dict())
        return model, tokenizer
