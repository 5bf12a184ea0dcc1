"""experiments.same_numbers: rows matched whatever their order, every result number compared,
timings not."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.same_numbers import differences, main


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
