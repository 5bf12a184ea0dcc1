"""Federated FLAP-style structural baseline (issue 4): importance on each client's data, one global mask cut by the
server at the SFT-P budget, then FedAvg LoRA recovery (FedIT's local round) on the routed model.

Round 1 (`importance`): the client runs `fedflap-batches` batches of its training texts through the dense model
(adapters off, no masks) and replies one float importance per bus coordinate for each of SFT-P's four masks per
layer (`importance_scores`), plus `num-examples`. Rounds 2..R (`recovery`): the global arrays carry the server's
bool masks (`fedflap-mask.<name>`, layers × d) next to the LoRA tensors; the client sets the masks (it never
changes them), trains LoRA for `local-steps` and replies LoRA only. Evaluation: round 0 the dense model; later the
masked model with the global LoRA (round 1 = masks and the zero LoRA: "post hoc, no training").
"""

from __future__ import annotations

import time
from typing import Any

from flwr.app import MetricRecord, RecordDict
from torch import nn

from clients.fedit import FedITClient
from fedprune_app.core.protocol import to_record
from fedprune_app.core.registry import register_client
from fedprune_app.llm.data import training_batches
from fedprune_app.llm.evaluation import evaluate_client
from fedprune_app.llm.models import model_device, set_adapter_state
from fedprune_app.methods.fedflap.config import FedFLAPConfig
from fedprune_app.methods.fedflap.importance import (
    IMPORTANCE_PREFIX,
    MASK_PREFIX,
    fedflap_model_for,
    importance_scores,
    masks_from_arrays,
)
from fedprune_app.methods.sftp.generator import model_kept_ratios
from fedprune_app.methods.sftp.routing import LayerMasks, set_masks


@register_client("fedflap")
class FedFLAPClient(FedITClient):
    """Round 1: FLAP importance of the bus coordinates on the client's data; later rounds: FedIT's LoRA round
    on the routed model with the server's fixed global masks."""

    name = "fedflap"

    def load(self, content: RecordDict) -> tuple[nn.Module, Any, list[LayerMasks] | None]:
        """The routed model with the message's LoRA loaded and its masks set (None: dense)."""
        model, tokenizer = fedflap_model_for(self.cfg)
        model.eval()
        arrays = content.array_records["arrays"].to_torch_state_dict()
        set_adapter_state(model, {k: v for k, v in arrays.items() if not k.startswith(MASK_PREFIX)})
        masks = masks_from_arrays(arrays, model_device(model))
        set_masks(model, masks)
        return model, tokenizer, masks

    def train(self, content: RecordDict) -> RecordDict:
        server_round = int(content.config_records["config"]["server-round"])
        if server_round == 1:
            return self.importance(server_round)
        model, tokenizer, masks = self.load(content)
        if masks is None:
            raise ValueError("fedflap recovery round without the global masks (fedflap-mask.*) in the arrays")
        try:
            return self.local_round(model, tokenizer, server_round, **model_kept_ratios(model, masks))
        finally:
            set_masks(model, None)

    def importance(self, server_round: int) -> RecordDict:
        """Round 1: the importance arrays and num-examples (no activations, no text)."""
        start = time.perf_counter()
        model, tokenizer = fedflap_model_for(self.cfg)
        model.eval()
        batches = list(training_batches(self.data.train, tokenizer, self.cfg.batch_size,
                                        self.cfg.section(FedFLAPConfig).fedflap_batches, self.cfg.seq_len,
                                        self.seed(server_round)))
        scores = importance_scores(model, batches)
        self.private["rounds-trained"] = int(self.private.get("rounds-trained", 0)) + 1
        metrics = MetricRecord({"num-examples": len(self.data.train), "partition-id": self.partition_id,
                                "seconds": time.perf_counter() - start})
        arrays = to_record({IMPORTANCE_PREFIX + k: v for k, v in scores.items()})
        return RecordDict({"arrays": arrays, "metrics": metrics, "info": self.info()})

    def evaluate(self, content: RecordDict) -> RecordDict:
        """The client's own task on the dense model (round 0) or the masked model with the global LoRA."""
        start = time.perf_counter()
        model, tokenizer, masks = self.load(content)
        try:
            scores = evaluate_client(model, tokenizer, self.data, self.cfg, self.num_partitions)
        finally:
            set_masks(model, None)
        metrics = MetricRecord({**scores, **model_kept_ratios(model, masks), "num-examples": len(self.data.test),
                                "partition-id": self.partition_id, "seconds": time.perf_counter() - start})
        return RecordDict({"metrics": metrics, "info": self.info()})
