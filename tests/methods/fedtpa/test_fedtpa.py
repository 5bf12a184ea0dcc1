"""FedTPA: the pure functions against hand/brute-force computations, the strategy with hand-built
replies, one client train call on the tiny model, and the data extensions its presets use."""

from __future__ import annotations

import copy
import math
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
from torch import nn

from clients.fedtpa import mean_feature
from fedprune_app.core.config import ConfigError
from fedprune_app.core.protocol import spec_of
from fedprune_app.core.replies import to_record
from fedprune_app.llm.data import collate, encode, local_split, ni_category, partition_pool
from fedprune_app.llm.lora import LORA_A, LORA_B, adapter_layers, keep_count
from fedprune_app.llm.models import get_adapter_state, peft_model_for, set_adapter_state
from fedprune_app.methods.fedtpa.aggregation import (
    cosine_distances,
    initial_betas,
    lcwa,
    next_beta,
    zero_pad,
)
from fedprune_app.methods.fedtpa.rank_pruning import (
    ContributionTracker,
    dimension_scores,
    layer_contributions,
    lora_modules,
    prune_log,
    pruned_adapters,
    slice_adapter,
    update_contribution,
)
from strategies.fedtpa import FedTPAStrategy
from tests.conftest import small_config
from tests.fake_grid import FakeGrid

# --- Eq. 6 and the dimension scores ---------------------------------------------------------------


class _Lora(nn.Module):
    """A stand-in peft LoraLayer: lora_A / lora_B ModuleDicts holding the 'default' adapter."""

    def __init__(self, d_out: int, d_in: int, r: int) -> None:
        super().__init__()
        self.lora_A = nn.ModuleDict({"default": nn.Linear(d_in, r, bias=False)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(r, d_out, bias=False)})
        nn.init.normal_(self.lora_B["default"].weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lora_B["default"](self.lora_A["default"](x))


def test_contribution_ema_matches_a_hand_computation() -> None:
    torch.manual_seed(0)
    layer, eta = _Lora(3, 5, 2), 0.8
    x1, x2 = torch.randn(4, 5), torch.randn(4, 5)
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    expected = {"A": torch.zeros(2, 5), "B": torch.zeros(3, 2)}
    tracker = ContributionTracker({"m": layer}, eta)
    with tracker:
        for x in (x1, x2):
            twin = copy.deepcopy(layer)  # the same weights, no hooks: the reference gradient
            ga, gb = torch.autograd.grad(
                (twin(x) ** 2).mean(),
                [twin.lora_A["default"].weight, twin.lora_B["default"].weight],
            )
            loss = (layer(x) ** 2).mean()
            expected["A"] = eta * expected["A"] + (1 - eta) * (a.detach() * ga).abs()
            expected["B"] = eta * expected["B"] + (1 - eta) * (b.detach() * gb).abs()
            loss.backward()
            with torch.no_grad():  # a step between the two, so the second w differs
                a -= 0.1 * a.grad
                b -= 0.1 * b.grad
            a.grad = b.grad = None
    torch.testing.assert_close(tracker.ema["m.lora_A"], expected["A"])
    torch.testing.assert_close(tracker.ema["m.lora_B"], expected["B"])
    (layer(x1).sum()).backward()  # hooks are gone after the block
    torch.testing.assert_close(tracker.ema["m.lora_A"], expected["A"])
    # the pure update on plain numbers
    h = torch.tensor([1.0, 2.0])
    update_contribution(h, torch.tensor([2.0, -1.0]), torch.tensor([0.5, 3.0]), 0.9)
    torch.testing.assert_close(h, torch.tensor([0.9 * 1 + 0.1 * 1.0, 0.9 * 2 + 0.1 * 3.0]))


def test_dimension_score_is_the_mean_over_column_of_b_and_row_of_a() -> None:
    h_a = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 6.0]])  # r=2 × l=3
    h_b = torch.tensor([[1.0, 4.0], [1.0, 0.0], [1.0, 2.0], [1.0, 0.0]])  # d=4 × r=2
    torch.testing.assert_close(dimension_scores(h_a, h_b), torch.tensor([(6 + 4) / 7, (6 + 6) / 7]))


# --- pruning, the log, Eq. 7 ----------------------------------------------------------------------


@pytest.mark.parametrize("beta", [1.0, 0.55, 0.3, 0.01])
def test_global_top_k_keeps_floor_beta_n_r_and_the_best_dimensions(beta: float) -> None:
    scores = torch.rand(5, 4, generator=torch.Generator().manual_seed(1))
    log = prune_log(scores, beta)
    assert log.dtype == torch.bool and log.shape == (5, 4)
    assert int(log.sum()) == max(1, math.floor(beta * 5 * 4 + 1e-9))
    if not log.all():
        assert scores[log].min() > scores[~log].max()
    assert keep_count(0.3, 60, 16) == 288  # 0.3·60·16 is 287.999… in floating point


def test_layer_contribution_is_the_mean_of_kept_dimensions() -> None:
    scores = torch.tensor([[4.0, 1.0, 3.0], [0.5, 0.2, 0.1], [2.0, 2.5, 0.0]])
    log = prune_log(scores, 4 / 9)  # keeps 4.0, 3.0, 2.5, 2.0
    brute = [
        np.mean([s for s, k in zip(row, keep, strict=True) if k]) if keep.any() else 0.0
        for row, keep in zip(scores.tolist(), log, strict=True)
    ]
    np.testing.assert_allclose(layer_contributions(scores, log).numpy(), brute)
    assert brute[1] == 0.0 and brute[0] == 3.5


def test_slicing_and_zero_padding_round_trip() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(6, 5)).astype(np.float32), rng.normal(size=(7, 6)).astype(np.float32)
    keep = np.array([True, False, True, True, False, False])
    a_k, b_k = slice_adapter(torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(keep))
    assert a_k.shape == (3, 5) and b_k.shape == (7, 3)
    a_pad, b_pad = zero_pad(a_k.numpy(), b_k.numpy(), keep)
    np.testing.assert_array_equal(a_pad[keep], a[keep])
    np.testing.assert_array_equal(b_pad[:, keep], b[:, keep])
    assert not a_pad[~keep].any() and not b_pad[:, ~keep].any()
    np.testing.assert_allclose(b_pad @ a_pad, b[:, keep] @ a[keep], rtol=1e-6)


# --- server: LCWA, DAPR, ITPA ---------------------------------------------------------------------


def _adapter(rng: np.random.Generator, layers: list[str], r: int = 4) -> dict[str, np.ndarray]:
    out = {}
    for layer in layers:
        out[layer + LORA_A] = rng.normal(size=(r, 6)).astype(np.float32)
        out[layer + LORA_B] = rng.normal(size=(5, r)).astype(np.float32)
    return out


def test_lcwa_equals_the_brute_force_layer_weighted_average() -> None:
    rng = np.random.default_rng(3)
    layers = ["m.0.q", "m.0.v"]
    states = [_adapter(rng, layers) for _ in range(3)]
    scores = np.array(
        [[1.0, 0.0], [3.0, 0.0], [0.0, 0.0]]
    )  # layer 1: every score 0 -> fallback weights
    merged = lcwa(states, scores, layers, fallback=[10, 20, 70])
    for key in states[0]:
        w = [1 / 4, 3 / 4, 0.0] if key.startswith("m.0.q") else [0.1, 0.2, 0.7]
        brute = sum(wi * s[key].astype(np.float64) for wi, s in zip(w, states, strict=True))
        np.testing.assert_allclose(merged[key], brute, rtol=1e-5, atol=1e-6)


def test_dapr_follows_eq9_on_all_branches() -> None:
    assert next_beta(0.5, 2.0, 1.0, 9.0, 9.0, 0.1) == pytest.approx(0.55)  # training loss rose
    assert next_beta(0.5, 1.0, 2.0, 3.0, 2.0, 0.1) == pytest.approx(0.45)  # fell, validation rose
    assert next_beta(0.5, 1.0, 1.0, 3.0, 2.0, 0.1) == pytest.approx(
        0.45
    )  # equal counts as "not rose"
    assert next_beta(0.5, 1.0, 2.0, 1.0, 2.0, 0.1) == 0.5  # both fell: unchanged
    assert next_beta(0.95, 2.0, 1.0, 1.0, 1.0, 0.1) == 1.0  # clipped to 1
    assert next_beta(0.5, 1.0, 2.0, math.nan, 2.0, 0.1) == 0.5  # no validation data
    assert next_beta(0.5, 2.0, 1.0, 1.0, 1.0, 0.0) == 0.5  # δ = 0: DAPR off


def test_itpa_maps_distances_linearly_onto_beta_min_to_one() -> None:
    rng = np.random.default_rng(4)
    feats, sizes = rng.normal(size=(4, 8)) + 2.0, [10, 40, 30, 20]
    d = cosine_distances(feats, sizes)
    lam_g = (np.array(sizes)[:, None] * feats).sum(0) / sum(sizes)
    brute = [1 - f @ lam_g / (np.linalg.norm(f) * np.linalg.norm(lam_g)) for f in feats]
    np.testing.assert_allclose(d, brute, rtol=1e-10)
    beta = initial_betas(d, 0.25)
    assert beta[np.argmax(d)] == pytest.approx(1.0) and beta[np.argmin(d)] == pytest.approx(0.25)
    np.testing.assert_allclose(beta, 0.25 + 0.75 * (d - d.min()) / (d.max() - d.min()))
    assert (initial_betas(np.array([0.3, 0.3]), 0.25) == 1.0).all()


# --- the strategy with hand-built replies ---------------------------------------------------------


@pytest.fixture()
def strategy(tiny_model_dir: Path, flower_ids: None) -> FedTPAStrategy:
    s = FedTPAStrategy(
        small_config(tiny_model_dir, method="fedtpa", local_steps=3, fedtpa_warmup_steps=1)
    )
    s.global_arrays = s.initial_arrays()
    return s


def _reply(
    to: Message,
    strategy: FedTPAStrategy,
    beta: float,
    pid: int,
    seed: int,
    train: float = 1.0,
    val: float = 1.0,
    **tamper: Any,
) -> tuple[Message, dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """A well-formed client reply (kept dims of a random adapter) unless `tamper` breaks it."""
    rng = np.random.default_rng(seed)
    n, r = len(strategy.layers), strategy.rank
    scores = torch.from_numpy(rng.random((n, r)))
    keep = prune_log(scores, beta).numpy()
    full = {
        k: rng.normal(size=v.numpy().shape).astype(np.float32)
        for k, v in strategy.global_arrays.items()
    }
    kept = {}
    for j, layer in enumerate(strategy.layers):
        kept[layer + LORA_A], kept[layer + LORA_B] = (
            full[layer + LORA_A][keep[j]],
            full[layer + LORA_B][:, keep[j]],
        )
    layer_scores = layer_contributions(scores, torch.from_numpy(keep)).numpy().astype(np.float32)
    kept.update(tamper.get("arrays", {}))
    log = tamper.get("log", keep)
    content = RecordDict(
        {
            "arrays": to_record(kept),
            "fedtpa": to_record(
                {"pruning-log": log, "layer-scores": tamper.get("scores", layer_scores)}
            ),
            "metrics": MetricRecord(
                {
                    "num-examples": 10 * (pid + 1),
                    "partition-id": pid,
                    "train-loss": train,
                    "val-loss": val,
                }
            ),
        }
    )
    return Message(content=content, reply_to=to), kept, keep, layer_scores


def test_strategy_rejects_malformed_replies_without_changing_state(
    strategy: FedTPAStrategy,
) -> None:
    strategy.beta = {0: 0.5}
    strategy.node_partition = {1: 0}
    sent = list(strategy.configure_train(1, strategy.global_arrays, ConfigRecord(), FakeGrid([1])))
    assert sent[0].content.config_records["config"]["beta"] == 0.5
    layer = strategy.layers[0]
    good, kept, keep, _ = _reply(sent[0], strategy, 0.5, pid=0, seed=1)
    k0 = int(keep[0].sum())
    too_wide = np.zeros((strategy.rank + 1, kept[layer + LORA_A].shape[1]), np.float32)
    nan = kept[layer + LORA_B].copy()
    nan[0, 0] = np.nan
    wrong_count = keep.copy()
    wrong_count[:, :] = True
    bad = {
        "rank beyond r_g": _reply(sent[0], strategy, 0.5, 0, 1, arrays={layer + LORA_A: too_wide})[
            0
        ],
        "log/adapter mismatch": _reply(
            sent[0],
            strategy,
            0.5,
            0,
            1,
            arrays={layer + LORA_A: kept[layer + LORA_A][: max(0, k0 - 1)]},
        )[0],
        "non-finite adapter": _reply(sent[0], strategy, 0.5, 0, 1, arrays={layer + LORA_B: nan})[0],
        "non-finite score": _reply(
            sent[0], strategy, 0.5, 0, 1, scores=np.full(len(strategy.layers), np.inf, np.float32)
        )[0],
        "keep count != floor(beta N r)": _reply(sent[0], strategy, 0.5, 0, 1, log=wrong_count)[0],
        "non-finite loss": _reply(sent[0], strategy, 0.5, 0, 1, train=math.inf)[0],
    }
    before = (dict(strategy.beta), dict(strategy.losses), dict(strategy.node_partition))
    for name, msg in bad.items():
        assert strategy.aggregate_train(1, [msg]) == (None, None), name
        assert (strategy.beta, strategy.losses, strategy.node_partition) == before, name
    arrays, _ = strategy.aggregate_train(1, [good])
    assert arrays is not None and strategy.losses[0] == (1.0, 1.0)


def test_round_aggregates_by_lcwa_and_state_survives_a_node_id_change(
    strategy: FedTPAStrategy,
) -> None:
    strategy.beta, strategy.node_partition = {0: 0.5, 1: 0.75}, {11: 0, 22: 1}
    sent = list(
        strategy.configure_train(1, strategy.global_arrays, ConfigRecord(), FakeGrid([11, 22]))
    )
    replies = [
        _reply(sent[0], strategy, 0.5, pid=0, seed=5, train=2.0, val=2.0),
        _reply(sent[1], strategy, 0.75, pid=1, seed=6, train=2.0, val=2.0),
    ]
    arrays, _ = strategy.aggregate_train(1, [m for m, *_ in replies])
    assert arrays is not None
    for j, layer in enumerate(strategy.layers):
        padded = [
            zero_pad(k[layer + LORA_A], k[layer + LORA_B], keep[j]) for _, k, keep, _ in replies
        ]
        h = np.array([s[j] for *_, s in replies], dtype=np.float64)
        w = h / h.sum() if h.sum() > 0 else np.array([10.0, 20.0]) / 30
        np.testing.assert_allclose(
            arrays[layer + LORA_A].numpy(),
            w[0] * padded[0][0] + w[1] * padded[1][0],
            rtol=1e-5,
            atol=1e-6,
        )
        np.testing.assert_allclose(
            arrays[layer + LORA_B].numpy(),
            w[0] * padded[0][1] + w[1] * padded[1][1],
            rtol=1e-5,
            atol=1e-6,
        )
    assert strategy.beta == {0: 0.5, 1: 0.75}  # first round: no trend yet
    # round 2: partition 0 comes back on a new node id (99); its state is found by partition id
    sent = list(strategy.configure_train(2, arrays, ConfigRecord(), FakeGrid([22, 99])))
    assert sent[1].content.config_records["config"]["beta"] == 1.0  # unknown node: full adapter
    replies = [
        _reply(sent[0], strategy, 0.75, pid=1, seed=7, train=1.5, val=2.5)[
            0
        ],  # overfitting -> shrink
        _reply(sent[1], strategy, 1.0, pid=0, seed=8, train=3.0, val=1.0)[0],
    ]  # underfitting -> grow
    strategy.aggregate_train(2, replies)
    assert strategy.beta[1] == pytest.approx(0.75 * 0.9) and strategy.beta[0] == pytest.approx(
        0.5 * 1.1
    )
    assert strategy.node_partition[99] == 0
    strategy.cfg = strategy.cfg.replace(
        fedtpa_lcwa=False, fedtpa_dapr=False
    )  # the ablations: FedAvg, fixed β
    sent = list(strategy.configure_train(3, arrays, ConfigRecord(), FakeGrid([11])))
    msg, kept, keep, _ = _reply(sent[0], strategy, 0.5, pid=0, seed=9, train=9.0, val=9.0)
    arrays, _ = strategy.aggregate_train(3, [msg])
    layer = strategy.layers[0]
    np.testing.assert_allclose(
        arrays[layer + LORA_A].numpy(),
        zero_pad(kept[layer + LORA_A], kept[layer + LORA_B], keep[0])[0],
        rtol=1e-6,
    )
    assert strategy.beta[0] == pytest.approx(0.55)


# --- the client on the tiny model -----------------------------------------------------------------


def test_pruned_adapters_train_only_kept_dimensions_and_match_the_zeroed_model(
    tiny_model_dir: Path,
) -> None:
    cfg = small_config(tiny_model_dir)
    model, tok = peft_model_for(cfg)
    rng = torch.Generator().manual_seed(0)
    state = {
        k: torch.randn(v.shape, generator=rng) * 0.1 for k, v in get_adapter_state(model).items()
    }
    set_adapter_state(model, state)
    modules = lora_modules(model)
    assert list(modules) == adapter_layers(state)
    keep = prune_log(torch.rand(len(modules), 4, generator=rng), 0.4)
    keep[0] = False  # one layer pruned entirely: a rank-0 adapter
    ids = torch.tensor([[5, 17, 300, 41, 9]])
    zeroed = {}
    for j, name in enumerate(modules):
        zeroed[name + LORA_A] = state[name + LORA_A] * keep[j][:, None]
        zeroed[name + LORA_B] = state[name + LORA_B] * keep[j][None, :]
    with pruned_adapters(list(modules.values()), keep):
        shapes = [tuple(m.lora_A["default"].weight.shape) for m in modules.values()]
        assert shapes == [
            (int(k.sum()), m.lora_A["default"].weight.shape[1])
            for k, m in zip(keep, modules.values(), strict=True)
        ]
        with torch.no_grad():
            pruned_out = model(input_ids=ids).logits
        for m in modules.values():
            with torch.no_grad():
                m.lora_A["default"].weight.add_(1.0)
    set_after = get_adapter_state(model)
    set_adapter_state(model, zeroed)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, pruned_out)
    for j, name in enumerate(modules):
        torch.testing.assert_close(
            set_after[name + LORA_A][keep[j]], state[name + LORA_A][keep[j]] + 1.0
        )
        assert (
            not set_after[name + LORA_A][~keep[j]].any()
            and not set_after[name + LORA_B][:, ~keep[j]].any()
        )


def test_client_train_call_returns_adapters_consistent_with_its_log(
    tiny_model_dir: Path, flower_ids: None
) -> None:
    from fedprune_app.client_app import app

    cfg = small_config(
        tiny_model_dir,
        method="fedtpa",
        local_steps=2,
        fedtpa_warmup_steps=1,
        fedtpa_ema_scope="run",
    )
    context = Context(
        run_id=1,
        node_id=7,
        node_config={"partition-id": 1, "num-partitions": 4},
        state=RecordDict(),
        run_config=cfg.to_dict(),
    )
    model, _ = peft_model_for(cfg)
    gen = torch.Generator().manual_seed(
        2
    )  # a trained-looking global adapter (B ≠ 0): one warm-up step scores
    initial = ArrayRecord(
        {k: torch.randn(v.shape, generator=gen) * 0.05 for k, v in get_adapter_state(model).items()}
    )
    content = RecordDict(
        {"arrays": initial, "config": ConfigRecord({"server-round": 1, "beta": 0.5})}
    )
    reply = app(Message(content=content, message_type=MessageType.TRAIN, dst_node_id=7), context)
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    out = reply.content
    assert set(out.keys()) == {"arrays", "fedtpa", "metrics", "info"}
    layers = adapter_layers(initial.keys())
    keep, scores = out["fedtpa"]["pruning-log"].numpy(), out["fedtpa"]["layer-scores"].numpy()
    assert (
        keep.dtype == np.bool_ and keep.shape == (len(layers), 4) and scores.shape == (len(layers),)
    )
    assert int(keep.sum()) == keep_count(0.5, len(layers), 4) == out["metrics"]["kept-dims"]
    after = get_adapter_state(
        model
    )  # the cached model after the call: kept dims trained, pruned dims zero
    for j, layer in enumerate(layers):
        a, b = out["arrays"][layer + LORA_A].numpy(), out["arrays"][layer + LORA_B].numpy()
        np.testing.assert_array_equal(a, after[layer + LORA_A].numpy()[keep[j]])
        np.testing.assert_array_equal(b, after[layer + LORA_B].numpy()[:, keep[j]])
        assert not after[layer + LORA_A].numpy()[~keep[j]].any()
    assert any(
        np.abs(out["arrays"][k].numpy()).sum() > 0 for k in out["arrays"] if k.endswith(LORA_B)
    )
    assert (scores >= 0).all() and scores.max() > 0
    # a server accepts it (the reply passes every check)
    strategy = FedTPAStrategy(cfg)
    strategy.initial_arrays()
    strategy.sent, strategy.sent_beta = {7: spec_of(initial)}, {7: 0.5}
    assert strategy.accept_reply(1, 7, out, "train") is None
    # private state: the EMA stays in context.state and never travels
    ema = context.state.array_records["fedtpa-ema"]
    assert set(ema) == {f"{layer}.{p}" for layer in layers for p in ("lora_A", "lora_B")}
    assert context.state.config_records["fedtpa"]["rounds-trained"] == 1
    assert all("ema" not in name for name in out.keys()) and "rounds-trained" not in out["metrics"]
    sent_arrays = {k for rec in out.array_records.values() for k in rec}
    assert not sent_arrays & set(ema)


def test_query_returns_the_mean_pooled_backbone_feature(
    tiny_model_dir: Path, flower_ids: None
) -> None:
    from fedprune_app.client_app import app

    cfg = small_config(
        tiny_model_dir,
        method="fedtpa",
        local_steps=3,
        fedtpa_warmup_steps=1,
        fedtpa_feature_examples=3,
    )
    context = Context(
        run_id=1,
        node_id=7,
        node_config={"partition-id": 0, "num-partitions": 2},
        state=RecordDict(),
        run_config=cfg.to_dict(),
    )
    reply = app(
        Message(
            content=RecordDict({"config": ConfigRecord({"server-round": 0})}),
            message_type=MessageType.QUERY,
            dst_node_id=7,
        ),
        context,
    )
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    lam = reply.content["features"]["lambda"].numpy()
    assert (
        reply.content["metrics"]["feature-examples"] == 3
        and reply.content["metrics"]["partition-id"] == 0
    )
    model, tok = peft_model_for(cfg)
    from fedprune_app.llm.data import client_data

    examples = client_data(cfg, 0, 2).train[:3]
    backbone = model.get_base_model().model
    with torch.no_grad(), model.disable_adapter():  # one sample at a time: no padding involved
        each = [
            backbone(
                **{
                    k: v
                    for k, v in collate([encode(tok, e, 64)], tok.pad_token_id).items()
                    if k != "labels"
                }
            )
            .last_hidden_state[0]
            .mean(0)
            for e in examples
        ]
    np.testing.assert_allclose(lam, torch.stack(each).mean(0).numpy(), rtol=1e-4, atol=1e-5)
    assert lam.shape == (model.get_base_model().config.hidden_size,)
    np.testing.assert_allclose(
        mean_feature(model, tok, examples, 64, batch_size=2), lam, rtol=1e-4, atol=1e-5
    )


# --- data and config ------------------------------------------------------------------------------


def test_data_extensions_for_the_instruction_presets(tiny_model_dir: Path) -> None:
    from fedprune_app.llm.models import load_tokenizer

    assert ni_category("subtask002_quoref_answer_generation") == "quoref"
    assert (
        ni_category("subtask043_essential_terms_answering_incomplete_questions")
        == "essential_terms"
    )
    assert ni_category("subtask046_miscellaenous_question_typing") == "misc"
    pool = [{"source": "ni", "category": c} for c in ["a"] * 30 + ["b"] * 30]
    parts = partition_pool(
        pool, 2, "dirichlet", 0.05, seed=1
    )  # by category, although all share one source
    assert sorted(i for p in parts for i in p) == list(range(60))
    # the Dirichlet label is the category: the same split as if the categories were the sources, not
    # the split of the one shared source
    assert parts == partition_pool(
        [{"source": e["category"]} for e in pool], 2, "dirichlet", 0.05, seed=1
    )
    assert parts != partition_pool([{"source": "ni"} for _ in pool], 2, "dirichlet", 0.05, seed=1)
    train = [{"i": i} for i in range(10)]
    rest, val = local_split(train, 0.2, 0, seed=3)
    assert (
        len(val) == 2 and len(rest) == 8 and sorted(e["i"] for e in rest + val) == list(range(10))
    )
    assert (
        local_split(train, 0.2, 0, seed=3) == (rest, val)
        and len(local_split(train, 0.5, 2, seed=3)[1]) == 2
    )
    tok = load_tokenizer(str(tiny_model_dir))
    long = {"prompt": "word " * 200 + "\nOutput:", "response": "the answer"}
    ids, labels = encode(tok, long, 32)
    answer = tok(" the answer", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert (
        len(ids) == 32
        and [t for t in labels if t != -100] == answer
        and ids[-len(answer) :] == answer
    )


def test_warmup_must_leave_fine_tuning_steps(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="fedtpa-warmup-steps"):
        small_config(tiny_model_dir, method="fedtpa", local_steps=3, fedtpa_warmup_steps=3)


@pytest.mark.parametrize("scope", ["warmup", "run"])
def test_ema_scope_restarts_or_carries_the_contributions(
    scope: str, tiny_model_dir: Path, flower_ids: None
) -> None:
    """The same round trained twice from the same global adapter: with 'warmup' (§III-D1: the score
    of this warm-up) the second call scores exactly as the first, and nothing is kept in
    context.state; with 'run' the second starts from the first's EMA, so its scores differ and the
    EMA is stored."""
    from fedprune_app.client_app import app

    cfg = small_config(
        tiny_model_dir,
        method="fedtpa",
        local_steps=3,
        fedtpa_warmup_steps=2,
        fedtpa_ema_scope=scope,
    )
    context = Context(
        run_id=1,
        node_id=7,
        node_config={"partition-id": 1, "num-partitions": 4},
        state=RecordDict(),
        run_config=cfg.to_dict(),
    )
    model, _ = peft_model_for(cfg)
    gen = torch.Generator().manual_seed(3)
    initial = ArrayRecord(
        {k: torch.randn(v.shape, generator=gen) * 0.05 for k, v in get_adapter_state(model).items()}
    )
    scores = []
    for _ in range(2):
        content = RecordDict(
            {"arrays": initial, "config": ConfigRecord({"server-round": 1, "beta": 0.5})}
        )
        reply = app(
            Message(content=content, message_type=MessageType.TRAIN, dst_node_id=7), context
        )
        assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
        scores.append(reply.content["fedtpa"]["layer-scores"].numpy())
    assert scores[0].max() > 0
    if scope == "warmup":
        np.testing.assert_array_equal(scores[0], scores[1])
        assert "fedtpa-ema" not in context.state.array_records
    else:
        assert (
            not np.array_equal(scores[0], scores[1]) and "fedtpa-ema" in context.state.array_records
        )
