"""Evaluation: perplexity (sliding window, or of the answers; with a bootstrap interval),
multiple-choice accuracy through lm-eval (log-likelihoods from `fast_eval.PackedChoicesLM`), Rouge-L
on generations.

Accuracy is computed by lm-eval's `simple_evaluate` on an `HFLM` that wraps the in-memory model, so
the numbers are comparable with the papers' lm-eval numbers. Offline, each client's multiple-choice
test split becomes a local lm-eval task (a task dict whose JSON data file has an absolute path);
standard task names (`arc_easy`, `piqa`, ...) work wherever lm-eval can reach their datasets.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedprune_app.llm.data import (
    ClientData,
    Example,
    collate,
    encode,
    perplexity_set_text,
    source_splits,
    text_of,
)
from fedprune_app.llm.fast_eval import PackedChoicesLM
from fedprune_app.llm.intervals import TokenScores, perplexity_interval
from fedprune_app.llm.models import model_device
from fedprune_app.llm.settings import EvalSettings, per_client


def _windows(n: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(start, first, last) of each sliding window over n tokens: it holds tokens
    [start, last) and scores [first, last) (see `perplexity`)."""
    step = max(1, min(stride, window - 1))
    return [
        (max(0, min(first + step, n) - window), first, min(first + step, n))
        for first in range(1, n, step)
    ]


@torch.no_grad()
def window_scores(
    model: nn.Module,
    tokenizer: Any,
    text: str,
    window: int = 256,
    stride: int = 256,
    max_tokens: int = 0,
    batch_size: int = 8,
) -> TokenScores:
    """Summed NLL and token count of every sliding window of `text` (`perplexity`'s windows),
    `batch_size` windows per forward (right-padded: causal attention keeps the padding out of every
    scored token's context)."""
    ids = tokenizer(text, return_tensors="pt")["input_ids"][0]
    if max_tokens:
        ids = ids[:max_tokens]
    if len(ids) < 2:
        raise ValueError("perplexity needs at least 2 tokens of text")
    spans, device = _windows(len(ids), window, stride), model_device(model)
    nll, tokens = [], []
    for i in range(0, len(spans), batch_size):
        batch = spans[i : i + batch_size]
        chunk = torch.zeros(
            len(batch), max(last - start for start, _, last in batch), dtype=torch.long
        )
        for row, (start, _, last) in enumerate(batch):
            chunk[row, : last - start] = ids[start:last]
        logp = torch.log_softmax(model(input_ids=chunk.to(device)).logits[:, :-1].float(), dim=-1)
        logp = logp.gather(2, chunk[:, 1:, None].to(device))[..., 0]
        for row, (start, first, last) in enumerate(batch):
            nll.append(-logp[row, first - start - 1 : last - start - 1].sum().item())
            tokens.append(last - first)
    return TokenScores.of(nll, tokens)


def perplexity(
    model: nn.Module,
    tokenizer: Any,
    text: str,
    window: int = 256,
    stride: int = 256,
    max_tokens: int = 0,
    batch_size: int = 8,
) -> float:
    """exp(mean NLL) of `text`, every token after the first scored exactly once, in sliding windows.

    A window holds at most `window` tokens and scores its last `step = min(stride, window - 1)`
    tokens, the ones before them serving as context only. stride == window therefore gives
    back-to-back windows that overlap by the one token each needs as context (no token is skipped);
    a smaller stride gives every scored token at least `window - stride` tokens of context (the
    usual sliding-window perplexity). `batch_size` windows run per forward (`window_scores`); the
    result does not depend on it.
    """
    return window_scores(model, tokenizer, text, window, stride, max_tokens, batch_size).perplexity


@torch.no_grad()
def answer_scores(
    model: nn.Module, tokenizer: Any, examples: Sequence[Example], seq_len: int, batch_size: int = 8
) -> TokenScores:
    """Summed NLL and token count of each example's response given its prompt (the units of answer
    perplexity)."""
    nll, tokens, device = [], [], model_device(model)
    for i in range(0, len(examples), batch_size):
        batch = collate(
            [encode(tokenizer, e, seq_len) for e in examples[i : i + batch_size]],
            tokenizer.pad_token_id,
        )
        batch = {k: v.to(device) for k, v in batch.items()}
        logits = (
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            .logits[:, :-1]
            .float()
        )
        labels = batch["labels"][:, 1:]
        mask = labels != -100
        each = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), labels.clamp(min=0), reduction="none"
        )
        nll += (each * mask).sum(dim=1).tolist()
        tokens += mask.sum(dim=1).tolist()
    return TokenScores.of(nll, tokens)


def mean_loss(
    model: nn.Module, tokenizer: Any, examples: Sequence[Example], seq_len: int, batch_size: int = 8
) -> float:
    """Token-weighted mean NLL of each example's response given its prompt (NaN for no examples).

    exp() of it is the "answer perplexity" a client reports for question/instruction data: the
    quantity that instruction tuning minimises (loss on the response tokens only, as in training).
    """
    if not examples:
        return math.nan
    scores = answer_scores(model, tokenizer, examples, seq_len, batch_size)
    return scores.mean_nll if scores.token_count else math.nan


def perplexity_metrics(scores: TokenScores, iters: int, seed: int) -> dict[str, float]:
    """The eval row's perplexity keys: `ppl`, `ppl-tokens`, the number of scored units `ppl-n`
    (answers or windows) and, with `iters` > 0, the 95% bootstrap interval over them `ppl-lo`,
    `ppl-hi` (intervals.perplexity_interval)."""
    out = {
        "ppl": scores.perplexity,
        "ppl-tokens": float(scores.token_count),
        "ppl-n": float(len(scores.nll)),
    }
    if iters > 0:
        ci = perplexity_interval(scores, iters, seed)
        out |= {"ppl-lo": ci.lo, "ppl-hi": ci.hi}
    return out


WINDOW_KEYS = (
    "window-nll",
    "window-tokens",
)  # per-window scores in a row: paired intervals between models


def held_out_metrics(
    model: nn.Module, tokenizer: Any, text: str, cfg: EvalSettings
) -> dict[str, Any]:
    """A model's sliding-window perplexity of one held-out text (the server's and the references'
    score): `perplexity_metrics` plus each window's summed NLL and token count (`WINDOW_KEYS`), so
    that two models scored on the same text can be compared with a paired bootstrap afterwards
    (`intervals.paired_perplexity_interval`)."""
    scores = window_scores(
        model,
        tokenizer,
        text,
        cfg.ppl_window,
        cfg.ppl_stride,
        cfg.eval_ppl_tokens,
        cfg.eval_batch_size,
    )
    return {
        **perplexity_metrics(scores, cfg.ppl_bootstrap_iters, cfg.seed),
        "window-nll": [round(float(x), 6) for x in scores.nll],
        "window-tokens": [int(t) for t in scores.tokens],
    }


def window_scores_of(row: dict[str, Any]) -> TokenScores | None:
    """The per-window scores a metrics row (or reply) carries (`held_out_metrics`), None where it
    has none."""
    nll, tokens = row.get("window-nll"), row.get("window-tokens")
    return TokenScores.of(nll, tokens) if nll and tokens else None


def local_mc_task(name: str, test_path: Path) -> dict[str, Any]:
    """An lm-eval multiple-choice task over a JSONL file of our examples (prompt, choices,
    label)."""
    return {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(Path(test_path).resolve())}},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": "{{prompt}}",
        "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{label}}",
        "target_delimiter": " ",
        "metric_list": [
            {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
            {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
        ],
        "metadata": {"version": 1.0},
    }


def _simple_evaluate(
    model: nn.Module,
    tokenizer: Any,
    tasks: Sequence[str | dict[str, Any]],
    batch_size: int,
    limit: int | None,
    include_path: str,
    log_samples: bool,
    fast: bool = True,
) -> dict[str, Any]:
    """lm-eval's `simple_evaluate`, zero-shot, on an in-memory model, tasks by name or as dicts.
    `fast`: the log-likelihoods come from `fast_eval.PackedChoicesLM` (each context encoded once; it
    falls back to the stock path, saying why, for a model that cannot use a KV cache); else from
    lm-eval's stock `HFLM`."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm-eval").setLevel(logging.WARNING)
    names = [t for t in tasks if isinstance(t, str)]
    local = set()
    if include_path:
        local = {p.stem for p in Path(include_path).rglob("*.yaml")}
    include_defaults = any(
        n not in local for n in names
    )  # indexing lm-eval's own tasks costs ~15 s
    manager = TaskManager(include_path=include_path or None, include_defaults=include_defaults)
    was_training = model.training
    model.eval()
    lm = (PackedChoicesLM if fast else HFLM)(
        pretrained=model,
        tokenizer=tokenizer,
        batch_size=batch_size,
        device=str(model_device(model)),
    )
    res = lm_eval.simple_evaluate(
        model=lm,
        tasks=list(tasks),
        task_manager=manager,
        num_fewshot=0,
        limit=limit,
        log_samples=log_samples,
        bootstrap_iters=0,
        verbosity="WARNING",
    )
    model.train(was_training)
    return res


def lm_eval_accuracy(
    model: nn.Module,
    tokenizer: Any,
    tasks: Sequence[str | dict[str, Any]],
    batch_size: int = 8,
    limit: int | None = None,
    include_path: str = "",
    fast: bool = True,
) -> dict[str, dict[str, float]]:
    """lm-eval zero-shot accuracy: {task: {"acc": ., "acc_norm": .}} for task names or task dicts
    (`fast`: see `_simple_evaluate`)."""
    res = _simple_evaluate(
        model, tokenizer, tasks, batch_size, limit, include_path, log_samples=False, fast=fast
    )
    out = {}
    for task, metrics in res["results"].items():
        out[task] = {
            m.split(",")[0]: float(v)
            for m, v in metrics.items()
            if m.split(",")[0] in ("acc", "acc_norm") and isinstance(v, int | float)
        }
    return out


def lm_eval_per_example(
    model: nn.Module,
    tokenizer: Any,
    task: str | dict[str, Any],
    batch_size: int = 8,
    include_path: str = "",
    fast: bool = True,
) -> dict[str, list[float]]:
    """lm-eval zero-shot correctness per document of one task, in document order: {"acc":
    [0/1, ...], "acc_norm": [...]} (the means are `lm_eval_accuracy`'s numbers; per example they
    allow paired bootstrap intervals)."""
    res = _simple_evaluate(
        model, tokenizer, [task], batch_size, None, include_path, log_samples=True, fast=fast
    )
    (samples,) = res["samples"].values()
    samples = sorted(samples, key=lambda s: int(s["doc_id"]))
    return {m: [float(s[m]) for s in samples] for m in ("acc", "acc_norm")}


def rouge_l_scores(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    """Rouge-L F1 per example (rouge-score's tokenizer and stemmer, as in the papers'
    instruction-tuning tables)."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return [
        scorer.score(ref, pred)["rougeL"].fmeasure
        for pred, ref in zip(predictions, references, strict=True)
    ]


def bootstrap_means(
    values: Sequence[float],
    paired_with: Sequence[float] | None = None,
    iters: int = 2000,
    seed: int = 0,
    strata: Sequence[int] | None = None,
) -> tuple[float, np.ndarray]:
    """(estimate, its `iters` bootstrap draws) of the mean of `values` — or of the per-example
    differences values − paired_with (a paired bootstrap: both resampled on the same example
    indices). With `strata` (a group id per value, e.g. the client that owns the example) the
    statistic is the mean of the group means and each group is resampled within itself, so every
    bootstrap sample keeps each group's size."""
    x = torch.tensor(list(values), dtype=torch.float64)
    if paired_with is not None:
        x = x - torch.tensor(list(paired_with), dtype=torch.float64)
    if x.numel() == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    if strata is not None and len(strata) != x.numel():
        raise ValueError(f"bootstrap_ci: {len(strata)} strata for {x.numel()} values")
    gen = torch.Generator().manual_seed(seed)
    groups = (
        [x]
        if strata is None
        else [x[torch.tensor([s == g for s in strata])] for g in sorted(set(strata))]
    )
    means = torch.stack(
        [
            g[torch.randint(0, g.numel(), (iters, g.numel()), generator=gen)].mean(dim=1)
            for g in groups
        ]
    ).mean(dim=0)
    return float(torch.stack([g.mean() for g in groups]).mean()), means.numpy()


def bootstrap_ci(
    values: Sequence[float],
    paired_with: Sequence[float] | None = None,
    iters: int = 2000,
    seed: int = 0,
    strata: Sequence[int] | None = None,
) -> tuple[float, float, float]:
    """(mean, 2.5th, 97.5th percentile) of `bootstrap_means`' statistic (the same arguments)."""
    estimate, means = bootstrap_means(values, paired_with, iters, seed, strata)
    lo, hi = torch.quantile(
        torch.from_numpy(means), torch.tensor([0.025, 0.975], dtype=torch.float64)
    ).tolist()
    return estimate, lo, hi


def rouge_l(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Mean Rouge-L F1 over the examples."""
    scores = rouge_l_scores(predictions, references)
    return sum(scores) / max(len(scores), 1)


@torch.no_grad()
def generate(
    model: nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    max_new_tokens: int = 32,
    batch_size: int = 8,
) -> list[str]:
    """Greedy continuations of `prompts` (left-padded batches), decoded without the prompt, in the
    prompts' order. Batches are formed from the prompts sorted by token length, so a batch pads
    little (on natural_instructions prompts this halves the prefill tokens of batches of 8)."""
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    order = sorted(range(len(prompts)), key=lambda i: len(tokenizer(prompts[i])["input_ids"]))
    outs: dict[int, str] = {}
    device = model_device(model)
    try:
        for i in range(0, len(order), batch_size):
            batch = order[i : i + batch_size]
            enc = tokenizer([prompts[j] for j in batch], return_tensors="pt", padding=True).to(
                device
            )
            gen = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
            outs |= zip(
                batch,
                tokenizer.batch_decode(
                    gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True
                ),
                strict=True,
            )
    finally:
        tokenizer.padding_side = side
    return [outs[i].strip().split("\n")[0] for i in range(len(prompts))]


def eval_task_for(
    cfg: EvalSettings, data: ClientData, num_partitions: int
) -> str | dict[str, Any] | None:
    """The lm-eval task a client is scored on: `eval-tasks` if set, else its own multiple-choice
    test split."""
    if cfg.eval_tasks.strip():
        return per_client(cfg.eval_tasks, num_partitions, str, "eval-tasks")[data.partition_id]
    if data.test and data.test[0]["choices"] and data.test_path is not None:
        slug = "".join(c if c.isalnum() else "_" for c in data.eval_source)
        return local_mc_task(f"fedprune_{slug}", data.test_path)
    return None


def evaluate_client(
    model: nn.Module, tokenizer: Any, data: ClientData, cfg: EvalSettings, num_partitions: int
) -> dict[str, float]:
    """A client's metrics on its own test split: acc/acc_norm (lm-eval) for multiple choice, with,
    for its own split, the questions scored `acc-n` and chance accuracy `acc-chance` (mean of 1 /
    number of choices); rouge-l for instructions (with `rouge-l-n` and its bootstrap interval); and
    ppl: of the answers given the prompts, or sliding-window over plain text, with its scored token
    count and bootstrap interval over answers / windows (`perplexity_metrics`)."""
    metrics: dict[str, float] = {}
    task = eval_task_for(cfg, data, num_partitions)
    if task is not None:
        res = lm_eval_accuracy(
            model, tokenizer, [task], cfg.eval_batch_size, include_path=cfg.eval_include_path
        )
        metrics.update(next(iter(res.values())))
        if isinstance(task, dict):  # its own split (`local_mc_task`): every example's choices known
            metrics["acc-n"] = float(len(data.test))
            metrics["acc-chance"] = sum(1 / len(e["choices"]) for e in data.test) / len(data.test)
    if data.test and data.test[0]["prompt"]:  # questions / instructions: perplexity of the answers
        scores = answer_scores(model, tokenizer, data.test, cfg.seq_len, cfg.eval_batch_size)
        metrics.update(perplexity_metrics(scores, cfg.ppl_bootstrap_iters, cfg.seed))
    elif data.test and cfg.eval_ppl_tokens > 0:  # plain text: sliding-window perplexity
        scores = window_scores(
            model,
            tokenizer,
            text_of(data.test),
            cfg.ppl_window,
            cfg.ppl_stride,
            cfg.eval_ppl_tokens,
            cfg.eval_batch_size,
        )
        metrics.update(perplexity_metrics(scores, cfg.ppl_bootstrap_iters, cfg.seed))
    if data.test and not data.test[0]["choices"] and data.test[0]["prompt"]:
        preds = generate(
            model,
            tokenizer,
            [e["prompt"] for e in data.test],
            cfg.gen_max_new_tokens,
            cfg.eval_batch_size,
        )
        refs = [e["response"] for e in data.test]
        metrics |= {"rouge-l": rouge_l(preds, refs), "rouge-l-n": float(len(refs))}
        if cfg.ppl_bootstrap_iters > 0:  # its 95% interval: a bootstrap over the examples
            _, lo, hi = bootstrap_ci(
                rouge_l_scores(preds, refs), iters=cfg.ppl_bootstrap_iters, seed=cfg.seed
            )
            metrics |= {"rouge-l-lo": lo, "rouge-l-hi": hi}
    return metrics


def held_out_text(source: str, cfg: EvalSettings) -> str:
    """The test split of a source as text (the server's perplexity set); `ppl:wikitext2|ptb|c4` are
    the pruning papers' sets, read through `datasets` (see data.PERPLEXITY_SETS)."""

    if source.startswith("ppl:"):
        return perplexity_set_text(source[4:])
    splits = source_splits(
        source, cfg.seed, cfg.test_examples, cfg.val_examples, cfg.max_train_examples
    )
    return text_of(splits.test)
