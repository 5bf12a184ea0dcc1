"""The ClientApp: validate the run config, build the method's client, answer the server's messages.

Every handler first restores the client's checkpointed private state when a resumed run starts it
with an empty `context.state` (`FederatedClient.restore_state`); a train handler saves it
afterwards, on this device.
"""

from __future__ import annotations

import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedprune_app.core import registry, untouched
from fedprune_app.core.client import FederatedClient
from fedprune_app.core.config import RunConfig
from fedprune_app.core.runtime import quiet_libraries

app = ClientApp()


def make_client(context: Context) -> FederatedClient:
    """The run's method's client for this node, its run config validated first."""
    cfg = RunConfig.from_flower(context.run_config, methods=registry.names())
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    quiet_libraries()
    return registry.client_class(cfg.method)(cfg, context)


def _restored(msg: Message, context: Context) -> FederatedClient:
    client = make_client(context)
    client.restore_state(msg.content)
    return client


@app.train()
def train(msg: Message, context: Context) -> Message:
    """`train` messages: private state restored, trained, then checkpointed on this device."""
    client = _restored(msg, context)
    content = client.private_reply(msg.content, client.train(msg.content))  # DP: clipped here
    client.save_state(msg.content)
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Round 0 (the untouched model) is answered from this machine's cache when it holds the same
    model, data, settings and code (`cache-untouched`, fedprune_app/core/untouched.py); scored and
    kept otherwise."""
    client = _restored(msg, context)
    config = msg.content.config_records.get("config")
    if not client.cfg.cache_untouched or config is None or int(config.get("server-round", -1)) != 0:
        return Message(content=client.evaluate(msg.content), reply_to=msg)
    key = untouched.cache_key(
        dict(context.run_config), dict(context.node_config), type(client).__module__
    )
    cached = untouched.lookup(key)
    if cached is not None:
        content = RecordDict(
            {"metrics": MetricRecord({**cached, "cached": 1}), "info": client.info()}
        )
        return Message(content=content, reply_to=msg)
    content = client.evaluate(msg.content)
    if set(content.keys()) <= {"metrics", "info"} and "metrics" in content.metric_records:
        untouched.store(key, dict(content.metric_records["metrics"]))
    return Message(content=content, reply_to=msg)


@app.evaluate("reference")
def reference(msg: Message, context: Context) -> Message:
    """`evaluate.reference` messages: a baseline the client builds from its own data (see
    FederatedClient)."""
    return Message(content=_restored(msg, context).reference(msg.content), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """`query` messages: `{"query": "identity"}` (every method, before round 0: partition id and
    resources) or the method's own one-off question (e.g. a client's mean feature vector)."""
    client = make_client(context)
    config = msg.content.config_records.get("config")
    content: RecordDict = (
        client.identity()
        if config and config.get("query") == "identity"
        else client.query(msg.content)
    )
    return Message(content=content, reply_to=msg)
