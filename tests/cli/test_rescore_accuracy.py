"""`fedprune rescore accuracy`: answer scores per example, in document order (paired perplexity
units)."""

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
    model, tokenizer = (
        load_base_model(str(tiny_model_dir)).eval(),
        load_tokenizer(str(tiny_model_dir)),
    )
    rows = [
        mc_example("t", f"What is {i} plus {i}?", [str(2 * i), "seven hundred and one"], i % 2)
        for i in range(7)
    ]
    scored = answer_nll(model, tokenizer, rows, 64, batch_size=3)
    assert len(scored["nll"]) == len(scored["tokens"]) == 7
    for i, row in enumerate(
        rows
    ):  # one at a time: the same NLL, so batching and order change nothing
        alone = answer_nll(model, tokenizer, [row], 64, batch_size=1)
        assert scored["tokens"][i] == alone["tokens"][0]
        assert scored["nll"][i] == pytest.approx(alone["nll"][0], rel=1e-4)
    assert scored["tokens"][1] > scored["tokens"][0]  # the long answer has more tokens
    units = TokenScores.of(scored["nll"], scored["tokens"])
    assert units.perplexity == pytest.approx(
        math.exp(mean_loss(model, tokenizer, rows, 64)), rel=1e-5
    )


def test_a_fedit_and_a_flexlora_run_are_scored_with_the_models_their_clients_use(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """LoRA runs re-score too (so `fedprune compare` takes them): FedIT's global adapter on the base
    model for every client, FlexLoRA's per-client adapter for each; `dense` adds the untouched base
    model. The loaded model gives the adapter's own output, not the base model's."""
    import json

    import torch
    from peft import LoraConfig, get_peft_model

    from fedprune_app.core.config import RunConfig
    from fedprune_cli.rescore_accuracy import models_of

    def adapter(path: Path, rank: int, seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        model = get_peft_model(
            load_base_model(str(tiny_model_dir)),
            LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"]),
        )
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(
                    p, std=0.5
                )  # a non-zero delta: the adapter changes the output
        model.save_pretrained(path)
        return model.eval()(torch.tensor([[1, 2, 3]])).logits

    ids = torch.tensor([[1, 2, 3]])
    base_logits = load_base_model(str(tiny_model_dir)).eval()(ids).logits
    for method in ("fedit", "flexlora"):
        run = tmp_path / method
        run.mkdir()
        cfg = RunConfig.from_flower({"method": method, "model-name": str(tiny_model_dir)})
        (run / "config.json").write_text(json.dumps(cfg.to_dict()))  # as a run writes it
        if method == "fedit":
            expected = dict.fromkeys((0, 1), adapter(run / "adapter", 4, 0))
        else:
            expected = {
                k: adapter(run / "client-adapters" / f"client-{k}", 2 + 2 * k, k) for k in (0, 1)
            }
        models = models_of(run, cfg, [0, 1], dense=True)
        assert set(models) == {"final", "dense"}
        with torch.no_grad():
            for k in (0, 1):
                assert torch.allclose(models["final"][k](ids).logits, expected[k], atol=1e-5)
                assert not torch.allclose(models["final"][k](ids).logits, base_logits, atol=1e-3)
                assert torch.allclose(models["dense"][k](ids).logits, base_logits, atol=1e-5)


def test_a_run_is_dealt_again_into_the_partitions_it_recorded(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Client 3 of a 10-client run where 2 clients evaluated: its data is partition 3 of 10, not of
    2; a run without the record refuses unless every client evaluated."""
    import json

    from fedprune_app.llm.data import client_data
    from fedprune_cli.rescore_accuracy import held_out, num_partitions
    from tests.conftest import small_config

    cfg = small_config(tiny_model_dir, fraction_evaluate=0.2, partitioner="iid")
    (tmp_path / "summary.json").write_text(json.dumps({"num-partitions": 10}))
    assert num_partitions(tmp_path, cfg, [3, 7]) == 10
    _, rows, n_test = held_out(cfg, 3, 10, 0)
    assert rows == list(client_data(cfg, 3, 10).test) and n_test == len(rows)
    assert rows != list(client_data(cfg, 3, 4).test)
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed"}))
    with pytest.raises(ValueError, match="num-partitions"):
        num_partitions(tmp_path, cfg, [3, 7])
    assert num_partitions(tmp_path, small_config(tiny_model_dir), [0, 1, 2]) == 3
