"""Process set-up: the known third-party noise is silenced, every other warning still shows."""

from __future__ import annotations

import logging
import warnings

import pytest

from fedprune_app.core.runtime import quiet_warnings


def test_known_warnings_are_silenced_and_others_still_show() -> None:
    jit = "`torch.jit.script_method` is deprecated. Please switch to `torch.compile`."
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_warnings()
        warnings.warn(jit, DeprecationWarning, stacklevel=1)
        warnings.warn(
            "`is_gradient_checkpointing` is deprecated and will be removed in v6.",
            FutureWarning,
            stacklevel=1,
        )
        warnings.warn("the adapter has no weights for layer 3", UserWarning, stacklevel=1)
        warnings.warn(jit, UserWarning, stacklevel=1)  # the same text in another category
        warnings.warn("`numpy.foo` is deprecated", DeprecationWarning, stacklevel=1)
    assert [(w.category, str(w.message)) for w in seen] == [
        (UserWarning, "the adapter has no weights for layer 3"),
        (UserWarning, jit),
        (DeprecationWarning, "`numpy.foo` is deprecated"),
    ]


def test_the_bitsandbytes_kernels_line_is_dropped_and_its_other_lines_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    quiet_warnings()
    quiet_warnings()  # idempotent: one filter
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    assert len(logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger="bitsandbytes"):
        logger.warning(
            "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please "
            "make sure you already `pip install kernels`",
            "No module named 'kernels'",
        )
        logger.warning("CUDA kernel failed: %s", "out of memory")
    assert [r.getMessage() for r in caplog.records] == ["CUDA kernel failed: out of memory"]
