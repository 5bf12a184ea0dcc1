"""Re-score finished SFT-P grid runs (sftp, fedflap, llmpruner, slicegpt) on more held-out examples
per client.

In-run each client evaluates a small test split (30 examples by default), so that Table 1/2
accuracies can be checked for noise.

Each client k is scored, with lm-eval zero-shot like in-run, on its own task's test split (the
in-run examples) plus up to `--examples` examples of that task that no split of the run read
(`data.unused_tail`: the seeded shuffle's tail after test | val | train; a small task may have none
left, then only its test split counts), by the model it deploys:
  sftp     `compiled/client-<k>` (its deterministic mask, LoRA merged; equal to the in-run
           masked model within float tolerance, see tests/test_routing.py); with `--dense` also
           the base model (`dense`), so that a run whose seed drew test splits no fedflap run
           scored is compared with the untouched model on its own questions
           (`fedprune compare <run> <run> --b-model dense`);
  fedflap  `compiled/` for every client, and the run's two references: `post-hoc` (the base
           model compiled with the run's masks.npz, no LoRA: fedflap's round 1) and `dense` (the
           base model: round 0);
  llmpruner, slicegpt  `compiled/` (the pruned / sliced model, LoRA merged) for every client.
Per-example correctness (acc and acc_norm) and the answer's NLL and token count (`nll`, `tokens`:
answer perplexity, paired between models) go to `<run>/rescore.json`, with a digest of each client's
questions (`fedprune_cli.compare` pairs two runs only on the same questions); the SFT-P grid renders
it with paired, per-client stratified bootstrap intervals. A run whose rescore.json has the same
`--examples` is skipped.

    fedprune rescore accuracy outputs/grids/sftp/2026* --examples 100
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TQDM_DISABLE", "1")  # lm-eval's progress bars, one set per client and model

from fedprune_app.core.config import RunConfig  # noqa: E402
from fedprune_app.llm.data import Example, client_data, unused_tail, write_jsonl  # noqa: E402
from fedprune_app.llm.evaluation import (  # noqa: E402
    answer_scores,
    bootstrap_ci,
    lm_eval_per_example,
    local_mc_task,
)
from fedprune_app.llm.models import load_base_model, load_run, load_tokenizer  # noqa: E402
from fedprune_app.structural.routing import (  # noqa: E402
    compile_model,
    load_compiled,
    per_layer_masks,
)


def evaluated_clients(run_dir: Path) -> list[int]:
    """The client (partition) ids that evaluated in the run, from its metrics.jsonl."""
    rows = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    return sorted(
        {
            int(r["client"])
            for r in rows
            if r.get("phase") == "evaluate" and isinstance(r.get("client"), int)
        }
    )


def num_partitions(run_dir: Path, cfg: RunConfig, clients: list[int]) -> int:
    """How many partitions the run dealt its data into (what `client_data` needs to deal client
    k's again): summary.json's `num-partitions`; for a run that did not record it, the clients
    that evaluated, when every client evaluated (`fraction-evaluate` = 1).

    Raises:
        ValueError: the run records no count and only a sample of its clients evaluated."""
    summary = run_dir / "summary.json"
    recorded = json.loads(summary.read_text()).get("num-partitions") if summary.is_file() else None
    if isinstance(recorded, int) and recorded > max(clients, default=-1):
        return recorded
    if cfg.fraction_evaluate < 1.0:
        raise ValueError(
            f"{run_dir}: summary.json records no 'num-partitions' and fraction-evaluate = "
            f"{cfg.fraction_evaluate:g}, so the clients' data cannot be dealt again"
        )
    return len(clients)


def held_out(
    cfg: RunConfig, client: int, num_clients: int, n: int
) -> tuple[str, list[Example], int]:
    """(source, examples, how many of them are the in-run test split) of one client: its test split,
    then up to n unused examples of the same source."""
    data = client_data(cfg, client, num_clients)
    return data.eval_source, list(data.test) + unused_tail(cfg, data.eval_source, n), len(data.test)


def question_digest(rows: list[Example]) -> str:
    """A short digest of the examples a client was scored on, in order: two records pair only when
    it is equal."""
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


def models_of(
    run_dir: Path, cfg: RunConfig, clients: list[int], dense: bool = False
) -> dict[str, dict[int, Any]]:
    """{row: {client: the model it is scored with}} of one run (see the module docstring); `dense`
    adds the untouched base model (row `dense`) for every method."""
    models = {"final": _final_models(run_dir, cfg, clients)}
    if cfg.method == "fedflap":
        base = load_base_model(cfg.model_name, cfg.model_dtype).eval()
        post_hoc = compile_model(base, per_layer_masks(np.load(run_dir / "masks.npz")))
        models["post-hoc"] = dict.fromkeys(clients, post_hoc)
        models["dense"] = dict.fromkeys(clients, base)
    elif dense:
        models["dense"] = dict.fromkeys(
            clients, load_base_model(cfg.model_name, cfg.model_dtype).eval()
        )
    return models


def _final_models(run_dir: Path, cfg: RunConfig, clients: list[int]) -> dict[int, Any]:
    """{client: the model it deploys}: a compiled / pruned / sliced model, the global adapter on the
    base model (FedIT, FedTPA), client k's truncated adapter (FlexLoRA) or the sparse global model
    (FedSpaLLM)."""
    if cfg.method == "sftp":
        return {k: load_compiled(run_dir / "compiled" / f"client-{k}") for k in clients}
    if cfg.method == "llmpruner":
        from fedprune_app.methods.llmpruner.structure import load_pruned

        return dict.fromkeys(clients, load_pruned(run_dir / "compiled").eval())
    if cfg.method == "slicegpt":
        from fedprune_app.methods.slicegpt.sliced import load_sliced

        return dict.fromkeys(clients, load_sliced(run_dir / "compiled").eval())
    if cfg.method == "fedflap":
        return dict.fromkeys(clients, load_compiled(run_dir / "compiled"))
    if cfg.method == "fedspallm":
        from transformers import AutoModelForCausalLM

        return dict.fromkeys(
            clients, AutoModelForCausalLM.from_pretrained(run_dir / "model").eval()
        )
    from peft import PeftModel

    if cfg.method == "flexlora":
        return {
            k: PeftModel.from_pretrained(
                load_base_model(cfg.model_name, cfg.model_dtype),
                run_dir / "client-adapters" / f"client-{k}",
            ).eval()
            for k in clients
        }
    return dict.fromkeys(clients, load_run(run_dir)[0])


def answer_nll(
    model: Any, tokenizer: Any, rows: list[Example], seq_len: int, batch_size: int
) -> dict[str, list]:
    """Per example, in the task's document order: the summed NLL of its answer given its question
    (`nll`) and the answer's token count (`tokens`): the units of a paired answer-perplexity
    comparison between two models."""
    scores = answer_scores(model, tokenizer, rows, seq_len, batch_size)
    return {
        "nll": [round(float(x), 6) for x in scores.nll],
        "tokens": [int(t) for t in scores.tokens],
    }


def rescore(run_dir: Path, examples: int, batch_size: int, dense: bool = False) -> dict[str, Any]:
    """Score one run's models on each client's held-out examples; the record written to
    rescore.json. `dense`: an SFT-P run's record also scores the base model (fedflap's always
    does)."""
    cfg = RunConfig.from_record(json.loads((run_dir / "config.json").read_text()))
    clients = evaluated_clients(run_dir)
    partitions = num_partitions(run_dir, cfg, clients)
    tokenizer = load_tokenizer(cfg.model_name)
    start = time.perf_counter()
    record: dict[str, Any] = {"per-source": examples, "clients": {}, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tasks, rows_of = {}, {}
        for k in clients:
            source, rows, n_test = held_out(cfg, k, partitions, examples)
            rows_of[k] = rows
            record["clients"][str(k)] = {
                "source": source,
                "examples": len(rows),
                "test-split": n_test,
                "questions": question_digest(rows),
            }
            tasks[k] = local_mc_task(
                f"fedprune_rescore_client_{k}", write_jsonl(Path(tmp) / f"client-{k}.jsonl", rows)
            )
        for name, per_client in models_of(run_dir, cfg, clients, dense).items():
            record["models"][name] = {
                str(k): lm_eval_per_example(model, tokenizer, tasks[k], batch_size)
                | answer_nll(model, tokenizer, rows_of[k], cfg.seq_len, batch_size)
                for k, model in per_client.items()
            }
    record["seconds"] = round(time.perf_counter() - start, 1)
    return record


ARTEFACT = {
    "sftp": "compiled",
    "fedflap": "compiled",
    "llmpruner": "compiled",
    "slicegpt": "compiled",
    "fedspallm": "model",
    "flexlora": "client-adapters",
}  # the rest: adapter/


def skip_reason(run_dir: Path) -> str | None:
    """Why a directory cannot be re-scored (None when it can): no config.json, or its models are not
    there."""
    config = run_dir / "config.json"
    if not config.is_file():
        return "no config.json (not a run directory)"
    method = json.loads(config.read_text()).get("method")
    artefact = ARTEFACT.get(method, "adapter")
    if not (run_dir / artefact).is_dir():
        return f"no {artefact}/ (a {method} run that did not finish, or an archived record)"
    return None


def report(run_dir: Path, record: dict[str, Any]) -> None:
    for name, per_client in record["models"].items():
        values = [v for k in sorted(per_client) for v in per_client[k]["acc"]]
        strata = [int(k) for k in sorted(per_client) for _ in per_client[k]["acc"]]
        mean, lo, hi = bootstrap_ci(values, strata=strata)
        sizes = "/".join(str(len(per_client[k]["acc"])) for k in sorted(per_client))
        print(
            f"{run_dir.name} {name}: mean acc over clients ×100 {100 * mean:.2f} [{100 * lo:.2f}, "
            f"{100 * hi:.2f}] on {sizes} examples ({record['seconds']} s)",
            flush=True,
        )


FLAGS = {"dense": "also score the untouched base model (row `dense`; fedflap runs always do)"}


def missing(record: dict[str, Any], options: dict[str, bool]) -> bool:
    """A record lacks what the flags ask for (the `dense` row)."""
    return options["dense"] and "dense" not in record.get("models", {})
