"""FlexLoRA: ΔW averaging and SVD redistribution against direct computations, the strategy with
hand-built replies (ranks, malformed replies), and one client train call on the tiny model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)

from fedprune_app.core.config import ConfigError
from fedprune_app.core.protocol import numpy_state, spec_of
from fedprune_app.core.replies import to_record
from fedprune_app.llm.lora import LORA_A, LORA_B, adapter_layers, lora_rank, truncate_factors
from fedprune_app.llm.models import get_adapter_state, peft_model_for
from fedprune_app.methods.flexlora.svd import average_deltas, fit_rank, lora_delta, svd_factors
from strategies.flexlora import FlexLoRAStrategy
from tests.conftest import small_config
from tests.fake_grid import FakeGrid

ALPHA = 32.0


def test_svd_redistribution_is_the_best_rank_r_approximation() -> None:
    rng = np.random.default_rng(0)
    delta = rng.normal(size=(12, 9))
    u, s, vt = np.linalg.svd(delta)
    for r in (1, 3, 9):
        b, a, kept = svd_factors(delta, r, ALPHA)
        assert b.shape == (12, r) and a.shape == (r, 9)
        approx = lora_delta(b, a, ALPHA, r)  # what peft computes with scaling α/r
        np.testing.assert_allclose(approx, (u[:, :r] * s[:r]) @ vt[:r], atol=1e-5)
        # Eckart–Young: the error is exactly the tail of the spectrum
        assert np.linalg.norm(delta - approx) ** 2 == pytest.approx((s[r:] ** 2).sum(), abs=1e-6)
        assert kept == pytest.approx((s[:r] ** 2).sum() / (s**2).sum())
        np.testing.assert_allclose(a @ a.T, np.eye(r), atol=1e-5)  # A = V_rᵀ: orthonormal rows
    # a random rank-r factorisation is never better
    other = rng.normal(size=(12, 3)) @ rng.normal(size=(3, 9))
    assert np.linalg.norm(delta - other) > np.linalg.norm(
        delta - lora_delta(*svd_factors(delta, 3, ALPHA)[:2], ALPHA, 3)
    )
    b, a, _ = svd_factors(delta, 11, ALPHA)  # above min(d, l) = 9: zero-padded, same ΔW
    assert b.shape == (12, 11) and not a[9:].any() and not b[:, 9:].any()
    np.testing.assert_allclose(lora_delta(b, a, ALPHA, 11), delta, atol=1e-5)


def test_truncating_the_global_factors_equals_the_svd_at_the_clients_rank() -> None:
    delta = np.random.default_rng(1).normal(size=(10, 8))
    b8, a8, _ = svd_factors(delta, 8, ALPHA)
    for r in (2, 5):
        bt, at = truncate_factors(b8, a8, r)
        b, a, _ = svd_factors(delta, r, ALPHA)
        np.testing.assert_allclose(
            lora_delta(bt, at, ALPHA, r), lora_delta(b, a, ALPHA, r), atol=1e-5
        )
    with pytest.raises(ValueError):
        truncate_factors(b8, a8, 9)


def test_delta_average_matches_brute_force() -> None:
    rng = np.random.default_rng(2)
    layers, ranks, sizes = ["x.q", "x.v"], [2, 4, 3], [10.0, 30.0, 60.0]
    states = [
        {
            **{f"{lay}{LORA_A}": rng.normal(size=(r, 6)) for lay in layers},
            **{f"{lay}{LORA_B}": rng.normal(size=(5, r)) for lay in layers},
        }
        for r in ranks
    ]
    avg = average_deltas(states, ranks, sizes, layers, ALPHA)
    for layer in layers:
        brute = sum(
            n / 100 * (ALPHA / r) * s[layer + LORA_B] @ s[layer + LORA_A]
            for s, r, n in zip(states, ranks, sizes, strict=True)
        )
        np.testing.assert_allclose(avg[layer], brute, rtol=1e-10)


def test_fit_rank_keeps_delta_w_when_truncating_or_growing() -> None:
    delta = np.random.default_rng(3).normal(size=(6, 7))
    b, a, _ = svd_factors(delta, 4, ALPHA)
    state = {"m" + LORA_B: b, "m" + LORA_A: a}
    small = fit_rank(state, 2, seed=0)
    np.testing.assert_allclose(
        lora_delta(small["m" + LORA_B], small["m" + LORA_A], ALPHA, 2),
        lora_delta(*svd_factors(delta, 2, ALPHA)[:2], ALPHA, 2),
        atol=1e-5,
    )
    big = fit_rank(state, 6, seed=0)
    assert (
        lora_rank(big) == 6 and big["m" + LORA_A][4:].any() and not big["m" + LORA_B][:, 4:].any()
    )
    np.testing.assert_allclose(
        lora_delta(big["m" + LORA_B], big["m" + LORA_A], ALPHA, 6),
        lora_delta(b, a, ALPHA, 4),
        atol=1e-5,
    )


# --- the strategy ---------------------------------------------------------------------------------


def _reply(
    to: Message, rank: int, pid: int, seed: int, layers_like: ArrayRecord, **tamper: object
) -> Message:
    rng = np.random.default_rng(seed)
    state = {}
    for key, arr in layers_like.items():
        shape = arr.numpy().shape
        state[key] = rng.normal(size=(rank, shape[1]) if key.endswith(LORA_A) else (shape[0], rank))
        state[key] = state[key].astype(np.float32)
    state.update(tamper.get("arrays", {}))  # type: ignore[arg-type]
    metrics = {
        "num-examples": 10 * (pid + 1),
        "partition-id": pid,
        "rank": tamper.get("reported", rank),
        "train-loss": 1.0,
        "val-loss": 1.0,
    }
    return Message(
        content=RecordDict({"arrays": to_record(state), "metrics": MetricRecord(metrics)}),
        reply_to=to,
    )


def test_strategy_averages_delta_w_and_respects_each_clients_rank(
    tiny_model_dir: Path, flower_ids: None
) -> None:
    cfg = small_config(tiny_model_dir, method="flexlora", flexlora_ranks="2,4,3")
    strategy = FlexLoRAStrategy(cfg)
    initial = strategy.initial_arrays()
    assert lora_rank(numpy_state(initial)) == 4  # the global adapter has rank r_max
    sent = list(strategy.configure_train(1, initial, ConfigRecord(), FakeGrid([1, 2, 3])))
    assert all(lora_rank(numpy_state(m.content["arrays"])) == 4 for m in sent)  # ranks unknown yet
    replies = [
        _reply(m, r, pid, seed, initial)
        for m, r, pid, seed in zip(sent, (2, 4, 3), (0, 1, 2), (5, 6, 7), strict=True)
    ]
    arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays is not None
    states = [numpy_state(m.content["arrays"]) for m in replies]
    layers = adapter_layers(initial.keys())
    for layer in layers:
        brute = sum(
            n / 60 * (ALPHA / r) * s[layer + LORA_B].astype(np.float64) @ s[layer + LORA_A]
            for s, r, n in zip(states, (2, 4, 3), (10, 20, 30), strict=True)
        )
        u, sv, vt = np.linalg.svd(brute, full_matrices=False)
        got = lora_delta(arrays[layer + LORA_B].numpy(), arrays[layer + LORA_A].numpy(), ALPHA, 4)
        np.testing.assert_allclose(got, (u[:, :4] * sv[:4]) @ vt[:4], atol=1e-4)
    # round 2: every node gets its own rank, the truncation of the same decomposition
    sent = list(strategy.configure_train(2, arrays, ConfigRecord(), FakeGrid([1, 2, 3])))
    assert [lora_rank(numpy_state(m.content["arrays"])) for m in sent] == [2, 4, 3]
    assert [m.content["config"]["rank"] for m in sent] == [2, 4, 3]
    node1 = numpy_state(sent[0].content["arrays"])
    for layer in layers:
        b, a, _ = svd_factors(
            lora_delta(arrays[layer + LORA_B].numpy(), arrays[layer + LORA_A].numpy(), ALPHA, 4),
            2,
            ALPHA,
        )
        np.testing.assert_allclose(
            lora_delta(node1[layer + LORA_B], node1[layer + LORA_A], ALPHA, 2),
            lora_delta(b, a, ALPHA, 2),
            atol=1e-4,
        )


def test_strategy_rejects_malformed_replies_without_changing_state(
    tiny_model_dir: Path, flower_ids: None
) -> None:
    strategy = FlexLoRAStrategy(
        small_config(tiny_model_dir, method="flexlora", flexlora_ranks="2,4")
    )
    initial = strategy.initial_arrays()
    sent = list(strategy.configure_train(1, initial, ConfigRecord(), FakeGrid([1])))[0]
    key_a = next(k for k in initial if k.endswith(LORA_A))
    nan = (
        np.random.default_rng(0)
        .normal(size=(2, initial[key_a].numpy().shape[1]))
        .astype(np.float32)
    )
    nan[0, 0] = np.nan
    bad = {
        "rank beyond r_max": _reply(sent, 5, 0, 1, initial),
        "ranks differ across layers": _reply(
            sent, 2, 0, 1, initial, arrays={key_a: np.zeros((3, nan.shape[1]), np.float32)}
        ),
        "reported rank differs": _reply(sent, 2, 0, 1, initial, reported=3),
        "non-finite": _reply(sent, 2, 0, 1, initial, arrays={key_a: nan}),
    }
    for name, pid in (
        ("partition id a bool", True),
        ("partition id a string", "0"),
        ("negative partition id", -1),
    ):
        good = _reply(
            sent, 2, 0, 1, initial
        ).content  # a ConfigRecord entry overrides the metric of that name
        bad[name] = Message(
            content=RecordDict({**dict(good.items()), "info": ConfigRecord({"partition-id": pid})}),
            reply_to=sent,
        )
    for name, msg in bad.items():
        assert strategy.aggregate_train(1, [msg]) == (None, None), name
        assert strategy.partition_rank == {} and strategy.node_partition == {}, name
    assert strategy.aggregate_train(1, [_reply(sent, 2, 0, 1, initial)])[0] is not None
    assert strategy.partition_rank == {0: 2} and strategy.rank_of(1) == 2


def test_ranks_key_is_validated(tiny_model_dir: Path) -> None:
    for bad in ("8,x", "0,8", ""):
        with pytest.raises(ConfigError, match="flexlora-ranks"):
            small_config(tiny_model_dir, flexlora_ranks=bad)


# --- the client on the tiny model -----------------------------------------------------------------


def test_client_trains_at_its_own_rank_and_keeps_state_private(
    tiny_model_dir: Path, flower_ids: None
) -> None:
    from fedprune_app.client_app import app

    cfg = small_config(tiny_model_dir, method="flexlora", flexlora_ranks="2,3", local_steps=1)
    context = Context(
        run_id=1,
        node_id=7,
        node_config={"partition-id": 1, "num-partitions": 2},
        state=RecordDict(),
        run_config=cfg.to_dict(),
    )
    model, _ = peft_model_for(cfg.replace(lora_rank=3))
    initial = ArrayRecord(
        get_adapter_state(model)
    )  # what the server sends an unknown node: rank r_max = 3
    content = RecordDict(
        {"arrays": initial, "config": ConfigRecord({"server-round": 1, "rank": 3})}
    )
    reply = app(Message(content=content, message_type=MessageType.TRAIN, dst_node_id=7), context)
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    out = reply.content
    assert out["metrics"]["rank"] == 3 and lora_rank(numpy_state(out["arrays"])) == 3
    assert set(out["arrays"]) == set(initial)
    context0 = Context(
        run_id=1,
        node_id=8,
        node_config={"partition-id": 0, "num-partitions": 2},
        state=RecordDict(),
        run_config=cfg.to_dict(),
    )
    out0 = app(
        Message(content=content, message_type=MessageType.TRAIN, dst_node_id=8), context0
    ).content
    assert out0["metrics"]["rank"] == 2 and lora_rank(numpy_state(out0["arrays"])) == 2
    assert (
        context0.state.config_records["flexlora"]["rounds-trained"] == 1
        and "flexlora" not in out0.keys()
    )
    strategy = FlexLoRAStrategy(cfg)
    strategy.initial_arrays()
    strategy.sent = {8: spec_of(initial)}
    assert strategy.accept_reply(1, 8, out0, "train") is None and strategy.partition_rank == {0: 2}
