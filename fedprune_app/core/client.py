"""The template every fedprune client follows.

The ClientApp builds one client object per message (`Client(cfg, context)`) and calls
`train(content)` or `evaluate(content)`; both return the reply's RecordDict. What a client keeps
between rounds lives in `context.state` (per node, never sent); what it holds of the data is
`self.data`.
"""

from __future__ import annotations

from collections import Counter
from functools import cached_property
from pathlib import Path
from typing import ClassVar

from flwr.app import ConfigRecord, Context, MetricRecord, RecordDict

from fedprune_app.core.checkpoint import client_state_dir, load_client_state, save_client_state
from fedprune_app.core.config import NodeConfig, RunConfig
from fedprune_app.core.privacy import DPConfig, clip_update, float_keys
from fedprune_app.core.protocol import numpy_state, to_record
from fedprune_app.core.runtime import client_seed
from fedprune_app.llm.data import ClientData, client_data, source_splits


class FederatedClient:
    """Partition bookkeeping, the client's data and its private state."""

    name = "client"
    dp_clips_on_client: ClassVar[bool] = False  # its train reply = the sent arrays + an update

    def __init__(self, cfg: RunConfig, context: Context) -> None:
        self.cfg = cfg
        self.context = context
        node = NodeConfig.from_flower(context.node_config)  # ConfigError naming the bad key
        self.partition_id = node.partition_id
        self.num_partitions = node.num_partitions
        # a private JSONL on this device, replaces the partition
        self.data_path: str | None = node.data_path
        self.resources: float | None = node.resources  # its compute share r_i, when it sets one
        # where checkpointed private state goes (None = default)
        self.state_dir: str | None = node.state_dir

    @cached_property
    def data(self) -> ClientData:
        """This client's data: its node's JSONL file (`data-path`) or its share of `client-data`."""
        if self.data_path is not None:
            return local_file_data(self.cfg, self.partition_id, self.data_path)
        return client_data(self.cfg, self.partition_id, self.num_partitions)

    @property
    def private(self) -> ConfigRecord:
        """This method's private state record in `context.state` (created on first use)."""
        if self.name not in self.context.state.config_records:
            self.context.state[self.name] = ConfigRecord()
        return self.context.state.config_records[self.name]

    def info(self) -> ConfigRecord:
        """Descriptive, non-private facts sent with each reply (which data the client is scored
        on)."""
        return ConfigRecord({"data": self.data.eval_source})

    def seed(self, server_round: int) -> int:
        """A seed distinct per (run seed, round, client)."""
        return client_seed(self.cfg.seed, server_round, self.partition_id)

    def identity(self) -> RecordDict:
        """The answer to the server's `{"query": "identity"}`: partition id and node-config
        `resources` (its compute share r_i; 0 = not set). Nothing about the data."""
        return RecordDict(
            {
                "metrics": MetricRecord(
                    {
                        "partition-id": self.partition_id,
                        "num-partitions": self.num_partitions,
                        "resources": float(self.resources or 0.0),
                    }
                )
            }
        )

    def query(self, content: RecordDict) -> RecordDict:
        """A method's own one-off question (e.g. a mean feature vector); none by default."""
        raise NotImplementedError(
            f"method {self.cfg.method!r} answers no query {dict(content.config_records)}"
        )

    # --- the private state on this device, across an interruption ---------------------------------
    def state_file(self, content: RecordDict) -> Path | None:
        """Where this client checkpoints `context.state`: `<state-dir>/<run-key>/partition-<id>/`
        (None when the server sent no run key)."""
        key = (
            str(content.config_records["config"].get("run-key", "")) if "config" in content else ""
        )
        return client_state_dir(self.state_dir, key, self.partition_id) if key else None

    def restore_state(self, content: RecordDict) -> None:
        """A resumed run starts with an empty `context.state`: load the one this client saved after
        its last train message before this round (same run key), so its private state (EMAs,
        embeddings) continues."""
        directory = self.state_file(content)
        if directory is None or len(self.context.state.keys()) > 0:
            return
        server_round = int(content.config_records["config"].get("server-round", 1 << 30))
        saved = load_client_state(directory, before_round=server_round)
        if saved is not None:
            for name, record in saved.items():
                self.context.state[name] = record

    def save_state(self, content: RecordDict) -> None:
        """After a train message: checkpoint `context.state` (it never leaves this device)."""
        directory = self.state_file(content)
        if directory is not None and len(self.context.state.keys()) > 0:
            save_client_state(
                directory, int(content.config_records["config"]["server-round"]), self.context.state
            )

    def train(self, content: RecordDict) -> RecordDict:
        """The reply to a train message: the updated arrays and `metrics` (`num-examples`, ...).

        Args:
            content: the message's arrays and config (`server-round`, `run-key`, the node's own).

        Returns:
            The reply's content.
        """
        raise NotImplementedError

    def private_reply(self, content: RecordDict, reply: RecordDict) -> RecordDict:
        """With `dp-clipping-norm` = C > 0 and a reply whose arrays update the sent ones
        (`dp_clips_on_client`): the update Δ = reply − sent of every float tensor sent back in the
        same shape, clipped on this device to ‖Δ‖₂ ≤ C jointly (DP-FedAvg's per-user clipping,
        `core/privacy.clip_update`), so the server never holds an unclipped update; the metric
        `dp-clipped` says (0/1) whether clipping shrank it. Otherwise `reply`."""
        dp = self.cfg.section(DPConfig)
        sent, mine = content.array_records.get("arrays"), reply.array_records.get("arrays")
        if not dp.enabled or not self.dp_clips_on_client or sent is None or mine is None:
            return reply
        reference, local = numpy_state(sent), numpy_state(mine)
        keys = [
            k for k in float_keys(local) if k in reference and reference[k].shape == local[k].shape
        ]
        if not keys:
            return reply
        clipped, norm = clip_update(local, reference, keys, dp.dp_clipping_norm)
        reply["arrays"] = to_record(clipped)
        if "metrics" in reply.metric_records:
            reply.metric_records["metrics"]["dp-clipped"] = int(norm > dp.dp_clipping_norm)
        return reply

    def evaluate(self, content: RecordDict) -> RecordDict:
        """The reply to an evaluate message: the client's scores on its own test split (`metrics`).

        Args:
            content: the message's arrays (the global state) and its config.

        Returns:
            The reply's content.
        """
        raise NotImplementedError

    def reference(self, content: RecordDict) -> RecordDict:
        """A comparison model built from this client's data alone (e.g. pruned on its own data),
        scored here.
        `content.config_records["config"]["reference"]` names it; the reply carries metrics only."""
        name = content.config_records["config"]["reference"]
        raise NotImplementedError(
            f"method {self.cfg.method!r} has no client-side reference {name!r}"
        )


def local_file_data(cfg: RunConfig, partition_id: int, data_path: str) -> ClientData:
    """A device's own JSONL file (node-config `data-path`) as this client's data, split like any
    `client-data` source (`jsonl:` reader, seeded test | val | train split of `data.source_splits`,
    the same sizes). The file's name (not its path) is what replies report as the client's data."""
    splits = source_splits(
        f"jsonl:{data_path}", cfg.seed, cfg.test_examples, cfg.val_examples, cfg.max_train_examples
    )
    return ClientData(
        partition_id,
        splits.train,
        splits.val,
        splits.test,
        f"data-path:{Path(data_path).name}",
        splits.test_path,
        Counter(e["source"] for e in splits.train),
    )
