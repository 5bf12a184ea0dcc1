"""FlexLoRA's tests; its conformance settings (tests/conformance)."""

from tests.conformance import Conformance

CONFORMANCE = Conformance(settings={"flexlora-ranks": "2,4,3,4"})
