"""The template every fedprune client follows.

The ClientApp builds one client object per message (`Client(cfg, context)`) and calls `train(content)` or
`evaluate(content)`; both return the reply's RecordDict. What a client keeps between rounds lives in
`context.state` (per node, never sent); what it holds of the data is `self.data`.
"""

from __future__ import annotations

from functools import cached_property

from flwr.app import ConfigRecord, Context, RecordDict

from fedprune_app.config import RunConfig
from fedprune_app.data import ClientData, client_data


class FederatedClient:
    """Partition bookkeeping, the client's data and its private state."""

    name = "client"

    def __init__(self, cfg: RunConfig, context: Context) -> None:
        self.cfg = cfg
        self.context = context
        self.partition_id = int(context.node_config.get("partition-id", 0))
        self.num_partitions = int(context.node_config.get("num-partitions", 1))

    @cached_property
    def data(self) -> ClientData:
        return client_data(self.cfg, self.partition_id, self.num_partitions)

    @property
    def private(self) -> ConfigRecord:
        """This method's private state record in `context.state` (created on first use)."""
        if self.name not in self.context.state.config_records:
            self.context.state[self.name] = ConfigRecord()
        return self.context.state.config_records[self.name]

    def info(self) -> ConfigRecord:
        """Descriptive, non-private facts sent with each reply (which data the client is scored on)."""
        return ConfigRecord({"data": self.data.eval_source})

    def seed(self, server_round: int) -> int:
        """A seed distinct per (run seed, round, client)."""
        return int(self.cfg.seed) * 1_000_003 + server_round * 1009 + self.partition_id

    def train(self, content: RecordDict) -> RecordDict:
        raise NotImplementedError

    def evaluate(self, content: RecordDict) -> RecordDict:
        raise NotImplementedError
