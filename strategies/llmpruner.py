"""LLM-Pruner, federated (Ma et al. 2023; SFT-P's Table 1 baseline "LLM-Pruner+FT" in federated
form).

Round 1: every sampled client sends its Taylor rows (`fedprune_app.methods.llmpruner.importance`);
the server averages them weighted by the clients' token counts, takes |·|, sums them per coupled
structure (kv groups, MLP channels) and cuts ONE global structure at the budget
`llmpruner-keep-ratio` (`structure.cut`, LLM-Pruner's block-wise recipe over
`llmpruner-layer-start/-end`). Rounds 2..R: FedAvg LoRA recovery (FedIT) on the pruned model; the
structure travels as bool arrays `llmpruner-keep.heads` / `llmpruner-keep.channels` and never
changes.

References in one run: round 0 = dense, round 1 = post hoc (the cut, zero LoRA), the last
round = llmpruner; with `llmpruner-centralized` the server also scores (simulation only) the cut
from the pooled calibration data of all clients ('centralized') and the federated cut, both without
recovery. `save_final` writes `compiled/` (LoRA merged, heads and channels removed:
`fedprune_app.methods.llmpruner.structure.load_pruned`), `adapter/`, `structure.npz`,
`importance.npz`, and `phase: compiled` rows (size, kept ratio, server perplexity, optional speed)
for results.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from fedprune_app.core.config import RunConfig
from fedprune_app.core.protocol import flat_metrics
from fedprune_app.core.recovery import Spec, StatisticsThenRecovery
from fedprune_app.core.registry import register_strategy
from fedprune_app.core.strategy import MethodReport, Recorder
from fedprune_app.llm.models import initial_adapter_state, peft_model_for, set_adapter_state
from fedprune_app.methods.llmpruner.config import LLMPrunerConfig
from fedprune_app.methods.llmpruner.importance import (
    IMPORTANCE_PREFIX,
    average_rows,
    client_importance,
    group_scores,
    row_widths,
)
from fedprune_app.methods.llmpruner.models import dense_model, keep_from_arrays, pruned_model_for
from fedprune_app.methods.llmpruner.structure import (
    KEEP_PREFIX,
    cut,
    kept_parameters,
    layer_range,
    merged_copy,
    pruned_ceiling,
    save_pruned,
    shrink_,
)
from fedprune_app.structural.routing import prunable_parameters
from fedprune_app.structural.speed import compiled_rows, compiled_section

log = logging.getLogger("flwr")


class LLMPrunerReport(MethodReport):
    """llmpruner's part of the run's report."""

    def reference_models(self) -> dict[str, Callable[[], tuple[Any, Any]]]:
        """With `llmpruner-centralized` (simulation only): 'centralized' = the cut from the Taylor
        rows of every partition's round-1 calibration batches pooled (the server rebuilds them from
        the run's data sources with the clients' seeds), 'federated-cut' = the federated cut; both
        without LoRA recovery."""
        s = self.strategy
        if not s.section.llmpruner_centralized or s.keep is None:
            return {}
        keep = s.keep

        def federated() -> tuple[Any, Any]:
            model, tokenizer = dense_model(s.cfg)
            return shrink_(model, keep), tokenizer

        return {"centralized": self.centralized_model, "federated-cut": federated}

    def centralized_model(self) -> tuple[Any, Any]:
        s = self.strategy
        model, tokenizer = dense_model(s.cfg)
        batches = s.pooled_batches(tokenizer, s.section.llmpruner_batches, targets="sequence")
        log.info(
            "[fedprune] reference centralized: Taylor importance on the pooled calibration data "
            "of %d clients",
            max(1, s.num_connected),
        )
        rows, _ = client_importance(model, batches, s.section.llmpruner_taylor)
        keep, _ = s.cut_from_rows(rows, model.config)
        agree = float(np.mean(np.concatenate([(keep[k] == s.keep[k]).reshape(-1) for k in keep])))
        log.info(
            "[fedprune] reference centralized: its cut agrees with the federated one on %.4f of "
            "the structures",
            agree,
        )
        s.record({"phase": "llmpruner-cut-agreement", "agreement": agree})
        return shrink_(model, keep), tokenizer

    def save_final(self, arrays: ArrayRecord, out_dir: Path) -> dict[str, str]:
        s = self.strategy
        model, tokenizer = s.global_model(arrays)
        model.save_pretrained(out_dir / "adapter")
        artefacts = {"adapter": "adapter"}
        if s.keep is None:
            return artefacts
        compiled = merged_copy(model)  # the global model is the pruned one: merge its LoRA
        save_pruned(compiled, out_dir / "compiled", tokenizer)
        np.savez_compressed(out_dir / "structure.npz", **s.keep)
        np.savez_compressed(out_dir / "importance.npz", **(s.scores or {}))
        self.record_compiled(compiled, tokenizer)
        return artefacts | {
            "compiled": "compiled",
            "structure": "structure.npz",
            "importance": "importance.npz",
        }

    def results_sections(self, records: list[dict[str, Any]]) -> str:
        """The 'Compiled models' section: the `compiled` rows of `record_compiled`."""

        return compiled_section(records)

    def record_compiled(self, compiled: Any, tokenizer: Any) -> None:
        """`phase: compiled` rows for the dense and the pruned model: parameters, MB, kept ratio of
        the prunable projections, the server's held-out perplexity, and
        (`llmpruner-speed-prefill` > 0) prefill latency and generation speed against the dense
        model, each beside its FLOP ceiling (`structure.pruned_ceiling`)."""
        s = self.strategy

        dense, _ = dense_model(s.cfg)
        kept = {
            "dense": 1.0,
            "llmpruner": kept_parameters(dense.config, s.keep) / prunable_parameters(dense.config),
        }
        prefill = s.section.llmpruner_speed_prefill

        def ceiling(name: str, task: str) -> float:
            return 1.0 if name == "dense" else pruned_ceiling(dense.config, s.keep, task, prefill)

        for row in compiled_rows(
            s.cfg, {"dense": dense, "llmpruner": compiled}, tokenizer, kept, prefill, ceiling
        ):
            s.record(row)


@register_strategy("llmpruner")
class LLMPrunerStrategy(StatisticsThenRecovery):
    """Round 1: Taylor rows → averaged → one global cut; rounds 2..R: FedAvg over LoRA on the pruned
    model."""

    structure_prefix = KEEP_PREFIX
    statistics_name = "importance"
    array_state = ("keep", "scores")
    report_class = LLMPrunerReport

    def __init__(self, cfg: RunConfig, recorder: Recorder | None = None) -> None:
        super().__init__(cfg, recorder)
        self.section = cfg.section(LLMPrunerConfig)
        self.keep: dict[str, np.ndarray] | None = None
        self.scores: dict[str, np.ndarray] | None = None

    def initial_arrays(self) -> ArrayRecord:
        """FedIT's Φ^(0) on the dense model (B = 0): round 0 evaluates the dense model."""
        model, _ = peft_model_for(self.cfg)
        return ArrayRecord(initial_adapter_state(model))

    def statistics_shapes(self) -> Spec:
        """Round 1: float32 (layers, width) per Taylor row array."""
        model, _ = peft_model_for(self.cfg)
        layers = int(model.config.num_hidden_layers)
        return {
            IMPORTANCE_PREFIX + n: ((layers, w), "float32")
            for n, w in row_widths(model.config).items()
        }

    def accept_reply(
        self, server_round: int, node_id: int, reply: RecordDict, phase: str
    ) -> str | None:
        """The base checks, then `param_first` rows must be ≥ 0 (sums of absolute values)."""
        problem = super().accept_reply(server_round, node_id, reply, phase)
        if (
            problem is not None
            or phase != "train"
            or self.section.llmpruner_taylor != "param_first"
        ):
            return problem
        negative = [
            k
            for k, v in reply.array_records["arrays"].items()
            if k.startswith(IMPORTANCE_PREFIX) and (v.numpy() < 0).any()
        ]
        return (
            f"param_first Taylor rows must be >= 0 (sums of |w * grad|): {negative[0]}"
            if negative
            else None
        )

    def cut_from_rows(
        self, rows: dict[str, np.ndarray], config: Any
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(structure, group scores) of averaged Taylor rows at this run's budget and layer
        range."""
        scores = group_scores(rows, config)
        layers = layer_range(
            config, self.section.llmpruner_layer_start, self.section.llmpruner_layer_end
        )
        return cut(scores, config, self.section.llmpruner_keep_ratio, layers), scores

    def cut(
        self, states: list[dict[str, np.ndarray]], replies: list[RecordDict]
    ) -> dict[str, np.ndarray]:
        """Taylor rows averaged by token count, one global cut; the fresh LoRA of the pruned
        model."""
        weights = [float(flat_metrics(r)["num-examples"]) for r in replies]
        rows = average_rows(
            [{k[len(IMPORTANCE_PREFIX) :]: v for k, v in s.items()} for s in states], weights
        )
        model, _ = peft_model_for(self.cfg)
        self.keep, self.scores = self.cut_from_rows(rows, model.config)
        kept = kept_parameters(model.config, self.keep) / prunable_parameters(model.config)
        log.info(
            "[fedprune] llmpruner: global cut keeps %.4f of the prunable weights (%d kv groups, "
            "%d channels)",
            kept,
            int(self.keep["heads"].sum()),
            int(self.keep["channels"].sum()),
        )
        pruned, _ = pruned_model_for(self.cfg, self.keep)
        return {k: v.numpy() for k, v in initial_adapter_state(pruned).items()}

    def structure_arrays(self) -> dict[str, np.ndarray] | None:
        return None if self.keep is None else {KEEP_PREFIX + k: v for k, v in self.keep.items()}

    def global_model(self, arrays: ArrayRecord) -> tuple[Any, Any]:
        """The pruned LoRA model with the global adapter (the dense one before round 1)."""
        state = arrays.to_torch_state_dict()
        keep = keep_from_arrays(state)
        model, tokenizer = (
            peft_model_for(self.cfg) if keep is None else pruned_model_for(self.cfg, keep)
        )
        model.eval()
        set_adapter_state(model, self.lora_state(state))
        return model, tokenizer
