"""The ClientApp called directly with a hand-built Context and Message (no Ray)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from fedprune_app.client_app import app
from fedprune_app.core.lora import LoRAStrategy
from fedprune_app.llm.models import get_adapter_state, peft_model_for
from tests.conftest import small_config
from tests.local_grid import LocalGrid


@pytest.fixture()
def setup(tiny_model_dir: Path, flower_ids: None):
    cfg = small_config(tiny_model_dir)
    context = Context(
        run_id=1,
        node_id=7,
        node_config={"partition-id": 1, "num-partitions": 4},
        state=RecordDict(),
        run_config=cfg.to_dict(),
    )
    model, _ = peft_model_for(cfg)
    return cfg, context, ArrayRecord(get_adapter_state(model))


def _message(arrays: ArrayRecord, kind: str, server_round: int = 1) -> Message:
    content = RecordDict({"arrays": arrays, "config": ConfigRecord({"server-round": server_round})})
    return Message(content=content, message_type=kind, dst_node_id=7)


def test_train_call_returns_updated_adapters_and_keeps_private_state(setup) -> None:
    cfg, context, initial = setup
    reply = app(_message(initial, MessageType.TRAIN), context)
    assert not reply.has_error()
    content = reply.content
    assert set(content.keys()) == {"arrays", "metrics", "info"}
    arrays = content.array_records["arrays"]
    assert set(arrays) == set(initial)
    changed = [k for k in arrays if not np.allclose(arrays[k].numpy(), initial[k].numpy())]
    assert any("lora_B" in k for k in changed), "training must move the adapters"
    metrics = content.metric_records["metrics"]
    assert (
        metrics["num-examples"] == 16
        and metrics["partition-id"] == 1
        and np.isfinite(metrics["train-loss"])
    )
    assert content.config_records["info"]["data"] == "olmo:commonsense_qa"
    # client-private state stays in context.state and never travels
    assert context.state.config_records["fedit"]["rounds-trained"] == 1
    app(_message(arrays, MessageType.TRAIN, 2), context)
    assert context.state.config_records["fedit"]["rounds-trained"] == 2
    assert "fedit" not in content and "rounds-trained" not in metrics


def test_same_message_same_update(setup) -> None:
    """Local training is seeded by (seed, round, client): a retried message gives the same
    update."""
    cfg, context, initial = setup
    a = app(_message(initial, MessageType.TRAIN), context).content.array_records["arrays"]
    b = app(_message(initial, MessageType.TRAIN), context).content.array_records["arrays"]
    for k in a:
        np.testing.assert_allclose(a[k].numpy(), b[k].numpy(), rtol=1e-5, atol=1e-7)


def test_evaluate_call_scores_the_clients_own_task(setup) -> None:
    cfg, context, initial = setup
    reply = app(_message(initial, MessageType.EVALUATE, 0), context)
    metrics = reply.content.metric_records["metrics"]
    assert {"acc", "acc_norm", "ppl", "num-examples"} <= set(metrics)
    assert 0.0 <= metrics["acc"] <= 1.0 and metrics["ppl"] > 1.0 and metrics["num-examples"] == 8


def test_a_bad_message_becomes_an_error_reply_not_a_crash(setup) -> None:
    """A train message without one adapter tensor: the ClientApp raises, naming the tensor; the
    node's runtime turns a raising ClientApp into an error reply carrying the exception's text
    (Flower's SuperNode does; LocalGrid does the same in this process); the strategy logs that reply
    as rejected with the reason and keeps the global state (no aggregate, no exception), so the run
    goes on."""
    cfg, _, initial = setup
    missing = sorted(initial)[0]
    broken = ArrayRecord({k: v for k, v in initial.items() if k != missing})
    rows: list[dict] = []
    strategy, grid = LoRAStrategy(cfg, recorder=rows.append), LocalGrid(cfg, 1, ids=[7])
    replies = list(grid.send_and_receive(strategy.configure_train(1, broken, ConfigRecord(), grid)))
    assert len(replies) == 1 and replies[0].has_error()
    assert (
        "adapter state lacks 1 tensors" in replies[0].error.reason
        and missing in replies[0].error.reason
    )
    assert strategy.aggregate_train(1, replies) == (None, None)
    assert [(r["node"], r["status"]) for r in rows] == [(7, "rejected")] and missing in rows[0][
        "problem"
    ]


def test_instruction_clients_are_scored_with_rouge_l(tiny_model_dir: Path) -> None:
    from fedprune_app.llm.data import client_data
    from fedprune_app.llm.evaluation import evaluate_client

    cfg = small_config(
        tiny_model_dir,
        client_data="instructions:drop",
        test_examples=3,
        gen_max_new_tokens=4,
    )
    data = client_data(cfg, 0, 1)
    assert data.train[0]["response"] and "Output:" in data.train[0]["prompt"]
    model, tok = peft_model_for(cfg)
    metrics = evaluate_client(model, tok, data, cfg, 1)
    assert (
        set(metrics)
        == {
            "rouge-l",
            "rouge-l-n",
            "rouge-l-lo",
            "rouge-l-hi",
            "ppl",
            "ppl-tokens",
            "ppl-n",
            "ppl-lo",
            "ppl-hi",
        }
        and 0.0 <= metrics["rouge-l"] <= 1.0
    )


def test_identify_hears_how_many_partitions_the_data_was_dealt_into(
    tiny_model_dir: Path, flower_ids: None
) -> None:
    """summary.json's `num-partitions` comes from the clients' node config, also when a round
    would sample only some of them: what `fedprune rescore` needs to deal a client's data again."""
    cfg = small_config(tiny_model_dir, fraction_evaluate=0.5)
    strategy, grid = LoRAStrategy(cfg), LocalGrid(cfg, 3)
    assert strategy.num_partitions is None
    strategy.identify(grid)
    assert strategy.num_partitions == 3 and sorted(strategy.node_partition.values()) == [0, 1, 2]
