"""`cache-untouched`: a client answers round 0 from its machine's cache when model, data, settings
and code are the same, scores again when any of them changes, and never keeps a non-finite score."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

import clients.fedit as fedit
from fedprune_app import client_app
from fedprune_app.core import untouched
from tests.conftest import small_config


def _evaluate(
    cfg_keys: dict[str, Any], server_round: int = 0, partition: int = 0
) -> dict[str, Any]:
    msg = Message(
        RecordDict({"config": ConfigRecord({"server-round": server_round})}),
        message_type=MessageType.EVALUATE,
        dst_node_id=7,
    )
    context = Context(
        run_id=1,
        node_id=7,
        state=RecordDict(),
        run_config=cfg_keys,
        node_config={"partition-id": partition, "num-partitions": 2},
    )
    return dict(client_app.evaluate(msg, context).content.metric_records["metrics"])


@pytest.fixture()
def scored(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """FedIT's evaluation replaced by a counter: its n-th call scores acc = n / 10."""
    calls: list[int] = []

    def evaluate(self: fedit.FedITClient, content: RecordDict) -> RecordDict:
        from flwr.app import MetricRecord

        calls.append(1)
        return RecordDict(
            {
                "metrics": MetricRecord({"acc": len(calls) / 10, "num-examples": 8}),
                "info": self.info(),
            }
        )

    monkeypatch.setattr(fedit.FedITClient, "evaluate", evaluate)
    return calls


def test_round_0_is_scored_once_and_answered_from_the_cache(
    tiny_model_dir: Path, scored: list[int], flower_ids: None, untouched_cache: Path
) -> None:
    keys = small_config(tiny_model_dir, cache_untouched=True).to_dict()
    first, second = _evaluate(keys), _evaluate(keys)
    assert len(scored) == 1 and first == {"acc": 0.1, "num-examples": 8}
    assert second == {**first, "cached": 1}
    assert len(list(untouched_cache.iterdir())) == 1
    _evaluate(keys, server_round=1)  # later rounds are never cached
    _evaluate(keys, server_round=1)
    assert len(scored) == 3


def test_training_keys_share_the_score_and_evaluation_keys_do_not(
    tiny_model_dir: Path, scored: list[int], flower_ids: None
) -> None:
    base = dict(cache_untouched=True)
    _evaluate(small_config(tiny_model_dir, **base).to_dict())
    _evaluate(
        small_config(
            tiny_model_dir, **base, local_steps=9, learning_rate=1e-3, num_server_rounds=7
        ).to_dict()
    )
    dp = dict(dp_clipping_norm=50.0, dp_noise_multiplier=1.5, dp_delta=1e-5, dp_max_epsilon=8.0)
    _evaluate(small_config(tiny_model_dir, **base, **dp).to_dict())
    assert len(scored) == 1  # keys that act only after round 0 (DP's included): the same score
    _evaluate(small_config(tiny_model_dir, **base, test_examples=6).to_dict())
    _evaluate(small_config(tiny_model_dir, **base, seed=3).to_dict())
    _evaluate(small_config(tiny_model_dir, **base).to_dict(), partition=1)
    assert len(scored) == 4  # another test split, seed or client: scored again


def test_a_code_change_or_cache_off_scores_again(
    tiny_model_dir: Path, scored: list[int], flower_ids: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = small_config(tiny_model_dir, cache_untouched=True).to_dict()
    _evaluate(keys)
    monkeypatch.setattr(untouched, "_code", lambda module: "another version")
    _evaluate(keys)
    _evaluate({**keys, "cache-untouched": False})
    _evaluate({**keys, "cache-untouched": False})
    assert len(scored) == 4


def test_a_non_finite_score_or_a_foreign_file_is_never_used(untouched_cache: Path) -> None:
    untouched.store("k", {"acc": float("nan")})
    assert untouched.lookup("k") is None and not any(untouched_cache.iterdir())
    (untouched_cache / "j.json").write_text('{"acc": "import os"}')
    assert untouched.lookup("j") is None
    untouched.store("i", {"acc": 0.5, "n": 3})
    assert untouched.lookup("i") == {"acc": 0.5, "n": 3}


def test_a_cached_nan_or_bool_is_not_used(untouched_cache: Path) -> None:
    (untouched_cache / "n.json").write_text('{"acc": NaN}')
    (untouched_cache / "b.json").write_text('{"acc": true}')
    assert untouched.lookup("n") is None and untouched.lookup("b") is None


def test_the_key_follows_the_contents_of_jsonl_data_and_eval_yamls(tmp_path: Path) -> None:
    """Same size, same mtime, other contents: another key (an edited file is scored again)."""
    import os

    data = tmp_path / "a.jsonl"
    data.write_text('{"text": "one"}\n')
    include = tmp_path / "tasks"
    include.mkdir()
    (include / "t.yaml").write_text("task: a\n")
    config = {"client-data": f"jsonl:{data}", "eval-include-path": str(include)}

    def key() -> str:
        return untouched.cache_key(config, {"partition-id": 0}, "clients.fedit")

    first = key()
    stat = data.stat()
    data.write_text('{"text": "two"}\n')
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    second = key()
    (include / "t.yaml").write_text("task: b\n")
    assert len({first, second, key()}) == 3
