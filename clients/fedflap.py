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

import numpy as np
import torch
from flwr.app import MetricRecord, RecordDict
from torch import Tensor, nn

from clients.fedit import FedITClient
from fedprune_app.config import RunConfig
from fedprune_app.data import training_batches
from fedprune_app.evaluation import evaluate_client
from fedprune_app.mask_generator import backbone_parameters, kept_ratios, routed_model_for
from fedprune_app.models import model_device, set_adapter_state
from fedprune_app.records import to_record
from fedprune_app.routing import (
    MASK_NAMES,
    LayerMasks,
    decoder_layers,
    kept_parameters,
    per_layer_masks,
    prunable_parameters,
    set_masks,
)

MASK_PREFIX = "fedflap-mask."  # the global masks in the arrays the server sends: bool (layers, d) per mask name
IMPORTANCE_PREFIX = "importance."  # a round-1 reply: float32 (layers, d) per mask name


def fedflap_model_for(cfg: RunConfig) -> tuple[nn.Module, Any]:
    """The process's cached routed backbone + LoRA (lora-* keys) and tokenizer; callers set masks and adapters."""
    return routed_model_for(cfg.replace(sftp_adapters=True))


def _base_weight(module: nn.Module) -> Tensor:
    """The frozen weight of a (possibly peft-wrapped) linear layer."""
    return getattr(module, "base_layer", module).weight


class _Moments:
    """Running count, sum and sum of squares per coordinate (float64) of the rows of (tokens, d) matrices."""

    def __init__(self) -> None:
        self.n, self.s, self.s2 = 0, 0.0, 0.0

    def add(self, x: Tensor) -> None:
        x = x.detach().to("cpu", torch.float64)
        self.n += x.shape[0]
        self.s = self.s + x.sum(0)
        self.s2 = self.s2 + x.pow(2).sum(0)

    def variance(self) -> Tensor:
        """The sample variance (n − 1 in the denominator; 0 with fewer than 2 rows)."""
        if self.n < 2:
            return torch.zeros_like(torch.as_tensor(self.s2, dtype=torch.float64))
        return ((self.s2 - self.s.pow(2) / self.n) / (self.n - 1)).clamp_min(0.0)


@torch.no_grad()
def importance_scores(model: nn.Module, batches: list[dict[str, Tensor]]) -> dict[str, np.ndarray]:
    """FLAP's fluctuation metric (An et al. 2024, "Fluctuation-based Adaptive Structured Pruning") carried over
    to SFT-P's bus coordinates; returns {mask: (layers, d)}.

    FLAP scores input channel j of a linear map W by S_j = Var_n(X_{n,j}) · ‖W_{:,j}‖²: the expected squared change
    of W·X when channel j is replaced by its mean (their bias compensation). On the residual bus, per layer:

    - attn-in: X = the input RMSNorm's output (γ ⊙ x̂, what q/k/v read), S_j = Var(X_j) · Σ_{q,k,v} ‖W_{:,j}‖²;
    - ffn-in: X = the post-attention RMSNorm's output, S_j = Var(X_j) · Σ_{gate,up} ‖W_{:,j}‖²;
    - attn-out / ffn-out: Y = the o_proj / down_proj output, S_j = Var(Y_j): the same quantity (expected squared
      change of what the submodule writes to the bus when coordinate j of its write is replaced by its mean). No
      extra ‖W_{j,:}‖² factor: Y_j = W_{j,:}·h already carries the row's scale, so it would count it twice.

    Statistics over every non-padding token of `batches`, in float64, on the dense model (masks off, adapters off).
    Not modelled: removing an input coordinate also changes the RMS over the active lane (routing.route), and
    SFT-P's masked/compiled forms have no compensation bias (FLAP adds one), so a removed coordinate's mean is not
    restored: this baseline is FLAP's score and standardised global cut without its bias compensation.
    """
    layers = decoder_layers(model)
    moments = [{name: _Moments() for name in MASK_NAMES} for _ in layers]
    keep: list[Tensor] = []  # the current batch's non-padding positions (tokens,)
    sources = {"attn-in": lambda lay: lay.input_layernorm, "ffn-in": lambda lay: lay.post_attention_layernorm,
               "attn-out": lambda lay: lay.self_attn.o_proj, "ffn-out": lambda lay: lay.mlp.down_proj}

    def hook(stats: _Moments) -> Any:
        def record(_module: nn.Module, _inputs: Any, output: Tensor) -> None:
            stats.add(output.reshape(-1, output.shape[-1])[keep[0]])
        return record

    handles = [sources[name](layer).register_forward_hook(hook(moments[i][name]))
               for i, layer in enumerate(layers) for name in MASK_NAMES]
    set_masks(model, None)
    device = model_device(model)
    try:
        context = model.disable_adapter() if hasattr(model, "disable_adapter") else torch.no_grad()
        with context:
            for batch in batches:
                keep[:] = [batch["attention_mask"].reshape(-1).bool().to(device)]
                model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device))
    finally:
        for h in handles:
            h.remove()
    out: dict[str, list[Tensor]] = {name: [] for name in MASK_NAMES}
    for i, layer in enumerate(layers):
        attn, mlp = layer.self_attn, layer.mlp
        cols = {"attn-in": [attn.q_proj, attn.k_proj, attn.v_proj], "ffn-in": [mlp.gate_proj, mlp.up_proj]}
        for name in MASK_NAMES:
            var = moments[i][name].variance()
            if name in cols:
                var = var * sum(_base_weight(m).detach().double().cpu().pow(2).sum(0) for m in cols[name])
            out[name].append(var)
    return {name: torch.stack(v).numpy().astype(np.float32) for name, v in out.items()}


def masks_from_arrays(arrays: dict[str, Tensor], device: torch.device) -> list[LayerMasks] | None:
    """The global masks in a message's arrays as `set_masks` input (float 0/1 on `device`), None when absent."""
    if MASK_PREFIX + MASK_NAMES[0] not in arrays:
        return None
    return per_layer_masks({name: arrays[MASK_PREFIX + name].to(device, torch.float32) for name in MASK_NAMES})


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

    def kept(self, model: nn.Module, masks: list[LayerMasks] | None) -> dict[str, float]:
        total = prunable_parameters(model.config)
        kept = float(total if masks is None else kept_parameters(model.config, masks))
        return kept_ratios(kept, total, backbone_parameters(model))

    def train(self, content: RecordDict) -> RecordDict:
        server_round = int(content.config_records["config"]["server-round"])
        if server_round == 1:
            return self.importance(server_round)
        model, tokenizer, masks = self.load(content)
        if masks is None:
            raise ValueError("fedflap recovery round without the global masks (fedflap-mask.*) in the arrays")
        try:
            return self.local_round(model, tokenizer, server_round, **self.kept(model, masks))
        finally:
            set_masks(model, None)

    def importance(self, server_round: int) -> RecordDict:
        """Round 1: the importance arrays and num-examples (no activations, no text)."""
        start = time.perf_counter()
        model, tokenizer = fedflap_model_for(self.cfg)
        model.eval()
        batches = list(training_batches(self.data.train, tokenizer, int(self.cfg.batch_size),
                                        int(self.cfg.fedflap_batches), int(self.cfg.seq_len),
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
        metrics = MetricRecord({**scores, **self.kept(model, masks), "num-examples": len(self.data.test),
                                "partition-id": self.partition_id, "seconds": time.perf_counter() - start})
        return RecordDict({"metrics": metrics, "info": self.info()})
