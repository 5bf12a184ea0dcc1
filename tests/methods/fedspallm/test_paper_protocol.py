"""FedSpaLLM under the paper's protocol (conf/fedspallm-paper.toml): every client calibrates on an
IID share of one generic corpus, and the models are scored on corpora that no client calibrated on,
32,768 tokens of each."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedprune_app.core.config import RunConfig, split_list
from fedprune_app.llm.data import client_data, load_source
from fedprune_app.llm.evaluation import held_out_text
from fedprune_app.llm.models import load_tokenizer
from fedprune_cli.launch import merged_config

ROOT = Path(__file__).resolve().parents[3]
CLIENTS = 4


def paper_config(**overrides: object) -> RunConfig:
    preset = merged_config(ROOT, ["conf/fedspallm-paper.toml"])
    return RunConfig.from_flower({**preset, **overrides})


# the fixture's corpora are small: the same protocol on fewer held-out paragraphs; the preset itself
# on the real data in the slow run
SIZES = [
    pytest.param({"test-examples": 20, "max-train-examples": 30}, id="fixture"),
    pytest.param({}, id="embedded", marks=[pytest.mark.slow, pytest.mark.embedded]),
]


@pytest.mark.parametrize("overrides", SIZES)
def test_no_calibration_text_is_in_an_evaluation_corpus(overrides: dict) -> None:
    cfg = paper_config(**overrides)
    calibration, evaluation = (
        set(split_list(cfg.client_data)),
        set(split_list(cfg.server_eval_data)),
    )
    assert cfg.partitioner == "iid" and calibration and evaluation and not calibration & evaluation
    scored = {source: held_out_text(source, cfg) for source in evaluation}
    shares = [client_data(cfg, k, CLIENTS) for k in range(CLIENTS)]
    for data in shares:  # every client holds generic text only, of both calibration sources (IID)
        assert set(data.sources) == calibration
        for example in data.train:
            assert all(example["response"] not in text for text in scored.values())
    every = {
        e["response"] for source in evaluation for e in load_source(source)
    }  # whole corpora, not only
    pooled = {e["response"] for data in shares for e in data.train}  # the scored paragraphs
    assert not pooled & every
    sizes = [len(d.train) for d in shares]
    assert max(sizes) - min(sizes) <= 1 and len(pooled) == sum(sizes)  # IID shares, disjoint


@pytest.mark.slow
@pytest.mark.embedded
def test_each_evaluation_corpus_is_scored_on_32768_tokens() -> None:
    cfg = paper_config()
    tokenizer = load_tokenizer(cfg.model_name)
    for source in split_list(cfg.server_eval_data):
        assert (
            len(tokenizer(held_out_text(source, cfg))["input_ids"]) >= cfg.eval_ppl_tokens == 32768
        )
