"""FedSpaLLM client (Alg. 1, lines 8–13): prune the sampled layers with local calibration data.

The client keeps the dense model (Eq. 9: unsampled layers stay dense), writes the received global weights
of its sampled layers over it, runs the sequential layer loop with its pruner on `calib-segments` windows
of its own text, and replies with only those layers' pruned weights and bool masks (`<name>:mask`).
"""

from __future__ import annotations

import json
import time

from flwr.app import MetricRecord, RecordDict

from clients.base import FederatedClient
from clients.pruning import make_pruner, prune_sequentially, sparsity_of
from fedprune_app.pruned_models import MASK_SUFFIX, calibration_batches, dense_model, model_with_weights
from fedprune_app.records import to_record


class FedSpaLLMClient(FederatedClient):
    """Local pruning of the sampled decoder layers."""

    name = "fedspallm"

    def train(self, content: RecordDict) -> RecordDict:
        start = time.perf_counter()
        config = content.config_records["config"]
        server_round, layers = int(config["server-round"]), json.loads(str(config["layers"]))
        received = {k: v.numpy() for k, v in content.array_records["arrays"].items()}
        # both restore the process's cached model to dense first (Eq. 9), whatever an earlier message pruned
        model, tokenizer = model_with_weights(self.cfg, received) if received else dense_model(self.cfg)
        batches = calibration_batches(self.data.train, tokenizer, int(self.cfg.calib_segments),
                                      int(self.cfg.calib_seq_len), self.seed(server_round))
        pruner = make_pruner(str(self.cfg.pruner), float(self.cfg.sparsity), int(self.cfg.prune_n),
                             int(self.cfg.prune_m), int(self.cfg.sparsegpt_blocksize),
                             float(self.cfg.sparsegpt_percdamp))
        masks = prune_sequentially(model, batches, layers, pruner)
        params = dict(model.named_parameters())
        reply = {}
        for name, kept in masks.items():
            reply[name] = params[name].detach().float().numpy().copy()
            reply[name + MASK_SUFFIX] = kept.numpy()
        self.private["rounds-pruned"] = int(self.private.get("rounds-pruned", 0)) + 1
        metrics = MetricRecord({
            "num-examples": int(sum(b.shape[0] for b in batches)), "partition-id": self.partition_id,
            "layers": len(layers), "sparsity": sum(sparsity_of(m) for m in masks.values()) / max(1, len(masks)),
            "calib-tokens": int(sum(b.numel() for b in batches)), "seconds": time.perf_counter() - start,
        })
        return RecordDict({"arrays": to_record(reply), "metrics": metrics, "info": self.info()})

    def evaluate(self, content: RecordDict) -> RecordDict:
        raise NotImplementedError("FedSpaLLM evaluates the global model on the server (server-eval-data)")

