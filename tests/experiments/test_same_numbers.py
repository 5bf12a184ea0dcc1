"""experiments.same_numbers: rows matched whatever their order, every result number compared,
timings not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.same_numbers import differences, main, paired_runs


def run(path: Path, rows: list[dict]) -> Path:
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_runs_in_another_reply_order_agree_and_a_changed_number_is_named(tmp_path: Path) -> None:
    rows = [
        {
            "phase": "evaluate",
            "round": 1,
            "client": c,
            "data": f"d{c}",
            "ppl": 10.0 + c,
            "seconds": c,
        }
        for c in range(3)
    ]
    a = run(tmp_path / "a", rows)
    b = run(
        tmp_path / "b", [{**r, "seconds": 99} for r in reversed(rows)]
    )  # other order, other timings
    assert differences(a, b) == (9, [], [])  # round, client and ppl of 3 rows; seconds skipped
    assert main([str(a), str(b)]) == 0
    c = run(tmp_path / "c", [*rows[:2], {**rows[2], "ppl": 12.5}])
    compared, differ, unmatched = differences(a, c)
    assert differ == ["('evaluate', 1, 2, 'd2', 'None') ppl: 12.0 vs 12.5"] and not unmatched
    assert main([str(a), str(c)]) == 1
    d = run(tmp_path / "d", rows[:2])
    assert differences(a, d)[2] == ["('evaluate', 1, 2, 'd2', 'None')"]


def test_sets_pair_runs_by_name_and_fail_on_one_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"phase": "evaluate", "round": 1, "client": 0, "data": "d", "ppl": 10.0}]
    before, after = tmp_path / "before", tmp_path / "after"
    before.mkdir(), after.mkdir()
    run(before / "20261206-110000-fedit-smoke", rows)
    run(before / "20261206-110500-sftp", rows)
    run(after / "20261206-120000-fedit-smoke", rows)
    run(after / "20261206-120700-sftp", [{**rows[0], "ppl": 11.0}])
    run(after / "20261206-121000-slicegpt-smoke", rows)  # no partner: not compared
    assert [n for n, _, _ in paired_runs(before, after)] == ["fedit-smoke", "sftp"]
    assert main(["--sets", str(before), str(after)]) == 1
    table = capsys.readouterr().out
    assert (
        "| fedit-smoke | `20261206-110000-fedit-smoke` |" in table and "ppl: 10.0 vs 11.0" in table
    )
    (after / "20261206-120700-sftp" / "metrics.jsonl").unlink()
    run(after / "20261206-120800-sftp", rows)
    assert main(["--sets", str(before), str(after)]) == 0
