"""FedIT client: load the global LoRA adapter, train it `local-steps` steps on the local data, send it back."""

from __future__ import annotations

import math
import time
from typing import Any

from flwr.app import ArrayRecord, MetricRecord, RecordDict

from fedprune_app.core.client import FederatedClient
from fedprune_app.core.registry import register_client
from fedprune_app.llm.evaluation import evaluate_client, mean_loss
from fedprune_app.llm.models import get_adapter_state, peft_model_for, set_adapter_state
from fedprune_app.llm.training import train_steps


@register_client("fedit")
class FedITClient(FederatedClient):
    """Homogeneous LoRA; the reply holds the adapter tensors and training metrics."""

    name = "fedit"
    dp_clips_on_client = True  # the reply is the sent adapter after local steps

    def load(self, content: RecordDict):  # -> (model, tokenizer) with the message's adapter loaded
        model, tokenizer = peft_model_for(self.cfg)
        set_adapter_state(model, content.array_records["arrays"].to_torch_state_dict())
        return model, tokenizer

    def train(self, content: RecordDict) -> RecordDict:
        server_round = int(content.config_records["config"]["server-round"])
        model, tokenizer = self.load(content)
        return self.local_round(model, tokenizer, server_round)

    def local_round(self, model: Any, tokenizer: Any, server_round: int, **extra: float | int) -> RecordDict:
        """`local-steps` of LoRA training from the loaded adapter, the validation loss, and the reply
        (adapter tensors + metrics, `extra` metrics added)."""
        report = train_steps(model, tokenizer, self.data.train, self.cfg, seed=self.seed(server_round))
        start = time.perf_counter()
        val_loss = mean_loss(model, tokenizer, self.data.val, self.cfg.seq_len) if self.data.val else math.nan
        self.private["rounds-trained"] = int(self.private.get("rounds-trained", 0)) + 1
        metrics = MetricRecord({
            "train-loss": report.mean_loss, "val-loss": val_loss, "num-examples": len(self.data.train),
            "partition-id": self.partition_id, "train-seconds": report.seconds, **extra,
            "seconds": report.seconds + time.perf_counter() - start,
        })
        return RecordDict({"arrays": ArrayRecord(get_adapter_state(model)), "metrics": metrics, "info": self.info()})

    def evaluate(self, content: RecordDict) -> RecordDict:
        start = time.perf_counter()
        model, tokenizer = self.load(content)
        scores = evaluate_client(model, tokenizer, self.data, self.cfg, self.num_partitions)
        metrics = MetricRecord({**scores, "num-examples": len(self.data.test), "partition-id": self.partition_id,
                                "seconds": time.perf_counter() - start})
        return RecordDict({"metrics": metrics, "info": self.info()})
