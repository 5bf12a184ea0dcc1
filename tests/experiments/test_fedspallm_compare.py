"""probes.fedspallm.compare: two runs paired on the same windows, checked against a brute-force
bootstrap."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks import render as render_bench
from experiments.probes.fedspallm import compare as fedspallm_compare
from fedprune_app.llm.intervals import TokenScores

N = 40


def scores(rng: np.random.Generator, shift: float = 0.0) -> TokenScores:
    tokens = rng.integers(200, 256, size=N)
    return TokenScores.of(list(tokens * (3.0 + shift + rng.normal(0, 0.3, size=N))), list(tokens))


def run_scores(seed: int, fed_shift: float, dense: TokenScores) -> dict[str, list[TokenScores]]:
    rng = np.random.default_rng(seed)
    tokens = dense.tokens
    per = [TokenScores(tokens * (4.0 + rng.normal(0, 0.2, size=N)), tokens) for _ in range(3)]
    fed = TokenScores(tokens * (4.0 + fed_shift + rng.normal(0, 0.2, size=N)), tokens)
    return {"dense": [dense], "fedspallm": [fed], "standalone": per}


def brute_force(base: dict, variant: dict, iters: int, seed: int) -> np.ndarray:
    """Δ(global − standalone mean) per bootstrap sample, one model and one window at a time."""
    idx = np.random.default_rng(seed).integers(0, N, size=(iters, N))

    def ppl(s: TokenScores, pick: np.ndarray) -> float:
        return math.exp(sum(s.nll[i] for i in pick) / sum(int(s.tokens[i]) for i in pick))

    out = []
    for pick in idx:
        stat = [
            ppl(r["fedspallm"][0], pick) - np.mean([ppl(s, pick) for s in r["standalone"]])
            for r in (base, variant)
        ]
        out.append(stat[1] - stat[0])
    return np.array(out)


def test_difference_of_the_claims_statistic_matches_a_brute_force_bootstrap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fedspallm_compare, "ITERS", 300)
    dense = scores(np.random.default_rng(0))
    base, variant = run_scores(1, 0.4, dense), run_scores(2, -0.2, dense)
    row = fedspallm_compare.compare_corpus(base, variant)
    gap = [
        r["fedspallm"][0].perplexity - np.mean([s.perplexity for s in r["standalone"]])
        for r in (base, variant)
    ]
    point, lo, hi = row["variant - base"]["global - standalone mean"]
    assert point == pytest.approx(gap[1] - gap[0])
    expected = np.percentile(brute_force(base, variant, 300, 0), [2.5, 97.5])
    assert [lo, hi] == pytest.approx(list(expected), rel=1e-9)
    assert row["base"]["global - standalone mean"][0] == pytest.approx(gap[0])
    assert hi < 0  # the variant's global model sits 0.6 nats per token lower: resolved
    assert row["windows"] == N and row["dense"] == pytest.approx(dense.perplexity)


def test_the_same_run_against_itself_differs_by_exactly_zero() -> None:
    dense = scores(np.random.default_rng(3))
    run = run_scores(4, 0.1, dense)
    row = fedspallm_compare.compare_corpus(run, run)
    assert all(row["variant - base"][k] == [0.0, 0.0, 0.0] for k in fedspallm_compare.STATISTICS)


def test_runs_that_scored_other_windows_are_refused() -> None:
    rng = np.random.default_rng(5)
    base, variant = run_scores(1, 0.0, scores(rng)), run_scores(2, 0.0, scores(rng))
    with pytest.raises(ValueError, match="same windows"):
        fedspallm_compare.compare_corpus(base, variant)


def write_run(folder: Path, run: dict[str, list[TokenScores]], corpus: str) -> Path:
    """A metrics.jsonl with the rows `window_scores` reads: the server's rounds 0 and 1 and one
    reference per client."""
    folder.mkdir(parents=True)

    def row(s: TokenScores, **kw: object) -> dict:
        return {
            **kw,
            "data": corpus,
            "window-nll": s.nll.tolist(),
            "window-tokens": s.tokens.tolist(),
        }

    rows = [
        row(run["dense"][0], phase="server-evaluate", round=0),
        row(run["fedspallm"][0], phase="server-evaluate", round=1),
    ]
    rows += [
        row(s, phase="reference", model="standalone", client=k)
        for k, s in enumerate(run["standalone"])
    ]
    rows += [
        {"phase": "train", "round": 1, "client": k, "calib-tokens": 8192}
        for k in range(len(run["standalone"]))
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_cli_writes_a_record_that_renders(tmp_path: Path) -> None:
    dense = scores(np.random.default_rng(7))
    base = write_run(tmp_path / "a-seed1", run_scores(1, 0.3, dense), "squad_shifts:nyt")
    variant = write_run(tmp_path / "b-seed1", run_scores(2, 0.0, dense), "squad_shifts:nyt")
    out = tmp_path / "cmp.json"
    record = fedspallm_compare.main(
        ["--base", str(base), "--variant", str(variant), "--label", "calib 1024", "--out", str(out)]
    )
    assert json.loads(out.read_text())["corpora"].keys() == {"squad_shifts:nyt"}
    table = render_bench.render("fedspallm-compare", [out])
    assert "| calib 1024 | `nyt` | 40 |" in table and record["kind"] == "fedspallm-compare"
    assert record["runs"]["base"] == {"seconds": None, "calib-tokens": [8192]}
    assert "base `a-seed1` (8,192 calibration tokens per client, time not recorded)" in table


def test_a_run_without_standalone_models_is_refused_by_name(tmp_path: Path) -> None:
    dense = scores(np.random.default_rng(8))
    run = run_scores(1, 0.0, dense)
    base = write_run(tmp_path / "a", run, "c")
    bare = write_run(tmp_path / "b", {**run, "standalone": []}, "c")
    with pytest.raises(ValueError, match="standalone"):
        fedspallm_compare.compare_runs(base, bare)
