"""llmpruner's tests; its conformance settings (tests/conformance)."""

from tests.conformance import Conformance

CONFORMANCE = Conformance(
    settings={
        "llmpruner-keep-ratio": 0.6,
        "llmpruner-batches": 2,
        "llmpruner-layer-start": 0,
        "llmpruner-layer-end": 0,
        "llmpruner-centralized": False,
    }
)
