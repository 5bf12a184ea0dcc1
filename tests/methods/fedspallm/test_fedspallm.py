"""FedSpaLLM: ℓ0 aggregation, mask expansion and layer sampling against brute force; the client; the
strategy."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from pathlib import Path

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

from fedprune_app.client_app import app
from fedprune_app.core.encoding import decode_dense, decode_sparse, encode_sparse
from fedprune_app.core.replies import to_record
from fedprune_app.llm.layers import prunable_names, prunable_weights
from fedprune_app.methods.fedspallm.aggregation import (
    L0Sum,
    expand_masks,
    kept_by,
    l0_aggregate,
    layer_quota,
    sample_layers,
)
from fedprune_app.methods.fedspallm.masks import MASK_SUFFIX, target_count
from strategies.fedspallm import FedSpaLLMStrategy
from tests.conftest import small_config
from tests.local_grid import LocalGrid


def test_l0_aggregate_matches_a_brute_force_loop() -> None:
    rng = np.random.default_rng(0)
    ws = [rng.normal(size=(5, 7)).astype(np.float32) for _ in range(3)]
    ms = [rng.random((5, 7)) > 0.5 for _ in range(3)]
    ms[0][0, 0] = ms[1][0, 0] = ms[2][0, 0] = False  # pruned by everyone
    merged, pruned_count = l0_aggregate(ws, ms)
    for i in range(5):
        for j in range(7):
            kept = [w[i, j] for w, m in zip(ws, ms, strict=True) if m[i, j]]
            assert merged[i, j] == pytest.approx(sum(kept) / len(kept) if kept else 0.0, rel=1e-6)
            assert pruned_count[i, j] == 3 - len(kept)
    assert merged[0, 0] == 0 and pruned_count[0, 0] == 3


def test_l0_sums_do_not_depend_on_the_order_replies_arrive_in() -> None:
    """The server folds replies in as they are pulled (arrival order is a race): 16 clients in 5
    orders give the same float32 bits, and the same as the brute-force-checked `l0_aggregate`."""
    rng = np.random.default_rng(5)
    ws = [rng.normal(scale=0.05, size=(32, 48)).astype(np.float32) for _ in range(16)]
    ms = [rng.random((32, 48)) > 0.6 for _ in range(16)]
    reference, ref_counts = l0_aggregate(ws, ms)
    for _ in range(5):
        acc = L0Sum(ws[0].shape)
        for i in rng.permutation(16):
            acc.add(ws[i], ms[i])
        merged, counts = acc.merged()
        assert merged.tobytes() == reference.tobytes() and np.array_equal(counts, ref_counts)


@pytest.mark.parametrize("sparsity", [0.5, 0.55, 0.6, 0.8])
def test_mask_expansion_hits_the_exact_target_and_prefers_agreed_positions(sparsity: float) -> None:
    rng = np.random.default_rng(1)
    n = 4
    ws = [rng.normal(size=(16, 24)).astype(np.float32) for _ in range(n)]
    ms = []
    for w in ws:  # each client prunes exactly `sparsity` of its matrix by its own scores
        k = int(round(sparsity * w.size))
        kept = np.ones(w.size, bool)
        kept[np.argsort(np.abs(w + rng.normal(size=w.shape)).flatten())[:k]] = False
        ms.append(kept.reshape(w.shape))
    merged, counts = l0_aggregate(ws, ms)
    final, kept = expand_masks(merged, counts, n, sparsity)
    assert (
        (~kept).sum()
        == target_count(sparsity, merged.size)
        == math.ceil(sparsity * merged.size - 1e-9)
    )
    assert (final[~kept] == 0).all() and np.array_equal(final[kept], merged[kept])
    assert (~kept[counts == n]).all()  # pruned by all -> pruned
    # no kept position was pruned by more clients than any pruned position (apart from the all-agree
    # set)
    assert counts[kept].max() <= counts[~kept].min() or counts[~kept].min() == n


def test_mask_expansion_breaks_ties_by_magnitude_and_supports_n_m() -> None:
    merged = np.array([[0.1, -5.0, 0.3, 2.0]], dtype=np.float32)
    counts = np.array([[1, 1, 1, 0]])
    _, kept = expand_masks(merged, counts, 2, 0.5)
    assert kept.tolist() == [
        [False, True, False, True]
    ]  # two of the three C=1 positions, the smallest |w|
    rng = np.random.default_rng(2)
    merged = rng.normal(size=(4, 8)).astype(np.float32)
    _, kept = expand_masks(merged, rng.integers(0, 3, size=(4, 8)), 3, 0.5, prunen=2, prunem=4)
    assert (kept.reshape(4, 2, 4).sum(-1) == 2).all()


def test_kept_by_counts_the_clients_behind_each_kept_position() -> None:
    rng = np.random.default_rng(5)
    masks = [rng.random((6, 7)) < 0.6 for _ in range(3)]
    kept = np.sum(masks, axis=0).astype(np.uint16)
    global_mask = (kept > 0) & (rng.random((6, 7)) < 0.7)
    brute = Counter(
        int(sum(m[pos] for m in masks)) for pos in zip(*np.nonzero(global_mask), strict=True)
    )
    assert kept_by(kept, global_mask, 3).tolist() == [brute[j] for j in range(4)]


def test_layer_sampling_covers_every_layer_and_follows_resources() -> None:
    quotas = layer_quota(30, [0.2, 0.4, 0.6, 1.0])
    assert quotas == [6, 12, 18, 30]
    rng = random.Random(0)
    hits: Counter[int] = Counter()
    for _ in range(200):
        assignment = sample_layers(30, [6, 6, 12, 9], rng)
        assert [len(a) for a in assignment] == [6, 6, 12, 9]
        assert set().union(*map(set, assignment)) == set(range(30))
        hits.update(layer for a in assignment for layer in a)
    assert max(hits.values()) / min(hits.values()) < 1.3  # every layer equally likely (Theorem 4.2)
    with pytest.raises(ValueError, match="'fedspallm-resources'"):
        sample_layers(30, [5, 5], rng)


@pytest.fixture()
def fedspallm_cfg(tiny_model_dir: Path, tmp_path: Path):
    text = tmp_path / "text.jsonl"
    text.write_text(
        "".join(
            json.dumps(
                {
                    "text": f"Paragraph {i}: the river runs past the old mill and the "
                    f"town of number {i} near the hills."
                }
            )
            + "\n"
            for i in range(60)
        )
    )
    return small_config(
        tiny_model_dir,
        method="fedspallm",
        client_data=f"{text}",
        calib_segments=4,
        calib_seq_len=32,
        sparsity=0.5,
        server_eval_data=f"{text}",
        sparsegpt_blocksize=32,
    )


def test_client_prunes_and_returns_only_its_sampled_layers(fedspallm_cfg, flower_ids: None) -> None:
    context = Context(
        run_id=1,
        node_id=3,
        node_config={"partition-id": 0, "num-partitions": 1},
        state=RecordDict(),
        run_config=fedspallm_cfg.to_dict(),
    )
    content = RecordDict(
        {"arrays": ArrayRecord(), "config": ConfigRecord({"server-round": 1, "layers": "[1]"})}
    )
    reply = app(
        Message(content=content, message_type=MessageType.TRAIN, dst_node_id=3), context
    ).content
    arrays = {k: v.numpy() for k, v in reply.array_records["arrays"].items()}
    weights = [k for k in arrays if not k.endswith(MASK_SUFFIX)]
    assert weights and all(k.startswith("model.layers.1.") for k in weights)
    assert len(weights) == 7  # q k v o gate up down
    shapes = {k: v.shape for k, v in prunable_weights(fedspallm_cfg)[0].items() if k in weights}
    for k, (values, m) in decode_sparse(arrays, shapes).items():  # kept values + bit-packed masks
        assert arrays[k + MASK_SUFFIX].dtype == np.uint8 and values.size == m.sum()
        assert (values != 0).all() and abs((~m).mean() - 0.5) < 0.01
    assert reply.metric_records["metrics"]["num-examples"] == 4


def test_strategy_aggregates_hand_built_replies(fedspallm_cfg, flower_ids: None) -> None:
    rows: list[dict] = []
    strategy = FedSpaLLMStrategy(fedspallm_cfg, recorder=rows.append)
    handle = strategy.initial_arrays()
    before = {k: v.copy() for k, v in strategy.global_state.items()}

    class Grid:
        def get_node_ids(self) -> list[int]:
            return [1, 2]

    sent = list(strategy.configure_train(1, handle, ConfigRecord(), Grid()))
    assert set().union(
        *(set(json.loads(m.content.config_records["config"]["layers"])) for m in sent)
    ) == {0, 1}
    rng = np.random.default_rng(3)
    replies = []
    dense: dict[
        int, dict[str, tuple[np.ndarray, np.ndarray]]
    ] = {}  # reply -> {name: (pruned W, mask)} unpacked
    for i, msg in enumerate(sent):
        got = {k: v.numpy() for k, v in msg.content.array_records["arrays"].items()}
        names = {k: before[k].shape for k in got if not k.endswith(MASK_SUFFIX)}
        dense[i] = {}
        for k, w in decode_dense(got, names).items():  # what was sent is the (dense) global weights
            np.testing.assert_array_equal(w, before[k])
            keep = (rng.permutation(w.size) < w.size // 2).reshape(
                w.shape
            )  # the target sparsity 0.5
            dense[i][k] = (
                np.where(keep, w + rng.normal(scale=0.01, size=w.shape), 0).astype(np.float32),
                keep,
            )
        payload = encode_sparse(
            {k: w for k, (w, _) in dense[i].items()}, {k: m for k, (_, m) in dense[i].items()}
        )
        content = RecordDict(
            {
                "arrays": to_record(payload),
                "metrics": MetricRecord({"num-examples": 4, "partition-id": i}),
            }
        )
        replies.append(Message(content=content, reply_to=msg))
    first = {k: v.numpy() for k, v in replies[0].content.array_records["arrays"].items()}
    bad = RecordDict(
        {
            "arrays": to_record(
                {
                    k: np.full(v.shape, np.nan, np.float32) if v.dtype.kind == "f" else v
                    for k, v in first.items()
                }
            ),
            "metrics": MetricRecord({"num-examples": 4}),
        }
    )
    replies.append(Message(content=bad, reply_to=sent[0]))
    arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays is not None and [r.get("status") for r in rows].count("rejected") == 1
    assert (
        strategy.l0 == {}
    )  # the round's sums are spent; no reply's weights are held after the round
    sampled = {
        k for m in sent for k in m.content.array_records["arrays"] if not k.endswith(MASK_SUFFIX)
    }
    for (
        k
    ) in sampled:  # packed replies folded in = Eq. 5–7 over the unpacked fp32 replies, bit for bit
        got = [d[k] for d in dense.values() if k in d]
        merged, counts = l0_aggregate([w for w, _ in got], [m for _, m in got])
        np.testing.assert_array_equal(
            strategy.global_state[k], expand_masks(merged, counts, len(got), 0.5)[0]
        )
    expected: dict[
        str, Counter
    ] = {}  # per number of sampling clients: kept-by count of each global kept position
    for k in sampled:
        got = [m for d in dense.values() if k in d for _, m in [d[k]]]
        tally = expected.setdefault(str(len(got)), Counter())
        for pos in zip(*np.nonzero(strategy.global_state[k]), strict=True):
            tally[sum(bool(m[pos]) for m in got)] += 1
    row = next(r for r in rows if r.get("phase") == "server-aggregate")
    assert set(row["global-kept-by"]) == set(expected)
    for n_clients, tally in expected.items():
        total = sum(tally.values())
        want = [tally[j] / total for j in range(int(n_clients) + 1)]
        np.testing.assert_allclose(row["global-kept-by"][n_clients], want, atol=1e-6)
    for k, v in strategy.global_state.items():
        if k in sampled:
            assert (v == 0).sum() == math.ceil(0.5 * v.size)
        else:
            np.testing.assert_array_equal(v, before[k])
    assert len(prunable_names(strategy.global_model(arrays)[0])) == len(before)


def test_random_reference_hits_the_target_sparsity(fedspallm_cfg) -> None:
    from fedprune_app.core.config import ConfigError, RunConfig
    from fedprune_app.llm.layers import prunable_names
    from fedprune_app.methods.fedspallm.aggregation import random_prune
    from fedprune_app.report.tables import render_references

    w = np.ones((10, 10), np.float32)
    assert (random_prune(w, 0.55, np.random.default_rng(0)) == 0).sum() == 55
    strategy = FedSpaLLMStrategy(fedspallm_cfg)
    strategy.initial_arrays()
    model, _ = strategy.report_class(strategy).reference_models()["random"]()
    params = dict(model.named_parameters())
    for name in prunable_names(model):
        assert (params[name] == 0).float().mean().item() == pytest.approx(0.5, abs=1e-3)
    text = render_references(
        fedspallm_cfg,
        {"0": {"ppl `d`": 10.0}, "1": {"ppl `d`": 20.0}},
        [{"model": "random", "data": "d", "ppl": 900.0}],
    )
    assert "| dense (round 0) | 10.00 |" in text and "| random | 900.00 |" in text
    assert "| fedspallm (round 1) | 20.00 |" in text
    with pytest.raises(
        ConfigError, match="'fedspallm-references' accepts random, standalone, centralized"
    ):
        RunConfig.from_flower({"fedspallm-references": "random,oracle"})


def ClientGrid(  # noqa: N802
    cfg,
    partitions: int,
    failing: int | None = None,
    ids: list[int] | None = None,
    node_configs: dict[int, dict] | None = None,
) -> LocalGrid:
    """Nodes 10, 11, ... (or `ids`) as in-process ClientApp calls, `failing` answering with
    errors."""
    return LocalGrid(
        cfg,
        partitions,
        failing=[] if failing is None else [failing],
        ids=ids or [10 + p for p in range(partitions)],
        node_configs=node_configs,
    )


def test_standalone_reference_is_each_clients_own_full_pruning(
    fedspallm_cfg, flower_ids: None
) -> None:
    """Every client prunes all layers with its own round-1 segments and reports only perplexities; a
    failing client is logged, not fatal."""
    from fedprune_app.core.runtime import client_seed
    from fedprune_app.llm.data import client_data
    from fedprune_app.llm.evaluation import held_out_text, perplexity, window_scores
    from fedprune_app.llm.layers import calibration_batches, dense_model
    from fedprune_app.methods.fedspallm.pruners import prune_sequentially, pruner_for

    cfg = fedspallm_cfg.replace(**{"fedspallm-references": "standalone", "partitioner": "iid"})
    rows: list[dict] = []
    strategy = FedSpaLLMStrategy(cfg, recorder=rows.append)
    strategy.initial_arrays()
    assert strategy.report_class(strategy).client_references() == ["standalone"]
    strategy.score_client_references(
        ClientGrid(cfg, partitions=3, failing=12),
        strategy.report_class(strategy).client_references(),
    )
    ok = [r for r in rows if r.get("status") != "failed"]
    assert sorted(r["client"] for r in ok) == [0, 1] and [
        r["node"] for r in rows if "problem" in r
    ] == [12]
    # brute force for client 1: the same segments, every layer pruned, the same held-out text
    model, tok = dense_model(cfg)
    batches = calibration_batches(client_data(cfg, 1, 3).train, tok, 4, 32, client_seed(0, 1, 1))
    prune_sequentially(model, batches, [0, 1], pruner_for(cfg))
    source = cfg.server_eval_data
    expected = perplexity(model, tok, held_out_text(source, cfg), 64, 64, 128)
    row = next(r for r in ok if r["client"] == 1)
    assert row["ppl"] == pytest.approx(expected, rel=1e-5)
    # each window's score travels too (public text), so the server can pair it with the global
    # model's
    windows = window_scores(model, tok, held_out_text(source, cfg), 64, 64, 128)
    assert row["window-tokens"] == windows.tokens.tolist() and len(windows.tokens) > 1
    assert row["window-nll"] == pytest.approx(windows.nll.tolist(), rel=1e-5)
    dense_ppl = perplexity(*dense_model(cfg), held_out_text(source, cfg), 64, 64, 128)
    assert expected != pytest.approx(dense_ppl, rel=1e-3)


def test_standalone_reuses_a_round_1_prune_of_every_layer(
    fedspallm_cfg, flower_ids: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With r_i = 1 the round-1 train message prunes every layer from the dense model with the
    round-1 segments: the standalone model. Its scores are kept and sent, equal to pruning again,
    and nothing is pruned again."""
    import clients.fedspallm as client_module

    cfg = fedspallm_cfg.replace(**{"fedspallm-references": "standalone", "partitioner": "iid"})
    fresh = ClientGrid(cfg, partitions=2)
    recomputed = {
        m: dict(r.content.metric_records["metrics"])
        for m, r in zip(
            [10, 11], fresh.send_and_receive(_reference_messages([10, 11])), strict=True
        )
    }
    grid = ClientGrid(cfg, partitions=2)
    strategy = FedSpaLLMStrategy(cfg)
    handle = strategy.initial_arrays()
    strategy.identify(grid)
    replies = list(
        grid.send_and_receive(list(strategy.configure_train(1, handle, ConfigRecord(), grid)))
    )
    assert all(not r.has_error() and r.content["metrics"]["layers"] == 2 for r in replies)
    calls: list[int] = []
    monkeypatch.setattr(client_module, "prune_sequentially", lambda *a, **k: calls.append(1))
    for node, reply in zip(
        [10, 11], grid.send_and_receive(_reference_messages([10, 11])), strict=True
    ):
        got = dict(reply.content.metric_records["metrics"])
        assert got.pop("reused-round-1") == 1 and not calls
        for key in [k for k in got if k.startswith(("ppl/", "window-nll/", "window-tokens/"))]:
            assert got[key] == pytest.approx(recomputed[node][key], rel=1e-6), key
        assert any(k.startswith("window-nll/") for k in got)


def _reference_messages(nodes: list[int]) -> list[Message]:
    return [
        Message(
            content=RecordDict({"config": ConfigRecord({"reference": "standalone"})}),
            message_type="evaluate.reference",
            dst_node_id=n,
        )
        for n in nodes
    ]


def test_standalone_reply_holds_metrics_only(fedspallm_cfg, flower_ids: None) -> None:
    grid = ClientGrid(fedspallm_cfg, partitions=1)
    msg = Message(
        content=RecordDict({"config": ConfigRecord({"reference": "standalone"})}),
        message_type="evaluate.reference",
        dst_node_id=10,
    )
    reply = next(grid.send_and_receive([msg])).content
    assert not reply.array_records and set(reply.metric_records) == {"metrics"}
    assert any(k.startswith("ppl/") for k in reply.metric_records["metrics"])


def test_centralized_reference_prunes_on_the_pooled_segments(fedspallm_cfg) -> None:
    from fedprune_app.core.runtime import client_seed
    from fedprune_app.llm.data import client_data
    from fedprune_app.llm.layers import calibration_batches, dense_model
    from fedprune_app.methods.fedspallm.pruners import prune_sequentially, pruner_for

    cfg = fedspallm_cfg.replace(
        **{"fedspallm-references": "random,centralized", "partitioner": "iid"}
    )
    rows: list[dict] = []
    strategy = FedSpaLLMStrategy(cfg, recorder=rows.append)
    strategy.initial_arrays()
    strategy.num_connected = 2
    rng = np.random.default_rng(
        0
    )  # a global mask to compare with: half the positions of each matrix zeroed
    strategy.global_state = {
        k: np.where(rng.random(w.shape) < 0.5, 0, w) for k, w in strategy.global_state.items()
    }
    model, _ = strategy.report_class(strategy).reference_models()["centralized"]()
    got = {k: v.detach().clone() for k, v in model.named_parameters() if k in strategy.global_state}
    both = sum(
        int(((got[k] != 0).numpy() & (w != 0)).sum()) for k, w in strategy.global_state.items()
    )
    kept = sum(int((w != 0).sum()) for w in strategy.global_state.values())
    assert rows == [
        {"phase": "fedspallm-mask-agreement", "global-vs-centralized": pytest.approx(both / kept)}
    ]
    assert (
        0.3 < both / kept < 0.7
    )  # two independent half masks share about half of the kept positions
    model, tok = dense_model(cfg)
    pooled = [
        b
        for p in range(2)
        for b in calibration_batches(client_data(cfg, p, 2).train, tok, 4, 32, client_seed(0, 1, p))
    ]
    prune_sequentially(model, pooled, [0, 1], pruner_for(cfg))
    params = dict(model.named_parameters())
    for k, v in got.items():
        assert torch.equal(v, params[k]), k
        assert (v == 0).float().mean().item() == pytest.approx(0.5, abs=0.02)


def test_resources_come_from_node_config_and_layers_follow_partitions(
    fedspallm_cfg, flower_ids: None
) -> None:
    """`identify` asks each node for (partition id, node-config resources); a node's own r_i
    overrides the run config's per-partition list, and the same seed deals the same layers to the
    same partitions whatever node ids Flower gives."""
    cfg = fedspallm_cfg.replace(**{"fedspallm-resources": "1.0,0.5,1.0"})
    deals = []
    for ids in ([10, 11, 12], [99, 5, 42]):
        strategy = FedSpaLLMStrategy(cfg)
        handle = strategy.initial_arrays()
        grid = ClientGrid(cfg, partitions=3, ids=ids, node_configs={2: {"resources": 0.4}})
        strategy.identify(grid)
        assert strategy.node_partition == {ids[0]: 0, ids[1]: 1, ids[2]: 2}
        assert strategy.node_resources == {ids[0]: 0.0, ids[1]: 0.0, ids[2]: 0.4}
        assert strategy.resources_of(ids) == [1.0, 0.5, 0.4]
        sent = list(strategy.configure_train(1, handle, ConfigRecord(), grid))
        by_partition = {
            ids.index(m.metadata.dst_node_id): json.loads(
                m.content.config_records["config"]["layers"]
            )
            for m in sent
        }
        assert [len(by_partition[p]) for p in range(3)] == [
            2,
            1,
            1,
        ]  # k_i = max(1, round(r_i * 2 layers))
        deals.append(by_partition)
    assert deals[0] == deals[1]


def test_server_and_reference_rows_carry_their_windows(fedspallm_cfg) -> None:
    """The server's score of the global model and of each reference it builds are logged per window,
    on the same windows: what the grid's paired intervals resample."""
    from fedprune_app.llm.evaluation import held_out_text, window_scores, window_scores_of
    from fedprune_app.llm.layers import dense_model
    from fedprune_app.server_app import score_references, server_evaluation

    class Log:
        def __init__(self) -> None:
            self.rows: list[dict] = []

        def log(self, row: dict) -> None:
            self.rows.append(row)

    cfg = fedspallm_cfg.replace(**{"fedspallm-references": "random"})
    strategy, run = FedSpaLLMStrategy(cfg), Log()
    handle = strategy.initial_arrays()
    server_evaluation(cfg, strategy, run)(0, handle)
    score_references(cfg, strategy.report_class(strategy), run)
    server, random = run.rows
    assert (server["phase"], random["phase"], random["model"]) == (
        "server-evaluate",
        "reference",
        "random",
    )
    expected = window_scores(
        *dense_model(cfg),
        held_out_text(cfg.server_eval_data, cfg),
        cfg.ppl_window,
        cfg.ppl_stride,
        cfg.eval_ppl_tokens,
    )
    dense = window_scores_of(server)
    assert (
        dense.tokens.tolist()
        == expected.tokens.tolist()
        == window_scores_of(random).tokens.tolist()
    )
    assert dense.nll.tolist() == pytest.approx(expected.nll.tolist(), rel=1e-5)
    assert (
        server["ppl"] == pytest.approx(dense.perplexity, rel=1e-5)
        and server["ppl-tokens"] == dense.token_count
    )
    assert server["ppl-lo"] < server["ppl"] < server["ppl-hi"]
    assert window_scores_of(random).nll.tolist() != pytest.approx(
        dense.nll.tolist(), rel=1e-3
    )  # another model
