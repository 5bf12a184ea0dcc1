"""probes.sftp.trajectory on the tiny model: the rows it writes, and federated == alone for one
client."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments.probes.sftp.trajectory import make_client, table, trajectory
from experiments.probes.sftp.trajectory_compare import compare, load
from fedprune_app.llm.data import unused_tail
from fedprune_cli.rescore_accuracy import question_digest
from tests.conftest import small_config


def test_rows_per_round_and_one_client_federated_equals_alone(tiny_model_dir: Path) -> None:
    cfg = small_config(
        tiny_model_dir,
        method="sftp",
        num_server_rounds=2,
        local_steps=1,
        keep_ratios="0.5",
        test_examples=4,
    )
    rows = trajectory(cfg, 1, [0], 3, log=lambda _: None)
    assert [(r["mode"], r["round"]) for r in rows] == [
        ("untouched", 0),
        ("federated", 1),
        ("alone", 1),
        ("federated", 2),
        ("alone", 2),
    ]
    assert rows[0]["kept"] == 1.0 and rows[0]["adapter-shift"] == 0.0
    for rnd in (1, 2):  # averaging over a single client is the identity: the same model either way
        fed, alone = (
            next(r for r in rows if r["mode"] == m and r["round"] == rnd)
            for m in ("federated", "alone")
        )
        # 1e-5: the server's average of one reply is exact, but the two clients' float32 runs may
        # sum in another order (seen once at 1.2e-6 in a clean clone); a wrong average or a
        # different model is off by far more
        assert fed["answer-nll"] == pytest.approx(alone["answer-nll"], rel=1e-5)
        assert fed["kept"] == alone["kept"] and fed["adapter-shift"] > 0
    assert "| 2 |" in table(rows)


def test_two_clients_are_averaged(tiny_model_dir: Path) -> None:
    cfg = small_config(
        tiny_model_dir,
        method="sftp",
        num_server_rounds=1,
        local_steps=1,
        keep_ratios="0.5",
        test_examples=4,
    )
    rows = trajectory(cfg, 2, [1], 2, log=lambda _: None)
    fed = {r["client"]: r for r in rows if r["mode"] == "federated"}
    alone = next(r for r in rows if r["mode"] == "alone")
    assert set(fed) == {0, 1} and fed[0]["adapter-shift"] == fed[1]["adapter-shift"]  # one global Φ
    assert alone["adapter-shift"] != fed[1]["adapter-shift"]  # client 1 alone moved Φ on its own


def test_federated_rows_score_the_pair_each_client_deploys(tiny_model_dir: Path) -> None:
    """Under sftp-deploy-state 'local' a federated client's row scores its own (Θ_k, Φ_k), so after
    round 1 it is the client alone's row (both trained once from the same start); under 'global' it
    scores the average."""
    rows = {}
    for state in ("global", "local"):
        cfg = small_config(
            tiny_model_dir,
            method="sftp",
            num_server_rounds=1,
            local_steps=2,
            keep_ratios="0.5",
            test_examples=4,
            sftp_deploy_state=state,
        )
        rows[state] = {
            (r["mode"], r["client"]): r for r in trajectory(cfg, 2, [1], 2, log=lambda _: None)
        }
    local, avg = rows["local"], rows["global"]
    assert (
        local["federated", 0]["adapter-shift"] != local["federated", 1]["adapter-shift"]
    )  # each its own Φ_k
    assert local["federated", 1]["adapter-shift"] == pytest.approx(
        local["alone", 1]["adapter-shift"], rel=1e-5
    )
    assert local["federated", 1]["answer-nll"] == pytest.approx(
        local["alone", 1]["answer-nll"], rel=1e-5
    )
    assert (
        avg["federated", 0]["adapter-shift"] == avg["federated", 1]["adapter-shift"]
    )  # one averaged Φ
    assert avg["federated", 1]["answer-nll"] != pytest.approx(
        local["federated", 1]["answer-nll"], rel=1e-5
    )


def test_alone_only_gives_the_same_alone_rows_without_the_federated_run(
    tiny_model_dir: Path,
) -> None:
    cfg = small_config(
        tiny_model_dir,
        method="sftp",
        num_server_rounds=2,
        local_steps=1,
        keep_ratios="0.5",
        test_examples=4,
    )
    full = trajectory(cfg, 2, [1], 2, log=lambda _: None)
    only = trajectory(cfg, 2, [1], 2, log=lambda _: None, federate=False)
    assert [(r["mode"], r["client"], r["round"]) for r in only] == [
        ("untouched", 1, 0),
        ("alone", 1, 1),
        ("alone", 1, 2),
    ]
    for row in only:  # client 1 alone does not depend on whether the federated run ran beside it
        same = next(
            r
            for r in full
            if (r["mode"], r["client"], r["round"]) == (row["mode"], 1, row["round"])
        )
        assert (
            row["answer-nll"] == pytest.approx(same["answer-nll"], rel=1e-5)
            and row["kept"] == same["kept"]
        )


def test_rows_carry_each_questions_scores_whose_weighted_mean_is_the_answer_nll(
    tiny_model_dir: Path,
) -> None:
    cfg = small_config(
        tiny_model_dir,
        method="sftp",
        num_server_rounds=1,
        local_steps=1,
        keep_ratios="0.5",
        test_examples=4,
    )
    rows = trajectory(cfg, 1, [0], 3, log=lambda _: None, federate=False)
    for row in rows:
        assert len(row["example-nll"]) == len(row["example-tokens"]) == 3
        assert sum(row["example-nll"]) / sum(row["example-tokens"]) == pytest.approx(
            row["answer-nll"], rel=1e-5
        )


def test_unused_examples_extend_the_scored_questions_after_the_test_split(
    tiny_model_dir: Path,
) -> None:
    cfg = small_config(
        tiny_model_dir,
        method="sftp",
        num_server_rounds=1,
        local_steps=1,
        keep_ratios="0.5",
        test_examples=4,
    )
    client = make_client(cfg, 0, 1)
    tail = unused_tail(cfg, client.data.eval_source, 3)
    assert len(tail) == 3 and not {r["question"] for r in tail} & {
        r["question"] for r in client.data.test
    }
    short = trajectory(cfg, 1, [0], 2, log=lambda _: None, federate=False)
    longer = trajectory(cfg, 1, [0], 2, log=lambda _: None, federate=False, unused=3)
    for s_row, l_row in zip(
        short, longer, strict=True
    ):  # the same test questions first, then the tail
        assert len(l_row["example-nll"]) == 5
        assert l_row["example-nll"][:2] == pytest.approx(s_row["example-nll"], rel=1e-5)
        assert l_row["questions"] == question_digest([*client.data.test[:2], *tail])
        assert s_row["questions"] == question_digest(client.data.test[:2])
    with pytest.raises(
        ValueError, match="different questions"
    ):  # same seed, other questions: not paired
        compare({"rows": short}, {"rows": longer}, 0)


def _record(
    untouched: list[float], trained: list[float], tokens: list[int], kept: float = 0.5
) -> dict:
    rows = [
        {
            "mode": "untouched",
            "client": 0,
            "round": 0,
            "kept": 1.0,
            "example-nll": untouched,
            "example-tokens": tokens,
        }
    ]
    rows += [
        {
            "mode": "alone",
            "client": 0,
            "round": r,
            "kept": kept,
            "example-nll": trained if r == 2 else untouched,
            "example-tokens": tokens,
        }
        for r in (1, 2)
    ]
    return {"rows": rows}


def test_compare_pairs_the_last_rounds_question_by_question() -> None:
    """A shift of c nats on every token gives exactly c with a degenerate interval (every resample
    pairs the same questions); the estimate is the token-weighted mean difference, by hand."""
    rng = np.random.default_rng(0)
    tokens = [int(t) for t in rng.integers(1, 9, size=40)]
    base = [float(t * v) for t, v in zip(tokens, rng.uniform(3, 6, size=40), strict=True)]
    a = _record(base, [v + 0.5 * t for v, t in zip(base, tokens, strict=True)], tokens)
    noisy = [
        v + t * float(e)
        for v, t, e in zip(base, tokens, rng.normal(0.2, 1.0, size=40), strict=True)
    ]
    b = _record(base, noisy, tokens, kept=0.51)
    shifted = compare(a, a, 0)
    assert shifted["A - untouched"] == pytest.approx((0.5, 0.5, 0.5))
    assert shifted["B - A"] == pytest.approx((0.0, 0.0, 0.0), abs=1e-12)
    result = compare(a, b, 0)
    by_hand = (sum(noisy) - sum(a["rows"][2]["example-nll"])) / sum(tokens)
    d, lo, hi = result["B - A"]
    assert d == pytest.approx(by_hand) and lo < d < hi and hi - lo > 0.1
    assert result["round"] == (2, 2) and result["kept"] == {"A": 0.5, "B": 0.51}


def test_compare_refuses_records_scored_on_other_questions() -> None:
    a = _record([4.0, 8.0], [3.0, 7.0], [1, 2])
    b = _record([4.0, 8.0], [3.0, 7.0], [2, 2])
    with pytest.raises(ValueError, match="same questions"):
        compare(a, b, 0)
    for record, digest in ((a, "q-a"), (b, "q-b")):
        for row in record["rows"]:
            row["questions"] = digest
    b["rows"] = [r | {"example-tokens": [1, 2]} for r in b["rows"]]  # same counts, other questions
    with pytest.raises(ValueError, match="different questions"):
        compare(a, b, 0)
    old = {"rows": [{k: v for k, v in r.items() if not k.startswith("example")} for r in a["rows"]]}
    with pytest.raises(ValueError, match="per-question scores"):
        compare(old, a, 0)


def test_a_rescored_run_pairs_with_a_trajectory_record_of_its_seed(tmp_path: Path) -> None:
    """A run directory reads as its deployed models at the last round (and the untouched model when
    re-scored with --dense); paired with an alone record on the same questions, the difference is
    the token-weighted one by hand."""
    tokens = [1, 2, 3, 2]
    alone = _record([4.0, 8.0, 9.0, 6.0], [3.0, 6.0, 9.0, 4.0], tokens)
    alone["config"] = {"seed": 0, "client-data": "x", "lora-rank": 8}
    for row in alone["rows"]:
        row["questions"] = "q"
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(
        json.dumps({"seed": 0, "client-data": "x", "num-server-rounds": 3})
    )
    fed_nll = [2.0, 7.0, 9.0, 6.0]
    (run / "rescore.json").write_text(
        json.dumps(
            {
                "clients": {"0": {"questions": "q"}},
                "models": {"final": {"0": {"acc": [1, 0, 1, 0], "nll": fed_nll, "tokens": tokens}}},
            }
        )
    )
    (run / "metrics.jsonl").write_text(
        json.dumps({"phase": "evaluate", "round": 3, "client": 0, "kept-ratio-prunable": 0.5})
        + "\n"
    )
    result = compare(load(run), alone, 0)  # A = the run, B = the client alone; untouched from B
    assert result["round"] == (3, 2) and result["kept"] == {"A": 0.5, "B": 0.5}
    assert result["B - A"][0] == pytest.approx(
        (sum(alone["rows"][2]["example-nll"]) - sum(fed_nll)) / sum(tokens)
    )
    assert result["answer-nll"]["untouched"] == pytest.approx(27.0 / 8)
    (run / "config.json").write_text(
        json.dumps({"seed": 1, "client-data": "x", "num-server-rounds": 3})
    )
    with pytest.raises(ValueError, match="seed differ"):
        compare(load(run), alone, 0)


def test_alone_none_parses_and_needs_the_federated_run(capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.probes.sftp.trajectory import main

    with pytest.raises(
        SystemExit
    ):  # 'none' is a choice, not a client list; alone with no clients is refused
        main(["--alone", "none", "--no-federated"])
    assert "--no-federated needs at least one --alone client" in capsys.readouterr().err
