"""What the server scores for SFT-P. Every round: the generator's mask at the zero input, labelled
(under +C it is no client's model). After the last round: each client's compiled model, the artefact
the client deploys, on the same held-out text; equal to loading `compiled/client-<k>` and scoring it
by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedprune_app.core.config import RunConfig
from fedprune_app.core.replies import to_record
from fedprune_app.llm.evaluation import held_out_text, perplexity
from fedprune_app.llm.models import load_base_model, load_tokenizer
from fedprune_app.methods.sftp.config import SFTPConfig
from fedprune_app.methods.sftp.generator import (
    deterministic_mask,
    generator_for,
    set_generator_state,
)
from fedprune_app.report.run import ReportedRun as RunDirectory
from fedprune_app.server_app import server_evaluation
from fedprune_app.structural.routing import MASK_NAMES, load_compiled
from strategies.sftp import SFTPStrategy
from tests.conftest import small_config
from tests.fake_grid import FakeGrid

ROUNDS = 2


@pytest.fixture()
def text_source(tmp_path: Path) -> str:
    text = tmp_path / "held-out.jsonl"
    text.write_text(
        "".join(
            json.dumps(
                {
                    "text": f"Paragraph {i}: the river runs past the old mill and the town of "
                    f"number {i} near the hills, where the baker sells bread."
                }
            )
            + "\n"
            for i in range(60)
        )
    )
    return str(text)


def sftp_cfg(model_dir: Path, source: str, tmp_path: Path, **overrides: object) -> RunConfig:
    return small_config(
        model_dir,
        method="sftp",
        num_server_rounds=ROUNDS,
        lora_rank=4,
        lora_alpha=8.0,
        keep_ratios="0.5",
        server_eval_data=source,
        sftp_speed_prefill=0,
        output_dir=str(tmp_path / "out"),
        **overrides,
    )


def trained_arrays(strategy: SFTPStrategy, seed: int = 0) -> ArrayRecord:
    """Θ and Φ moved away from the start: LoRA B ≠ 0 (the merged adapters change the model) and a
    generator whose zero-input mask prunes (output bias −c ± noise), as after training."""
    rng = np.random.default_rng(seed)
    state = {k: v.numpy().copy() for k, v in strategy.initial_arrays().items()}
    for k, v in state.items():
        if "lora_B" in k:
            state[k] = rng.normal(0.0, 0.3, v.shape).astype(np.float32)
        elif k.endswith("fc2.bias"):
            state[k] = (
                rng.normal(0.0, 1.0, v.shape) - strategy.cfg.section(SFTPConfig).sftp_gate_bias
            ).astype(np.float32)
    return to_record(state)


def hand_in_final_masks(
    strategy: SFTPStrategy, arrays: ArrayRecord, masks: dict[int, dict[str, np.ndarray]]
) -> None:
    sent = list(
        strategy.configure_evaluate(
            ROUNDS, arrays, ConfigRecord(), FakeGrid([10 + k for k in masks])
        )
    )
    replies = [
        Message(
            RecordDict(
                {
                    "metrics": MetricRecord({"acc": 0.5, "num-examples": 4, "partition-id": k}),
                    "masks": to_record(m),
                }
            ),
            reply_to=msg,
        )
        for k, m, msg in zip(masks, masks.values(), sent, strict=True)
    ]
    strategy.aggregate_evaluate(ROUNDS, replies)


def random_client_masks(
    layers: int, d: int, clients: tuple[int, ...]
) -> dict[int, dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return {k: {n: rng.random((layers, d)) < 0.5 + 0.1 * k for n in MASK_NAMES} for k in clients}


def test_after_the_last_round_the_server_scores_each_clients_compiled_model(
    tiny_model_dir: Path, text_source: str, tmp_path: Path, flower_ids: None
) -> None:
    cfg = sftp_cfg(tiny_model_dir, text_source, tmp_path)
    run = RunDirectory.create(cfg)
    strategy = SFTPStrategy(cfg, run.log)
    arrays = trained_arrays(strategy)
    evaluate = server_evaluation(cfg, strategy, run)
    evaluate(0, strategy.initial_arrays())  # round 0: all-ones masks, B = 0: the dense model
    for rnd in range(
        1, ROUNDS + 1
    ):  # the per-round score: the zero-input mask, labelled, with its kept ratio
        evaluate(rnd, arrays)
    config = load_base_model(str(tiny_model_dir)).config
    hand_in_final_masks(
        strategy, arrays, random_client_masks(config.num_hidden_layers, config.hidden_size, (0, 1))
    )
    strategy.report_class(strategy).save_final(arrays, run.path)
    run.finish("completed", report=strategy.report_class(strategy))

    tokenizer, text = load_tokenizer(str(tiny_model_dir)), held_out_text(text_source, cfg)
    rows = {r["model"]: r for r in run.rows("compiled")}
    assert list(rows) == ["dense", "client 0", "client 1"]
    by_hand = {
        f"client {k}": perplexity(
            load_compiled(run.path / "compiled" / f"client-{k}"),
            tokenizer,
            text,
            cfg.ppl_window,
            cfg.ppl_stride,
            cfg.eval_ppl_tokens,
        )
        for k in (0, 1)
    }
    by_hand["dense"] = perplexity(
        load_base_model(str(tiny_model_dir)),
        tokenizer,
        text,
        cfg.ppl_window,
        cfg.ppl_stride,
        cfg.eval_ppl_tokens,
    )
    for name, ppl in by_hand.items():
        assert rows[name][f"ppl/{text_source}"] == pytest.approx(ppl, rel=1e-6), name
    assert len({round(p, 3) for p in by_hand.values()}) == 3  # three different models, three scores
    assert (
        rows["dense"]["kept-ratio-prunable"] == 1.0
        and 0.4 < rows["client 0"]["kept-ratio-prunable"] < 0.6
    )
    server = run.rows("server-evaluate")
    assert rows["dense"][f"ppl/{text_source}"] == pytest.approx(
        server[0]["ppl"], rel=1e-6
    )  # round 0 = dense
    assert all(
        "no client's model" in r["model"] for r in server
    )  # +C: the per-round model is nobody's
    assert all(
        r["ppl"] not in (pytest.approx(p, rel=1e-3) for p in by_hand.values()) for r in server[1:]
    )

    results = (run.path / "results.md").read_text()
    assert "The model scored: the backbone with the global Φ, routed by h_Θ(0)" in results
    assert "| round | kept (prunable) | ppl `" in results
    assert "Server-side evaluation of the deployed models" in results
    for name in ("dense", "client 0", "client 1"):
        assert (
            f"| {name} | {rows[name]['kept-ratio-prunable']:.3f} | {by_hand[name]:.2f} |" in results
        )


def test_under_noc_the_per_round_model_is_every_clients_deployed_model(
    tiny_model_dir: Path, text_source: str, tmp_path: Path, flower_ids: None
) -> None:
    """NOC with the threshold rule: h_Θ(0) is every client's mask, so the last round's server score
    is each client's compiled model's (masked form vs compiled form: equal up to float rounding)."""
    cfg = sftp_cfg(
        tiny_model_dir, text_source, tmp_path, sftp_conditioning=False, sftp_deploy_mask="threshold"
    )
    run = RunDirectory.create(cfg)
    strategy = SFTPStrategy(cfg, run.log)
    arrays = trained_arrays(strategy, seed=2)
    server_evaluation(cfg, strategy, run)(ROUNDS, arrays)
    model, _ = strategy.global_model(arrays)
    generator = generator_for(cfg, model.config)
    set_generator_state(generator, arrays.to_torch_state_dict())
    with torch.no_grad():
        bias = cfg.section(SFTPConfig).sftp_gate_bias
        gates = deterministic_mask(generator(None), bias).bool().numpy()  # what each client sends
    mask = {n: gates[:, i] for i, n in enumerate(MASK_NAMES)}
    assert 0 < gates.mean() < 1
    hand_in_final_masks(strategy, arrays, {0: mask, 1: mask})
    strategy.report_class(strategy).save_final(arrays, run.path)
    (last,) = run.rows("server-evaluate")
    assert last["model"].endswith("each client's model")
    rows = {r["model"]: r for r in run.rows("compiled")}
    for client in ("client 0", "client 1"):
        assert rows[client][f"ppl/{text_source}"] == pytest.approx(last["ppl"], rel=1e-4)
        assert rows[client]["kept-ratio-prunable"] == pytest.approx(last["kept-ratio-prunable"])
