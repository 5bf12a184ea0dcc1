"""FedSpaLLM client (Alg. 1, lines 8–13): prune the sampled layers with local calibration data.

The client keeps the dense model (Eq. 9: unsampled layers stay dense), writes the received global
weights of its sampled layers over it, runs the sequential layer loop with its pruner on
`calib-segments` windows of its own text, and replies with only those layers' kept weights and
bit-packed masks (`<name>`, `<name>:mask`, fedprune_app.core.encoding) in `payload-dtype`; the
global weights it receives come in the same encoding.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from fedprune_app.core.client import FederatedClient
from fedprune_app.core.config import split_list
from fedprune_app.core.encoding import decode_dense, encode_sparse
from fedprune_app.core.progress import layer_logger
from fedprune_app.core.protocol import to_record
from fedprune_app.core.registry import register_client
from fedprune_app.llm.evaluation import held_out_metrics, held_out_text
from fedprune_app.llm.layers import (
    calibration_batches,
    decoder_layers,
    dense_model,
    model_with_weights,
)
from fedprune_app.methods.fedspallm.config import FedSpaLLMConfig
from fedprune_app.methods.fedspallm.masks import MASK_SUFFIX
from fedprune_app.methods.fedspallm.pruners import (
    Pruner,
    prune_sequentially,
    pruner_for,
    sparsity_of,
)

# Flower's handler; a simulation's Ray workers pass it on to `flwr run --stream`
log = logging.getLogger("flwr")


@register_client("fedspallm")
class FedSpaLLMClient(FederatedClient):
    """Local pruning of the sampled decoder layers."""

    name = "fedspallm"

    def train(self, content: RecordDict) -> RecordDict:
        start = time.perf_counter()
        config = content.config_records["config"]
        server_round, layers = int(config["server-round"]), json.loads(str(config["layers"]))
        received = self.decode(content.array_records["arrays"])
        # both restore the process's cached model to dense first (Eq. 9), whatever an earlier
        # message pruned
        model, tokenizer = (
            model_with_weights(self.cfg, received) if received else dense_model(self.cfg)
        )
        batches = self.calibration(tokenizer, server_round)
        masks = prune_sequentially(
            model,
            batches,
            layers,
            self.pruner(),
            on_layer=layer_logger(
                log, f"[fedspallm] client {self.partition_id}, round {server_round}", layers
            ),
        )
        params = dict(model.named_parameters())
        reply = encode_sparse(
            {name: params[name].detach().to("cpu", torch.float32).numpy() for name in masks},
            {name: kept.cpu().numpy() for name, kept in masks.items()},
            self.payload_dtype(),
        )
        self.private["rounds-pruned"] = int(self.private.get("rounds-pruned", 0)) + 1
        if (
            server_round == 1
            and len(layers) == len(decoder_layers(model))
            and self.wants_standalone()
        ):
            # every layer pruned from the dense model with the round-1 segments: this IS the
            # standalone model
            self.private.update(
                {f"standalone/{k}": v for k, v in self.scores(model, tokenizer).items()}
            )
        metrics = MetricRecord(
            {
                "num-examples": int(sum(b.shape[0] for b in batches)),
                "partition-id": self.partition_id,
                "layers": len(layers),
                "sparsity": sum(sparsity_of(m) for m in masks.values()) / max(1, len(masks)),
                "calib-tokens": int(sum(b.numel() for b in batches)),
                "seconds": time.perf_counter() - start,
            }
        )
        return RecordDict({"arrays": to_record(reply), "metrics": metrics, "info": self.info()})

    def payload_dtype(self) -> str:
        return self.cfg.section(FedSpaLLMConfig).payload_dtype

    def decode(self, arrays: ArrayRecord) -> dict[str, np.ndarray]:
        """The server's global weights of the sampled layers, dense float32, from their wire
        encoding (the shapes are this client's model's)."""
        encoded = {k: v.numpy() for k, v in arrays.items()}
        if not encoded:
            return {}
        model, _ = dense_model(self.cfg)
        shapes = {
            name: tuple(p.shape)
            for name, p in model.named_parameters()
            if name in encoded and not name.endswith(MASK_SUFFIX)
        }
        return decode_dense(encoded, shapes, self.payload_dtype())

    def evaluate(self, content: RecordDict) -> RecordDict:
        raise NotImplementedError(
            "FedSpaLLM evaluates the global model on the server (server-eval-data)"
        )

    def wants_standalone(self) -> bool:
        return "standalone" in split_list(self.cfg.section(FedSpaLLMConfig).fedspallm_references)

    def scores(self, model: Any, tokenizer: Any) -> dict[str, Any]:
        """`ppl/<source>` of `model` on the public held-out texts the server scores
        (`server-eval-data`), with each window's NLL and token count (`window-nll/<source>`,
        `window-tokens/<source>`, both lists of floats: scores of public text, never integers that
        could carry token ids), which let the server pair this model with the global one window by
        window."""
        out: dict[str, Any] = {}
        for source in split_list(self.cfg.server_eval_data):
            scored = held_out_metrics(model, tokenizer, held_out_text(source, self.cfg), self.cfg)
            out[f"ppl/{source}"] = scored["ppl"]
            out[f"window-nll/{source}"] = scored["window-nll"]
            # counts, sent as scores
            out[f"window-tokens/{source}"] = [float(t) for t in scored["window-tokens"]]
        return out

    def reference(self, content: RecordDict) -> RecordDict:
        """`standalone` (the paper's baseline): this client prunes every layer of the dense model
        with only its own calibration data (the same segments as its round-1 call) and scores the
        result's perplexity on the public held-out texts the server uses (`server-eval-data`), so
        the server can report the client models' mean. Nothing but the perplexities is sent. When
        this client's round-1 train message already pruned every layer (r_i = 1), that model was the
        standalone one: its scores, kept in `context.state`, are sent (`reused-round-1` = 1) instead
        of pruning the same model again."""
        name = str(content.config_records["config"]["reference"])
        if name != "standalone":
            return super().reference(content)
        start = time.perf_counter()
        model, tokenizer = dense_model(self.cfg)
        batches = self.calibration(tokenizer, server_round=1)
        metrics: dict[str, Any] = {
            "num-examples": int(sum(b.shape[0] for b in batches)),
            "partition-id": self.partition_id,
        }
        stored = {
            k[len("standalone/") :]: v
            for k, v in self.private.items()
            if k.startswith("standalone/")
        }
        if stored:
            metrics.update(stored, **{"reused-round-1": 1})
        else:
            every = range(len(decoder_layers(model)))
            prune_sequentially(
                model,
                batches,
                every,
                self.pruner(),
                on_layer=layer_logger(
                    log, f"[fedspallm] client {self.partition_id}, standalone reference", every
                ),
            )
            metrics.update(self.scores(model, tokenizer))
        metrics["seconds"] = time.perf_counter() - start
        return RecordDict({"metrics": MetricRecord(metrics), "info": self.info()})

    def calibration(self, tokenizer: Any, server_round: int) -> list[torch.Tensor]:
        prune_cfg = self.cfg.section(FedSpaLLMConfig)
        return calibration_batches(
            self.data.train,
            tokenizer,
            prune_cfg.calib_segments,
            prune_cfg.calib_seq_len,
            self.seed(server_round),
        )

    def pruner(self) -> Pruner:
        return pruner_for(self.cfg)
