"""toy's tests; its conformance settings (tests/conformance)."""

from tests.conformance import Conformance

CONFORMANCE = Conformance(settings={"toy-server-lr": 0.5})
