"""The method registry: method name -> (server strategy class, client class).

Adding a method = one file in clients/, one in strategies/, one line here.
"""

from __future__ import annotations

from dataclasses import dataclass

from clients.base import FederatedClient
from clients.fedflap import FedFLAPClient
from clients.fedit import FedITClient
from clients.fedspallm import FedSpaLLMClient
from clients.fedtpa import FedTPAClient
from clients.flexlora import FlexLoRAClient
from clients.sftp import SFTPClient
from strategies.base import FederatedStrategy
from strategies.fedflap import FedFLAPStrategy
from strategies.fedit import FedITStrategy
from strategies.fedspallm import FedSpaLLMStrategy
from strategies.fedtpa import FedTPAStrategy
from strategies.flexlora import FlexLoRAStrategy
from strategies.sftp import SFTPStrategy


@dataclass(frozen=True)
class Method:
    strategy: type[FederatedStrategy]
    client: type[FederatedClient]


METHODS: dict[str, Method] = {
    "fedit": Method(FedITStrategy, FedITClient),
    "fedspallm": Method(FedSpaLLMStrategy, FedSpaLLMClient),
    "fedtpa": Method(FedTPAStrategy, FedTPAClient),
    "flexlora": Method(FlexLoRAStrategy, FlexLoRAClient),
    "sftp": Method(SFTPStrategy, SFTPClient),
    "fedflap": Method(FedFLAPStrategy, FedFLAPClient),  # SFT-P's federated structural baseline
}


def names() -> tuple[str, ...]:
    return tuple(METHODS)


def get(name: str) -> Method:
    if name not in METHODS:
        raise KeyError(f"run-config key 'method' must be one of {', '.join(map(repr, METHODS))}, got {name!r}")
    return METHODS[name]
