"""The fast evaluator against lm-eval's stock HFLM: the same log-likelihoods (1e-4), greedy flags and accuracies, on
plain, peft-wrapped, SFT-P routed and compiled models; the stock path for a model that cannot use a KV cache."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from lm_eval.models.huggingface import HFLM
from transformers import LlamaModel

from fedprune_app.llm.data import normalize_record
from fedprune_app.llm.evaluation import lm_eval_accuracy, lm_eval_per_example, local_mc_task
from fedprune_app.llm.fast_eval import PrefixCachedLM, cache_support
from fedprune_app.llm.models import load_base_model, load_tokenizer

# (context, [continuations]): a context shared by several choices of 1..8 tokens, two choices that differ only
# in their last token (HFLM's logits cache merges those), a one-token context (no prefix to cache).
QUESTIONS = [
    ("Question: what comes after one? Answer:", [" two", " three hundred and six", " four", " a very long answer"]),
    ("The sky is", [" blue", " green", " very very blue today"]),
    ("Pick a letter:", [" A", " B", " C", " D", " E"]),
    ("Hello", [" world", " there, how are you doing on this fine morning?"]),
    ("A much longer context that goes on for a while about the weather in the park and the children",
     [" play", " run"]),
]


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path):
    return load_tokenizer(str(tiny_model_dir))


def _requests(tok) -> list:
    out = []
    for ctx, conts in QUESTIONS:
        ctx_ids = tok(ctx, add_special_tokens=False)["input_ids"]
        out += [((ctx, c), ctx_ids, tok(c, add_special_tokens=False)["input_ids"]) for c in conts]
    out.append((None, [tok.eos_token_id], tok("one two three", add_special_tokens=False)["input_ids"]))
    return out


def _peft(model):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"]))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:  # B = 0 would leave the model unchanged
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return peft_model.eval()


def _masks(model, seed: int):
    from fedprune_app.methods.sftp.hf.configuration_fedprune_routed_llama import MASK_NAMES

    d, gen = model.config.hidden_size, torch.Generator().manual_seed(seed)
    return [{n: (torch.rand(d, generator=gen) < 0.6).float() for n in MASK_NAMES}
            for _ in range(model.config.num_hidden_layers)]


def _routed(model):
    from fedprune_app.methods.sftp.routing import install_routing, set_masks

    install_routing(model)
    set_masks(model, _masks(model, 1))
    return model.eval()


def _compiled(model):
    from fedprune_app.methods.sftp.routing import compile_model

    return compile_model(model, _masks(model, 2))


@pytest.mark.parametrize("build", [lambda m: m.eval(), _peft, _routed, _compiled], ids=["llama", "peft", "routed",
                                                                                          "compiled"])
def test_fast_loglikelihoods_equal_stock_hflm(tiny_model_dir: Path, tok, build) -> None:
    model = build(load_base_model(str(tiny_model_dir)))
    requests = _requests(tok)
    stock = HFLM(pretrained=model, tokenizer=tok, batch_size=4)._loglikelihood_tokens(requests)
    for tokens in (1024, 16):  # one batch of contexts; many small batches
        fast = PrefixCachedLM(pretrained=model, tokenizer=tok, batch_size=4, batch_tokens=tokens)
        assert fast.uses_cache, fast.fallback_reason
        got = fast._loglikelihood_tokens(requests)
        assert [g for _, g in got] == [g for _, g in stock]
        assert [ll for ll, _ in got] == pytest.approx([ll for ll, _ in stock], abs=1e-4)


def test_fast_accuracies_equal_stock_accuracies(tiny_model_dir: Path, tok, tmp_path: Path) -> None:
    model = load_base_model(str(tiny_model_dir))
    rows = [normalize_record("t", {"question": q, "choices": c, "label": i % len(c)})
            for i, (q, c) in enumerate(QUESTIONS)]
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = local_mc_task("fast_check", path)
    assert lm_eval_accuracy(model, tok, [task], 4) == lm_eval_accuracy(model, tok, [task], 4, fast=False)
    assert lm_eval_per_example(model, tok, task, 4) == lm_eval_per_example(model, tok, task, 4, fast=False)


class _DropsCache(LlamaModel):
    """A decoder that ignores `past_key_values` (returns none): the fast path cannot serve it."""

    def forward(self, *args, past_key_values=None, use_cache=None, **kwargs):
        return super().forward(*args, use_cache=False, **kwargs)


class _IgnoresPositions(LlamaModel):
    """A decoder that keeps a cache but ignores the positions and mask it is given: its cached scores are wrong."""

    def forward(self, *args, position_ids=None, attention_mask=None, **kwargs):
        return super().forward(*args, **kwargs)


@pytest.mark.parametrize("cls", [_DropsCache, _IgnoresPositions])
def test_a_model_that_cannot_use_the_cache_is_scored_by_the_stock_path(tiny_model_dir: Path, tok, cls, caplog) -> None:
    model = load_base_model(str(tiny_model_dir)).eval()
    stock = HFLM(pretrained=model, tokenizer=tok, batch_size=4)._loglikelihood_tokens(_requests(tok))
    model.model.__class__ = cls  # the decoder, as the causal LM's forward and the fast path both call it
    ok, _, reason = cache_support(model)
    assert not ok and reason
    with caplog.at_level(logging.WARNING, logger="fedprune_app.llm.fast_eval"):
        fast = PrefixCachedLM(pretrained=model, tokenizer=tok, batch_size=4)
    assert not fast.uses_cache and "fast evaluator off" in caplog.text
    assert fast._loglikelihood_tokens(_requests(tok)) == stock
