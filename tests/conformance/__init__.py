"""The suites every registered method must pass: privacy, bad replies, resume (parametrised over the
registry).

A method says how to run it on the tiny model in `tests/methods/<m>/__init__.py`:

    # run-config overrides for a 3-round run on 4 tiny clients
    CONFORMANCE = Conformance(settings={...})

A registered method without one fails these suites instead of being skipped.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from flwr.app import MessageType, RecordDict

Tamper = Callable[[RecordDict], RecordDict]

# message type -> the records a reply may hold (a method adds its own in `Conformance.replies`)
COMMON_REPLIES: dict[str, set[str]] = {
    MessageType.QUERY: {"metrics"},
    MessageType.TRAIN: {"arrays", "metrics", "info"},
    MessageType.EVALUATE: {"metrics", "info"},
    f"{MessageType.EVALUATE}.reference": {"metrics", "info"},
}


@dataclass(frozen=True)
class Conformance:
    """How the conformance suites run one method."""

    settings: dict[str, Any] = field(default_factory=dict)  # run-config overrides on the tiny model
    # message type -> records beyond COMMON_REPLIES
    replies: dict[str, set[str]] = field(default_factory=dict)
    # extra overrides for the privacy run
    privacy_settings: dict[str, Any] = field(default_factory=dict)
    evaluated_by: str = MessageType.EVALUATE  # the message type by which clients score a model
    # method-specific checks on the privacy run's grid
    privacy_checks: tuple[Callable[[Any], None], ...] = ()
    # method-specific bad replies
    tampers: dict[str, tuple[Tamper, str]] = field(default_factory=dict)
    # a method whose arrays travel encoded (FedSpaLLM: uint8 packed masks, bfloat16 as uint16;
    # core.encoding): (run config, record name, its arrays) -> the arrays as the server decodes them
    # (raising if not an encoding)
    decode: Callable[[Any, str, dict[str, Any]], dict[str, Any]] | None = None

    def allowed_records(self, message_type: str) -> set[str]:
        return COMMON_REPLIES.get(message_type, set()) | self.replies.get(message_type, set())


def conformance_of(method: str) -> Conformance:
    """The method's `CONFORMANCE`, or a test failure naming the file to add."""
    try:
        module = importlib.import_module(f"tests.methods.{method}")
    except ModuleNotFoundError:
        module = None
    spec = getattr(module, "CONFORMANCE", None)
    if not isinstance(spec, Conformance):
        pytest.fail(
            f"method {method!r} has no test configuration: "
            f"add `CONFORMANCE = Conformance(settings=...)` to tests/methods/{method}/__init__.py"
        )
    return spec
