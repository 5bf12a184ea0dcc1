"""The round runner: the loop every fedprune strategy runs, apart from any method.

`RoundRunner` subclasses Flower's abstract `Strategy` and owns the whole run in `start` (Flower's
own `Strategy.start` is replaced, not extended: it cannot identify nodes, retry rounds, fold replies
in as they arrive or resume). It drives a strategy (`core/strategy.py`, `FederatedStrategy`) through
its hooks and does what every method shares:

- **identify**: asks every connected node for its partition id, node-config `resources` and
  `num-partitions`, so sampling and per-client state follow partition ids, not the node ids Flower
  draws at random;
- **sampling**: ⌈fraction·N⌉ nodes with the run's seeded RNG, over the partition order; the
  evaluation panel from its own RNG, the same every round;
- **send and pull**: one message per node (`configure_round`'s payload and config), replies handed
  on as they arrive, nodes silent at `round-timeout` logged as failed;
- **reply validation**: every reply passes `common_problem` (its arrays' real bytes against their
  declared shapes, metric names, its partition id against the node's), then the method's
  `accept_reply`; a check that raises rejects that reply, never the run;
- **retries**: a round is aggregated only when at least `min-replies` replies are usable; otherwise
  it is sent again (`round-retries`) and then the run stops with `RoundFailed` (its message the
  clients' own error when every reply failed with the same one): never a silent partial aggregate,
  and a client never corrupts the global state;
- **DP release**: with `dp-clipping-norm` > 0 a round's aggregate is `dp_aggregate` (clipped
  updates, uniform mean, Gaussian noise, charged to the ledger first; `core/privacy.py`);
- **checkpoint**: `on_round_end` after every round (the ServerApp writes the checkpoint).

`start` (Flower's signature plus `first_round` / `on_round_end` for resume and checkpoints):
identify, `prepare`, round 0 (every client scores the untouched model; skipped when resuming), then
per round train → federated evaluation → server evaluation → `on_round_end`, each round ending with
its progress line.
"""

from __future__ import annotations

import contextlib
import logging
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedprune_app.core.config import RunConfig
from fedprune_app.core.privacy import PrivateRelease
from fedprune_app.core.progress import RoundProgress
from fedprune_app.core.protocol import (
    flat_metrics,
    parse_partition_id,
    record_bytes,
    spec_of,
)
from fedprune_app.core.replies import (
    ROW_FIELDS,
    examples_problem,
    identity_problem,
    metrics_problem,
    record_problem,
)
from fedprune_app.llm.evaluation import WINDOW_KEYS

log = logging.getLogger("flwr")  # Flower's handler streams it to `flwr run --stream`
Recorder = Callable[[dict[str, Any]], None]


def _tail(reason: str, n: int = 600) -> str:
    """The end of an error text (where a traceback names the exception), without terminal colour
    codes."""
    clean = re.sub(r"\x1b\[[0-9;]*m", "", reason).strip()
    return clean if len(clean) <= n else "…" + clean[-n:]


def error_line(reason: str, n: int = 500) -> str:
    """The one line of an error reply's reason (or a rejection's problem) that says what went wrong:
    the message of the exception the ClientApp raised. Flower wraps it as `<class '...'>:<'...'>`,
    and Ray's simulation as `...ClientAppException occurred. Message: <message>'>` after a
    traceback; otherwise the text's last line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", reason).strip()
    marker = "occurred. Message: "
    if marker in text:
        text = " ".join(text.rsplit(marker, 1)[1].split())
    elif match := re.fullmatch(r"<class '([\w.]+)'>:<'(.*)'>", text, re.S):
        text = f"{match[1].rsplit('.', 1)[-1]}: {' '.join(match[2].split())}"
    else:
        text = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")
    text = text.removesuffix("'>").strip() or "(no error text)"
    return text if len(text) <= n else text[:n] + "…"


class RoundFailed(RuntimeError):
    """Fewer than `min-replies` usable train replies after every retry: the run stops, the last
    checkpoint stays."""


class RoundRunner(PrivateRelease, Strategy):
    """Flower's `Strategy` with the run loop in `start`: seeded sampling by partition, per-node
    messages, reply checks, per-client logging, retries, DP release and checkpoints. The method is
    the subclass's hooks (`FederatedStrategy`)."""

    # the strategy's declarations (`FederatedStrategy` documents them)
    federated_evaluation: ClassVar[bool] = True
    evaluate_round_1: ClassVar[bool] = False
    folds_replies: ClassVar[bool] = False

    def __init__(self, cfg: RunConfig, recorder: Recorder | None = None) -> None:
        self.fraction_train = cfg.fraction_train
        self.fraction_evaluate = cfg.fraction_evaluate
        self.min_available_nodes = cfg.min_nodes
        self.cfg = cfg
        self.record = recorder or (lambda row: None)
        self.rng = random.Random(cfg.seed)
        # node -> {key: (shape, dtype)} sent
        self.sent: dict[int, dict[str, tuple[tuple[int, ...], str]]] = {}
        self.bytes_down: dict[int, int] = {}  # node -> tensor bytes of its train payload this round
        # nodes connected at the last sampling (= partitions in a simulation), and their ids
        self.num_connected, self.connected_nodes = 0, set()
        # node id -> partition id (from `identify` and train replies)
        self.node_partition: dict[int, int] = {}
        # node id -> node-config `resources` (0 = not set)
        self.node_resources: dict[int, float] = {}
        # the clients' node-config `num-partitions` (the largest `identify` heard; None: none said)
        self.num_partitions: int | None = None
        # names the run (kept on resume); clients key their checkpointed private state by it
        self.run_key = ""
        self.timeout = 3600.0
        # error_line of every unusable train reply of the current round
        self.train_problems: list[str] = []
        self.global_model_notes = {}

    def summary(self) -> None:
        """Flower's hook: log what this strategy runs with."""
        log.info(
            "[fedprune] %s: fraction-train %g, fraction-evaluate %g, min-nodes %d, min-replies %d",
            type(self).__name__,
            self.fraction_train,
            self.fraction_evaluate,
            self.min_available_nodes,
            self.cfg.min_replies,
        )

    def partition_order(self, node_id: int) -> tuple[int, int]:
        """Sort key: identified nodes by partition id, then the rest by node id."""
        return self.node_partition.get(node_id, 1 << 30), node_id

    def connected(self, grid: Grid) -> list[int]:
        """Wait for `min-nodes`, then the connected nodes in partition order."""
        while len(nodes := sorted(grid.get_node_ids())) < self.min_available_nodes:
            log.info(
                "waiting for nodes: %d connected, %d required", len(nodes), self.min_available_nodes
            )
            time.sleep(1)
        self.num_connected, self.connected_nodes = len(nodes), set(nodes)
        return sorted(nodes, key=self.partition_order)

    def sample(self, grid: Grid, fraction: float) -> list[int]:
        """Draw ⌈fraction·N⌉ of the connected nodes with the run's seeded RNG, over the partition
        order: the same seed samples the same partitions whatever node ids Flower assigned."""
        nodes = self.connected(grid)
        k = max(1, min(len(nodes), round(fraction * len(nodes))))
        return sorted(self.rng.sample(nodes, k), key=self.partition_order)

    def evaluation_panel(self, grid: Grid) -> list[int]:
        """The ⌈fraction-evaluate·N⌉ nodes that evaluate: drawn from the partition order by an RNG
        seeded afresh from `seed` at every call, so the same clients evaluate every round
        (per-client tables compare like with like across rounds) and evaluation never advances the
        training sampler's RNG."""
        nodes = self.connected(grid)
        k = max(1, min(len(nodes), round(self.fraction_evaluate * len(nodes))))
        return sorted(
            random.Random(f"{self.cfg.seed}:evaluate").sample(nodes, k), key=self.partition_order
        )

    def identify(self, grid: Grid) -> None:
        """Ask every connected node for its partition id, node-config `resources` and
        `num-partitions` (`query` message `{"query": "identity"}`, answered by
        `FederatedClient.identity`; summary.json keeps `num-partitions`, so that a run's client data
        can be dealt again afterwards). A node that does not answer is logged and sampled after the
        identified ones."""
        nodes = self.connected(grid)
        messages = [
            Message(
                content=RecordDict({"config": ConfigRecord({"query": "identity"})}),
                message_type=MessageType.QUERY,
                dst_node_id=n,
            )
            for n in nodes
        ]
        for msg in grid.send_and_receive(messages, timeout=self.timeout):
            node = msg.metadata.src_node_id
            try:
                metrics = {} if msg.has_error() else flat_metrics(msg.content)
                problem = (
                    msg.error.reason
                    if msg.has_error()
                    else identity_problem(metrics) or self.partition_problem(node, metrics)
                )
            except Exception as err:  # noqa: BLE001 - any malformed reply is this node's problem
                problem, metrics = f"unreadable identity reply ({type(err).__name__})", {}
            if problem is not None:
                log.warning("node %d did not say who it is: %s", node, _tail(problem, 300))
                continue
            self.node_partition[node] = parse_partition_id(metrics["partition-id"])
            self.node_resources[node] = float(metrics.get("resources", 0.0))
            if isinstance(count := metrics.get("num-partitions"), int):
                self.num_partitions = max(self.num_partitions or 0, count)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Flower's hook: one train message per sampled node, its payload and config from
        `configure_round` (none when `fraction-train` is 0)."""
        if self.fraction_train == 0.0:
            return []
        messages = []
        self.sent, self.bytes_down = {}, {}
        node_ids = self.sample(grid, self.fraction_train)
        for node_id, (payload, own) in self.configure_round(server_round, arrays, node_ids).items():
            self.sent[node_id], self.bytes_down[node_id] = spec_of(payload), record_bytes(payload)
            node_cfg = ConfigRecord({**dict(config), **self.message_config(server_round), **own})
            content = RecordDict({"arrays": payload, "config": node_cfg})
            messages.append(
                Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node_id)
            )
        return messages

    def message_config(self, server_round: int) -> dict[str, Any]:
        """What every train / evaluate message's config carries: the round and the run key."""
        return {"server-round": server_round, **({"run-key": self.run_key} if self.run_key else {})}

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's hook: the accepted replies aggregated, or (None, None) when none is usable.
        Refused with differential privacy on: it knows neither the sampled m nor the release
        (`train_round` calls `dp_aggregate`)."""
        if self.dp.enabled:
            raise RuntimeError(
                "aggregate_train bypasses differential privacy (dp-clipping-norm > 0): the "
                "round's release is dp_aggregate's"
            )
        accepted = self.collect_train(server_round, replies)
        if not accepted:
            log.warning("round %d: no usable reply, the global state is kept", server_round)
            return None, None
        return self.aggregate(server_round, accepted), self.mean_metrics(accepted)

    def collect_train(self, server_round: int, replies: Iterable[Message]) -> list[RecordDict]:
        """Log every train reply (accepted / rejected with its reason and node id) and return the
        usable ones, in partition order (arrival order is a race; float sums are not
        associative)."""
        accepted: list[RecordDict] = []
        for msg in replies:
            node_id = msg.metadata.src_node_id
            row: dict[str, Any] = {
                "round": server_round,
                "phase": "train",
                "node": node_id,
                "bytes-down": self.bytes_down.get(node_id, 0),
            }
            metrics: dict[str, Any] = {}
            if msg.has_error():
                problem = f"client error: {msg.error.reason}"
            elif node_id not in self.sent:
                problem = "unexpected reply"
            else:
                metrics, problem = self.common_problem(node_id, msg.content)
                if problem is None:
                    row["bytes-up"] = record_bytes(msg.content)
                    problem = self.safe_check(
                        self.accept_reply, server_round, node_id, msg.content, "train"
                    )
            self.fill_row(row, node_id, metrics, trusted=problem is None)
            row["status"] = "rejected" if problem else "accepted"
            if problem:
                row["problem"] = _tail(problem)
                self.train_problems.append(
                    error_line(msg.error.reason if msg.has_error() else problem)
                )
                log.warning(
                    "round %d: reply of node %d dropped: %s",
                    server_round,
                    node_id,
                    _tail(problem, 300),
                )
            else:
                accepted.append(
                    RecordDict({k: v for k, v in msg.content.items() if k != "arrays"})
                    if self.folds_replies  # folded in by `accept_reply`: keep its metrics only
                    else msg.content
                )
                self.claim_partition(node_id, metrics)
            self.record(row)
        accepted.sort(key=lambda r: (flat_metrics(r).get("partition-id", 1 << 30),))
        return accepted

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Flower's hook: log every evaluate reply as a row; the example-weighted mean of the good
        ones."""
        good: list[RecordDict] = []
        for msg in replies:
            node = msg.metadata.src_node_id
            row: dict[str, Any] = {"round": server_round, "phase": "evaluate", "node": node}
            metrics: dict[str, Any] = {}
            if msg.has_error():
                status, problem = "failed", msg.error.reason
            else:
                metrics, problem = self.common_problem(node, msg.content)
                if problem is None and "num-examples" in metrics:
                    problem = examples_problem(metrics)
                if problem is None:
                    self.claim_partition(node, metrics)
                    problem = self.safe_check(
                        self.accept_reply, server_round, node, msg.content, "evaluate"
                    )
                status = "rejected" if problem else "ok"
            self.fill_row(row, node, metrics, trusted=problem is None)
            row["status"] = status
            if problem:
                row["problem"] = _tail(problem)
                log.warning(
                    "round %d: evaluation on node %d %s: %s",
                    server_round,
                    node,
                    status,
                    _tail(problem, 300),
                )
            else:
                good.append(msg.content)
            self.record(row)
        return self.mean_metrics(good) if good else None

    # --- every reply, before anything reads it ----------------------------------------------------
    def common_problem(self, node_id: int, reply: RecordDict) -> tuple[dict[str, Any], str | None]:
        """The checks every train, evaluate and reference reply passes first (`core/replies.py`):
        each Array's real bytes against its declared shape and dtype, metric names that cannot
        overwrite the row, and a `partition-id` equal to the one the node declared (`identify`).
        Returns the reply's flat metrics ({} when unreadable) and the problem (None: passed)."""
        try:
            metrics = flat_metrics(reply)
        except Exception as err:  # noqa: BLE001 - e.g. bytes that are not UTF-8
            return {}, f"reply metrics cannot be read ({type(err).__name__})"
        problem = (
            self.safe_check(record_problem, reply)
            or metrics_problem(metrics)
            or self.partition_problem(node_id, metrics)
        )
        return metrics, problem

    def partition_problem(self, node_id: int, metrics: Mapping[str, Any]) -> str | None:
        """Why a reply's `partition-id` is not its node's: not a valid id, another id than the node
        declared in `identify`, or (for a node that did not answer it) the id of another node that
        is still connected. A partition that comes back on a new node id (a restarted SuperNode)
        is accepted once its old node is gone (`claim_partition`)."""
        if "partition-id" not in metrics:
            return None
        try:
            pid = parse_partition_id(metrics["partition-id"])
        except ValueError as err:
            return f"reply metric {err}"
        declared = self.node_partition.get(node_id)
        if declared is not None and pid != declared:
            return f"reply says partition-id {pid}, but node {node_id} declared {declared}"
        owner = next((n for n, p in self.node_partition.items() if p == pid), node_id)
        if owner != node_id and owner in self.connected_nodes:
            return f"reply says partition-id {pid}, which connected node {owner} declared"
        return None

    def claim_partition(self, node_id: int, metrics: Mapping[str, Any]) -> None:
        """After a reply passed `partition_problem`: a node not identified yet takes the partition
        its reply names (from any node that held it before)."""
        if node_id in self.node_partition or "partition-id" not in metrics:
            return
        pid = parse_partition_id(metrics["partition-id"])
        for old in [n for n, p in self.node_partition.items() if p == pid]:
            del self.node_partition[old]
        self.node_partition[node_id] = pid

    def fill_row(
        self, row: dict[str, Any], node_id: int, metrics: Mapping[str, Any], trusted: bool
    ) -> None:
        """A reply's row: its metrics beside the row's own fields (never over them), `client` the
        partition its node declared, else (for a `trusted` reply, one that passed every check) the
        partition it names; a rejected reply of an unidentified node stays its node's."""
        skipped = ROW_FIELDS | {"partition-id"}
        row.update({k: v for k, v in metrics.items() if k not in skipped})
        client = self.node_partition.get(node_id)
        if client is None and trusted:
            with contextlib.suppress(ValueError):
                client = parse_partition_id(metrics.get("partition-id"))
        row["client"] = client

    @staticmethod
    def safe_check(check: Callable[..., str | None], *args: Any) -> str | None:
        """`check(*args)`, with any exception it raises turned into the problem it names: a reply
        that breaks a check is rejected, never the run."""
        try:
            return check(*args)
        except Exception as err:  # noqa: BLE001 - the reply's problem, not the run's
            return f"reply could not be checked ({type(err).__name__}: {_tail(str(err), 200)})"

    @staticmethod
    def mean_metrics(replies: list[RecordDict]) -> MetricRecord:
        """Example-weighted mean of every numeric scalar metric the replies share."""
        flat = [flat_metrics(r) for r in replies]
        weights = [float(m.get("num-examples", 1)) for m in flat]
        keys = set.intersection(*(set(m) for m in flat))
        out: dict[str, float | int] = {"num-examples": int(sum(weights))}
        for k in sorted(keys - {"num-examples", "partition-id"}):
            if all(isinstance(m[k], int | float) and not isinstance(m[k], bool) for m in flat):
                out[k] = sum(m[k] * w for m, w in zip(flat, weights, strict=True)) / sum(weights)
        return MetricRecord(out)

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        first_round: int = 1,
        on_round_end: Callable[[int, ArrayRecord], None] | None = None,
    ) -> Result:
        """The run: `identify`, `prepare`, round 0 (skipped when resuming at `first_round` > 1),
        then per round `train_round` -> federated evaluation -> server evaluation
        (`evaluate_fn`) -> `on_round_end`, each round ending with its progress line
        (`[round r/N] ... elapsed, ~... left`, `core/progress.py`)."""
        self.timeout = timeout
        train_config, evaluate_config = (
            train_config or ConfigRecord(),
            evaluate_config or ConfigRecord(),
        )
        result = Result()
        # `[round r/N] ... ~t left` after every round
        progress = RoundProgress(num_rounds, self.evaluates)
        self.identify(grid)
        self.prepare(grid, timeout)
        arrays = initial_arrays
        if first_round == 1:
            progress.start_round()
            self.evaluate_round(0, grid, arrays, evaluate_config, evaluate_fn, result)
            log.info("%s", progress.round_done(0))
        for server_round in range(first_round, num_rounds + 1):
            if not self.dp_allows(server_round, num_rounds):  # the privacy budget is spent
                last = server_round - 1  # its models are final: scored by the clients, once
                if last > 0 and last not in result.evaluate_metrics_clientapp:
                    self.evaluate_round(last, grid, arrays, evaluate_config, None, result)
                break
            log.info("[fedprune] round %d/%d", server_round, num_rounds)
            progress.start_round()
            new_arrays, metrics = self.train_round(server_round, grid, arrays, train_config)
            progress.trained()
            if new_arrays is not None:
                arrays = result.arrays = new_arrays
            if metrics is not None:
                result.train_metrics_clientapp[server_round] = metrics
            self.evaluate_round(server_round, grid, arrays, evaluate_config, evaluate_fn, result)
            if on_round_end is not None:
                on_round_end(server_round, arrays)
            log.info("%s", progress.round_done(server_round))
        return result

    def train_round(
        self, server_round: int, grid: Grid, arrays: ArrayRecord, config: ConfigRecord
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Send the train messages and aggregate once at least `min-replies` replies are usable;
        below that, send the round again (a fresh sample) up to `round-retries` times, then raise
        `RoundFailed`."""
        need, attempts = self.cfg.min_replies, self.cfg.round_retries + 1
        self.train_problems, usable = [], 0
        for attempt in range(1, attempts + 1):
            messages = list(self.configure_train(server_round, arrays, config, grid))
            if not messages:  # fraction-train = 0: nothing to train
                return None, None
            if len(messages) < need:
                raise RoundFailed(
                    f"round {server_round}: run-config key 'min-replies' = {need} but a round "
                    f"samples only {len(messages)} of {self.num_connected} connected nodes; lower "
                    "'min-replies' or raise 'fraction-train'"
                )
            n_sent, pending = len(messages), self.push(grid, messages)
            # the payloads now live in the SuperLink; the server keeps only their specs
            del messages
            accepted = self.collect_train(
                server_round, self.pull(grid, pending, server_round, "train")
            )
            if len(accepted) >= need:
                new = (
                    self.dp_aggregate(server_round, accepted, arrays, n_sent)
                    if self.dp.enabled
                    else self.aggregate(server_round, accepted)
                )
                return new, self.mean_metrics(accepted)
            usable += len(accepted)
            self.record(
                {
                    "round": server_round,
                    "phase": "round-retry",
                    "attempt": attempt,
                    "usable": len(accepted),
                    "sent": n_sent,
                }
            )
            log.warning(
                "round %d (attempt %d/%d): %d usable replies of %d, min-replies = %d",
                server_round,
                attempt,
                attempts,
                len(accepted),
                n_sent,
                need,
            )
        raise RoundFailed(self.round_failure(server_round, need, attempts, usable))

    def round_failure(self, server_round: int, need: int, attempts: int, usable: int) -> str:
        """`RoundFailed`'s message: the clients' error itself when every reply of every attempt
        failed with the same one; otherwise the count, with the most common problem."""
        problems = self.train_problems
        counts = {line: problems.count(line) for line in dict.fromkeys(problems)}
        if problems and not usable and len(counts) == 1:
            return (
                f"round {server_round}: every client failed with the same error ({len(problems)} "
                f"train replies in {attempts} attempt(s)): {problems[0]}"
            )
        text = (
            f"round {server_round}: fewer than min-replies = {need} usable train replies in "
            f"{attempts} attempt(s); the global state of round {server_round - 1} is in the last "
            "checkpoint (continue with run-config key 'resume-from')"
        )
        if counts:
            line, k = max(counts.items(), key=lambda item: item[1])
            text += f"; the most common problem ({k} of {len(problems)} unusable replies): {line}"
        return text

    @staticmethod
    def push(grid: Grid, messages: list[Message]) -> dict[str, int]:
        """Push the messages; {message id: destination node} of those the grid accepted."""
        nodes = [m.metadata.dst_node_id for m in messages]
        return dict(zip(grid.push_messages(messages), nodes, strict=True))

    def pull(
        self, grid: Grid, pending: dict[str, int], server_round: int, phase: str, poll: float = 1.0
    ) -> Iterator[Message]:
        """Flower's `send_and_receive` loop, lazily: each reply is handed on as soon as it is
        pulled, so the caller can fold it in and drop it before the next one arrives. Nodes still
        silent at `round-timeout` are logged as failed (`record_silent`)."""
        pending, deadline = dict(pending), time.monotonic() + self.timeout
        while pending and time.monotonic() < deadline:
            replies = list(grid.pull_messages(list(pending)))
            for reply in replies:
                pending.pop(reply.metadata.reply_to_message_id, None)
                yield reply
            if pending and not replies:
                time.sleep(poll)
        self.record_silent(server_round, phase, list(pending.values()))

    def record_silent(self, server_round: int, phase: str, silent: Iterable[int]) -> None:
        """Log a failure for every node that sent nothing back before `round-timeout` (disconnected,
        too slow)."""
        problem = f"no reply within round-timeout = {self.timeout:g} s (disconnected or too slow)"
        for node in silent:
            self.record(
                {
                    "round": server_round,
                    "phase": phase,
                    "node": node,
                    "client": self.node_partition.get(node),
                    "status": "failed",
                    "problem": problem,
                }
            )
            if phase == "train":
                self.train_problems.append(problem)
            log.warning("round %d: node %d: %s", server_round, node, problem)

    def evaluate_round(
        self,
        server_round: int,
        grid: Grid,
        arrays: ArrayRecord,
        config: ConfigRecord,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None,
        result: Result,
    ) -> None:
        """Federated evaluation (when this round evaluates), then the server's own
        (`evaluate_fn`)."""
        messages = list(self.configure_evaluate(server_round, arrays, config, grid))
        if messages:
            replies = list(self.pull(grid, self.push(grid, messages), server_round, "evaluate"))
            metrics = self.aggregate_evaluate(server_round, replies)
            if metrics is not None:
                result.evaluate_metrics_clientapp[server_round] = metrics
        if evaluate_fn is not None:
            server_metrics = evaluate_fn(server_round, arrays)
            if server_metrics is not None:
                result.evaluate_metrics_serverapp[server_round] = server_metrics

    def score_client_references(
        self, grid: Grid, names: Iterable[str], timeout: float = 3600
    ) -> None:
        """After the last round: one `evaluate.reference` message per node and baseline (`names`,
        the method report's `client_references`); each reply's `ppl/<data>` metrics are logged as
        `reference` rows (one per client; results.md reports the mean over clients)."""
        for name in names:
            log.info("[fedprune] reference %s: every client builds it from its own data", name)
            config = ConfigRecord(
                {"reference": name, **self.message_config(self.cfg.num_server_rounds + 1)}
            )
            messages = [
                Message(
                    content=RecordDict({"config": config}),
                    message_type=f"{MessageType.EVALUATE}.reference",
                    dst_node_id=node_id,
                )
                for node_id in self.sample(grid, 1.0)
            ]
            for msg in grid.send_and_receive(messages, timeout=timeout):
                node_id = msg.metadata.src_node_id
                if msg.has_error():
                    self.record(
                        {
                            "phase": "reference",
                            "model": name,
                            "node": node_id,
                            "status": "failed",
                            "problem": _tail(msg.error.reason),
                        }
                    )
                    log.warning(
                        "reference %s on node %d failed: %s",
                        name,
                        node_id,
                        _tail(msg.error.reason, 300),
                    )
                    continue
                metrics, problem = self.common_problem(node_id, msg.content)
                if problem is None:
                    problem = self.safe_check(self.record_reference, name, node_id, metrics)
                if problem is not None:
                    self.record(
                        {
                            "phase": "reference",
                            "model": name,
                            "node": node_id,
                            "status": "rejected",
                            "problem": _tail(problem),
                        }
                    )
                    log.warning("reference %s of node %d rejected: %s", name, node_id, problem)

    def record_reference(self, name: str, node_id: int, metrics: Mapping[str, Any]) -> None:
        """A reference reply's `reference` rows: one per `ppl/<data>` metric, with its per-window
        scores where sent; all built before any is logged, so a malformed reply logs none."""
        rows = []
        for key, value in metrics.items():
            if not key.startswith("ppl/"):
                continue
            nll, tokens = (metrics.get(f"{w}/{key[4:]}") for w in WINDOW_KEYS)
            windows = {}
            if nll is not None and tokens is not None:
                counts = [float(t) for t in tokens]
                if len(counts) != len(nll) or not all(c >= 0 and c.is_integer() for c in counts):
                    raise ValueError(f"windows of {key[4:]}: token counts must be whole numbers")
                windows = {
                    "window-nll": [float(v) for v in nll],
                    "window-tokens": [int(c) for c in counts],
                }
            rows.append(
                {
                    "phase": "reference",
                    "model": name,
                    "node": node_id,
                    "client": self.node_partition.get(node_id, metrics.get("partition-id")),
                    "data": key[4:],
                    "ppl": float(value),
                    **windows,
                    "seconds": metrics.get("seconds"),
                }
            )
        for row in rows:
            self.record(row)

    def evaluates(self, server_round: int) -> bool:
        """Round 0 (unless `eval-untouched` is false) and the last round; every `eval-every` rounds
        between; round 1 too where the strategy says (`evaluate_round_1`)."""
        if server_round == 0 and not self.cfg.eval_untouched:
            return False
        if server_round == 1 and self.evaluate_round_1:
            return True
        if server_round == self.__dict__.get("dp_last_round"):  # the privacy budget's last round
            return True
        every = self.cfg.eval_every
        return server_round in (0, self.cfg.num_server_rounds) or (
            every > 0 and server_round % every == 0
        )

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Flower's hook: one evaluate message with the global arrays per node of the evaluation
        panel, in the rounds that evaluate (`evaluates`); none for a strategy without federated
        evaluation (`federated_evaluation`)."""
        if (
            not self.federated_evaluation
            or self.fraction_evaluate == 0.0
            or not self.evaluates(server_round)
        ):
            return []
        log.info(
            "[fedprune] round %d: federated evaluation%s",
            server_round,
            " of the untouched model" if server_round == 0 else "",
        )
        node_cfg = ConfigRecord({**dict(config), **self.message_config(server_round)})
        return [
            Message(
                content=RecordDict({"arrays": arrays, "config": node_cfg}),
                message_type=MessageType.EVALUATE,
                dst_node_id=node_id,
            )
            for node_id in self.evaluation_panel(grid)
        ]
