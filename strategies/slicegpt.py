"""slicegpt: SliceGPT (Ashkboos et al. 2024) ported to the federation, SFT-P's "SliceGPT+FT (FL)"
baseline.

Round 1: every sampled client runs `slicegpt-batches` batches of its training texts through the
DENSE model and sends, once, the covariance sum Σ x xᵀ (float64, d × d) of the residual stream at
each of the 2L + 1 points (`fedprune_app.methods.slicegpt.pca`) and its token count: a data
statistic, like FedTPA's mean feature (docs/methods/slicegpt.md#threat-model). The server sums them
(= the pooled sum), takes per point the top-k eigenvectors B_p = Q_p[:, :k], k from
`slicegpt-keep-ratio` under SFT-P's accounting (`sliced_width`), and sends the bases (float32, d × k
per point) with a fresh LoRA. Rounds 2..R: FedAvg LoRA recovery (FedIT's local round) on the sliced
model each client builds from its dense model and the bases, which never change.

One-shot: every covariance is the dense model's (one round). The reference is sequential (point p's
covariance on the model sliced before p: 2L + 1 rounds in a federation);
`slicegpt-references = "centralized"` builds that on the pooled calibration data (simulation only)
and the server scores it beside the final model.

Evaluations: round 0 dense, round 1 "post hoc" (sliced, zero LoRA), the last round slicegpt.
`save_final` writes `compiled/` (LoRA merged, sliced:
`fedprune_app.methods.slicegpt.sliced.load_sliced`), `adapter/`, `slicegpt.json` (width, parameter
counts, kept share of each point's variance) and the 'Compiled models' rows (size, speed).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict

from fedprune_app.core.config import RunConfig, split_list
from fedprune_app.core.protocol import flat_metrics
from fedprune_app.core.recovery import Spec, StatisticsThenRecovery
from fedprune_app.core.registry import register_strategy
from fedprune_app.core.replies import MAX_NUM_EXAMPLES, number_problem
from fedprune_app.core.strategy import MethodReport, Recorder, log
from fedprune_app.llm.layers import dense_model
from fedprune_app.llm.models import (
    initial_adapter_state,
    load_base_model,
    save_adapter,
    set_adapter_state,
)
from fedprune_app.methods.slicegpt.config import SliceGPTConfig
from fedprune_app.methods.slicegpt.models import bases_from_arrays, sliced_flops, sliced_model_for
from fedprune_app.methods.slicegpt.pca import (
    BASIS_PREFIX,
    COVARIANCE_PREFIX,
    principal_basis,
    sequential_bases,
    sum_covariances,
)
from fedprune_app.methods.slicegpt.sliced import (
    num_points,
    save_sliced,
    sliced_parameters,
    sliced_width,
)
from fedprune_app.structural.routing import prunable_parameters
from fedprune_app.structural.speed import compiled_rows, compiled_section, workload_flops


def budget(config: Any, keep_ratio: float) -> dict[str, Any]:
    """The width k for `keep_ratio` and what it keeps, under SFT-P's accounting and in total
    parameters."""
    d, n = int(config.hidden_size), num_points(config)
    k = sliced_width(config, keep_ratio)
    counts = sliced_parameters(config, [k] * n)
    dense_total = sliced_parameters(config, [d] * n)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    dense_params = (
        dense_total["projections"] + dense_total["embedding"] + (0 if tied else dense_total["head"])
    )
    return {
        "keep-ratio-target": keep_ratio,
        "width": k,
        "hidden-size": d,
        "slicing": 1 - k / d,
        "kept-ratio-prunable": (counts["projections"] + counts["shortcuts"])
        / prunable_parameters(config),
        "parameters": counts,
        "dense-parameters": dense_params,
        "params-ratio": counts["total"] / dense_params,
    }


class SliceGPTReport(MethodReport):
    """slicegpt's part of the run's report."""

    def reference_models(self) -> dict[str, Any]:
        """`centralized` (simulation only: the server rebuilds every partition's data): the
        reference, sequential SliceGPT on the pooled round-1 batches of all clients, at the same
        width, no recovery."""
        s = self.strategy
        if "centralized" not in split_list(s.options.slicegpt_references):
            return {}

        def centralized() -> tuple[Any, Any]:
            dense, tokenizer = dense_model(s.cfg)
            batches = s.pooled_batches(tokenizer, s.options.slicegpt_batches)
            log.info(
                "[fedprune] reference centralized: sequential SliceGPT on the pooled batches "
                "of %d clients",
                max(1, s.num_connected),
            )
            k = sliced_width(dense.config, s.options.slicegpt_keep_ratio)
            return sequential_bases(dense, batches, k)[1], tokenizer

        return {"centralized": centralized}

    def save_final(self, arrays: ArrayRecord, out_dir: Path) -> dict[str, str]:
        s = self.strategy
        model, tokenizer = s.global_model(arrays)
        if s.bases is None:
            return {}
        save_adapter(model, out_dir / "adapter")
        compiled = copy.deepcopy(model).merge_and_unload().eval()
        save_sliced(compiled, out_dir / "compiled", tokenizer)
        (out_dir / "slicegpt.json").write_text(json.dumps(s.stats, indent=1) + "\n")
        self.record_compiled(compiled, tokenizer)
        return {"adapter": "adapter", "compiled": "compiled", "slicegpt": "slicegpt.json"}

    def results_sections(self, records: list[dict[str, Any]]) -> str:
        """The 'Compiled models' section: the `compiled` rows of `record_compiled`."""

        return compiled_section(records)

    def record_compiled(self, compiled: torch.nn.Module, tokenizer: Any) -> None:
        """'Compiled models' rows: dense and the compiled sliced model, parameters (the sliced one's
        untied LM head counted), held-out perplexity (`server-eval-data`), and
        (`slicegpt-speed-prefill` > 0) prefill and generation timed round-robin against the dense
        model, beside the FLOP ceiling (`sliced_flops`)."""
        s = self.strategy

        dense = load_base_model(s.cfg.model_name, s.cfg.model_dtype, "none", s.cfg.device)
        prefill, dims = s.options.slicegpt_speed_prefill, list(compiled.config.slicegpt_dims)

        def ceiling(name: str, task: str) -> float | None:
            if name != "slicegpt":
                return None
            return workload_flops(dense.config, None, task, prefill=prefill) / sliced_flops(
                dense.config, dims, task, prefill=prefill
            )

        kept = {"dense": 1.0, "slicegpt": float(s.stats.get("kept-ratio-prunable", 1.0))}
        for row in compiled_rows(
            s.cfg, {"dense": dense, "slicegpt": compiled}, tokenizer, kept, prefill, ceiling
        ):
            s.record(row)


@register_strategy("slicegpt")
class SliceGPTStrategy(StatisticsThenRecovery):
    """Round 1: covariance sums → bases; rounds 2..R: FedAvg over LoRA on the sliced model."""

    structure_prefix = BASIS_PREFIX
    structure_name = "bases"
    statistics_name = "covariances"
    array_state = ("bases",)
    json_state = ("stats",)
    report_class = SliceGPTReport

    def __init__(self, cfg: RunConfig, recorder: Recorder | None = None) -> None:
        super().__init__(cfg, recorder)
        self.options = cfg.section(SliceGPTConfig)
        self.bases: dict[str, np.ndarray] | None = None
        self.stats: dict[str, Any] = {}

    def dense_config(self) -> Any:
        return dense_model(self.cfg)[0].config

    def initial_arrays(self) -> ArrayRecord:
        """No bases, no LoRA: round 0 evaluates the dense model."""
        return ArrayRecord()

    def statistics_shapes(self) -> Spec:
        """Round 1: a float64 d × d covariance sum per point."""
        config = self.dense_config()
        d = int(config.hidden_size)
        return {f"{COVARIANCE_PREFIX}{p}": ((d, d), "float64") for p in range(num_points(config))}

    def accept_reply(
        self, server_round: int, node_id: int, reply: RecordDict, phase: str
    ) -> str | None:
        """The base checks, then (round 1) each covariance sum must be float64, symmetric with a
        non-negative diagonal, and the reply must count its tokens (`calibration-tokens` > 0)."""
        problem = super().accept_reply(server_round, node_id, reply, phase)
        if problem is not None or phase != "train" or self.sent[node_id]:
            return problem
        tokens = flat_metrics(reply).get("calibration-tokens")
        if number_problem("calibration-tokens", tokens, 1, MAX_NUM_EXAMPLES) is not None:
            return f"round-1 reply lacks a positive 'calibration-tokens' metric (got {tokens!r})"
        for key, array in reply.array_records["arrays"].items():
            c = array.numpy()
            if c.dtype != np.float64:
                return f"covariance {key} must be float64, got {c.dtype}"
            if not np.allclose(c, c.T, rtol=1e-9, atol=1e-9 * max(1.0, float(np.abs(c).max()))):
                return f"covariance {key} is not symmetric"
            if (np.diag(c) < 0).any():
                return f"covariance {key} has a negative diagonal entry"
        return None

    def structure_arrays(self) -> dict[str, np.ndarray] | None:
        return self.bases

    def cut(
        self, states: list[dict[str, np.ndarray]], replies: list[RecordDict]
    ) -> dict[str, np.ndarray]:
        """Σ_k C_p^(k), B_p = top-k eigenvectors per point; the fresh LoRA of the sliced model."""
        tokens = [float(flat_metrics(r)["calibration-tokens"]) for r in replies]
        config = self.dense_config()
        covs = sum_covariances(
            [
                {int(k[len(COVARIANCE_PREFIX) :]): torch.from_numpy(v) for k, v in s.items()}
                for s in states
            ]
        )
        info = budget(config, self.options.slicegpt_keep_ratio)
        k = info["width"]
        bases, kept = [], []
        for p in sorted(covs):
            values, basis = principal_basis(covs[p], k)
            bases.append(basis)
            kept.append(float(values[:k].sum() / values.sum()))
        self.bases = {
            f"{BASIS_PREFIX}{p}": b.to(torch.float32).numpy() for p, b in enumerate(bases)
        }
        self.stats = info | {
            "clients": len(states),
            "calibration-tokens": sum(tokens),
            "variance-kept": kept,
        }
        log.info(
            "[fedprune] slicegpt: width %d of %d (slicing %.3f), kept %.3f of SFT-P's "
            "prunable parameters",
            k,
            info["hidden-size"],
            info["slicing"],
            info["kept-ratio-prunable"],
        )
        model, _ = sliced_model_for(self.cfg, self.basis_tensors())
        return {key: v.numpy() for key, v in initial_adapter_state(model).items()}

    def basis_tensors(self) -> list[torch.Tensor]:
        assert self.bases is not None
        return [
            torch.from_numpy(self.bases[f"{BASIS_PREFIX}{p}"]).to(torch.float64)
            for p in range(len(self.bases))
        ]

    def global_model(self, arrays: ArrayRecord) -> tuple[Any, Any]:
        """The sliced model with the global LoRA; the dense model before round 1."""
        state = arrays.to_torch_state_dict() if len(arrays) else {}
        dense, tokenizer = dense_model(self.cfg)
        bases = bases_from_arrays(state, dense.config)
        if bases is None:
            return dense, tokenizer
        model, tokenizer = sliced_model_for(self.cfg, bases)
        set_adapter_state(model, self.lora_state(state))
        model.eval()
        return model, tokenizer
