"""SFT-P on the tiny LLaMA: the client's private state, its training, its evaluate replies; the
strategy's FedAvg, final masks and artefacts."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)

from clients.sftp import EMBEDDING_RECORD, SFTPClient
from fedprune_app.core.config import ConfigError, RunConfig
from fedprune_app.core.replies import to_record
from fedprune_app.methods.sftp.config import SFTPConfig
from fedprune_app.methods.sftp.generator import (
    GENERATOR_PREFIX,
    deployed_gates,
    deterministic_mask,
    generator_for,
    layer_masks,
)
from fedprune_app.methods.sftp.local import RoundPlan, local_round
from fedprune_app.methods.sftp.models import routed_model
from fedprune_app.structural.held import held_coordinates
from fedprune_app.structural.routing import (
    MASK_NAMES,
    kept_parameters,
    load_compiled,
    mask_statistics,
    masked,
    prunable_parameters,
)
from fedprune_app.structural.speed import render_compiled
from strategies.sftp import SFTPStrategy
from tests.conftest import record_training_batches, small_config
from tests.fake_grid import FakeGrid

ROUNDS = 2


def sftp_config(model_dir: Path, **overrides: object) -> RunConfig:
    return small_config(
        model_dir,
        method="sftp",
        num_server_rounds=ROUNDS,
        lora_rank=4,
        lora_alpha=8.0,
        keep_ratios="0.8,0.5,0.5,0.5",
        **overrides,
    )


def make_client(
    cfg: RunConfig, partition_id: int = 1, state: RecordDict | None = None
) -> SFTPClient:
    context = Context(
        run_id=1,
        node_id=7,
        node_config={"partition-id": partition_id, "num-partitions": 4},
        state=state if state is not None else RecordDict(),
        run_config=cfg.to_dict(),
    )
    return SFTPClient(cfg, context)


def content(arrays: ArrayRecord, server_round: int) -> RecordDict:
    return RecordDict({"arrays": arrays, "config": ConfigRecord({"server-round": server_round})})


def private_tensors(client: SFTPClient) -> dict[str, np.ndarray]:
    return {
        k: v.numpy().copy() for k, v in client.context.state.array_records[EMBEDDING_RECORD].items()
    }


def record_set_masks(monkeypatch: pytest.MonkeyPatch) -> list[list[dict[str, torch.Tensor]]]:
    """A copy of every mask list the SFT-P client routes its model by (the dense model is not
    recorded)."""
    import fedprune_app.structural.routing as routing

    seen: list[list[dict[str, torch.Tensor]]] = []
    real = routing.set_masks

    def recording(model: torch.nn.Module, masks: list | None) -> None:
        if masks is not None and any(g is not None for g in masks):
            seen.append([{k: v.detach().clone() for k, v in g.items()} for g in masks])
        real(model, masks)

    monkeypatch.setattr(routing, "set_masks", recording)
    return seen


def assert_nothing_private(reply: RecordDict, private: dict[str, np.ndarray]) -> None:
    """No array of the reply equals e_k or its AdamW moments, nor holds one of them as a row; no
    config/metric value is a private tensor or names one."""
    for record in reply.array_records.values():
        for name, arr in record.items():
            a = arr.numpy()
            for secret in private.values():
                rows = (
                    a.reshape(-1, a.shape[-1])
                    if a.ndim and a.shape[-1] == secret.shape[-1]
                    else np.empty((0, 1))
                )
                assert not any(np.allclose(r, secret, rtol=1e-6, atol=0) for r in rows), (
                    f"{name} carries e_k"
                )
    for record in [*reply.metric_records.values(), *reply.config_records.values()]:
        for key, value in record.items():
            assert (
                "exp_avg" not in key and key != "embedding" and not isinstance(value, list | bytes)
            )


@pytest.fixture()
def setup(tiny_model_dir: Path, flower_ids: None) -> tuple[RunConfig, SFTPStrategy, ArrayRecord]:
    cfg = sftp_config(tiny_model_dir)
    strategy = SFTPStrategy(cfg)
    return cfg, strategy, strategy.initial_arrays()


@pytest.fixture(scope="module")
def round_one(
    tiny_model_dir: Path,
) -> tuple[RunConfig, ArrayRecord, SFTPClient, RecordDict, dict[str, np.ndarray]]:
    """Client 1 after one training round: (cfg, initial arrays, client, its reply, its private
    tensors then)."""
    cfg = sftp_config(tiny_model_dir)
    initial = SFTPStrategy(cfg).initial_arrays()
    client = make_client(cfg)
    reply = client.train(content(initial, 1))
    return cfg, initial, client, reply, private_tensors(client)


def test_initial_state_is_theta_and_phi_and_routes_dense(setup) -> None:
    cfg, _, initial = setup
    assert any(k.startswith(GENERATOR_PREFIX) for k in initial) and any(
        "lora_B" in k for k in initial
    )
    client = make_client(cfg)
    model, _, generator = client.load(content(initial, 1))
    embedding = client.client_state().embedding
    with torch.no_grad():
        assert (
            deterministic_mask(generator(embedding), cfg.section(SFTPConfig).sftp_gate_bias).min()
            == 1.0
        )


def test_embedding_stays_private_and_persists_across_rounds(round_one) -> None:
    cfg, initial, client, first, after_one = round_one
    assert set(after_one) == {"embedding", "exp_avg", "exp_avg_sq"}
    assert client.private["embedding-step"] == cfg.local_steps
    assert_nothing_private(first, after_one)
    assert set(first.array_records["arrays"]) == set(initial)  # Θ (+Φ) only
    # a new client object on a copy of the node's state (the next message) continues from the stored
    # state
    again = make_client(cfg, state=copy.deepcopy(client.context.state))
    second = again.train(content(first.array_records["arrays"], 2))
    after_two = private_tensors(again)
    assert again.private["embedding-step"] == 2 * cfg.local_steps
    for key in after_one:
        assert not np.allclose(after_one[key], after_two[key], rtol=1e-3, atol=0), (
            f"{key} did not change"
        )
    assert_nothing_private(second, after_two)
    assert_nothing_private(second, after_one)
    for reply in (first, second):
        metrics = reply.metric_records["metrics"]
        assert (
            metrics["num-examples"] == 16
            and np.isfinite(metrics["clm-loss"])
            and metrics["penalty"] >= 0
        )
        assert (
            0 < metrics["kept-ratio-model"] <= 1
            and metrics["kept-ratio-model"] >= metrics["kept-ratio-prunable"]
        )
    final = again.evaluate(content(second.array_records["arrays"], ROUNDS))
    assert "masks" in final.array_records
    assert_nothing_private(final, after_two)


def test_noc_keeps_no_embedding_and_gives_every_client_the_same_mask(
    tiny_model_dir: Path, flower_ids: None
) -> None:
    cfg = sftp_config(tiny_model_dir, sftp_conditioning=False, sftp_adapters=False)
    initial = SFTPStrategy(cfg).initial_arrays()
    assert not any("lora" in k for k in initial)
    client = make_client(cfg)
    reply = client.train(content(initial, 1))
    assert EMBEDDING_RECORD not in client.context.state.array_records
    arrays = reply.array_records["arrays"]
    masks = []
    for pid in (0, 3):
        _, _, generator = make_client(cfg, pid).load(content(arrays, 2))
        with torch.no_grad():
            masks.append(deterministic_mask(generator(None), 3.0))
    assert torch.equal(masks[0], masks[1])


def test_local_training_moves_the_kept_ratio_to_the_budget(tiny_model_dir: Path) -> None:
    """λ·R pulls T(g) from all-ones to p·T_total (τ = 1, lr 1e-2 so that a few dozen steps
    suffice)."""
    cfg = sftp_config(
        tiny_model_dir,
        sftp_gate_tau=1.0,
        sftp_generator_lr=1e-2,
        local_steps=30,
        batch_size=1,
        seq_len=16,
    )
    client = make_client(cfg)
    model, tokenizer = routed_model(cfg)
    generator = generator_for(cfg, model.config, seed=0)
    state = client.client_state()
    report = local_round(
        cfg, model, tokenizer, generator, state, client.data.train, RoundPlan(1, 0, 0.5)
    )
    with torch.no_grad():
        masks = layer_masks(deterministic_mask(generator(state.embedding), 3.0))
    ratio = kept_parameters(model.config, masks).item() / prunable_parameters(model.config)
    assert abs(ratio - 0.5) < 0.15, ratio
    penalty = report.values["penalty"]
    assert np.mean(penalty[-5:]) < 0.5 * np.mean(penalty[:5])
    assert all(
        layer.routing_masks is None for layer in model.base_model.model.model.layers
    )  # left dense


def _one_local_step(
    tiny_model_dir: Path, **overrides: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e_k before, e_k after, Θ's move) of one local step from the seeded start (same batch, gates
    and gradient whatever `overrides` change), at generator lr 1e-2."""
    cfg = sftp_config(
        tiny_model_dir, sftp_generator_lr=1e-2, local_steps=1, batch_size=1, seq_len=16, **overrides
    )
    client = make_client(cfg)
    model, tokenizer = routed_model(cfg)
    generator = generator_for(cfg, model.config, seed=0)
    theta = torch.cat([p.detach().clone().flatten() for p in generator.parameters()])
    state = client.client_state()
    start = state.embedding.detach().clone()
    local_round(cfg, model, tokenizer, generator, state, client.data.train, RoundPlan(1, 0, 0.5))
    moved = torch.cat([p.detach().flatten() for p in generator.parameters()]) - theta
    return start, state.embedding.detach().clone(), moved


def test_embed_lr_scale_moves_e_k_at_its_own_rate(tiny_model_dir: Path) -> None:
    """`sftp-embed-lr-scale` = e_k's AdamW lr / Θ's. One step from the same start (same batch,
    gates, gradient): AdamW's first step is lr·(g/(|g|+eps) + wd·p), so e_k's step scales with the
    factor while Θ's step does not; at 0 e_k stays put."""
    steps: dict[float, tuple[torch.Tensor, torch.Tensor]] = {}
    for scale in (1.0, 0.25, 0.0):
        start, end, moved = _one_local_step(tiny_model_dir, sftp_embed_lr_scale=scale)
        steps[scale] = (end - start, moved)
    full, quarter, frozen = steps[1.0], steps[0.25], steps[0.0]
    assert full[0].abs().max() > 1e-3
    torch.testing.assert_close(quarter[0], 0.25 * full[0], rtol=1e-4, atol=1e-7)
    assert torch.count_nonzero(frozen[0]) == 0
    for other in (
        quarter[1],
        frozen[1],
    ):  # Θ's step does not depend on the factor (a few entries whose gradient
        same = torch.isclose(
            other, full[1], rtol=1e-4, atol=1e-7
        )  # is near AdamW's eps differ with thread order)
        assert same.float().mean() > 0.99, same.float().mean()


def test_embed_weight_decay_decays_e_k_alone(tiny_model_dir: Path) -> None:
    """`sftp-embed-weight-decay` is e_k's decoupled AdamW decay: one step from the same start (same
    batch, gates and gradient) moves e_k by the same Adam update plus −lr·wd·e_k^(0), so the two
    runs differ by exactly that (a reference computation, not the optimiser's), and Θ's step is the
    same with either value."""
    start, no_decay, theta0 = _one_local_step(tiny_model_dir, sftp_embed_weight_decay=0.0)
    start_b, decayed, theta1 = _one_local_step(tiny_model_dir, sftp_embed_weight_decay=0.5)
    torch.testing.assert_close(start, start_b)
    assert start.abs().max() > 0.1  # e_k^(0) ~ N(0, 1): the decay term is visible
    torch.testing.assert_close(decayed - no_decay, -1e-2 * 0.5 * start, rtol=1e-3, atol=1e-6)
    assert torch.isclose(theta0, theta1, rtol=1e-4, atol=1e-7).float().mean() > 0.99


def _eq13_by_hand(
    model: torch.nn.Module,
    masks: list[dict[str, torch.Tensor]],
    batch: dict[str, torch.Tensor],
    keep_ratio: float,
) -> tuple[float, float]:
    """(CLM, R) of one step computed here, not by the code under test: CLM = mean next-token
    cross-entropy of the routed model's logits under `masks` over the labelled tokens;
    R = |log(T(g) / (p·T_total))| (Eq. 13–14) with T counted from the weight shapes of the
    peft-wrapped LLaMA's projections (rows of q/k/v and gate/up per kept input lane, columns of o
    and down per kept output lane)."""
    with masked(model, masks), torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).logits.float()
    labels = batch["labels"][:, 1:].reshape(-1)
    clm = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), labels, ignore_index=-100
    )
    kept = total = 0
    for layer, g in zip(model.base_model.model.model.layers, masks, strict=True):
        a, f = layer.self_attn, layer.mlp
        w = {
            name: getattr(m, "base_layer", m).weight.shape
            for name, m in (
                ("q", a.q_proj),
                ("k", a.k_proj),
                ("v", a.v_proj),
                ("o", a.o_proj),
                ("gate", f.gate_proj),
                ("up", f.up_proj),
                ("down", f.down_proj),
            )
        }
        n = {name: int(g[name].sum()) for name in MASK_NAMES}
        assert min(n.values()) > 0  # no empty lane (that would drop a whole submodule from T)
        kept += n["attn-in"] * (w["q"][0] + w["k"][0] + w["v"][0]) + n["attn-out"] * w["o"][1]
        kept += n["ffn-in"] * (w["gate"][0] + w["up"][0]) + n["ffn-out"] * w["down"][1]
        total += sum(s[0] * s[1] for s in w.values())
    return clm.item(), abs(np.log(kept / (keep_ratio * total)))


def test_the_reported_training_loss_is_eq_13(
    tiny_model_dir: Path, flower_ids: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the client reports as its training objective (one local step: the loss at the Θ, Φ, e_k
    it received) is Eq. 13, L = CLM + λ·R, recomputed here from the step's own sampled gates and
    batch, for two λ: a client that dropped λ, the penalty or the log ratio, or trained on another
    loss, reports another number."""
    import fedprune_app.llm.training as training

    seen: dict[str, list] = {
        "masks": record_set_masks(monkeypatch),
        "batches": record_training_batches(training, monkeypatch),
    }
    reported = {}
    for lam in (1.0, 16.0):
        cfg = sftp_config(
            tiny_model_dir, local_steps=1, lora_dropout=0.0, sftp_lambda=lam, pack_sequences=False
        )  # the padded batch; packed = padded: test_packed_local_training
        initial = SFTPStrategy(cfg).initial_arrays()
        seen["masks"].clear()
        seen["batches"].clear()
        client = make_client(cfg)  # partition 1: p = 0.5
        metrics = client.train(content(initial, 1)).metric_records["metrics"]
        assert (
            len(seen["batches"]) == 1 and len(seen["masks"]) == 2
        )  # the step's gates, then the val-loss mask
        model, _, _ = client.load(
            content(initial, 1)
        )  # Φ as received (the step moved the cached model's)
        clm, penalty = _eq13_by_hand(model, seen["masks"][0], seen["batches"][0], client.keep_ratio)
        assert penalty > 0.1  # far enough from the budget that λ changes the objective
        assert metrics["clm-loss"] == pytest.approx(clm, rel=1e-4)
        assert metrics["penalty"] == pytest.approx(penalty, rel=1e-4)
        assert metrics["train-loss"] == pytest.approx(clm + lam * penalty, rel=1e-4)
        reported[lam] = (metrics["train-loss"], penalty)
    (low, penalty), (high, _) = reported[1.0], reported[16.0]
    assert high - low == pytest.approx(15.0 * penalty, rel=1e-3)


@pytest.mark.parametrize("loss_on", ["sequence", "answer", None])
def test_the_client_trains_on_the_configured_targets(
    loss_on: str | None, tiny_model_dir: Path, flower_ids: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """L_CLM (Eq. 13) is on every token by default (§3.3's causal LM loss on the local corpus);
    `sftp-loss-on = 'answer'` puts it on the responses only."""
    import fedprune_app.llm.training as training

    batches = record_training_batches(training, monkeypatch)
    cfg = sftp_config(
        tiny_model_dir,
        local_steps=2,
        pack_sequences=False,  # padded rows show which tokens are real
        **({} if loss_on is None else {"sftp_loss_on": loss_on}),
    )
    make_client(cfg).train(content(SFTPStrategy(cfg).initial_arrays(), 1))
    assert len(batches) == 2
    for batch in batches:
        real = batch["attention_mask"] == 1
        targets = batch["labels"] != -100
        if loss_on == "answer":
            assert targets.sum() < real.sum() and not (targets & ~real).any()
        else:
            assert torch.equal(targets, real) and torch.equal(
                batch["labels"][real], batch["input_ids"][real]
            )


def test_packed_local_training_follows_the_padded_trajectory(
    tiny_model_dir: Path, flower_ids: None
) -> None:
    """Alg. 1's inner loop on packed rows (`pack-sequences`, the default) and on padded rows, 3
    steps from the same Θ, Φ, e_k and gate seed: the same CLM and penalty per step and the same
    reply to float rounding."""
    replies = {}
    for packed in (True, False):
        cfg = sftp_config(tiny_model_dir, local_steps=3, lora_dropout=0.0, pack_sequences=packed)
        reply = make_client(cfg).train(content(SFTPStrategy(cfg).initial_arrays(), 1))
        replies[packed] = (
            reply.metric_records["metrics"],
            reply.array_records["arrays"].to_numpy_ndarrays(),
        )
    (m_packed, a_packed), (m_padded, a_padded) = replies[True], replies[False]
    for key in ("clm-loss", "penalty", "train-loss"):
        assert m_packed[key] == pytest.approx(m_padded[key], rel=1e-4), key
    for a, b in zip(a_packed, a_padded, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-6)


def test_only_the_final_evaluation_carries_the_masks(round_one) -> None:
    cfg, initial, client, reply, _ = round_one
    trained = reply.array_records["arrays"]
    dense = client.evaluate(content(initial, 0))
    middle = client.evaluate(content(trained, 1))
    final = client.evaluate(content(trained, ROUNDS))
    assert "masks" not in dense.array_records and "masks" not in middle.array_records
    assert dense.metric_records["metrics"]["kept-ratio-prunable"] == 1.0
    assert {"acc", "acc_norm"} <= set(final.metric_records["metrics"])
    sent = final.array_records["masks"]
    model, tokenizer, generator = client.load(content(trained, ROUNDS))
    embedding = client.client_state().embedding
    with torch.no_grad():
        expected = deployed_gates(
            generator(embedding),
            3.0,
            held_coordinates(cfg, model, tokenizer),
            model.config,
            client.keep_ratio,
            "budget",
        )
    assert set(sent) == set(MASK_NAMES)
    for i, name in enumerate(MASK_NAMES):
        arr = sent[name].numpy()
        assert arr.dtype == np.bool_ and arr.shape == (
            model.config.num_hidden_layers,
            model.config.hidden_size,
        )
        np.testing.assert_array_equal(arr, expected[:, i].bool().numpy())
    assert final.metric_records["metrics"]["kept-ratio-prunable"] == pytest.approx(
        kept_parameters(model.config, layer_masks(expected)).item()
        / prunable_parameters(model.config)
    )


def test_fedavg_over_theta_and_phi_matches_brute_force(setup) -> None:
    cfg, _, initial = setup
    rng = np.random.default_rng(0)
    shapes = {k: v.numpy().shape for k, v in initial.items()}
    states = [
        {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()} for _ in range(3)
    ]
    sizes = [5, 15, 80]
    replies = [
        RecordDict(
            {
                "arrays": to_record(s),
                "metrics": MetricRecord({"num-examples": n, "partition-id": i}),
            }
        )
        for i, (s, n) in enumerate(zip(states, sizes, strict=True))
    ]
    for mode, weights in (("equal", [1, 1, 1]), ("num-examples", sizes)):
        strategy = SFTPStrategy(cfg.replace(sftp_aggregation=mode))
        avg = strategy.aggregate(1, replies)
        for key in shapes:
            brute = sum(
                w * s[key].astype(np.float64) for s, w in zip(states, weights, strict=True)
            ) / sum(weights)
            np.testing.assert_allclose(avg[key].numpy(), brute, rtol=1e-5, atol=1e-6)
        assert [r["client"] for r in strategy.kept_history] == [0, 1, 2]


def test_final_masks_become_compiled_models(
    tiny_model_dir: Path, flower_ids: None, tmp_path: Path
) -> None:
    cfg = sftp_config(tiny_model_dir, sftp_speed_prefill=16)
    rows: list[dict] = []
    strategy = SFTPStrategy(cfg, rows.append)
    initial = strategy.initial_arrays()
    model, _ = routed_model(cfg)
    layers, d = model.config.num_hidden_layers, model.config.hidden_size
    rng = np.random.default_rng(1)
    masks = {pid: {n: rng.random((layers, d)) < 0.6 for n in MASK_NAMES} for pid in (0, 1)}
    sent = list(strategy.configure_evaluate(ROUNDS, initial, ConfigRecord(), FakeGrid([10, 11])))
    replies = [
        Message(
            RecordDict(
                {
                    "metrics": MetricRecord({"acc": 0.5, "num-examples": 4, "partition-id": pid}),
                    "masks": to_record(masks[pid]),
                }
            ),
            reply_to=m,
        )
        for pid, m in zip((0, 1), sent, strict=True)
    ]
    strategy.aggregate_evaluate(ROUNDS, replies)
    artefacts = strategy.report_class(strategy).save_final(initial, tmp_path)
    assert {"generator", "adapter", "compiled-client-0", "compiled-client-1", "masks"} <= set(
        artefacts
    )
    stored = np.load(tmp_path / "masks.npz")
    np.testing.assert_array_equal(stored["client-1/ffn-in"], masks[1]["ffn-in"])
    compiled = load_compiled(tmp_path / "compiled" / "client-1")
    per_layer = [
        {n: torch.from_numpy(masks[1][n][i]).float() for n in MASK_NAMES} for i in range(layers)
    ]
    ids = torch.tensor([[1, 20, 300, 4000, 5]])
    with masked(model, per_layer), torch.no_grad():
        routed = model(input_ids=ids).logits
    with torch.no_grad():
        torch.testing.assert_close(compiled(input_ids=ids).logits, routed, rtol=1e-4, atol=1e-4)
    assert sum(p.numel() for p in compiled.parameters()) < sum(
        p.numel() for n, p in model.named_parameters() if "lora_" not in n
    )
    # results.md's 'Compiled models' rows: the dense base model first, then each client's, sizes
    # counted
    timed = {r["model"]: r for r in rows if r["phase"] == "compiled"}
    assert list(timed) == ["dense", "client 0", "client 1"]
    assert timed["client 1"]["params"] == sum(p.numel() for p in compiled.parameters())
    assert timed["dense"]["params-ratio"] == 1.0 and timed["client 1"]["params-ratio"] < 1.0
    assert timed["dense"]["prefill-speedup"] == 1.0 and timed["client 0"]["prefill-ms"] > 0
    table = render_compiled(list(timed.values()))
    assert "| client 1 |" in table and "prefill of 16 tokens" in table


def test_mask_statistics_against_a_loop() -> None:
    rng = np.random.default_rng(2)
    masks = {k: {n: rng.random((3, 10)) < 0.5 for n in MASK_NAMES} for k in range(3)}
    stats = mask_statistics(masks)
    for n in MASK_NAMES:
        for layer in range(3):
            agree = (
                sum(len({bool(masks[k][n][layer, j]) for k in range(3)}) == 1 for j in range(10))
                / 10
            )
            assert stats["agreement"][n][layer] == pytest.approx(agree)
            assert stats["density"]["2"][n][layer] == pytest.approx(masks[2][n][layer].mean())
    for k in range(3):
        dropped = [
            (n, i, j)
            for n in MASK_NAMES
            for i in range(3)
            for j in range(10)
            if not masks[k][n][i, j]
        ]
        by_all = [c for c in dropped if not any(masks[o][c[0]][c[1], c[2]] for o in range(3))]
        assert stats["shared-cut"][str(k)] == pytest.approx(len(by_all) / len(dropped), abs=1e-4)
    same = mask_statistics({0: masks[0], 1: masks[0]})
    assert same["shared-cut"] == {"0": 1.0, "1": 1.0} and same["mean-agreement"] == 1.0


@pytest.mark.parametrize("bad", ["0", "1.5", "0.5,x", ""])
def test_keep_ratios_are_validated(bad: str) -> None:
    with pytest.raises(ConfigError, match="keep-ratios"):
        RunConfig.from_flower({"keep-ratios": bad})


def test_a_keep_ratio_per_client(tiny_model_dir: Path) -> None:
    cfg = sftp_config(tiny_model_dir)
    assert [make_client(cfg, pid).keep_ratio for pid in range(4)] == [0.8, 0.5, 0.5, 0.5]
    with pytest.raises(ConfigError, match="keep-ratios"):
        _ = make_client(cfg.replace(keep_ratios="0.5,0.6"), 0).keep_ratio


def test_client_app_dispatches_to_sftp(setup) -> None:
    from fedprune_app.client_app import app

    cfg, _, initial = setup
    context = Context(
        run_id=1,
        node_id=7,
        node_config={"partition-id": 0, "num-partitions": 4},
        state=RecordDict(),
        run_config=cfg.to_dict(),
    )
    context.run_config["local-steps"] = 1
    reply = app(
        Message(content=content(initial, 1), message_type=MessageType.TRAIN, dst_node_id=7), context
    )
    assert not reply.has_error() and EMBEDDING_RECORD in context.state.array_records
