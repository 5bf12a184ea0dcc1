"""tools/sftp_trajectory.py on the tiny model: the rows it writes, and federated == alone for one client."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import small_config
from tools.sftp_trajectory import table, trajectory


def test_rows_per_round_and_one_client_federated_equals_alone(tiny_model_dir: Path) -> None:
    cfg = small_config(tiny_model_dir, method="sftp", num_server_rounds=2, local_steps=1, sftp_keep_ratios="0.5",
                       test_examples=4)
    rows = trajectory(cfg, 1, [0], 3, log=lambda _: None)
    assert [(r["mode"], r["round"]) for r in rows] == [("untouched", 0), ("federated", 1), ("alone", 1),
                                                       ("federated", 2), ("alone", 2)]
    assert rows[0]["kept"] == 1.0 and rows[0]["adapter-shift"] == 0.0
    for rnd in (1, 2):  # averaging over a single client is the identity: the same model either way
        fed, alone = (next(r for r in rows if r["mode"] == m and r["round"] == rnd) for m in ("federated", "alone"))
        # 1e-5: the server's average of one reply is exact, but the two clients' float32 runs may sum in another
        # order (seen once at 1.2e-6 in a clean clone); a wrong average or a different model is off by far more
        assert fed["answer-nll"] == pytest.approx(alone["answer-nll"], rel=1e-5)
        assert fed["kept"] == alone["kept"] and fed["adapter-shift"] > 0
    assert "| 2 |" in table(rows)


def test_two_clients_are_averaged(tiny_model_dir: Path) -> None:
    cfg = small_config(tiny_model_dir, method="sftp", num_server_rounds=1, local_steps=1, sftp_keep_ratios="0.5",
                       test_examples=4)
    rows = trajectory(cfg, 2, [1], 2, log=lambda _: None)
    fed = {r["client"]: r for r in rows if r["mode"] == "federated"}
    alone = next(r for r in rows if r["mode"] == "alone")
    assert set(fed) == {0, 1} and fed[0]["adapter-shift"] == fed[1]["adapter-shift"]  # one global Φ
    assert alone["adapter-shift"] != fed[1]["adapter-shift"]  # client 1 alone moved Φ on its own


def test_alone_only_gives_the_same_alone_rows_without_the_federated_run(tiny_model_dir: Path) -> None:
    cfg = small_config(tiny_model_dir, method="sftp", num_server_rounds=2, local_steps=1, sftp_keep_ratios="0.5",
                       test_examples=4)
    full = trajectory(cfg, 2, [1], 2, log=lambda _: None)
    only = trajectory(cfg, 2, [1], 2, log=lambda _: None, federate=False)
    assert [(r["mode"], r["client"], r["round"]) for r in only] == [("untouched", 1, 0), ("alone", 1, 1),
                                                                    ("alone", 1, 2)]
    for row in only:  # client 1 alone does not depend on whether the federated run ran beside it
        same = next(r for r in full if (r["mode"], r["client"], r["round"]) == (row["mode"], 1, row["round"]))
        assert row["answer-nll"] == pytest.approx(same["answer-nll"], rel=1e-5) and row["kept"] == same["kept"]
