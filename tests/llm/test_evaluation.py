"""Evaluation against computations by hand: perplexity, lm-eval accuracy, Rouge-L."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from fedprune_app.llm.data import normalize_record
from fedprune_app.llm.evaluation import (
    bootstrap_ci,
    generate,
    lm_eval_accuracy,
    lm_eval_per_example,
    local_mc_task,
    perplexity,
    rouge_l,
    rouge_l_scores,
    window_scores,
)
from fedprune_app.llm.models import load_base_model, load_tokenizer

TEXT = (
    "The quick brown fox jumps over the lazy dog. It was a sunny day in the park, and the children "
    "were playing by the pond while their parents watched from the benches."
)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path):
    return load_base_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))


class Uniform(torch.nn.Module):
    """A 'model' whose next-token distribution is uniform: its perplexity is the vocabulary size."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.p = vocab, torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids: torch.Tensor):
        return type("Out", (), {"logits": torch.zeros(*input_ids.shape, self.vocab)})


def test_uniform_model_has_perplexity_equal_to_vocab(tiny) -> None:
    _, tok = tiny
    assert perplexity(Uniform(len(tok)), tok, TEXT, window=8, stride=8) == pytest.approx(
        len(tok), rel=1e-5
    )


def test_full_window_perplexity_matches_one_forward(tiny) -> None:
    model, tok = tiny
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1).gather(
            1, ids[0, 1:, None]
        )
    assert perplexity(model, tok, TEXT, window=512, stride=512) == pytest.approx(
        math.exp(-logp.mean().item()), rel=1e-5
    )


@pytest.mark.parametrize(("window", "stride"), [(8, 3), (8, 8), (5, 1)])
def test_sliding_window_scores_each_token_once_with_its_context(
    tiny, window: int, stride: int
) -> None:
    """Brute force: one forward per token over exactly the context its window gives it."""
    model, tok = tiny
    ids = tok(TEXT, return_tensors="pt")["input_ids"][0][:30]
    step, nll = min(stride, window - 1), 0.0
    for t in range(1, len(ids)):
        last = min(
            1 + ((t - 1) // step + 1) * step, len(ids)
        )  # end of the window that scores token t
        context = ids[max(0, last - window) : t]
        with torch.no_grad():
            nll -= torch.log_softmax(model(input_ids=context[None]).logits[0, -1], -1)[
                ids[t]
            ].item()
    expected = math.exp(nll / (len(ids) - 1))
    got = perplexity(model, tok, TEXT, window=window, stride=stride, max_tokens=30)
    assert got == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize(("window", "stride", "batch"), [(8, 3, 4), (8, 8, 3), (5, 1, 64)])
def test_batched_windows_score_as_one_window_at_a_time(
    tiny, window: int, stride: int, batch: int
) -> None:
    """The windows (shorter first ones included) run `batch` per forward; each window's NLL and
    token count equal those of its own forward, and the perplexity that of batch size 1."""
    model, tok = tiny
    ids = tok(TEXT, return_tensors="pt")["input_ids"][0][:30]
    got = window_scores(model, tok, TEXT, window, stride, 30, batch_size=batch)
    step, nll, counts = min(stride, window - 1), [], []
    for first in range(1, 30, step):
        last = min(first + step, 30)
        chunk = ids[max(0, last - window) : last]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=chunk[None]).logits[0, :-1], -1).gather(
                1, chunk[1:, None]
            )
        nll.append(-logp[-(last - first) :].sum().item())
        counts.append(last - first)
    assert got.tokens.tolist() == counts and sum(counts) == 29
    assert got.nll.tolist() == pytest.approx(nll, rel=1e-5)
    assert perplexity(model, tok, TEXT, window, stride, 30, batch_size=batch) == pytest.approx(
        perplexity(model, tok, TEXT, window, stride, 30, batch_size=1), rel=1e-6
    )


def test_client_eval_rows_carry_the_perplexity_interval_and_token_count(
    tiny_model_dir: Path,
) -> None:
    """Answer perplexity of a client's test split: ppl unchanged (exp of mean_loss), ppl-tokens the
    scored answer tokens, ppl-lo/hi the seeded bootstrap over its answers; none with
    ppl-bootstrap-iters = 0."""
    from fedprune_app.llm.data import client_data
    from fedprune_app.llm.evaluation import (
        answer_scores,
        evaluate_client,
        mean_loss,
        perplexity_metrics,
    )
    from fedprune_app.llm.intervals import perplexity_interval
    from tests.conftest import small_config

    model, tok = load_base_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    cfg = small_config(
        tiny_model_dir, client_data="olmo:social_iqa", ppl_bootstrap_iters=200, test_examples=5
    )
    data = client_data(cfg, 0, 1)
    metrics = evaluate_client(model, tok, data, cfg, 1)
    scores = answer_scores(model, tok, data.test, cfg.seq_len, cfg.eval_batch_size)
    ci = perplexity_interval(scores, 200, cfg.seed)
    assert set(metrics) == {
        "acc",
        "acc_norm",
        "acc-n",
        "acc-chance",
        "ppl",
        "ppl-tokens",
        "ppl-n",
        "ppl-lo",
        "ppl-hi",
    }
    assert metrics["acc-n"] == metrics["ppl-n"] == len(data.test) == 5
    assert metrics["acc-chance"] == pytest.approx(sum(1 / len(e["choices"]) for e in data.test) / 5)
    assert metrics["ppl"] == pytest.approx(
        math.exp(mean_loss(model, tok, data.test, cfg.seq_len)), rel=1e-5
    )
    assert metrics["ppl-tokens"] == scores.token_count > 0
    assert (metrics["ppl-lo"], metrics["ppl-hi"]) == (ci.lo, ci.hi) and ci.lo < metrics[
        "ppl"
    ] < ci.hi
    assert set(perplexity_metrics(scores, 0, cfg.seed)) == {
        "ppl",
        "ppl-tokens",
        "ppl-n",
    }  # no bootstrap


def _loglik(model, tok, prompt: str, continuation: str) -> float:
    ctx = tok(prompt, add_special_tokens=False)["input_ids"]
    whole = tok(prompt + continuation, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([whole])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1)
    return sum(logp[i - 1, whole[i]].item() for i in range(len(ctx), len(whole)))


def test_lm_eval_accuracy_matches_loglikelihoods_by_hand(tiny, tmp_path: Path) -> None:
    model, tok = tiny
    rows = [
        normalize_record(
            "t", {"question": f"What comes after {w}?", "choices": c, "label": i % len(c)}
        )
        for i, (w, c) in enumerate(
            [
                ("one", ["two", "three", "four"]),
                ("red", ["green", "a blue sky"]),
                ("Monday", ["Tuesday", "Sunday", "May"]),
                ("A", ["B", "C", "D", "E"]),
                ("spring", ["summer", "winter"]),
                ("up", ["down", "left", "sideways"]),
            ]
        )
    ]
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    acc = acc_norm = 0
    by_hand = []
    for r in rows:
        lls = [_loglik(model, tok, r["prompt"], " " + c) for c in r["choices"]]
        by_hand.append(max(range(len(lls)), key=lls.__getitem__) == r["label"])
        acc += by_hand[-1]
        normed = [ll / len(c) for ll, c in zip(lls, r["choices"], strict=True)]
        acc_norm += max(range(len(normed)), key=normed.__getitem__) == r["label"]
    res = lm_eval_accuracy(model, tok, [local_mc_task("hand_check", path)], batch_size=4)
    assert res["hand_check"]["acc"] == pytest.approx(acc / len(rows))
    assert res["hand_check"]["acc_norm"] == pytest.approx(acc_norm / len(rows))
    each = lm_eval_per_example(model, tok, local_mc_task("hand_check", path), batch_size=4)
    assert each["acc"] == [float(c) for c in by_hand]  # per document, in file order


def test_lm_eval_reads_task_yamls_from_an_include_path(tiny, tmp_path: Path) -> None:
    """Standard task names go through the same TaskManager path; here a named task defined in a
    local YAML."""
    model, tok = tiny
    data = tmp_path / "d.jsonl"
    data.write_text(
        json.dumps(normalize_record("t", {"question": "x", "choices": ["a", "b"], "label": 0}))
        + "\n"
    )
    task = local_mc_task("my_local_task", data)
    import yaml

    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "my_local_task.yaml").write_text(yaml.safe_dump(task))
    res = lm_eval_accuracy(model, tok, ["my_local_task"], include_path=str(tmp_path / "tasks"))
    assert set(res["my_local_task"]) == {"acc", "acc_norm"}


def test_rouge_l_is_the_lcs_f1() -> None:
    pred, ref = "the cat sat on a mat", "the cat was sitting on the mat"
    lcs = (
        4  # by hand: "the cat ... on ... mat" (stemming makes "sat" and "sitting" "sat" and "sit")
    )
    p, r = lcs / 6, lcs / 7
    assert rouge_l([pred], [ref]) == pytest.approx(2 * p * r / (p + r))
    assert rouge_l(["same words here"], ["same words here"]) == pytest.approx(1.0)
    assert rouge_l(["nothing"], ["shared"]) == 0.0


def test_answer_nll_matches_per_example_computation_and_ignores_padding(tiny) -> None:
    from fedprune_app.llm.data import encode
    from fedprune_app.llm.evaluation import mean_loss

    model, tok = tiny
    rows = [
        normalize_record("t", {"question": q, "choices": ["x", a], "label": 1})
        for q, a in [
            ("Name a colour.", "a very deep blue"),
            ("2+2?", "4"),
            ("Longest river?", "the Nile"),
        ]
    ]
    total, count = 0.0, 0
    for r in rows:
        ids, labels = encode(tok, r, 64)
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1], -1)
        for pos in range(1, len(ids)):
            if labels[pos] != -100:
                total -= logp[pos - 1, labels[pos]].item()
                count += 1
    assert mean_loss(model, tok, rows, 64, batch_size=1) == pytest.approx(total / count, rel=1e-5)
    assert mean_loss(model, tok, rows, 64, batch_size=3) == pytest.approx(total / count, rel=1e-4)


def test_rouge_l_scores_are_per_example_and_average_to_rouge_l() -> None:
    preds, refs = ["the cat sat", "nothing", "a b c d"], ["the cat sat down", "shared", "a c d"]
    scores = rouge_l_scores(preds, refs)
    assert scores[1] == 0.0 and scores[0] == pytest.approx(2 * 1 * 0.75 / 1.75)
    assert rouge_l(preds, refs) == pytest.approx(sum(scores) / 3)


def test_bootstrap_ci_matches_the_normal_interval_and_pairs_on_the_same_examples() -> None:
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(400, generator=gen) * 2 + 5).tolist()
    mean, lo, hi = bootstrap_ci(x, iters=4000)
    sd = torch.tensor(x).std().item()
    assert mean == pytest.approx(sum(x) / 400) and lo < mean < hi
    assert hi - lo == pytest.approx(
        2 * 1.96 * sd / 20, rel=0.15
    )  # the normal approximation's width
    assert bootstrap_ci([0.3] * 7) == pytest.approx((0.3, 0.3, 0.3))
    # paired: a constant shift has a zero-width interval; unpaired, the same samples' interval is
    # wide
    shifted = [v + 0.5 for v in x]
    assert bootstrap_ci(shifted, x) == pytest.approx((0.5, 0.5, 0.5))
    with pytest.raises(ValueError):
        bootstrap_ci([])


def test_stratified_bootstrap_averages_group_means_and_resamples_within_groups() -> None:
    """Two clients with 4 and 100 examples: the statistic is the mean of the two client means (not
    the pooled mean); one stratum is the unstratified bootstrap; a paired shift that is constant per
    client has zero width."""
    small, large = [1.0, 1.0, 0.0, 1.0], [0.0] * 90 + [1.0] * 10
    strata = [0] * 4 + [1] * 100
    mean, lo, hi = bootstrap_ci(small + large, strata=strata, iters=3000)
    assert mean == pytest.approx((0.75 + 0.10) / 2) and lo < mean < hi
    # brute force: resample each client on its own and average the two means
    gen = torch.Generator().manual_seed(7)
    ref = [
        (
            torch.tensor(small)[torch.randint(0, 4, (4,), generator=gen)].mean()
            + torch.tensor(large)[torch.randint(0, 100, (100,), generator=gen)].mean()
        ).item()
        / 2
        for _ in range(3000)
    ]
    ref_lo, ref_hi = torch.quantile(
        torch.tensor(ref, dtype=torch.float64), torch.tensor([0.025, 0.975], dtype=torch.float64)
    )
    assert lo == pytest.approx(ref_lo.item(), abs=0.03) and hi == pytest.approx(
        ref_hi.item(), abs=0.03
    )
    x = [0.1 * i for i in range(30)]
    assert bootstrap_ci(x, strata=[5] * 30) == bootstrap_ci(x)
    shifted = [v + 0.2 for v in small] + [v - 0.4 for v in large]
    assert bootstrap_ci(shifted, small + large, strata=strata) == pytest.approx((-0.1, -0.1, -0.1))
    with pytest.raises(ValueError, match="3 strata for 104 values"):
        bootstrap_ci(small + large, strata=[0, 1, 1])


def test_generate_returns_answers_in_prompt_order_whatever_the_length_sorted_batches(tiny) -> None:
    """Batches are formed by prompt length; each answer must still be the one its own prompt gets
    alone."""
    model, tok = tiny
    prompts = [
        "a b c d e f g h i j k l",
        "a",
        "b c d e f",
        "c d",
        "d e f g h i j k l m n o p q r",
        "e f g",
    ]
    alone = [generate(model, tok, [p], max_new_tokens=4, batch_size=1)[0] for p in prompts]
    assert generate(model, tok, prompts, max_new_tokens=4, batch_size=3) == alone
    assert generate(model, tok, prompts[::-1], max_new_tokens=4, batch_size=4) == alone[::-1]
