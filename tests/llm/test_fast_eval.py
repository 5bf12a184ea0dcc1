"""The fast evaluator against lm-eval's stock HFLM: the same log-likelihoods (1e-4), greedy flags
and accuracies, on plain, peft-wrapped, SFT-P routed and compiled models; the stock path for a model
that cannot honour a 4D attention mask; the tree mask and the row packing against brute force."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from lm_eval.models.huggingface import HFLM

from fedprune_app.llm.data import normalize_record
from fedprune_app.llm.evaluation import lm_eval_accuracy, lm_eval_per_example, local_mc_task
from fedprune_app.llm.fast_eval import (
    PackedChoicesLM,
    pack_rows,
    packing_support,
    segment,
    tree_mask,
)
from fedprune_app.llm.models import load_base_model, load_tokenizer
from tests.model_variants import (
    IgnoresMask,
    IgnoresPositions,
    compiled,
    llmpruner,
    peft,
    routed,
    slicegpt,
)

# (context, [continuations]): a context shared by several choices of 1..8 tokens, two choices that
# differ only in their last token (HFLM's logits cache merges those), a one-token context (no prefix
# to cache).
QUESTIONS = [
    (
        "Question: what comes after one? Answer:",
        [" two", " three hundred and six", " four", " a very long answer"],
    ),
    ("The sky is", [" blue", " green", " very very blue today"]),
    ("Pick a letter:", [" A", " B", " C", " D", " E"]),
    ("Hello", [" world", " there, how are you doing on this fine morning?"]),
    (
        "A much longer context that goes on for a while about the weather in the park and "
        "the children",
        [" play", " run"],
    ),
]


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path):
    return load_tokenizer(str(tiny_model_dir))


def _requests(tok) -> list:
    out = []
    for ctx, conts in QUESTIONS:
        ctx_ids = tok(ctx, add_special_tokens=False)["input_ids"]
        out += [((ctx, c), ctx_ids, tok(c, add_special_tokens=False)["input_ids"]) for c in conts]
    out.append(
        (None, [tok.eos_token_id], tok("one two three", add_special_tokens=False)["input_ids"])
    )
    return out


@pytest.mark.parametrize(
    "build",
    [lambda m: m.eval(), peft, routed, compiled, llmpruner, slicegpt],
    ids=["llama", "peft", "routed", "compiled", "llmpruner", "slicegpt"],
)
def test_fast_loglikelihoods_equal_stock_hflm(tiny_model_dir: Path, tok, build) -> None:
    model = build(load_base_model(str(tiny_model_dir)))
    requests = _requests(tok)
    stock = HFLM(pretrained=model, tokenizer=tok, batch_size=4)._loglikelihood_tokens(requests)
    for tokens in (1024, 16):  # one row for all questions; one question per row, two rows per batch
        fast = PackedChoicesLM(
            pretrained=model,
            tokenizer=tok,
            batch_size=4,
            row_tokens=tokens,
            batch_tokens=2 * tokens,
        )
        assert fast.uses_packing, fast.fallback_reason
        got = fast._loglikelihood_tokens(requests)
        assert [g for _, g in got] == [g for _, g in stock]
        assert [ll for ll, _ in got] == pytest.approx([ll for ll, _ in stock], abs=1e-4)


def test_fast_accuracies_equal_stock_accuracies(tiny_model_dir: Path, tok, tmp_path: Path) -> None:
    model = load_base_model(str(tiny_model_dir))
    rows = [
        normalize_record("t", {"question": q, "choices": c, "label": i % len(c)})
        for i, (q, c) in enumerate(QUESTIONS)
    ]
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = local_mc_task("fast_check", path)
    assert lm_eval_accuracy(model, tok, [task], 4) == lm_eval_accuracy(
        model, tok, [task], 4, fast=False
    )
    assert lm_eval_per_example(model, tok, task, 4) == lm_eval_per_example(
        model, tok, task, 4, fast=False
    )


@pytest.mark.parametrize("cls", [IgnoresMask, IgnoresPositions])
def test_a_model_that_cannot_score_packed_choices_is_scored_by_the_stock_path(
    tiny_model_dir: Path, tok, cls, caplog
) -> None:
    model = load_base_model(str(tiny_model_dir)).eval()
    stock = HFLM(pretrained=model, tokenizer=tok, batch_size=4)._loglikelihood_tokens(
        _requests(tok)
    )
    model.model.__class__ = (
        cls  # the decoder, as the causal LM's forward and the fast path both call it
    )
    ok, _, reason = packing_support(model)
    assert not ok and reason
    with caplog.at_level(logging.WARNING, logger="fedprune_app.llm.fast_eval"):
        fast = PackedChoicesLM(pretrained=model, tokenizer=tok, batch_size=4)
    assert not fast.uses_packing and "fast evaluator off" in caplog.text
    assert fast._loglikelihood_tokens(_requests(tok)) == stock


def test_tree_mask_equals_a_brute_force_rule() -> None:
    """Query q sees key k iff both are in one question, k is context or on q's choice, and k is not
    after q."""
    rows = [
        [([5, 6, 7], [[8, 9, 10], [11]]), ([12], [[13, 14]])],
        [([15, 16], [[17, 18], [19, 20, 21]])],
    ]
    segs = [[segment(c, k) for c, k in row] for row in rows]
    width = max(sum(len(x["ids"]) for x in row) for row in segs)
    doc = torch.full((2, width), -1)
    pos, branch = torch.zeros(2, width, dtype=torch.long), torch.zeros(2, width, dtype=torch.long)
    for r, row in enumerate(segs):
        at = 0
        for d, x in enumerate(row):
            n = len(x["ids"])
            doc[r, at : at + n], pos[r, at : at + n], branch[r, at : at + n] = (
                d,
                torch.tensor(x["pos"]),
                torch.tensor(x["branch"]),
            )
            at += n
    mask = tree_mask(doc, pos, branch)[:, 0]
    for r in range(2):
        for q in range(width):
            for k in range(width):
                if doc[r, q] < 0:
                    want = q == k
                else:
                    want = bool(
                        doc[r, k] == doc[r, q]
                        and pos[r, k] <= pos[r, q]
                        and (branch[r, k] == 0 or branch[r, k] == branch[r, q])
                    )
                assert bool(mask[r, q, k]) == want, (r, q, k)


def test_segment_reads_predict_each_continuation_token_from_its_own_prefix() -> None:
    seg = segment([1, 2, 3], [[4, 5, 6], [7], [8, 9]])
    assert seg["ids"] == [1, 2, 3, 4, 5, 8]
    assert seg["pos"] == [0, 1, 2, 3, 4, 3]
    assert seg["targets"] == [4, 5, 6, 7, 8, 9]
    # the token read for each target is the last token before it in context + that continuation
    assert [seg["ids"][i] for i in seg["reads"]] == [3, 4, 5, 3, 3, 8]


def test_pack_rows_places_every_segment_once_within_the_row_budget() -> None:
    sizes = list(np.random.default_rng(0).integers(1, 90, 57)) + [300]
    rows = pack_rows(sizes, 128)
    assert sorted(i for row in rows for i in row) == list(range(len(sizes)))
    assert all(sum(sizes[i] for i in row) <= 128 for row in rows if len(row) > 1)
    assert len(rows) <= 2 * -(
        -sum(sizes) // 128
    )  # first-fit never uses more than twice the optimum
