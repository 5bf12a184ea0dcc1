"""`fedprune rescore accuracy`: answer scores per example, in document order (paired perplexity units)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedprune_app.llm.data import mc_example
from fedprune_app.llm.evaluation import mean_loss
from fedprune_app.llm.intervals import TokenScores
from fedprune_app.llm.models import load_base_model, load_tokenizer
from fedprune_cli.rescore_accuracy import answer_nll


def test_answer_nll_is_each_answers_own_score_in_order(tiny_model_dir: Path) -> None:
    model, tokenizer = load_base_model(str(tiny_model_dir)).eval(), load_tokenizer(str(tiny_model_dir))
    rows = [mc_example("t", f"What is {i} plus {i}?", [str(2 * i), "seven hundred and one"], i % 2) for i in range(7)]
    scored = answer_nll(model, tokenizer, rows, 64, batch_size=3)
    assert len(scored["nll"]) == len(scored["tokens"]) == 7
    for i, row in enumerate(rows):  # one at a time: the same NLL, so batching and order change nothing
        alone = answer_nll(model, tokenizer, [row], 64, batch_size=1)
        assert scored["tokens"][i] == alone["tokens"][0]
        assert scored["nll"][i] == pytest.approx(alone["nll"][0], rel=1e-4)
    assert scored["tokens"][1] > scored["tokens"][0]  # the long answer has more tokens
    units = TokenScores.of(scored["nll"], scored["tokens"])
    assert units.perplexity == pytest.approx(math.exp(mean_loss(model, tokenizer, rows, 64)), rel=1e-5)
