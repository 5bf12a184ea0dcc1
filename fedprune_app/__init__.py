"""The fedprune Flower app. Importing it (the first thing Flower does in the ServerApp's and every
ClientApp's process) defaults the process to offline Hugging Face access, so that a plain
`flwr run .` reads only local files, and refuses at once an environment without the app's
dependencies (a Flower runtime environment, or a Flower installed apart from them)."""

from __future__ import annotations

import importlib.util
import os
import sys

# what the app can set for itself; a variable the user set (e.g. HF_HUB_OFFLINE=0 to download a Hub
# model) is kept. Flower telemetry and Ray usage stats start before the app: see docs/running.md.
APP_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
REQUIRED = ("torch", "transformers", "peft", "lm_eval", "datasets")

for _name, _value in APP_ENV.items():
    os.environ.setdefault(_name, _value)

_missing = [name for name in REQUIRED if importlib.util.find_spec(name) is None]
if _missing:
    raise ImportError(
        f"fedprune needs {', '.join(_missing)} in the Python that runs Flower "
        f"({sys.executable}): install the app there (`make setup`, or `pip install "
        "-e .` after the CPU torch wheel), then run `flwr run .` from it"
    )
