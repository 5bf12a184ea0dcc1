"""fedflap's tests; its conformance settings (tests/conformance)."""

from tests.conformance import Conformance

CONFORMANCE = Conformance(settings={"keep-ratios": "0.5", "fedflap-batches": 2})
