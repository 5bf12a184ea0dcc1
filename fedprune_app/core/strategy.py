"""The strategy base: what a method says about its rounds, in seven hooks.

The loop (identify, sampling, send, retries, timeouts, reply checks, DP release, checkpoints) is
`core/rounds.py`'s `RoundRunner`; a method subclasses `FederatedStrategy` and overrides the hooks
it needs (the LoRA base two, the conformance toy four):

- `initial_arrays()`                      the global state round 1 starts from (every method);
- `prepare(grid, timeout)`                once before round 0 (e.g. a one-off query of every
                                          client);
- `configure_round(round, arrays, nodes)` each sampled node's payload and config entries (default:
                                          the global arrays, no entries);
- `accept_reply(round, node, reply, phase)`
                                          check a train or evaluate reply and keep what the method
                                          needs of it (default: a train reply must hold what was
                                          sent);
- `aggregate(round, replies)`             the next global arrays (default: FedAvg);
- `global_model(arrays)`                  a model with the global state loaded (server evaluation);
- `state_dict()` / `load_state_dict()`    what a checkpoint holds beyond the global arrays.

Declared, not overridden: `report_class` (the method's part of the run's report, a `MethodReport`:
its final artefacts, reference models and results sections; rendered by `fedprune_app.report`),
`federated_evaluation` and `evaluate_round_1` (which rounds the clients score), `folds_replies`
(large replies folded in as they arrive), and for
differential privacy `dp_release` / `dp_unsupported` (`core/privacy.py`, `PrivateRelease`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from flwr.serverapp import Grid

from fedprune_app.core.protocol import flat_metrics, numpy_state, parse_partition_id
from fedprune_app.core.replies import check_arrays, examples_problem, to_record, weighted_average
from fedprune_app.core.rounds import Recorder, RoundFailed, RoundRunner, error_line, log

__all__ = [
    "HOOKS",
    "FederatedStrategy",
    "MethodReport",
    "Recorder",
    "RoundFailed",
    "error_line",
    "log",
]

Spec = dict[str, tuple[tuple[int, ...], str]]
Task = tuple[ArrayRecord, dict[str, Any]]  # a node's train payload and its config entries
# the methods a strategy may override (state_dict and load_state_dict are one pair)
HOOKS = (
    "initial_arrays",
    "prepare",
    "configure_round",
    "accept_reply",
    "aggregate",
    "global_model",
    "state_dict",
    "load_state_dict",
)


class MethodReport:
    """A method's part of its run's report, built once per run with its strategy
    (`FederatedStrategy.report_class`): the final artefacts, the comparison models, its sections of
    results.md. Everything here is optional; the base adds nothing."""

    def __init__(self, strategy: FederatedStrategy) -> None:
        self.strategy = strategy

    def save_final(self, arrays: ArrayRecord, out_dir: Path) -> dict[str, str]:
        """Write the final artefacts (adapters, compiled models, masks) under the run directory.

        Returns:
            {artefact name: path relative to `out_dir`} for summary.json; none by default.
        """
        return {}

    def reference_models(self) -> dict[str, Callable[[], tuple[Any, Any]]]:
        """Comparison models the server scores beside the final global one:
        {name: build() -> (model, tokenizer)}."""
        return {}

    def client_references(self) -> list[str]:
        """Names of the baselines every client builds from its own data and scores
        (`FederatedClient.reference`), asked for after the last round."""
        return []

    def server_columns(self) -> dict[str, tuple[str, str]]:
        """The numbers of the strategy's `global_model_notes` that results.md shows beside the
        server's scores: {row key: (column heading, legend line)}; none by default."""
        return {}

    def results_sections(self, records: list[dict[str, Any]]) -> str:
        """The method's own sections of results.md after the shared tables, from every metrics row
        of the run (e.g. its deployed models): Markdown starting with a blank line, or ""."""
        return ""


class FederatedStrategy(RoundRunner):
    """A method's server side: the hooks above, run by `RoundRunner`."""

    # the method's part of the run's report (a `MethodReport` subclass)
    report_class: ClassVar[type[MethodReport]] = MethodReport
    # False: the clients never score the global model (the server does, on held-out text)
    federated_evaluation: ClassVar[bool] = True
    # True: the clients also score round 1's model (a one-shot cut before its recovery rounds)
    evaluate_round_1: ClassVar[bool] = False
    # True: `accept_reply` folds each train reply into a running aggregate, so `aggregate` gets
    # the replies' metrics only (a round never holds every client's weights at once)
    folds_replies: ClassVar[bool] = False

    global_model_notes: dict[str, Any]
    """What the last `global_model` call built, when that is not simply the global model: `model` (a
    label results.md prints above the server's table) and numbers (e.g. the kept share of a pruned
    model). Every server-evaluate row of that call carries these fields; the report's
    `server_columns` says which numbers results.md tabulates. Empty by default."""

    def initial_arrays(self) -> ArrayRecord:
        """The global state the first round starts from (every method defines it).

        Returns:
            The arrays round 1's `configure_round` gets.
        """
        raise NotImplementedError

    def prepare(self, grid: Grid, timeout: float) -> None:
        """Called once before round 0 (e.g. a one-off query of every client); nothing by default.

        Args:
            grid: Flower's grid, to send messages.
            timeout: seconds to wait for replies (`round-timeout`).
        """

    def configure_round(
        self, server_round: int, arrays: ArrayRecord, node_ids: list[int]
    ) -> dict[int, Task]:
        """What each sampled node gets this round: its train payload and the entries its message's
        config adds to the round's (layer ids, ranks, budgets). By default every node gets the
        global arrays and no entries. A retried round is configured again.

        Args:
            server_round: the round about to be sent.
            arrays: the global arrays.
            node_ids: the sampled nodes, in partition order.

        Returns:
            {node id: (payload, {key: bool/int/float/str})}; what a train reply must hold is
            checked against the payload's spec by default (`accept_reply`).
        """
        return {node_id: (arrays, {}) for node_id in node_ids}

    def accept_reply(
        self, server_round: int, node_id: int, reply: RecordDict, phase: str
    ) -> str | None:
        """Check a reply that passed the common checks, and keep what the method needs of it.

        A train reply (`phase` "train") that passes goes to `aggregate`; a method with large
        replies folds them into a running aggregate here and declares `folds_replies`, so that
        `aggregate` gets their metrics only. The default checks the
        `arrays` record against the payload sent (`reply_arrays_problem`). An evaluate reply
        (`phase` "evaluate") passes by default; a method may keep something of it (e.g. each
        client's final masks). The node's partition is `self.node_partition[node_id]`.

        Args:
            server_round: the round the reply answers.
            node_id: the node that replied.
            reply: its content.
            phase: "train" or "evaluate".

        Returns:
            Why the reply is unusable in one phrase (it is then dropped and logged), or None.
        """
        if phase != "train":
            return None
        return self.reply_arrays_problem(reply, self.sent[node_id])

    def aggregate(self, server_round: int, replies: list[RecordDict]) -> ArrayRecord:
        """The new global arrays from the round's accepted replies; by default FedAvg weighted by
        `num-examples`.

        Args:
            server_round: the round being aggregated.
            replies: the accepted replies (their metrics only under `folds_replies`), in
                partition order.

        Returns:
            The next global arrays.
        """
        states = [numpy_state(r.array_records["arrays"]) for r in replies]
        weights = [float(flat_metrics(r)["num-examples"]) for r in replies]
        return to_record(weighted_average(states, weights))

    def global_model(self, arrays: ArrayRecord) -> tuple[Any, Any]:
        """A model with the global state loaded: what the server scores every round
        (`server-eval-data`) and the report's artefacts start from. A strategy whose model is not
        simply "the" global model says what it built in `global_model_notes`.

        Args:
            arrays: the global arrays.

        Returns:
            (model, tokenizer), in eval mode.
        """
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Server-side state a checkpoint needs beyond the global arrays: the sampling and training
        RNGs and the privacy ledger here; a subclass adds its own to this."""
        return {
            "rng": self.rng.getstate(),
            "numpy-rng": np.random.get_state(),
            "torch-rng": torch.get_rng_state(),
            **self.dp_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (a resumed run; a subclass restores its own, then
        calls this)."""
        self.rng.setstate(state["rng"])
        np.random.set_state(state["numpy-rng"])
        torch.set_rng_state(state["torch-rng"])
        self.load_dp_state(state)

    # --- helpers for the hooks (not hooks) --------------------------------------------------------
    @staticmethod
    def reply_arrays_problem(reply: RecordDict, expected: Spec) -> str | None:
        """Why a train reply's content is not a usable update of `expected` ({key: (shape,
        dtype)}): no `arrays` record, a bad example count or partition id, or arrays that differ in
        keys, shapes or finiteness."""
        if "arrays" not in reply.array_records:
            return "reply holds no 'arrays' record"
        metrics = flat_metrics(reply)
        if (problem := examples_problem(metrics)) is not None:
            return problem
        if "partition-id" in metrics:
            try:
                parse_partition_id(metrics["partition-id"])
            except ValueError as err:
                return str(err)
        return check_arrays(reply.array_records["arrays"], expected)
