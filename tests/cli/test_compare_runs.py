"""`fedprune compare`: two re-scored runs, per client, against a brute-force computation."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from fedprune_cli.compare import compare, compare_pooled
from fedprune_cli.main import main


def write_run(
    path: Path,
    per_client: dict[int, tuple[list[float], list[float], list[int]]],
    model: str = "final",
) -> Path:
    """A rescore.json as fedprune_cli/rescore_accuracy.py writes it: {client: (acc, nll,
    tokens)}."""
    path.mkdir(parents=True)
    models = {
        model: {
            str(k): {"acc": acc, "acc_norm": acc, "nll": nll, "tokens": tokens}
            for k, (acc, nll, tokens) in per_client.items()
        }
    }
    (path / "rescore.json").write_text(
        json.dumps(
            {
                "per-source": 10,
                "clients": [str(k) for k in per_client],
                "models": models,
                "seconds": 1.0,
            }
        )
    )
    return path


def client(seed: int, shift: float, n: int = 40) -> tuple[list[float], list[float], list[int]]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 6, n).tolist()
    nll = [t * (2.0 + shift) + float(rng.normal(0, 0.1)) for t in tokens]
    return rng.integers(0, 2, n).astype(float).tolist(), nll, tokens


def test_perplexities_and_accuracy_deltas_match_brute_force(tmp_path: Path) -> None:
    a = {0: client(0, 1.0), 1: client(1, 1.0)}
    b = {0: client(0, 0.0), 1: client(1, 0.0)}
    b[1] = ([1.0 - x for x in b[1][0]], b[1][1], b[1][2])  # B's client 1 answers the other way
    lines = compare(write_run(tmp_path / "a", a), write_run(tmp_path / "b", b))
    for k in (0, 1):  # answer perplexity = exp(sum NLL / sum tokens), per client
        ppl_a, ppl_b = (math.exp(sum(r[k][1]) / sum(r[k][2])) for r in (a, b))
        assert f"client {k}: {ppl_a:.2f} vs {ppl_b:.2f}" in lines[0]
    assert "**not held**" in lines[0]  # A is e^1 times B on every answer: every interval excludes 0
    deltas = [100 * (np.mean(a[k][0]) - np.mean(b[k][0])) for k in (0, 1)]
    found = [float(x) for x in re.findall(r"Δ ([+-][0-9.]+) \[", lines[1])]
    assert found == pytest.approx([*deltas, np.mean(deltas)], abs=0.051)


def test_a_dense_reference_and_mismatched_examples(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", {0: client(0, 0.0)})
    dense = write_run(tmp_path / "b", {0: client(0, 0.0)}, model="dense")
    line = compare(a, dense, "dense")[
        0
    ]  # the same answers, read from B's `dense` model: Δ exactly 0
    assert "**held**" in line and "Δ +0.00 [0.00, 0.00], n = 40" in line
    with pytest.raises(SystemExit, match="no re-scored answers"):
        compare(a, dense)  # B has no final models
    short = write_run(tmp_path / "c", {0: client(0, 0.0, n=30)})
    with pytest.raises(SystemExit, match="different examples"):
        compare(a, short)


def with_digests(run: Path, digests: dict[int, str]) -> Path:
    """Give run's rescore.json the per-client question digests fedprune_cli/rescore_accuracy.py
    writes."""
    record = json.loads((run / "rescore.json").read_text())
    record["clients"] = {str(k): {"questions": d} for k, d in digests.items()}
    (run / "rescore.json").write_text(json.dumps(record))
    return run


def test_runs_scored_on_different_questions_are_refused(tmp_path: Path) -> None:
    scores = {0: client(0, 0.0), 1: client(1, 0.0)}
    a = with_digests(write_run(tmp_path / "a", scores), {0: "q0", 1: "q1"})
    same = with_digests(write_run(tmp_path / "same", scores), {0: "q0", 1: "q1"})
    assert "Δ +0.00 [0.00, 0.00]" in compare(a, same)[0]
    other = with_digests(write_run(tmp_path / "other", scores), {0: "q0", 1: "another draw"})
    with pytest.raises(
        SystemExit, match=r"client\(s\) \[1\] were re-scored on different questions"
    ):
        compare(a, other)
    # records without digests (before 2026-11-28): the split keys of the two run configs decide
    old_a, old_b = write_run(tmp_path / "old-a", scores), write_run(tmp_path / "old-b", scores)
    for run, seed in ((old_a, 0), (old_b, 0)):
        (run / "config.json").write_text(
            json.dumps({"seed": seed, "client-data": "x,y", "lora-rank": seed + 4})
        )
    compare(old_a, old_b)  # same splits, another training key: paired
    (old_b / "config.json").write_text(json.dumps({"seed": 1, "client-data": "x,y"}))
    with pytest.raises(SystemExit, match="seed differ"):
        compare(old_a, old_b)


def test_pairs_pool_by_their_means_and_the_interval_holds_their_spread(tmp_path: Path) -> None:
    """Two seed replicates: the pooled Δ is the mean of the pairs' Δ (brute force), n counts both,
    and when the pairs disagree (A above B in one, below in the other, each decisively) the pooled
    interval holds both."""
    up = (
        write_run(tmp_path / "a1", {0: client(0, 1.0)}),
        write_run(tmp_path / "b1", {0: client(0, 0.0)}),
    )
    down = (
        write_run(tmp_path / "a2", {0: client(1, 0.0)}),
        write_run(tmp_path / "b2", {0: client(1, 1.0)}),
    )
    assert "**not held**" in compare(*up)[0] and "**held**" in compare(*down)[0]
    lines = compare_pooled([up, down])
    ppl = [
        [math.exp(sum(c[1]) / sum(c[2])) for c in (client(s, 1.0 - s), client(s, float(s)))]
        for s in (0, 1)
    ]
    mean_a, mean_b = np.mean([p[0] for p in ppl]), np.mean([p[1] for p in ppl])
    assert (
        f"client 0: {mean_a:.2f} vs {mean_b:.2f}" in lines[0] and "pooled over 2 pairs" in lines[0]
    )
    lo, hi = (
        float(x)
        for x in re.search(r"Δ [+-][0-9.]+ \[([-0-9.]+), ([-0-9.]+)\], n = 80", lines[0]).groups()
    )
    assert lo < min(p[0] - p[1] for p in ppl) + 0.5 and hi > max(p[0] - p[1] for p in ppl) - 0.5
    assert "**unresolved**" in lines[0]
    acc = [100 * (np.mean(client(s, 1.0 - s)[0]) - np.mean(client(s, float(s))[0])) for s in (0, 1)]
    found = float(re.search(r"client 0: Δ ([+-][0-9.]+) \[", lines[1]).group(1))
    assert found == pytest.approx(np.mean(acc), abs=0.051) and "n = 80" in lines[1]


def test_the_command_line_takes_runs_in_pairs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_run(tmp_path / "a", {0: client(0, 0.0)})
    assert main(["compare", str(a), str(a), str(a)]) == 2
    assert "runs come in pairs" in capsys.readouterr().err
    assert main(["compare", str(a), str(a), str(a), str(a)]) == 0
    assert "A2 = a" in capsys.readouterr().out
    assert main(["compare", str(a), str(a), "--ratio-goal", "0"]) == 2
    assert "--ratio-goal must be a positive ratio" in capsys.readouterr().err


def test_the_ratio_to_a_goal_is_the_paired_perplexity_ratio(tmp_path: Path) -> None:
    """`--ratio-goal`: per client ppl(A) / ppl(B) with the interval
    `intervals.paired_perplexity_interval` gives (one pair: the same draws), judged at or below the
    goal over the whole interval."""
    from fedprune_app.llm.intervals import TokenScores, paired_perplexity_interval

    a_scores, b_scores = (
        client(0, 0.3),
        client(0, 0.0),
    )  # A e^0.3 = 1.35 times B on every answer token
    a, b = write_run(tmp_path / "a", {0: a_scores}), write_run(tmp_path / "b", {0: b_scores})
    ref = paired_perplexity_interval(
        TokenScores.of(a_scores[1], a_scores[2]),
        TokenScores.of(b_scores[1], b_scores[2]),
        "ratio",
        iters=2000,
        seed=0,
    )
    for goal, verdict in ((1.25, "**not held**"), (1.5, "**held**")):
        line = compare_pooled([(a, b)], ratio_goal=goal)[2]
        assert line.startswith(f"answer perplexity ratio A / B at or below {goal:g}: {verdict}")
        assert f"client 0: {ref.estimate:.2f} vs {goal:.2f}" in line
        assert f"[{ref.lo - goal:.2f}, {ref.hi - goal:.2f}], n = 40" in line
    assert len(compare_pooled([(a, b)])) == 2  # no goal, no ratio line


def write_rouge_run(path: Path, scores: list[float], seed: int = 0) -> Path:
    """A run re-scored by `fedprune rescore rouge`: config.json and rescore.json with Rouge-L per
    example."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"method": "fedit", "seed": seed}))
    (path / "rescore.json").write_text(
        json.dumps(
            {
                "examples": len(scores),
                "per-source": 10,
                "rouge-l": float(np.mean(scores)),
                "scores": scores,
            }
        )
    )
    return path


def test_two_fedit_runs_compare_on_rouge_paired_per_example(tmp_path: Path) -> None:
    """Instruction-tuning runs compare by Rouge-L: the effect is the mean paired difference, its
    interval holds it, and a difference of noise only reads unresolved."""
    rng = np.random.default_rng(3)
    base = rng.uniform(0.1, 0.6, 200)
    a = write_rouge_run(tmp_path / "a", (base + 0.1).tolist())
    b = write_rouge_run(tmp_path / "b", base.tolist())
    line = compare_pooled([(a, b)])[0]
    effect, lo, hi = (
        float(x) for x in re.search(r"Δ ([+-][0-9.]+) \[([-0-9.]+), ([-0-9.]+)\]", line).groups()
    )
    assert effect == pytest.approx(10.0, abs=0.01) and lo <= effect <= hi and "A above B" in line
    noise = rng.normal(0, 0.05, 100)
    c = write_rouge_run(
        tmp_path / "c", (base + np.concatenate([noise, -noise])).tolist()
    )  # mean Δ exactly 0
    assert "**unresolved**" in compare_pooled([(c, b)])[0]
    d = write_rouge_run(tmp_path / "d", base.tolist(), seed=1)
    with pytest.raises(SystemExit, match="seed"):
        compare_pooled([(a, d)])
