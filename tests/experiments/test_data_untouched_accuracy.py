"""probes.data.untouched_accuracy: the Wilson interval against its closed form, and the probe's
accuracy = the run's evaluator on the same items (tiny model, fixture data)."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.probes.data.untouched_accuracy import probe, wilson


def test_wilson_interval_matches_its_textbook_values() -> None:
    lo, hi = wilson(98, 400)  # 0.245 of 400
    assert (round(lo, 4), round(hi, 4)) == (0.2054, 0.2894)  # by hand: 0.2474 ∓ 0.0420
    assert round(wilson(0, 10)[1], 4) == 0.2775
    assert wilson(0, 10)[0] == pytest.approx(0.0, abs=1e-12) and wilson(10, 10)[1] == pytest.approx(
        1.0
    )


def test_probe_scores_the_first_items_of_the_seeded_shuffle(tiny_model_dir: Path) -> None:
    from fedprune_app.llm.data import load_source, seeded_shuffle, write_jsonl
    from fedprune_app.llm.evaluation import lm_eval_accuracy, local_mc_task
    from fedprune_app.llm.models import load_base_model, load_tokenizer

    (row,) = probe(["olmo:piqa"], str(tiny_model_dir), examples=12)
    items = seeded_shuffle(load_source("olmo:piqa"), 0)[:12]
    path = write_jsonl(tiny_model_dir.parent / "piqa12.jsonl", items)
    model, tok = load_base_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    (expected,) = lm_eval_accuracy(model, tok, [local_mc_task("check", path)]).values()
    assert row["n"] == 12 and row["chance"] == pytest.approx(0.5)
    assert row["acc"]["value"] == pytest.approx(expected["acc"])
    lo, hi = row["acc"]["wilson95"]
    assert lo <= row["acc"]["value"] <= hi and row["train-tokens-max"] >= row["train-tokens-mean"]
