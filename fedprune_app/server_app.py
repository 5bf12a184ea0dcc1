"""The ServerApp: one federated run from top to bottom.

1. validate the run config (before any model or data is touched);
2. create the run directory (config.json);
3. build the method's strategy and its initial global state;
4. round 0: every client scores the untouched model; rounds 1..R: train / evaluate (the strategy's
   loop), each reply logged to metrics.jsonl, the server scoring the global model's perplexity after
   every round and writing checkpoint/ (`resume-from` continues a run from it: its rows, arrays and
   strategy state);
5. save the final artefacts, score the comparison models (built by the server, or by every client
   from its own data), write summary.json / results.md / plots, print results.md and, when a final
   model is broken (summary.json's `warnings`), say so in one warning line.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from collections.abc import Callable

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from fedprune_app.core import registry
from fedprune_app.core.checkpoint import (
    check_fits,
    load_checkpoint,
    new_run_key,
    resume_spec,
    save_checkpoint,
)
from fedprune_app.core.config import ConfigError, RunConfig, split_list
from fedprune_app.core.privacy import check_private
from fedprune_app.core.protocol import numpy_state
from fedprune_app.core.replies import to_record
from fedprune_app.core.runtime import quiet_libraries, seed_everything
from fedprune_app.core.strategy import FederatedStrategy, MethodReport
from fedprune_app.llm.evaluation import held_out_metrics, held_out_text
from fedprune_app.report.run import ReportedRun
from fedprune_app.report.tables import left_out_line

app = ServerApp()
log = logging.getLogger("flwr")  # Flower's handler streams it to `flwr run --stream`


def server_evaluation(
    cfg: RunConfig, strategy: FederatedStrategy, run: ReportedRun
) -> Callable[[int, ArrayRecord], MetricRecord | None] | None:
    """Perplexity of the global model on the held-out text of each `server-eval-data` source,
    after the rounds `server-eval-every` names. A strategy whose `global_model` is not simply "the"
    global model says what it built in `global_model_notes` (e.g. a mask no client has, and its
    kept ratio); the rows carry those fields and results.md the label."""
    sources = split_list(cfg.server_eval_data)
    if not sources or cfg.eval_ppl_tokens == 0:
        return None
    texts = {source: held_out_text(source, cfg) for source in sources}

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        every = cfg.server_eval_every
        due = server_round in (0, cfg.num_server_rounds) or (every and server_round % every == 0)
        if not due:
            return None
        model, tokenizer = strategy.global_model(arrays)
        notes = dict(strategy.global_model_notes)
        metrics: dict[str, float] = {}
        for source, text in texts.items():
            start = time.perf_counter()
            scored = held_out_metrics(model, tokenizer, text, cfg)
            run.log(
                {
                    **notes,
                    "round": server_round,
                    "phase": "server-evaluate",
                    "data": source,
                    **scored,
                    "seconds": time.perf_counter() - start,
                }
            )
            log.info(
                "[fedprune] round %d: server perplexity on %s = %.2f (%d tokens)",
                server_round,
                source,
                scored["ppl"],
                scored["ppl-tokens"],
            )
            metrics[f"ppl/{source}"] = scored["ppl"]
        return MetricRecord(metrics)

    return evaluate


def score_references(cfg: RunConfig, report: MethodReport, run: ReportedRun) -> None:
    """Perplexity of each of the method's comparison models (its report's `reference_models`) on
    the same held-out texts, per window too (rows as the server's own: `held_out_metrics`), so
    every comparison with the global model can be paired."""
    sources = split_list(cfg.server_eval_data)
    for name, build in report.reference_models().items():
        model, tokenizer = build()
        for source in sources:
            scored = held_out_metrics(model, tokenizer, held_out_text(source, cfg), cfg)
            run.log({"phase": "reference", "model": name, "data": source, **scored})
            log.info(
                "[fedprune] reference %s: perplexity on %s = %.2f", name, source, scored["ppl"]
            )


PHONING_HOME = ("FLWR_TELEMETRY_ENABLED", "RAY_USAGE_STATS_ENABLED")  # read before the app starts


def environment_warning() -> str | None:
    """A line naming the variables that let Flower and Ray report usage over the network, when the
    shell that started the SuperLink left them on (the app starts too late to turn them off)."""
    on = [name for name in PHONING_HOME if os.environ.get(name) != "0"]
    if not on:
        return None
    return (
        f"[fedprune] {' and '.join(on)} not set to 0 where the SuperLink started: Flower and "
        "Ray may report usage over the network; `export "
        + " ".join(f"{n}=0" for n in on)
        + "` before `flwr run` (fedprune run sets them)"
    )


@app.main()
def main(grid: Grid, context: Context) -> None:
    """The ServerApp's one run, steps 1-5 of this module's docstring."""
    if (warning := environment_warning()) is not None:
        log.warning(warning)
    cfg = RunConfig.from_flower(context.run_config, methods=registry.names())
    check_private(cfg)  # a method that cannot be DP says so, before any model loads
    if (problem := registry.architecture_problem(cfg.method, cfg.model_name)) is not None:
        raise ConfigError(problem)  # a structural method on an architecture it cannot rewrite
    # checked before anything is loaded
    checkpoint = load_checkpoint(cfg) if cfg.resume_from else None
    quiet_libraries()
    seed_everything(cfg.seed)
    run = ReportedRun.create(cfg, context.run_id)
    log.info("[fedprune] %s: run directory %s", cfg.method, run.path)
    report: MethodReport | None = None  # adds the method's part of results.md once it exists
    try:
        strategy = registry.strategy_class(cfg.method)(cfg, recorder=run.log)
        report = strategy.report_class(strategy)
        # names the clients' state directories: unique, even for two runs started in one second
        strategy.run_key = checkpoint.run_key if checkpoint else new_run_key(run.path.name)
        initial = strategy.initial_arrays()
        first_round = 1
        # continue after the checkpointed round, with its rows, arrays and state
        if checkpoint is not None:
            spec = resume_spec(cfg, numpy_state(initial), checkpoint.arrays)  # the launcher's
            check_fits(checkpoint, cfg, spec)
            run.extend(checkpoint.rows())
            strategy.load_state_dict(checkpoint.strategy)
            # DP: the interrupted run's ledger file, with releases after its checkpoint
            strategy.continue_ledger(checkpoint.run_dir, checkpoint.round)
            initial, first_round = to_record(checkpoint.arrays), checkpoint.round + 1
            log.info("[fedprune] resuming %s after round %d", checkpoint.run_dir, checkpoint.round)
        strategy.keep_ledger(run.path)  # DP: every release charged in privacy-ledger.json first
        initial_ready = time.time() - run.started

        def on_round_end(server_round: int, arrays: ArrayRecord) -> None:
            every = cfg.checkpoint_every
            if every and (server_round % every == 0 or server_round == cfg.num_server_rounds):
                save_checkpoint(
                    run.path,
                    server_round,
                    strategy.run_key,
                    numpy_state(arrays),
                    strategy.state_dict(),
                )

        # seconds per stage; `fedprune bench profile` splits rounds
        phases = {"set-up": round(initial_ready, 3)}
        started = time.time()
        result = strategy.start(
            grid=grid,
            initial_arrays=initial,
            num_rounds=cfg.num_server_rounds,
            timeout=cfg.round_timeout,
            train_config=ConfigRecord(),
            evaluate_config=ConfigRecord(),
            evaluate_fn=server_evaluation(cfg, strategy, run),
            first_round=first_round,
            on_round_end=on_round_end,
        )
        phases["rounds"], started = round(time.time() - started, 3), time.time()
        # no round produced an update: keep the start
        final = result.arrays if len(result.arrays) else initial
        artefacts = report.save_final(final, run.path)
        phases["final-artefacts"], started = round(time.time() - started, 3), time.time()
        score_references(cfg, report, run)
        strategy.score_client_references(grid, report.client_references())
        phases["references"] = round(time.time() - started, 3)
        privacy = strategy.privacy_summary()  # ε at δ, where DP is on
        summary = run.finish(
            "completed",
            {
                "artefacts": artefacts,
                "phase-seconds": phases,
                "initial-state-seconds": round(initial_ready, 3),
                **({"num-partitions": n} if (n := strategy.num_partitions) else {}),
                **({"privacy": privacy} if privacy else {}),
            },
            report,
        )
    except BaseException as err:
        error = traceback.format_exc()[-4000:]
        # what `fedprune run` prints as the run's error
        message = f"{type(err).__name__}: {err}".strip()
        try:
            run.finish("failed", {"error": error, "error-message": message}, report)
        finally:
            log.error("[fedprune] run failed: %s (see %s/summary.json)", message, run.path)
        raise
    print((run.path / "results.md").read_text(), flush=True)
    if summary["warnings"]:
        log.warning(
            "[fedprune] %d broken model(s), listed at the top of results.md above and in "
            'summary.json\'s "warnings"',
            len(summary["warnings"]),
        )
    log.info("[fedprune] run directory: %s", run.path)
    if left_out := left_out_line(summary):  # the last line of a run that lost replies
        log.warning("[fedprune] the run completed, but %s", left_out)
