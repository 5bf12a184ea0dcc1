"""The privacy-utility curve's cells and table (experiments/dp_utility.py), without running them."""

from __future__ import annotations

import math
import shlex

import pytest

from experiments import dp_utility
from fedprune_app.core.config import RunConfig
from fedprune_app.core.privacy import DPConfig, check_private
from tests.dp_reference import dp_accounting_epsilon


def _args(*argv: str):  # -> argparse.Namespace as main parses it
    captured = {}

    def keep(args):  # noqa: ANN001, ANN202
        captured["args"] = args
        return []

    real = dp_utility.cells
    dp_utility.cells = keep  # type: ignore[assignment]
    try:
        dp_utility.main(["--dry-run", *argv])
    finally:
        dp_utility.cells = real  # type: ignore[assignment]
    return captured["args"]


def test_every_cell_is_a_valid_dp_run_reaching_its_target_epsilon_at_delta_one_over_n() -> None:
    from fedprune_cli import launch

    args = _args("--clients", "100", "--rounds", "3", "--out", "/tmp/dp-utility-test")
    cells = dp_utility.cells(args)
    assert [(c.method, c.epsilon) for c in cells] == [
        (m, e) for m in ("fedit", "sftp") for e in (math.inf, 8.0, 2.0)
    ]
    for cell in cells:
        cfg = RunConfig.from_flower(launch.merged_config(dp_utility.ROOT, list(cell.run_config)))
        check_private(cfg)
        dp = cfg.section(DPConfig)
        assert (
            cfg.method == cell.method
            and cfg.num_server_rounds == 3
            and dp.dp_delta == pytest.approx(0.01)
        )
        assert dp.dp_clipping_norm == 0.1 and dp.dp_noise_multiplier == cell.sigma
        if math.isinf(cell.epsilon):
            assert cell.sigma == 0.0  # the same clipping, no noise
        else:
            eps = dp_accounting_epsilon(cell.sigma, 3, 0.01)
            assert 0.995 * cell.epsilon < eps <= cell.epsilon


def test_the_table_shows_each_client_before_and_after_with_n_and_interval() -> None:
    row = {
        "client": 3,
        "data": "bigbench:social_iqa",
        "acc/untouched": 0.45,
        "acc/tuned": 0.5,
        "acc-lo/tuned": 0.4,
        "acc-hi/tuned": 0.6,
        "acc-n/tuned": 60,
    }
    record = {
        **GRID,
        "cells": [
            {
                "method": "fedit",
                "epsilon": 8.0,
                "sigma": 0.78,
                "result": {"privacy": {"epsilon": 7.99}, "clients": [row]},
            }
        ],
    }
    text = dp_utility.render(record)
    assert (  # noise std σ·C/m = 0.78 · 0.1 / 10
        "| fedit | 8.0 | 0.78 | 0.0078 | 7.99 | 3 | bigbench:social_iqa | acc | 0.450 | 0.500 "
        "[0.400, 0.600] | 60 |" in text
    )
    assert "Not measured" in text


def test_the_dry_run_prints_one_fedprune_command_per_cell(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert dp_utility.main(["--dry-run", "--methods", "fedit", "--epsilons", "inf,8"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all(shlex.split(line)[:2] == ["fedprune", "run"] for line in lines)


GRID = {"clients": 100, "fraction": 0.1, "rounds": 3, "clipping-norm": 0.1}


def _plan(*cells: tuple[str, object]) -> dict:
    return {**GRID, "cells": [{"method": m, "epsilon": e, "sigma": 0.5} for m, e in cells]}


def test_a_finished_cell_is_kept_and_an_unfinished_one_planned_again() -> None:
    old = _plan(("fedit", "inf"), ("fedit", 8.0))
    old["cells"][0]["result"] = {"clients": []}  # inf finished, 8 did not
    new = dp_utility.merged(old, _plan(("fedit", "inf"), ("fedit", 8.0), ("sftp", 2.0)), False)
    assert [("result" in c, c["method"], c["epsilon"]) for c in new["cells"]] == [
        (True, "fedit", "inf"),
        (False, "fedit", 8.0),
        (False, "sftp", 2.0),
    ]
    forced = dp_utility.merged(old, _plan(("fedit", "inf")), True)
    assert ["result" in c for c in forced["cells"]] == [False]
    kept = dp_utility.merged(old, _plan(("sftp", 2.0)), False)  # a narrower plan keeps the rest
    assert [("result" in c, c["method"]) for c in kept["cells"]] == [
        (False, "sftp"),
        (True, "fedit"),
    ]


def test_a_record_of_another_grid_is_refused_not_mixed() -> None:
    other = {**_plan(("fedit", "inf")), "clients": 1000}
    with pytest.raises(SystemExit, match="clients=1000"):
        dp_utility.merged(other, _plan(("fedit", "inf")), False)
    old = _plan(("fedit", "inf"))
    old["cells"][0]["result"] = {"clients": []}
    with pytest.raises(SystemExit, match="rounds=3"):  # FedIT's finished cell ran 3 rounds, not 6
        dp_utility.merged(old, {**_plan(("fedit", 8.0)), "rounds": {"fedit": 6}}, False)


def test_each_method_runs_its_own_rounds_and_the_record_keeps_both() -> None:
    """SFT-P's cells run its preset's 6 rounds (its masks need the steps), FedIT's 3; σ is derived
    for each cell's own rounds, and a record of FedIT's finished cells takes SFT-P's beside them."""
    args = _args("--clients", "100", "--rounds", "fedit=3,sftp=6", "--out", "/tmp/dp-utility-test")
    by_method = {(c.method, c.epsilon): c for c in dp_utility.cells(args)}
    from fedprune_cli import launch

    for (method, eps), cell in by_method.items():
        cfg = RunConfig.from_flower(launch.merged_config(dp_utility.ROOT, list(cell.run_config)))
        rounds = {"fedit": 3, "sftp": 6}[method]
        assert cfg.num_server_rounds == rounds
        if not math.isinf(eps):
            assert 0.995 * eps < dp_accounting_epsilon(cell.sigma, rounds, 0.01) <= eps
    assert by_method[("sftp", 8.0)].sigma > by_method[("fedit", 8.0)].sigma
    old = _plan(("fedit", "inf"))  # an earlier record: `rounds` one int
    old["cells"][0]["result"] = {"clients": []}
    new = dp_utility.merged(old, {**_plan(("sftp", "inf")), "rounds": {"sftp": 6}}, False)
    assert new["rounds"] == {"sftp": 6, "fedit": 3}
    assert [(c["method"], "result" in c) for c in new["cells"]] == [
        ("sftp", False),
        ("fedit", True),
    ]


def test_the_server_table_shows_round_0_beside_the_last_round() -> None:
    server = {"0": {"ppl `squad`": 15.06}, "3": {"ppl `squad`": 16.5}, "1": {"ppl `squad`": 15.4}}
    record = {
        **GRID,
        "cells": [
            {
                "method": "fedit",
                "epsilon": 2.0,
                "sigma": 2.2,
                "result": {"privacy": {"epsilon": 1.99}, "server": server},
            }
        ],
    }
    assert "| fedit | 2.0 | 1.99 | ppl `squad` | 15.060 | 16.500 (round 3) |" in dp_utility.render(
        record
    )


def test_clients_scored_alike_share_a_line_and_others_keep_theirs() -> None:
    def row(client: int, data: str, tuned: float) -> dict:
        return {
            "client": client,
            "data": data,
            "acc/untouched": 0.4,
            "acc/tuned": tuned,
            "acc-n/tuned": 60,
        }

    rows = [row(3, "a", 0.5), row(9, "b", 0.5), row(5, "a", 0.5), row(7, "a", 0.6)]
    record = {
        **GRID,
        "cells": [
            {
                "method": "fedit",
                "epsilon": "inf",
                "sigma": 0.0,
                "result": {"privacy": {}, "clients": rows},
            }
        ],
    }
    text = dp_utility.render(record)
    assert "| fedit | inf | 0 | 0 | ∞ | 3, 5 | a | acc | 0.400 | 0.500 | 60 |" in text
    assert "| 9 | b |" in text and "| 7 | a | acc | 0.400 | 0.600 |" in text


def test_noise_sized_as_more_clients_gives_their_noise_std_at_the_target_epsilon() -> None:
    from fedprune_app.core.privacy import noise_multiplier_for

    argv = ["--clients", "4", "--fraction", "1", "--methods", "sftp", "--epsilons", "8"]
    argv += ["--delta", "1e-5", "--clipping-norm", "50", "--out", "/tmp/dp-utility-test"]
    (plain,) = dp_utility.cells(_args(*argv))
    (scaled,) = dp_utility.cells(_args(*argv, "--noise-as-clients", "1000"))
    target = noise_multiplier_for(8.0, 6, 1e-5)  # σ of 1000 clients per round at ε = 8
    assert plain.sigma == pytest.approx(target, abs=1e-4)
    # this run's noise std σ·C/m (m = 4) is that of m = 1000 at ε = 8, rounded up by < 1e-4 in σ
    assert scaled.sigma * 50 / 4 == pytest.approx(target * 50 / 1000, abs=1e-4 * 50 / 4)
    assert target * 4 / 1000 <= scaled.sigma <= target * 4 / 1000 * (1 + 1e-4)
    assert "as-1000" in scaled.run_config[1]
    assert (
        dp_utility.ceil_digits(1.563471) == 1.5635
        and dp_utility.ceil_digits(0.00062539) == 0.00062539
    )
    old = {**_plan(("sftp", 8.0)), "noise-as-clients": 1000}
    old["cells"][0]["result"] = {"clients": []}
    with pytest.raises(SystemExit, match="another grid"):
        dp_utility.merged(old, _plan(("sftp", 8.0)), False)
    record = {**old, "clients": 4, "fraction": 1.0, "clipping-norm": 50.0, "sampled": 4}
    assert "equals that of m = 1000" in dp_utility.render(record)
