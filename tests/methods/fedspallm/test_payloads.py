"""FedSpaLLM's payloads: kept values + bit-packed masks both ways, `payload-dtype`, old
replies and old checkpoints."""

from __future__ import annotations

import json
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

from fedprune_app.client_app import app
from fedprune_app.core.checkpoint import load_checkpoint, save_checkpoint
from fedprune_app.core.config import ConfigError
from fedprune_app.core.encoding import (
    MASK_SUFFIX,
    decode_sparse,
    encode_sparse,
    from_payload,
    to_payload,
)
from fedprune_app.core.protocol import record_bytes
from fedprune_app.core.replies import to_record
from fedprune_app.methods.fedspallm.aggregation import expand_masks, l0_aggregate
from strategies.fedspallm import FedSpaLLMStrategy
from tests.methods.fedspallm.test_fedspallm import fedspallm_cfg  # noqa: F401 - the fixture


class Nodes:
    def get_node_ids(self) -> list[int]:
        return [1, 2]


def _client_reply(cfg, layers: str = "[1]") -> dict[str, np.ndarray]:
    context = Context(
        run_id=1,
        node_id=3,
        node_config={"partition-id": 0, "num-partitions": 1},
        state=RecordDict(),
        run_config=cfg.to_dict(),
    )
    content = RecordDict(
        {"arrays": ArrayRecord(), "config": ConfigRecord({"server-round": 1, "layers": layers})}
    )
    reply = app(
        Message(content=content, message_type=MessageType.TRAIN, dst_node_id=3), context
    ).content
    return {k: v.numpy() for k, v in reply.array_records["arrays"].items()}


def test_payload_dtype_is_validated_naming_the_key(fedspallm_cfg) -> None:  # noqa: F811
    with pytest.raises(
        ConfigError,
        match="'payload-dtype' must be one of 'float32', 'float16', 'bfloat16', got 'fp8'",
    ):
        fedspallm_cfg.replace(payload_dtype="fp8")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_16_bit_reply_is_the_fp32_reply_rounded_at_half_the_value_bytes(
    fedspallm_cfg,  # noqa: F811
    dtype: str,
    flower_ids: None,
) -> None:
    full = _client_reply(fedspallm_cfg)
    half = _client_reply(fedspallm_cfg.replace(payload_dtype=dtype))
    assert full.keys() == half.keys()
    for k, v in full.items():
        if k.endswith(MASK_SUFFIX):
            np.testing.assert_array_equal(half[k], v)  # the same pruning: the same packed mask
        else:
            np.testing.assert_array_equal(half[k], to_payload(v, dtype))
    values = sum(v.nbytes for k, v in full.items() if not k.endswith(MASK_SUFFIX))
    masks = sum(v.nbytes for k, v in full.items() if k.endswith(MASK_SUFFIX))
    assert record_bytes(to_record(half)) == values // 2 + masks


def _round(cfg, dtype: str, seed: int = 3):
    """A strategy's round-1 messages and hand-built replies (random masks at exactly 50%, unpacked
    forms kept)."""
    strategy = FedSpaLLMStrategy(cfg.replace(payload_dtype=dtype))
    handle = strategy.initial_arrays()
    sent = list(strategy.configure_train(1, handle, ConfigRecord(), Nodes()))
    rng = np.random.default_rng(seed)
    replies, unpacked = [], []
    for i, msg in enumerate(sent):
        names = [k for k in msg.content.array_records["arrays"] if not k.endswith(MASK_SUFFIX)]
        weights = {
            k: (
                strategy.global_state[k]
                + rng.normal(scale=0.01, size=strategy.global_state[k].shape)
            ).astype(np.float32)
            for k in names
        }
        masks = {
            k: (rng.permutation(w.size) < w.size // 2).reshape(w.shape) for k, w in weights.items()
        }  # 50%
        unpacked.append(
            {k: (np.where(masks[k], w, 0).astype(np.float32), masks[k]) for k, w in weights.items()}
        )
        content = RecordDict(
            {
                "arrays": to_record(encode_sparse(weights, masks, dtype)),
                "metrics": MetricRecord({"num-examples": 4, "partition-id": i}),
            }
        )
        replies.append(Message(content=content, reply_to=msg))
    return strategy, sent, replies, unpacked


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_server_sends_and_aggregates_in_the_payload_dtype(
    fedspallm_cfg,  # noqa: F811
    dtype: str,
    flower_ids: None,
) -> None:
    strategy, sent, replies, unpacked = _round(fedspallm_cfg, dtype)
    before = {k: v.copy() for k, v in strategy.global_state.items()}
    for msg in (
        sent
    ):  # down: the global weights, kept values in the payload dtype (the dense model: all kept)
        arrays = {k: v.numpy() for k, v in msg.content.array_records["arrays"].items()}
        shapes = {k: before[k].shape for k in arrays if not k.endswith(MASK_SUFFIX)}
        for k, (values, mask) in decode_sparse(arrays, shapes, dtype).items():
            assert mask.all() and np.array_equal(
                values, from_payload(to_payload(before[k].ravel(), dtype), dtype)
            )
    assert strategy.aggregate_train(1, replies)[0] is not None
    for k in {k for u in unpacked for k in u}:
        got = [
            (np.where(m, from_payload(to_payload(w, dtype), dtype), 0), m)
            for u in unpacked
            if k in u
            for w, m in [u[k]]
        ]
        merged, counts = l0_aggregate([w for w, _ in got], [m for _, m in got])
        np.testing.assert_array_equal(
            strategy.global_state[k], expand_masks(merged, counts, len(got), 0.5)[0]
        )


def test_old_or_mistyped_replies_are_refused_saying_why(
    fedspallm_cfg,  # noqa: F811
    flower_ids: None,
) -> None:
    strategy, sent, replies, unpacked = _round(fedspallm_cfg, "float32")
    rows: list[dict] = []
    strategy.record = rows.append
    old = []  # the first format: dense fp32 weights + bool masks
    for msg, reply, u in zip(sent, replies, unpacked, strict=True):
        arrays = {k: w for k, (w, _) in u.items()} | {k + MASK_SUFFIX: m for k, (_, m) in u.items()}
        old.append(
            Message(
                RecordDict({"arrays": to_record(arrays), "metrics": reply.content["metrics"]}),
                reply_to=msg,
            )
        )
    assert strategy.aggregate_train(1, old) == (None, None)
    assert all(r["status"] == "rejected" for r in rows)
    assert any(
        "unpacked bool mask" in r["problem"] and "update the client" in r["problem"] for r in rows
    ), rows
    rows.clear()
    half = _round(fedspallm_cfg, "float16")[2]
    assert strategy.aggregate_train(
        1, [Message(r.content, reply_to=m) for r, m in zip(half, sent, strict=True)]
    ) == (None, None)
    assert all(
        "payload-dtype 'float32' travels as float32, got float16" in r["problem"] for r in rows
    ), rows


def test_a_checkpoint_from_before_payload_dtype_resumes_and_a_changed_one_fails(
    fedspallm_cfg,  # noqa: F811
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "20260101-000000-fedspallm"
    cfg = fedspallm_cfg.replace(num_server_rounds=3)
    old_config = {k: v for k, v in cfg.to_dict().items() if k != "payload-dtype"}
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(old_config))
    state = {"global-state": {"w": np.ones((2, 2), np.float32)}}
    save_checkpoint(run_dir, 1, run_dir.name, {"global-round": np.ones(1, np.int64)}, state)
    resumed = load_checkpoint(cfg.replace(resume_from=str(run_dir)))
    assert resumed.round == 1 and np.array_equal(
        resumed.strategy["global-state"]["w"], np.ones((2, 2))
    )
    with pytest.raises(ConfigError, match=r"'payload-dtype' \(None -> 'float16'\)"):
        load_checkpoint(cfg.replace(resume_from=str(run_dir), payload_dtype="float16"))
