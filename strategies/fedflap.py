"""fedflap: a federated FLAP-style structural baseline on SFT-P's protocol (FLAP, An et al. 2024).

Round 1: every sampled client scores the residual-bus coordinates of SFT-P's four masks per layer on
its own data (`clients.fedflap.importance_scores`); the server averages the scores weighted by
num-examples, standardises them per (layer, mask) and cuts ONE global mask at the budget p
(`keep-ratios`, a single value: SFT-P's budget key), `cut_masks`. Rounds 2..R: FedAvg LoRA
recovery (FedIT) on the routed model with those masks, which travel as bool arrays
`fedflap-mask.<name>` (layers × d) in the global arrays and never change.

References in one run: round 0 = dense, round 1 = "post hoc" (the cut masks, zero LoRA, no
training), the last round = fedflap. `save_final` writes `compiled/` (LoRA merged, sliced:
`fedprune_app.structural.routing.load_compiled`),
`adapter/`, `masks.npz`, `masks.json`, `importance.npz` and `fedflap.json` (per client: dense / post
hoc / fedflap).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from fedprune_app.core.config import RunConfig
from fedprune_app.core.protocol import flat_metrics
from fedprune_app.core.recovery import Spec, StatisticsThenRecovery
from fedprune_app.core.registry import register_strategy
from fedprune_app.core.strategy import MethodReport, Recorder
from fedprune_app.llm.models import (
    initial_adapter_state,
    model_device,
    save_adapter,
    set_adapter_state,
)
from fedprune_app.methods.fedflap.importance import (
    IMPORTANCE_PREFIX,
    MASK_PREFIX,
    average_importance,
    cut_masks,
    fedflap_model_for,
    masks_from_arrays,
    single_keep_ratio,
    standardise,
)
from fedprune_app.structural.held import held_coordinates
from fedprune_app.structural.routing import (
    MASK_NAMES,
    MaskedModel,
    compile_model,
    coordinate_costs,
    mask_statistics,
    per_layer_masks,
    prunable_parameters,
    save_compiled,
)

# --- pure server-side functions (tests call them without Flower or a model) -----------------------


def render_reference_table(table: Mapping[str, Any]) -> str:
    """fedflap.json as Markdown: a row per model (dense / post hoc / fedflap), acc per client and
    the mean."""
    labels = [k for k in ("dense", "post-hoc", "fedflap") if k in table]
    clients = sorted({c for k in labels for c in table[k]["clients"]}, key=lambda c: (len(c), c))
    lines = [
        f"fedflap at keep ratio {table['keep-ratio']:g} (acc on each client's own test split; post "
        "hoc = the cut masks with no training)",
        "",
        "| model (round) | "
        + " | ".join(f"client {c}" for c in clients)
        + " | mean | kept (prunable) |",
        "|---|" + "---|" * (len(clients) + 2),
    ]
    for k in labels:
        row, mean = table[k]["clients"], table[k]["mean"]
        cells = [f"{row[c]['acc']:.3f}" if "acc" in row.get(c, {}) else "–" for c in clients]
        cells += [
            f"{mean['acc']:.3f}" if "acc" in mean else "–",
            f"{mean.get('kept-ratio-prunable', 1.0):.3f}",
        ]
        lines.append(f"| {k} ({table['rounds'][k]}) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# --- the strategy ---------------------------------------------------------------------------------


class FedFLAPReport(MethodReport):
    """fedflap's part of the run's report."""

    def save_final(self, arrays: ArrayRecord, out_dir: Path) -> dict[str, str]:
        s = self.strategy
        model, tokenizer = s.load(arrays)
        save_adapter(
            model,
            out_dir / "adapter",
            out_dir / "merged" if s.cfg.save_merged else None,
            tokenizer,
        )
        artefacts = {"adapter": "adapter"} | ({"merged": "merged"} if s.cfg.save_merged else {})
        table = self.reference_table()
        (out_dir / "fedflap.json").write_text(json.dumps(table, indent=1) + "\n")
        (out_dir / "fedflap.md").write_text(render_reference_table(table))
        artefacts["references"] = "fedflap.md"
        if s.masks is None:
            return artefacts
        save_compiled(
            compile_model(model, per_layer_masks(s.masks)), out_dir / "compiled", tokenizer
        )
        np.savez_compressed(out_dir / "masks.npz", **s.masks)
        np.savez_compressed(out_dir / "importance.npz", **(s.importance or {}))
        (out_dir / "masks.json").write_text(json.dumps(mask_statistics({0: s.masks})) + "\n")
        return artefacts | {
            "compiled": "compiled",
            "masks": "masks.npz",
            "importance": "importance.npz",
        }

    def reference_table(self) -> dict[str, Any]:
        """Per client and mean: dense (round 0), post hoc (round 1: masks, no training), fedflap
        (last round)."""
        s = self.strategy
        evaluated = sorted(map(int, s.scores))
        rows = {"dense": "0", "post-hoc": "1"}
        if evaluated and evaluated[-1] > 1:
            rows["fedflap"] = str(evaluated[-1])
        table: dict[str, Any] = {"keep-ratio": s.keep_ratio, "rounds": rows}
        for label, r in rows.items():
            per = s.scores.get(r, {})
            table[label] = {
                "clients": per,
                "mean": {
                    k: float(np.mean([c[k] for c in per.values() if k in c]))
                    for k in sorted({k for c in per.values() for k in c})
                },
            }
        return table


@register_strategy("fedflap")
class FedFLAPStrategy(StatisticsThenRecovery):
    """Round 1: importance → global mask; rounds 2..R: FedAvg over LoRA with the masks fixed."""

    structure_prefix = MASK_PREFIX
    structure_name = "global masks"
    statistics_name = "importance"
    array_state = ("masks", "importance")
    report_class = FedFLAPReport
    json_state = ("scores",)

    def __init__(self, cfg: RunConfig, recorder: Recorder | None = None) -> None:
        super().__init__(cfg, recorder)
        self.keep_ratio = single_keep_ratio(cfg)
        self.masks: dict[str, np.ndarray] | None = None
        self.importance: dict[str, np.ndarray] | None = None
        # round -> client -> metrics (for fedflap.json)
        self.scores: dict[str, dict[str, dict[str, float]]] = {}

    def initial_arrays(self) -> ArrayRecord:
        """Φ^(0) (A seeded, B = 0) and no masks: round 0 evaluates the dense model."""
        model, _ = fedflap_model_for(self.cfg)
        return ArrayRecord(initial_adapter_state(model))

    def statistics_shapes(self) -> Spec:
        """Round 1: float32 (layers, d) per mask name."""
        model, _ = fedflap_model_for(self.cfg)
        shape = (int(model.config.num_hidden_layers), int(model.config.hidden_size))
        return {IMPORTANCE_PREFIX + n: (shape, "float32") for n in MASK_NAMES}

    def accept_reply(
        self, server_round: int, node_id: int, reply: RecordDict, phase: str
    ) -> str | None:
        """Train: the base checks, then importance scores must be ≥ 0. Evaluate: keep the client's
        scores of the round for fedflap.json, keyed by its partition."""
        if phase == "evaluate":
            client = self.node_partition.get(node_id)
            if client is not None:
                kept = ("acc", "acc_norm", "ppl", "kept-ratio-prunable")
                scores = {k: float(v) for k, v in flat_metrics(reply).items() if k in kept}
                self.scores.setdefault(str(server_round), {})[str(client)] = scores
            return None
        problem = super().accept_reply(server_round, node_id, reply, phase)
        if problem is not None:
            return problem
        negative = [
            k
            for k, v in reply.array_records["arrays"].items()
            if k.startswith(IMPORTANCE_PREFIX) and (v.numpy() < 0).any()
        ]
        return (
            f"importance scores must be >= 0 (variances times squared norms): {negative[0]}"
            if negative
            else None
        )

    def cut(
        self, states: list[dict[str, np.ndarray]], replies: list[RecordDict]
    ) -> dict[str, np.ndarray]:
        """Importance averaged by num-examples, standardised per (layer, mask), one global cut at
        the budget that keeps the `hold-open` coordinates (default: the massive activations, as
        SFT-P's masks do)."""
        weights = [float(flat_metrics(r)["num-examples"]) for r in replies]
        mean = average_importance(
            [{k[len(IMPORTANCE_PREFIX) :]: v for k, v in s.items()} for s in states], weights
        )
        model, tokenizer = fedflap_model_for(self.cfg)
        target = self.keep_ratio * prunable_parameters(model.config)
        held = held_coordinates(self.cfg, model, tokenizer)
        normalised = {n: standardise(v) for n, v in mean.items()}
        self.importance = {n: v.astype(np.float32) for n, v in mean.items()}
        self.masks = cut_masks(
            normalised,
            coordinate_costs(model.config),
            target,
            None if held is None else held.numpy() > 0.5,
        )
        return {k: v.numpy() for k, v in initial_adapter_state(model).items()}

    def structure_arrays(self) -> dict[str, np.ndarray] | None:
        return None if self.masks is None else {MASK_PREFIX + n: m for n, m in self.masks.items()}

    def load(self, arrays: ArrayRecord) -> tuple[Any, Any]:
        """The routed model (dense outside a `masked` block) with the global LoRA loaded."""
        model, tokenizer = fedflap_model_for(self.cfg)
        model.eval()
        set_adapter_state(model, self.lora_state(arrays.to_torch_state_dict()))
        return model, tokenizer

    def global_model(self, arrays: ArrayRecord) -> tuple[Any, Any]:
        """The routed model with the global LoRA, routed by the global masks (none before round 1:
        dense)."""
        model, tokenizer = self.load(arrays)
        masks = masks_from_arrays(arrays.to_torch_state_dict(), model_device(model))
        return MaskedModel(model, masks), tokenizer
