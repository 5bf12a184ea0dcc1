"""FedIT's tests; its conformance settings (tests/conformance)."""

from tests.conformance import Conformance

CONFORMANCE = Conformance(settings={})
