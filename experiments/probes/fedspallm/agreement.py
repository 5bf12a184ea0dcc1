"""Why FedSpaLLM's global model can lose to the clients' standalone models at high sparsity, one
matrix at a time.

Finding: At 80% the run's global mask with its weights re-solved on the pooled calibration is 30–31%
  below the global model's perplexity and 7–10% below centralized pruning on every corpus, so
  FedSpaLLM's 80% loss is the averaged weights, not the mask.
Record: docs/bench/fedspallm-resolved-s80.json (the `--run` mode; no per-layer record is kept);
  quoted in docs/notes/2026-11-fedspallm-investigations.md, docs/methods/fedspallm.md and
  docs/claims.md.

Under the paper's protocol (`conf/fedspallm-paper.toml`: 4 clients, IID shares of one generic
corpus) the global model is below the standalone mean at 50–70% sparsity but above it at 80%
(docs/methods/fedspallm.md). This tool takes a few decoder layers of the dense model and, for each
of their linear matrices W and each sparsity:

- standalone: every client runs SparseGPT on W with its own calibration Hessian H_i (as its client
  does in round 1);
- global: those client replies merged by ℓ0 aggregation and mask expansion (Eq. 5–7, `l0_aggregate`,
  `expand_masks`), as the server does;
- global mask, re-solved: the global mask kept, its weights set to the least-squares optimum on the
  pooled calibration Hessian (per row, w_S = W_S + H_SS⁻¹ H_SP W_P, P the pruned positions; the same
  damping as SparseGPT): what the global mask could do if its weights were compensated for it;
- centralized: SparseGPT on the pooled Hessian (the simulation-only reference).

Each is scored by its relative output error on held-out text from the corpora the server scores
(none calibrated on): err = ‖(W′ − W) X‖² / ‖W X‖² = tr(ΔW H ΔWᵀ) / tr(W H Wᵀ), H = XXᵀ over the
held-out tokens. Every layer sees the dense model's activations (not the pruned layers' before it),
so each error is the layer's own. Also reported: `kept_by`, the share of the global mask's kept
weights that 1..N clients kept.

If the global error exceeds the standalone one while the re-solved global mask does not, the loss
comes from averaging weights that each client compensated for a different mask (SparseGPT's
updates), not from the mask.

`--run DIR` asks the same of a finished FedSpaLLM run, end to end: its global mask (the zeros of
DIR/model) is kept and the weights re-solved layer by layer in order on the pooled calibration
segments (each layer's inputs from the re-solved layers before it, as SparseGPT's loop feeds them:
`prune_sequentially` with `resolve_for_mask` in place of the pruner); the model is scored on the
run's held-out windows and compared, paired, with the run's global, standalone and centralized
models (its metrics.jsonl). The global model is re-scored too: its perplexity must equal the run's
record (a check that the windows are the same).

    python -m experiments.probes.fedspallm.agreement --layers 0,15,29 --sparsities 0.5,0.8 \
        --out docs/bench/fedspallm-agreement.json
    python -m experiments.probes.fedspallm.agreement --run outputs/grids/fedspallm/<run>-paper-s80 \
        --out docs/bench/fedspallm-resolved-s80.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.render import finish_record, start_record
from experiments.grids.fedspallm import records
from fedprune_app.core.config import RunConfig, split_list
from fedprune_app.core.runtime import client_seed, quiet_libraries
from fedprune_app.llm.data import client_data
from fedprune_app.llm.evaluation import held_out_metrics, held_out_text
from fedprune_app.llm.intervals import TokenScores, paired_perplexity_interval
from fedprune_app.llm.layers import calibration_batches, decoder_layers, linear_modules
from fedprune_app.llm.models import load_base_model, load_tokenizer
from fedprune_app.methods.fedspallm.aggregation import expand_masks, kept_by, l0_aggregate
from fedprune_app.methods.fedspallm.config import FedSpaLLMConfig
from fedprune_app.methods.fedspallm.pruners import (
    Pruner,
    prune_sequentially,
    sparsegpt_prune,
)
from fedprune_cli.launch import APP_DIR, merged_config


@torch.no_grad()
def layer_hessians(
    model: Any, batches: list[torch.Tensor], layer_ids: set[int]
) -> dict[tuple[int, str], torch.Tensor]:
    """{(layer, linear name): H = 2XXᵀ/n of its inputs} for the layers in `layer_ids`, every layer
    fed the dense model's activations: the pruning loop (`prune_sequentially`) with a pruner that
    records H and keeps W."""
    where = {
        id(lin): (j, name)
        for j, layer in enumerate(decoder_layers(model))
        for name, lin in linear_modules(layer).items()
    }
    out: dict[tuple[int, str], torch.Tensor] = {}

    def record(
        _name: str, linear: torch.nn.Linear, hessian: torch.Tensor, _sq: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out[where[id(linear)]] = hessian.clone()
        return linear.weight.data, torch.ones_like(linear.weight, dtype=torch.bool)

    prune_sequentially(model, batches, sorted(layer_ids), Pruner(record))
    return out


def output_error(pruned: torch.Tensor, dense: torch.Tensor, hessian: torch.Tensor) -> float:
    """‖(W′ − W) X‖² / ‖W X‖² with H ∝ XXᵀ: tr(ΔW H ΔWᵀ) / tr(W H Wᵀ)."""
    delta = (pruned - dense).double()
    h = hessian.double()
    return float(((delta @ h) * delta).sum() / ((dense.double() @ h) * dense.double()).sum())


def resolve_for_mask(
    dense: torch.Tensor, kept: torch.Tensor, hessian: torch.Tensor, percdamp: float, chunk: int = 64
) -> torch.Tensor:
    """The least-squares weights for a fixed mask: per row, minimise (w′ − w) H (w′ − w)ᵀ with
    w′ = 0 off the mask, i.e. w′_S = w_S + H_SS⁻¹ H_SP w_P (S kept, P pruned), H dampened as
    SparseGPT dampens it. Rows are solved in batches of `chunk`: each row's kept positions first
    (padded with its pruned ones, whose block is set to the identity and right-hand side to 0, so
    they solve to 0)."""
    h = hessian.double().clone()
    h.diagonal().add_(percdamp * float(h.diagonal().mean()))
    w = dense.double()
    k = int(kept.sum(1).max()) if kept.numel() else 0
    out = torch.zeros_like(w)
    if k == 0:
        return out.to(dense.dtype)
    rhs_all = (
        w * ~kept
    ) @ h  # row r: H (w_r on its pruned positions), of which H_SP w_P is the kept part
    for r0 in range(0, w.shape[0], chunk):
        kc = kept[r0 : r0 + chunk]
        idx = torch.argsort((~kc).to(torch.int8), dim=1, stable=True)[:, :k]  # kept positions first
        valid = torch.arange(k).unsqueeze(0) < kc.sum(1, keepdim=True)
        both = valid.unsqueeze(2) & valid.unsqueeze(1)
        eye = torch.eye(k, dtype=h.dtype).expand_as(both)
        block = torch.where(both, h[idx.unsqueeze(2), idx.unsqueeze(1)], eye)
        rhs = torch.where(valid, rhs_all[r0 : r0 + chunk].gather(1, idx), 0.0)
        step = torch.linalg.solve(block, rhs.unsqueeze(2)).squeeze(2)
        out[r0 : r0 + chunk].scatter_(
            1, idx, torch.where(valid, w[r0 : r0 + chunk].gather(1, idx) + step, 0.0)
        )
    return out.to(dense.dtype)


def matrix_errors(
    dense: torch.Tensor,
    client_h: list[torch.Tensor],
    eval_h: torch.Tensor,
    sparsity: float,
    blocksize: int,
    percdamp: float,
) -> dict[str, Any]:
    """The four models of one matrix at one sparsity (module docstring), their held-out errors and
    `kept_by`."""
    replies = [sparsegpt_prune(dense, h, sparsity, 0, 0, blocksize, percdamp) for h in client_h]
    merged, pruned_count = l0_aggregate(
        [w.numpy() for w, _ in replies], [m.numpy() for _, m in replies]
    )
    global_w, global_kept = expand_masks(merged, pruned_count, len(replies), sparsity)
    pooled = sum(client_h) / len(client_h)
    central, _ = sparsegpt_prune(dense, pooled, sparsity, 0, 0, blocksize, percdamp)
    kept_t = torch.from_numpy(global_kept)
    counts = kept_by(len(replies) - pruned_count, global_kept, len(replies))
    return {
        "standalone": float(np.mean([output_error(w, dense, eval_h) for w, _ in replies])),
        "global": output_error(torch.from_numpy(global_w), dense, eval_h),
        "global-mask-resolved": output_error(
            resolve_for_mask(dense, kept_t, pooled, percdamp), dense, eval_h
        ),
        "centralized": output_error(central, dense, eval_h),
        "kept-by": (counts / counts.sum()).tolist(),
    }


def summarize(per_matrix: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Means over matrices: the errors, global / standalone, and the kept-by shares."""
    models = ("standalone", "global", "global-mask-resolved", "centralized")
    mean = {m: float(np.mean([r[m] for r in per_matrix.values()])) for m in models}
    return {
        **mean,
        "global-over-standalone": mean["global"] / mean["standalone"],
        "matrices-global-above-standalone": sum(
            r["global"] > r["standalone"] for r in per_matrix.values()
        ),
        "matrices": len(per_matrix),
        "kept-by": np.mean([r["kept-by"] for r in per_matrix.values()], axis=0).round(4).tolist(),
    }


def resolve_run(run_dir: Path, cfg: RunConfig) -> tuple[Any, Any]:
    """The run's global mask with its weights re-solved in layer order on the pooled calibration
    segments of every client's round 1 (the data the centralized reference prunes on)."""
    from transformers import AutoModelForCausalLM

    prune_cfg = cfg.section(FedSpaLLMConfig)
    fed = AutoModelForCausalLM.from_pretrained(run_dir / "model", dtype=torch.float32)
    kept = {name: p.detach() != 0 for name, p in fed.named_parameters()}
    model, tokenizer = load_base_model(cfg.model_name).eval(), load_tokenizer(cfg.model_name)
    full_name = {id(m): f"{name}.weight" for name, m in model.named_modules()}
    n = cfg.min_nodes
    batches = [
        b
        for pid in range(n)
        for b in calibration_batches(
            client_data(cfg, pid, n).train,
            tokenizer,
            prune_cfg.calib_segments,
            prune_cfg.calib_seq_len,
            client_seed(cfg.seed, 1, pid),
        )
    ]

    def refit(
        _name: str, linear: torch.nn.Linear, hessian: torch.Tensor, _sq: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        mask = kept[full_name[id(linear)]]
        return resolve_for_mask(
            linear.weight.data, mask, hessian, prune_cfg.sparsegpt_percdamp
        ), mask

    prune_sequentially(
        model,
        batches,
        range(len(decoder_layers(model))),
        Pruner(refit),
        on_layer=lambda j, sec: print(f"  layer {j} re-solved ({sec:.1f} s)", flush=True),
    )
    return model, fed


def run_decomposition(run_dir: Path) -> dict[str, Any]:
    """Perplexity of the re-solved global mask beside the run's own models, paired on the same
    windows."""
    cfg = RunConfig.from_record(json.loads((run_dir / "config.json").read_text()))
    resolved, fed = resolve_run(run_dir, cfg)
    tokenizer = load_tokenizer(cfg.model_name)
    recorded = records.window_scores(run_dir)
    out: dict[str, Any] = {}
    for source in split_list(cfg.server_eval_data):
        text = held_out_text(source, cfg)
        mine = {
            name: TokenScores.of(m["window-nll"], m["window-tokens"])
            for name, m in (
                ("resolved", held_out_metrics(resolved, tokenizer, text, cfg)),
                ("global-rescored", held_out_metrics(fed, tokenizer, text, cfg)),
            )
        }
        theirs = {
            name: recorded[name][source] for name in ("fedspallm", "standalone", "centralized")
        }
        row: dict[str, Any] = {
            "windows": len(mine["resolved"].nll),
            "ppl": {
                "resolved": mine["resolved"].perplexity,
                "global (record)": theirs["fedspallm"][0].perplexity,
                "global (re-scored)": mine["global-rescored"].perplexity,
                "standalone mean": float(np.mean([x.perplexity for x in theirs["standalone"]])),
                "centralized": theirs["centralized"][0].perplexity,
            },
        }
        for other, scores in (
            ("global", theirs["fedspallm"][0]),
            ("centralized", theirs["centralized"][0]),
        ):
            ci = paired_perplexity_interval(mine["resolved"], scores, "difference", 2000, cfg.seed)
            row[f"resolved - {other}"] = [ci.estimate, ci.lo, ci.hi]
        out[source] = row
        print(
            f"{source}: "
            + ", ".join(f"{k} {v:.2f}" for k, v in row["ppl"].items())
            + f"; resolved - global {row['resolved - global']}",
            flush=True,
        )
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="conf/fedspallm-paper.toml")
    p.add_argument(
        "--layers", default="0,10,20,29", help="decoder layers whose matrices are pruned"
    )
    p.add_argument("--sparsities", default="0.5,0.6,0.7,0.8")
    p.add_argument(
        "--eval-segments", type=int, default=32, help="held-out windows per server corpus"
    )
    p.add_argument(
        "--run-config", default="", help="'k=v ...' overrides of the preset (e.g. seed=1)"
    )
    p.add_argument(
        "--run", type=Path, default=None, help="a finished FedSpaLLM run: re-solve its global mask"
    )
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    quiet_libraries()
    if args.run is not None:
        record = start_record("fedspallm-resolved", "experiments.probes.fedspallm.agreement", argv)
        record.update({"run": str(args.run), "corpora": run_decomposition(args.run)})
        return finish_record(record, args.out)
    record = start_record("fedspallm-agreement", "experiments.probes.fedspallm.agreement", argv)
    cfg = RunConfig.from_flower(merged_config(APP_DIR, [args.preset, args.run_config]))
    prune_cfg = cfg.section(FedSpaLLMConfig)
    layers = {int(x) for x in split_list(args.layers)}
    model, tokenizer = load_base_model(cfg.model_name).eval(), load_tokenizer(cfg.model_name)
    n = cfg.min_nodes
    client_h = [
        layer_hessians(
            model,
            calibration_batches(
                client_data(cfg, pid, n).train,
                tokenizer,
                prune_cfg.calib_segments,
                prune_cfg.calib_seq_len,
                client_seed(cfg.seed, 1, pid),
            ),
            layers,
        )
        for pid in range(n)
    ]
    eval_batches = [
        b
        for i, source in enumerate(split_list(cfg.server_eval_data))
        for b in calibration_batches(
            [{"prompt": "", "response": held_out_text(source, cfg)}],
            tokenizer,
            args.eval_segments,
            prune_cfg.calib_seq_len,
            10_000 + i,
        )
    ]
    eval_h = layer_hessians(model, eval_batches, layers)
    weights = {
        (j, name): lin.weight.detach().float().clone()
        for j, layer in enumerate(decoder_layers(model))
        if j in layers
        for name, lin in linear_modules(layer).items()
    }
    record.update(
        {
            "preset": args.preset,
            "clients": n,
            "layers": sorted(layers),
            "calibration": f"{prune_cfg.calib_segments} x {prune_cfg.calib_seq_len} "
            "tokens per client",
            "held-out": f"{args.eval_segments} x {prune_cfg.calib_seq_len} tokens from each of "
            f"{cfg.server_eval_data}",
            "sparsities": {},
        }
    )
    for s in (float(x) for x in split_list(args.sparsities)):
        per_matrix = {
            f"{j}.{name}": matrix_errors(
                w,
                [h[(j, name)] for h in client_h],
                eval_h[(j, name)],
                s,
                prune_cfg.sparsegpt_blocksize,
                prune_cfg.sparsegpt_percdamp,
            )
            for (j, name), w in weights.items()
        }
        record["sparsities"][str(s)] = {"mean": summarize(per_matrix), "per-matrix": per_matrix}
        m = record["sparsities"][str(s)]["mean"]
        print(
            f"sparsity {s:.2f}: held-out output error standalone {m['standalone']:.4f}  global "
            f"{m['global']:.4f} ({m['global-over-standalone']:.2f}x; above on "
            f"{m['matrices-global-above-standalone']}/{m['matrices']})  global mask re-solved "
            f"{m['global-mask-resolved']:.4f}  centralized {m['centralized']:.4f}  kept by 1..{n} "
            f"clients {m['kept-by'][1:]}",
            flush=True,
        )
    return finish_record(record, args.out)


if __name__ == "__main__":
    main()
