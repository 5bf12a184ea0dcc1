"""The ClientApp: validate the run config, build the method's client, answer train/evaluate messages."""

from __future__ import annotations

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedprune_app import registry
from fedprune_app.config import RunConfig
from fedprune_app.runtime import quiet_libraries

app = ClientApp()


def make_client(context: Context):  # -> FederatedClient
    cfg = RunConfig.from_flower(context.run_config, methods=registry.names())
    if int(cfg.torch_threads):
        torch.set_num_threads(int(cfg.torch_threads))
    quiet_libraries()
    return registry.get(str(cfg.method)).client(cfg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    return Message(content=make_client(context).train(msg.content), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return Message(content=make_client(context).evaluate(msg.content), reply_to=msg)


@app.evaluate("reference")
def reference(msg: Message, context: Context) -> Message:
    """`evaluate.reference` messages: a baseline the client builds from its own data (see FederatedClient)."""
    return Message(content=make_client(context).reference(msg.content), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """`query` messages: a one-off question before training (FedTPA's mean feature vector, `query` of the client)."""
    return Message(content=make_client(context).query(msg.content), reply_to=msg)
