"""Re-score finished SFT-P grid runs (sftp, fedflap, llmpruner, slicegpt) on more held-out examples per client.

In-run each client evaluates a small test split (30 examples by default), so that Table 1/2 accuracies can be
checked for noise.

Each client k is scored, with lm-eval zero-shot like in-run, on its own task's test split (the in-run examples)
plus up to `--examples` examples of that task that no split of the run read (`data.unused_tail`: the seeded
shuffle's tail after test | val | train; a small task may have none left, then only its test split counts), by
the model it deploys:
  sftp     `compiled/client-<k>` (its deterministic mask, LoRA merged; equal to the in-run masked model within
           float tolerance, see tests/test_routing.py); with `--dense` also the base model (`dense`), so that a
           run whose seed drew test splits no fedflap run scored is compared with the untouched model on its own
           questions (`python -m tools.compare_runs <run> <run> --b-model dense`);
  fedflap  `compiled/` for every client, and the run's two references: `post-hoc` (the base model compiled with
           the run's masks.npz, no LoRA: fedflap's round 1) and `dense` (the base model: round 0);
  llmpruner, slicegpt  `compiled/` (the pruned / sliced model, LoRA merged) for every client.
Per-example correctness (acc and acc_norm) and the answer's NLL and token count (`nll`, `tokens`: answer
perplexity, paired between models) go to `<run>/rescore.json`, with a digest of each client's questions
(`tools.compare_runs` pairs two runs only on the same questions); the SFT-P grid renders it with paired,
per-client stratified bootstrap intervals. A run whose rescore.json has the same `--examples` is skipped.

    .venv/bin/python tools/rescore_accuracy.py outputs/grids/sftp/2026* --examples 100
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
from fedprune_app.llm.models import load_base_model, load_tokenizer  # noqa: E402
from fedprune_app.methods.sftp.routing import compile_model, load_compiled, per_layer_masks  # noqa: E402
from tools.rescore import rescore_runs  # noqa: E402

METHODS = ("sftp", "fedflap", "llmpruner", "slicegpt")


def evaluated_clients(run_dir: Path) -> list[int]:
    """The client (partition) ids that evaluated in the run, from its metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return sorted({int(r["client"]) for r in rows if r.get("phase") == "evaluate" and isinstance(r.get("client"), int)})


def held_out(cfg: RunConfig, client: int, num_clients: int, n: int) -> tuple[str, list[Example], int]:
    """(source, examples, how many of them are the in-run test split) of one client: its test split, then up to n
    unused examples of the same source."""
    data = client_data(cfg, client, num_clients)
    return data.eval_source, list(data.test) + unused_tail(cfg, data.eval_source, n), len(data.test)


def question_digest(rows: list[Example]) -> str:
    """A short digest of the examples a client was scored on, in order: two records pair only when it is equal."""
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


def models_of(run_dir: Path, cfg: RunConfig, clients: list[int], dense: bool = False) -> dict[str, dict[int, Any]]:
    """{row: {client: the model it is scored with}} of one run (see the module docstring)."""
    if cfg.method == "sftp":
        models = {"final": {k: load_compiled(run_dir / "compiled" / f"client-{k}") for k in clients}}
        if dense:
            models["dense"] = dict.fromkeys(clients, load_base_model(cfg.model_name, cfg.model_dtype).eval())
        return models
    if cfg.method == "llmpruner":
        from fedprune_app.methods.llmpruner.structure import load_pruned

        return {"final": dict.fromkeys(clients, load_pruned(run_dir / "compiled").eval())}
    if cfg.method == "slicegpt":
        from fedprune_app.methods.slicegpt.sliced import load_sliced

        return {"final": dict.fromkeys(clients, load_sliced(run_dir / "compiled").eval())}
    final = load_compiled(run_dir / "compiled")
    base = load_base_model(cfg.model_name, cfg.model_dtype).eval()
    post_hoc = compile_model(base, per_layer_masks(np.load(run_dir / "masks.npz")))
    return {"final": dict.fromkeys(clients, final), "post-hoc": dict.fromkeys(clients, post_hoc),
            "dense": dict.fromkeys(clients, base)}


def answer_nll(model: Any, tokenizer: Any, rows: list[Example], seq_len: int, batch_size: int) -> dict[str, list]:
    """Per example, in the task's document order: the summed NLL of its answer given its question (`nll`) and the
    answer's token count (`tokens`): the units of a paired answer-perplexity comparison between two models."""
    scores = answer_scores(model, tokenizer, rows, seq_len, batch_size)
    return {"nll": [round(float(x), 6) for x in scores.nll], "tokens": [int(t) for t in scores.tokens]}


def rescore(run_dir: Path, examples: int, batch_size: int, dense: bool = False) -> dict[str, Any]:
    """Score one run's models on each client's held-out examples; the record written to rescore.json. `dense`:
    an SFT-P run's record also scores the base model (fedflap's always does)."""
    cfg = RunConfig.from_flower(json.loads((run_dir / "config.json").read_text()))
    clients = evaluated_clients(run_dir)
    tokenizer = load_tokenizer(cfg.model_name)
    start = time.perf_counter()
    record: dict[str, Any] = {"per-source": examples, "clients": {}, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tasks, rows_of = {}, {}
        for k in clients:
            source, rows, n_test = held_out(cfg, k, len(clients), examples)
            rows_of[k] = rows
            record["clients"][str(k)] = {"source": source, "examples": len(rows), "test-split": n_test,
                                         "questions": question_digest(rows)}
            tasks[k] = local_mc_task(f"fedprune_rescore_client_{k}", write_jsonl(Path(tmp) / f"client-{k}.jsonl", rows))
        for name, per_client in models_of(run_dir, cfg, clients, dense).items():
            record["models"][name] = {str(k): lm_eval_per_example(model, tokenizer, tasks[k], batch_size)
                                      | answer_nll(model, tokenizer, rows_of[k], cfg.seq_len, batch_size)
                                      for k, model in per_client.items()}
    record["seconds"] = round(time.perf_counter() - start, 1)
    return record


def skip_reason(run_dir: Path) -> str | None:
    config = run_dir / "config.json"
    method = json.loads(config.read_text()).get("method") if config.is_file() else None
    if method not in METHODS or not (run_dir / "compiled").is_dir():
        return f"not a finished {' / '.join(METHODS)} run with compiled/"
    return None


def report(run_dir: Path, record: dict[str, Any]) -> None:
    for name, per_client in record["models"].items():
        values = [v for k in sorted(per_client) for v in per_client[k]["acc"]]
        strata = [int(k) for k in sorted(per_client) for _ in per_client[k]["acc"]]
        mean, lo, hi = bootstrap_ci(values, strata=strata)
        sizes = "/".join(str(len(per_client[k]["acc"])) for k in sorted(per_client))
        print(f"{run_dir.name} {name}: mean acc over clients ×100 {100 * mean:.2f} [{100 * lo:.2f}, {100 * hi:.2f}] "
              f"on {sizes} examples ({record['seconds']} s)", flush=True)


def main() -> None:
    rescore_runs(__doc__.splitlines()[0], "unused examples per client's task, at most", skip_reason, rescore, report,
                 flags={"dense": "SFT-P runs: also score the untouched base model (row `dense`)"},
                 missing=lambda record, options: options["dense"] and "dense" not in record.get("models", {}))


if __name__ == "__main__":
    main()
