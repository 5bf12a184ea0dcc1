"""The method registry: method name -> (server strategy class, client class).

Adding a method = one file in clients/, one in strategies/, one line here.
"""

from __future__ import annotations

from dataclasses import dataclass

from clients.base import FederatedClient
from clients.fedit import FedITClient
from clients.fedspallm import FedSpaLLMClient
from strategies.base import FederatedStrategy
from strategies.fedit import FedITStrategy
from strategies.fedspallm import FedSpaLLMStrategy


@dataclass(frozen=True)
class Method:
    strategy: type[FederatedStrategy]
    client: type[FederatedClient]


METHODS: dict[str, Method] = {
    "fedit": Method(FedITStrategy, FedITClient),
    "fedspallm": Method(FedSpaLLMStrategy, FedSpaLLMClient),
}


def names() -> tuple[str, ...]:
    return tuple(METHODS)


def get(name: str) -> Method:
    if name not in METHODS:
        raise KeyError(f"run-config key 'method' must be one of {', '.join(map(repr, METHODS))}, got {name!r}")
    return METHODS[name]
