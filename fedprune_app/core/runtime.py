"""Process set-up shared by the ServerApp and the ClientApp: offline flags, quiet libraries,
seeds."""

from __future__ import annotations

import functools
import logging
import os
import random
import warnings

import numpy as np
import torch

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
# a local simulation's Ray on the loopback address only: Ray treats the machine as a one-node
# cluster (what it does on macOS and Windows), so no Ray port listens on a routable address
LOOPBACK_RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


# Warnings third-party code raises on every run that say nothing about the run: (category, the
# start of the message as a regex). Each is matched exactly, so every other warning still shows.
KNOWN_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    # torch, when a library scripts a function at import
    (DeprecationWarning, r"`torch\.jit\.\w+` is deprecated"),
    # transformers, called by peft
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated"),
    # Ray, at the start of a simulation: a change of a default this app does not rely on
    (FutureWarning, r"Tip: In future versions of Ray, Ray will no longer override accelerator"),
)
# Log lines of the same kind: logger name -> the starts of the messages to drop (its others show).
KNOWN_LOG_LINES: dict[str, tuple[str, ...]] = {
    # bitsandbytes on a CPU with AVX-512 BF16: an optional faster 4-bit kernel is not installed
    "bitsandbytes.backends.cpu.ops": (
        "Failed to load CPU gemm_4bit_forward from kernels-community",
    ),
}


class _DropKnownLines(logging.Filter):
    """Drops the records whose message starts with one of `starts`."""

    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.starts)


def quiet_warnings() -> None:
    """Ignore exactly the `KNOWN_WARNINGS`, drop the `KNOWN_LOG_LINES`; all else still shows."""
    for category, message in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name, starts in KNOWN_LOG_LINES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnownLines) for f in logger.filters):
            logger.addFilter(_DropKnownLines(starts))


def _progress_bars_off() -> None:
    """tqdm bars off unless a caller asks for one: what TQDM_DISABLE=1 does, also for a tqdm
    imported before it was set (torch imports tqdm). lm-eval asks for its request bars: fast_eval's
    `PackedChoicesLM` turns them off through lm-eval's own `disable_tqdm`."""
    os.environ["TQDM_DISABLE"] = "1"  # for the processes this one starts (Ray's workers)
    try:
        import tqdm.std
    except ImportError:
        return
    if not getattr(tqdm.std.tqdm, "_fedprune_quiet", False):
        tqdm.std.tqdm.__init__ = functools.partialmethod(tqdm.std.tqdm.__init__, disable=True)
        tqdm.std.tqdm._fedprune_quiet = True


def quiet_libraries() -> None:
    """Keep the logs to what a user reads: no progress bars (datasets, transformers, lm-eval, tqdm),
    the libraries' info lines off, the known third-party warnings silenced (`quiet_warnings`).
    The ServerApp and the ClientApp call it before they load a model."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _progress_bars_off()
    for name in ("lm-eval", "lm_eval", "transformers", "datasets", "peft", "httpx"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import datasets
        import transformers

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except ImportError:
        pass
    quiet_warnings()


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def client_seed(seed: int, server_round: int, partition_id: int) -> int:
    """A seed distinct per (run seed, round, client): what a client draws its batches/segments with.
    The server uses it too when it rebuilds a client's round-1 calibration set (the simulation-only
    `centralized` reference)."""
    return seed * 1_000_003 + server_round * 1009 + partition_id
