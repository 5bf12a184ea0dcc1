"""SFT-P (Structural Federated Tuning and Pruning; §3, Alg. 1): FedAvg over the mask generator Θ and
the LoRA adapters Φ (Eq. 15); the client embeddings e_k stay on the clients.

Weights of Eq. 15: equal per client (`sftp-aggregation = "equal"`, Table 4) or the clients'
`num-examples`. At the last round each client's evaluate reply carries its hard masks; `save_final`
writes under the run:
- `generator/` Θ (`generator.safetensors`) + `config.json`; `adapter/` Φ (peft `save_pretrained`,
  with +A);
- `compiled/client-<k>/` the deployable model of client k (LoRA merged, sliced by its masks; the
  global Φ, or under `sftp-deploy-state = "local"` the Φ_k of the client's last train reply, the one
  its final evaluation used):
  `fedprune_app.structural.routing.load_compiled("<run>/compiled/client-0")`;
- `masks.npz` (`client-<k>/<mask>`: bool, layers × d), `masks.json` (per-layer density per client
  and cross-client agreement per layer: Fig. 3/5), `kept_ratio.json` + `plots/kept-ratio.png` (kept
  ratio per client per round: Fig. 4b).

What the server scores. Every round (`server_app.server_evaluation`) it scores `global_model`: the
backbone with the global Φ, routed by h_Θ at the shared fixed input e = 0. Under NOC that is every
client's mask, so it is the model each client deploys. Under +C a client's mask is h_Θ(e_k) with its
private e_k; e = 0 is no client's embedding, so that per-round score is of a model nobody deploys
(labelled so in results.md, with its kept ratio: `global_model_notes`). After the last round the
server holds each client's compiled model, the deployed artefact, and `record_compiled` scores every
one of them (and the dense base model) on the same held-out text: the 'Compiled models' rows of
results.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict

from fedprune_app.core.config import RunConfig
from fedprune_app.core.protocol import flat_metrics, numpy_state, parse_partition_id
from fedprune_app.core.registry import register_strategy
from fedprune_app.core.replies import check_arrays, to_record, weighted_average
from fedprune_app.core.strategy import FederatedStrategy, MethodReport, Recorder, log
from fedprune_app.llm.models import (
    initial_adapter_state,
    load_base_model,
    model_config,
    save_adapter,
    set_adapter_state,
)
from fedprune_app.methods.sftp.config import SFTPConfig
from fedprune_app.methods.sftp.generator import (
    GENERATOR_PREFIX,
    deterministic_mask,
    generator_for,
    get_generator_state,
    layer_masks,
)
from fedprune_app.methods.sftp.models import load_pair, routed_model
from fedprune_app.structural.held import force_open, held_coordinates
from fedprune_app.structural.routing import (
    MASK_NAMES,
    MaskedModel,
    compile_model,
    kept_parameters,
    mask_statistics,
    model_kept_ratios,
    per_layer_masks,
    prunable_parameters,
    save_compiled,
)
from fedprune_app.structural.speed import compiled_rows, compiled_section


class SFTPReport(MethodReport):
    """sftp's part of the run's report."""

    def save_final(self, arrays: ArrayRecord, out_dir: Path) -> dict[str, str]:
        s = self.strategy
        sftp_cfg = s.cfg.section(SFTPConfig)
        from safetensors.torch import save_file

        model, tokenizer, generator = s.load(arrays)
        artefacts: dict[str, str] = {}
        (out_dir / "generator").mkdir(parents=True, exist_ok=True)
        save_file(
            get_generator_state(generator), str(out_dir / "generator" / "generator.safetensors")
        )
        gen_config = {
            **generator.config(),
            "gate-bias": sftp_cfg.sftp_gate_bias,
            "gate-tau": sftp_cfg.sftp_gate_tau,
            "key-prefix": GENERATOR_PREFIX,
        }
        (out_dir / "generator" / "config.json").write_text(json.dumps(gen_config, indent=2) + "\n")
        artefacts["generator"] = "generator"
        # Φ on the dense backbone (a PEFT directory; merged: the unpruned model + Φ)
        if sftp_cfg.sftp_adapters:
            save_adapter(
                model,
                out_dir / "adapter",
                out_dir / "merged" if s.cfg.save_merged else None,
                tokenizer,
            )
            artefacts |= {"adapter": "adapter"} | (
                {"merged": "merged"} if s.cfg.save_merged else {}
            )
        compiled: dict[str, torch.nn.Module] = {}
        kept: dict[str, float] = {"dense": 1.0}
        for client, masks in sorted(s.final_masks.items()):
            s.set_deployed_adapter(model, arrays, client)
            compiled[f"client {client}"] = compile_model(model, per_layer_masks(masks))
            kept[f"client {client}"] = float(
                kept_parameters(model.config, per_layer_masks(masks))
            ) / prunable_parameters(model.config)
            save_compiled(
                compiled[f"client {client}"], out_dir / "compiled" / f"client-{client}", tokenizer
            )
            artefacts[f"compiled-client-{client}"] = f"compiled/client-{client}"
        if compiled:
            self.record_compiled(compiled, tokenizer, kept)
        if s.final_masks:
            np.savez_compressed(
                out_dir / "masks.npz",
                **{f"client-{k}/{n}": m[n] for k, m in s.final_masks.items() for n in MASK_NAMES},
            )
            (out_dir / "masks.json").write_text(json.dumps(mask_statistics(s.final_masks)) + "\n")
            artefacts["masks"] = "masks.npz"
        (out_dir / "kept_ratio.json").write_text(json.dumps(s.kept_history, indent=1) + "\n")
        self.plot_kept_ratio(out_dir / "plots" / "kept-ratio.png")
        return artefacts

    def server_columns(self) -> dict[str, tuple[str, str]]:
        """The kept share of the model `global_model` scored, beside the server's scores."""
        term = "kept (prunable): the share of the prunable weights the scored model keeps"
        return {"kept-ratio-prunable": ("kept (prunable)", term)}

    def results_sections(self, records: list[dict[str, Any]]) -> str:
        """The 'Compiled models' section: the `compiled` rows of `record_compiled`."""

        return compiled_section(records)

    def record_compiled(
        self,
        compiled: Mapping[str, torch.nn.Module],
        tokenizer: Any = None,
        kept: Mapping[str, float] | None = None,
    ) -> None:
        """One `compiled` row per client model, after the dense base model's: parameters, MB, the
        kept ratio of the prunable projections (`kept`), the perplexity of the server's held-out
        text (`ppl/<source>` per `server-eval-data` source, as the per-round server evaluation
        scores it; with `tokenizer` and `eval-ppl-tokens` > 0): the server's score of the model each
        client deploys; and (`sftp-speed-prefill` > 0) its prefill latency and generation speed
        against the dense model, each beside its FLOP ceiling
        (`fedprune_app.structural.speed.speed_table`, timed round-robin in this process). results.md
        tables them."""
        s = self.strategy

        dense = load_base_model(s.cfg.model_name, s.cfg.model_dtype, "none", s.cfg.device)
        for row in compiled_rows(
            s.cfg,
            {"dense": dense, **compiled},
            tokenizer,
            dict(kept or {}),
            s.cfg.section(SFTPConfig).sftp_speed_prefill,
        ):
            s.record(row)

    def plot_kept_ratio(self, path: Path) -> None:
        """Fig. 4b: per client and round, the kept ratio of the prunable projections that the budget
        penalty drives (expected under the sampled gates, `kept-expected`; records without it: the
        deployed mask's)."""
        s = self.strategy
        if not s.kept_history:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator

        path.parent.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(5, 3.2))
        for client in sorted({r["client"] for r in s.kept_history}, key=str):
            rows = sorted(
                (r["round"], r.get("kept-expected") or r["kept-ratio-prunable"])
                for r in s.kept_history
                if r["client"] == client
            )
            ax.plot(
                [r for r, _ in rows], [v for _, v in rows], marker="o", label=f"client {client}"
            )
        for target in sorted(
            {r["keep-target"] for r in s.kept_history if r["keep-target"] is not None}
        ):
            ax.axhline(target, color="grey", linestyle="--", linewidth=0.8)
        rounds = sorted({r["round"] for r in s.kept_history})
        ax.set_title(
            "Kept share of the prunable weights per client (dashed: each budget)", fontsize=9
        )
        ax.set_xlabel("round")
        if len(rounds) <= 20:
            ax.set_xticks(rounds)
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("kept ratio of prunable weights")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)


@register_strategy("sftp")
class SFTPStrategy(FederatedStrategy):
    """FedAvg over Θ (+Φ); collects the clients' final masks and compiles one model per client."""

    dp_release = "Θ (mask generator) and Φ (LoRA), one joint update per client; e_k stays"
    report_class = SFTPReport

    @classmethod
    def dp_refusal(cls, cfg: RunConfig) -> str | None:
        """DP-FedAvg averages with equal weights and releases only the noised global (Θ, Φ)."""
        sftp_cfg = cfg.section(SFTPConfig)
        if sftp_cfg.sftp_aggregation != "equal":
            return (
                f"sftp-aggregation = {sftp_cfg.sftp_aggregation!r} weights clients by data "
                "size; DP-FedAvg's mean is uniform: use 'equal'"
            )
        if sftp_cfg.sftp_deploy_state == "local" and sftp_cfg.sftp_adapters:
            return (
                "sftp-deploy-state = 'local' compiles each client's model from its own "
                "un-noised Φ_k on the server: use 'global'"
            )
        return None

    def __init__(self, cfg: RunConfig, recorder: Recorder | None = None) -> None:
        super().__init__(cfg, recorder)
        self.final_masks: dict[int, dict[str, np.ndarray]] = {}
        # Φ_k of each client's last accepted reply
        self.local_adapters: dict[int, dict[str, np.ndarray]] = {}
        self.kept_history: list[dict[str, Any]] = []

    def initial_arrays(self) -> ArrayRecord:
        """Θ^(0) (seeded by `seed`; all-ones initial masks) and, with adapters, Φ^(0) (B = 0: the
        dense model)."""
        model, _ = routed_model(self.cfg)
        state = get_generator_state(generator_for(self.cfg, model.config, seed=self.cfg.seed))
        if self.cfg.section(SFTPConfig).sftp_adapters:
            state |= initial_adapter_state(model)
        return ArrayRecord(state)

    def state_dict(self) -> dict[str, Any]:
        """The kept-ratio history per round (Fig. 5) and the final masks received so far."""
        return super().state_dict() | {
            "kept-history": list(self.kept_history),
            "final-masks": dict(self.final_masks),
            "local-adapters": dict(self.local_adapters),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.kept_history, self.final_masks = (
            list(state["kept-history"]),
            dict(state["final-masks"]),
        )
        self.local_adapters = dict(state.get("local-adapters", {}))

    def aggregate(self, server_round: int, replies: list[RecordDict]) -> ArrayRecord:
        """Eq. 15 over every tensor of Θ and Φ."""
        sftp_cfg = self.cfg.section(SFTPConfig)
        states = [numpy_state(r.array_records["arrays"]) for r in replies]
        metrics = [flat_metrics(r) for r in replies]
        weights = [
            1.0 if sftp_cfg.sftp_aggregation == "equal" else float(m["num-examples"])
            for m in metrics
        ]
        kept_keys = ("kept-ratio-prunable", "kept-ratio-model", "kept-expected", "keep-target")
        for m in metrics:
            self.kept_history.append(
                {
                    "round": server_round,
                    "client": m.get("partition-id"),
                    **{k: m.get(k) for k in kept_keys},
                }
            )
        if sftp_cfg.sftp_deploy_state == "local" and sftp_cfg.sftp_adapters:
            for state, m in zip(states, metrics, strict=True):
                try:
                    client = parse_partition_id(m.get("partition-id"))
                except ValueError as err:
                    log.warning("a train reply's Φ_k is not kept for deployment: %s", err)
                    continue
                self.local_adapters[client] = {
                    k: v for k, v in state.items() if not k.startswith(GENERATOR_PREFIX)
                }
        return to_record(weighted_average(states, weights))

    def accept_reply(
        self, server_round: int, node_id: int, reply: RecordDict, phase: str
    ) -> str | None:
        """Train: the base checks. Evaluate: keep the final masks a client sends with its last
        evaluation, keyed by the partition its node declared; masks of other names, shapes or
        dtypes than h_Θ's (`mask_spec`) reject the reply."""
        if phase == "train":
            return super().accept_reply(server_round, node_id, reply, phase)
        if "masks" not in reply.array_records:
            return None
        masks = reply.array_records["masks"]
        if (problem := check_arrays(masks, self.mask_spec())) is not None:
            return f"final masks: {problem}"
        client = self.node_partition.get(node_id)
        if client is None:
            return "final masks from a node that never said which partition it is"
        self.final_masks[client] = numpy_state(masks)
        return None

    def mask_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """{mask name: ((layers, hidden size), 'bool')}: what a client's final masks hold."""
        if "_mask_spec" not in self.__dict__:
            config = model_config(self.cfg.model_name)
            shape = (int(config["num_hidden_layers"]), int(config["hidden_size"]))
            self.__dict__["_mask_spec"] = {name: (shape, "bool") for name in MASK_NAMES}
        return self.__dict__["_mask_spec"]

    def load(self, arrays: ArrayRecord) -> tuple[Any, Any, Any]:
        """The routed model (dense outside a `masked` block) with the global Φ, and h_Θ with the
        global Θ."""
        return load_pair(self.cfg, arrays.to_torch_state_dict())

    def global_model(self, arrays: ArrayRecord) -> tuple[Any, Any]:
        """The model the server scores every round: backbone + the global Φ, routed by h_Θ's
        0.5-rounded mask 1[π > 0.5] (held gates at 1) for the shared fixed input (the zero vector):
        at round 0 that is the dense model, as the clients' round-0 evaluation is. Under NOC that
        input is every client's, so with `sftp-deploy-mask = 'threshold'` this is each client's
        model (masked form; its compiled form computes the same); with 'budget' each client's
        deployed mask is these gates refilled to its budget. Under +C the clients' masks are
        h_Θ(e_k) with private e_k (drawn N(0, I), then trained on the client); the server knows
        none, and no client ever routed through h_Θ(0): this model is nobody's, neither its mask nor
        its kept ratio need be any client's. `global_model_notes` says which it is and holds its
        kept ratios (the server-evaluate rows carry them); the deployed models are scored after the
        last round (`record_compiled`)."""
        sftp_cfg = self.cfg.section(SFTPConfig)
        model, tokenizer, generator = self.load(arrays)
        with torch.no_grad():
            logits = generator(generator.shared_input)
        held = held_coordinates(self.cfg, model, tokenizer)
        masks = layer_masks(force_open(deterministic_mask(logits, sftp_cfg.sftp_gate_bias), held))
        if sftp_cfg.sftp_conditioning:
            label = (
                "the backbone with the global Φ, routed by h_Θ(0), the generator at the zero "
                "input. Under +C client k's mask is h_Θ(e_k) with its private e_k, so this is no "
                "client's model, and its kept ratio need not be any client's; the models the "
                "clients deploy are scored under 'Compiled models' below"
            )
        elif sftp_cfg.sftp_deploy_mask == "threshold":
            label = (
                "the backbone with the global Φ, routed by h_Θ(0), which under NOC is every "
                "client's mask: each client's model"
            )
        else:
            label = (
                "the backbone with the global Φ, routed by h_Θ(0) rounded at π > 0.5: under NOC "
                "every client's gates before its deployed mask fills its budget (sftp-deploy-mask "
                "'budget'); the deployed models are scored under 'Compiled models' below"
            )
        self.global_model_notes = {"model": label, **model_kept_ratios(model, masks)}
        return MaskedModel(model, masks), tokenizer

    def set_deployed_adapter(
        self, model: torch.nn.Module, arrays: ArrayRecord, client: int
    ) -> None:
        """Load into `model` the Φ that client `client` deploys: the global `arrays`' Φ, or under
        `sftp-deploy-state = "local"` the Φ_k of its last accepted train reply (what its own final
        evaluation scored). No-op under NOA and under 'global' (`model` was loaded from
        `arrays`)."""
        sftp_cfg = self.cfg.section(SFTPConfig)
        if not sftp_cfg.sftp_adapters or sftp_cfg.sftp_deploy_state != "local":
            return
        if client in self.local_adapters:
            phi = {k: torch.from_numpy(np.array(v)) for k, v in self.local_adapters[client].items()}
        else:  # another client's Φ_k may be loaded: back to the global one
            log.warning(
                "client %d: no train reply of its own; its compiled model gets the global Φ", client
            )
            phi = {
                k: v
                for k, v in arrays.to_torch_state_dict().items()
                if not k.startswith(GENERATOR_PREFIX)
            }
        set_adapter_state(model, phi)
