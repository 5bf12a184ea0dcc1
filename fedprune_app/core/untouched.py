"""Round 0's scores of the untouched model, computed once per (model, data, settings) on this
machine.

Every run starts with each client scoring the model before training (round 0). With the same model
files, the same data, the same evaluation settings and the same code, that score is the same number
every time, so a client keeps its round-0 metrics in `<cache>/untouched/<key>.json` (`cache_root()`;
JSON only) and answers a later round 0 from there. The key is a SHA-256 of:

- the whole run config except `NOT_IN_ROUND_0` (keys that only act after round 0: training, rounds,
  differential privacy, where results go) — any other key, a new one included, changes the key;
- the client's partition id, partition count and its own data file (node-config `data-path`: size,
  mtime);
- the model directory's files (name, size, mtime) or, for a Hub name, the name;
- the contents (SHA-256) of every `jsonl:` data file and of the eval-include-path YAMLs;
- the source of `fedprune_app/` and the method's client module, and the torch and transformers
  versions.

`cache-untouched = false` turns it off; rows answered from the cache carry `cached = 1`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from fedprune_app.core.config import split_list
from fedprune_app.llm.assets import cache_root, resolve_model_path
from fedprune_app.llm.data import content_digest, source_file

NOT_IN_ROUND_0 = frozenset(
    {
        "num-server-rounds",
        "local-steps",
        "learning-rate",
        "weight-decay",
        "max-grad-norm",
        "mixed-precision",
        "run-tag",
        "output-dir",
        "resume-from",
        "checkpoint-every",
        "round-timeout",
        "round-retries",
        "server-eval-every",
        "server-eval-data",
        "eval-every",
        "cache-untouched",
        "save-merged",
        "dp-clipping-norm",
        "dp-noise-multiplier",
        "dp-delta",
        "dp-max-epsilon",
    }
)


def _files(path: Path) -> list[tuple[str, int, int]]:
    """(relative name, size, mtime in ns) of every file under `path` (or of `path` itself)."""
    if path.is_file():
        st = path.stat()
        return [(path.name, st.st_size, st.st_mtime_ns)]
    out = []
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        st = f.stat()
        out.append((str(f.relative_to(path)), st.st_size, st.st_mtime_ns))
    return out


@functools.lru_cache(maxsize=8)
def _code(method_module: str) -> str:
    """SHA-256 of the app's source and the method's client module (any code change is a new key)."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    module = sys.modules.get(method_module)
    extra = (
        [Path(module.__file__)] if module is not None and getattr(module, "__file__", None) else []
    )
    for f in [*sorted(root.rglob("*.py")), *extra]:
        digest.update(str(f.relative_to(f.parents[1])).encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()


def _model(model_name: str) -> Any:

    path = Path(resolve_model_path(model_name))
    return _files(path) if path.exists() else model_name


def _contents(run_config: dict[str, Any]) -> str:
    """`content_digest` of the files the round-0 scores read besides the model: every `jsonl:`
    source of client-data and server-eval-data, and the eval-include-path YAMLs."""

    sources = [
        *split_list(str(run_config.get("client-data", ""))),
        *split_list(str(run_config.get("server-eval-data", ""))),
    ]
    paths = [p for p in map(source_file, sources) if p is not None and p.exists()]
    include = str(run_config.get("eval-include-path", ""))
    if include and Path(include).expanduser().exists():
        paths.append(Path(include).expanduser())
    return content_digest(paths)


def cache_key(run_config: dict[str, Any], node_config: dict[str, Any], method_module: str) -> str:
    """The SHA-256 that names one client's round-0 scores (see the module docstring)."""
    import torch
    import transformers

    data_path = node_config.get("data-path")
    facts = {
        "config": {k: v for k, v in sorted(run_config.items()) if k not in NOT_IN_ROUND_0},
        "partition": [node_config.get("partition-id"), node_config.get("num-partitions")],
        "data-path": _files(Path(str(data_path)))
        if data_path and Path(str(data_path)).exists()
        else None,
        "model": _model(str(run_config.get("model-name", "embedded"))),
        "contents": _contents(run_config),
        "code": _code(method_module),
        "versions": [torch.__version__, transformers.__version__],
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


def cache_file(key: str) -> Path:
    """Where the round-0 metrics of `key` are kept."""
    return cache_root() / "untouched" / f"{key}.json"


def lookup(key: str) -> dict[str, Any] | None:
    """The cached round-0 metrics of `key`, or None (missing, unreadable, or not all finite
    numbers: score again)."""
    try:
        metrics = json.loads(cache_file(key).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(metrics, dict) and all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        for v in metrics.values()
    )
    return metrics if ok else None


def store(key: str, metrics: dict[str, Any]) -> None:
    """Keep round-0 metrics (numbers only) for `key`; written atomically, failures ignored (a
    cache)."""
    if not all(isinstance(v, int | float) and math.isfinite(v) for v in metrics.values()):
        return  # lists, or a non-finite score: never kept
    path = cache_file(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(metrics))
        os.replace(tmp, path)
    except OSError:
        pass
