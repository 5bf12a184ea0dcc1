"""Process set-up shared by the ServerApp and the ClientApp: offline flags, quiet libraries, seeds."""

from __future__ import annotations

import logging
import os
import random
import warnings

import numpy as np
import torch

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
    "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "RAY_USAGE_STATS_ENABLED": "0",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "TOKENIZERS_PARALLELISM": "false",
}


def quiet_libraries() -> None:
    """Keep the logs to what a user reads: no per-batch progress bars from datasets / transformers / lm-eval."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["TQDM_DISABLE"] = "1"  # lm-eval's per-request bars
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
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def client_seed(seed: int, server_round: int, partition_id: int) -> int:
    """A seed distinct per (run seed, round, client): what a client draws its batches/segments with. The server
    uses it too when it rebuilds a client's round-1 calibration set (the simulation-only `centralized` reference)."""
    return seed * 1_000_003 + server_round * 1009 + partition_id
