"""The launcher's checks before Flower starts: what a run would only find out after Ray's start-up.

`RunConfig.from_flower` refuses a bad value of one key (and each section's `check` a bad combination of keys). What
it cannot see is checked here, in a second or two, before anything starts:

- the federation: every per-client list key the method reads (`PER_CLIENT_KEYS`) holds 1 or num-supernodes
  values; `min-nodes` <= num-supernodes (else the server waits forever); `min-replies` <= the clients a round
  samples (else every round fails);
- the filesystem: every JSONL source of `client-data` / `server-eval-data` exists, holds one JSON object per line
  in a schema the data reader knows, and enough examples for the test / val / train splits; `resume-from` holds a
  checkpoint that matches this run (the ServerApp's own loader, so the message is the same); `model-name` is
  `embedded`, a local model directory holding config.json, or (runs are offline: HF_HUB_OFFLINE=1) a Hugging Face
  model already in the local cache.

Every check raises `ConfigError` with one line naming the key and what it accepts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedprune_app.core.config import ConfigError, RunConfig, SharedConfig, per_client, split_list

# run-config keys read with `per_client(value, num_partitions, cast, key)`: one value for all clients or one per
# partition (grep `per_client(`; a test checks this list against the source tree)
PER_CLIENT_KEYS: dict[str, type] = {
    "sftp-keep-ratios": float,
    "flexlora-ranks": int,
    "fedspallm-resources": float,
    "eval-tasks": str,
}
SOURCES_ACCEPTED = ("bigbench:<task>, squad_shifts:<domain>, natural_instructions[:<subtask>], "
                    "jsonl:<path> (or <path>.jsonl) or hf:<name>[:<config>]")
JSONL_ACCEPTED = ("one JSON object per line with 'text', or question|input|prompt + choices + label|answer, or "
                  "instruction|input|prompt + output|response|target|completion")
MODEL_ACCEPTED = ("'embedded', a local model directory holding config.json, or a Hugging Face model name "
                  "already in the local cache (runs are offline: HF_HUB_OFFLINE=1)")


def method_names() -> tuple[str, ...]:
    """The registered methods (the allowed values of `method`)."""
    from fedprune_app.core import registry

    return registry.names()


def method_keys(method: str) -> set[str]:
    """The run-config keys a method reads: the shared keys and those of its own config sections."""
    from fedprune_app.core import registry

    sections = (SharedConfig, *registry.get(method).configs)
    return {k.name for section in sections for k in section.keys()}


# --- the federation --------------------------------------------------------------------------------------------

def check_federation(cfg: RunConfig, num_supernodes: int) -> None:
    """The keys that must fit the number of SuperNodes (= partitions in a simulation)."""
    n = num_supernodes
    keys = method_keys(cfg.method)
    for key, cast in PER_CLIENT_KEYS.items():
        value = str(cfg[key]) if key in keys else ""
        items = split_list(value)
        if not items:  # not read by this method, or empty (eval-tasks: off)
            continue
        if len(items) not in (1, n):
            raise ConfigError(f"run-config key '{key}' has {len(items)} comma-separated values ({value!r}) but "
                              f"num-supernodes = {n}: give one value for every client or exactly {n}, one per "
                              "partition id")
        per_client(value, n, cast, key)  # each value parses
    if cfg.min_nodes > n:
        raise ConfigError(f"run-config key 'min-nodes' is {cfg.min_nodes} but num-supernodes = {n}: the server would "
                          f"wait for nodes that never come; use a value <= {n}")
    sampled = max(1, min(n, round(cfg.fraction_train * n)))  # FederatedStrategy.sample
    if cfg.fraction_train > 0 and cfg.min_replies > sampled:
        raise ConfigError(f"run-config key 'min-replies' is {cfg.min_replies} but a round samples {sampled} of "
                          f"num-supernodes = {n} (fraction-train = {cfg.fraction_train:g}): every round would fail; "
                          f"use a value <= {sampled} or raise 'fraction-train'")


def federation_size(federation: dict[str, Any]) -> int | None:
    """`num-supernodes` of the parsed `--federation-config` ("num-supernodes=4 ..."); None when it is not set."""
    n = federation.get("num-supernodes")
    if n is None:
        return None
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"--federation-config key 'num-supernodes' must be an int >= 1, got {n!r}")
    return n


# --- the filesystem ----------------------------------------------------------------------------------------------

def jsonl_path(source: str) -> Path | None:
    """The file a `jsonl:<path>` / `<path>.jsonl` source names (as the data reader resolves it), else None."""
    kind, _, arg = source.partition(":")
    if kind == "jsonl":
        return Path(arg).expanduser()
    return Path(source).expanduser() if source.endswith(".jsonl") else None


def check_jsonl(key: str, source: str, path: Path, cfg: RunConfig) -> None:
    """`path` exists, every line is a JSON object the data reader turns into an example, and there are enough
    examples for test-examples + val-examples + 1 (the splits `data.split_source` cuts)."""
    from fedprune_app.llm import data

    where = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
    if not path.is_file():
        raise ConfigError(f"run-config key '{key}': source {source!r} names {path}{where}, which is not an existing "
                          f"file; a JSONL source must be an existing file with {JSONL_ACCEPTED}")
    examples = []
    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(f"run-config key '{key}': {path} line {number} is not JSON ({err.msg}); a JSONL "
                                  f"source holds {JSONL_ACCEPTED}") from None
            if not isinstance(record, dict):
                raise ConfigError(f"run-config key '{key}': {path} line {number} is a JSON "
                                  f"{type(record).__name__}, not an object; a JSONL source holds {JSONL_ACCEPTED}")
            try:  # data.load_source's own record reader, line by line
                examples.append(data.record_example(source, record))
            except (ValueError, KeyError, IndexError, TypeError) as err:
                detail = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
                raise ConfigError(f"run-config key '{key}': {path} line {number}: {detail}") from None
    try:
        data.split_source(examples, cfg.seed, cfg.test_examples, cfg.val_examples, cfg.max_train_examples)
    except ConfigError as err:
        raise ConfigError(f"run-config key '{key}': {err}") from None


def check_sources(cfg: RunConfig, key: str) -> None:
    """Every source of `key` (client-data, server-eval-data) is of a known kind; its JSONL files pass `check_jsonl`."""
    for source in split_list(str(cfg[key])):
        path = jsonl_path(source)
        kind, _, arg = source.partition(":")
        if path is not None:
            check_jsonl(key, source, path, cfg)
        elif not (kind in ("bigbench", "squad_shifts", "hf") and arg or kind == "natural_instructions"
                  or kind == "ppl" and key == "server-eval-data"):  # data.load_source's kinds
            raise ConfigError(f"run-config key '{key}': cannot read source {source!r}; use {SOURCES_ACCEPTED}")


def check_resume(cfg: RunConfig) -> None:
    """`resume-from` holds a checkpoint this run can continue: the ServerApp's own loader, run here."""
    from fedprune_app.core.checkpoint import load_checkpoint

    try:
        load_checkpoint(cfg)
    except ConfigError:
        raise
    except (OSError, KeyError, ValueError) as err:
        raise ConfigError(f"run-config key 'resume-from' must be a run directory holding a readable checkpoint "
                          f"and config.json, got {cfg.resume_from!r}: {type(err).__name__}: {err}") from None


def check_model(name: str, offline: bool = True) -> None:
    """`model-name` is `embedded`, a local directory with config.json, or a Hugging Face name the run can load:
    with `offline` (the launcher's runs are), one already in the local Hugging Face cache."""
    if name == "embedded":
        return
    path = Path(name).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return
        raise ConfigError(f"run-config key 'model-name' must be {MODEL_ACCEPTED}; the directory {path} holds no "
                          "config.json (save_pretrained writes one)")
    if path.exists() or name.startswith(("/", "./", "../", "~")) or not _hub_name(name):
        raise ConfigError(f"run-config key 'model-name' must be {MODEL_ACCEPTED}; got {name!r}, which is neither a "
                          "local model directory nor a Hugging Face model name")
    if offline and not _cached(name):
        raise ConfigError(f"run-config key 'model-name' must be {MODEL_ACCEPTED}; {name!r} is neither a local model "
                          "directory nor in the local Hugging Face cache, so the offline run cannot load it (download "
                          f"it first with `hf download {name}`, or give its local directory)")


def _hub_name(name: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _cached(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(name, "config.json"), str)


# --- all of them ---------------------------------------------------------------------------------------------------

def preflight(values: dict[str, Any], num_supernodes: int | None, *, client_data: bool = True,
              offline: bool = True) -> RunConfig:
    """The validated run config, after every check above; ConfigError naming the key otherwise. `num_supernodes`
    None: the federation is not known (no federation check). `client_data` False: every node brings its own data
    (a deployment's `data-path`), so `client-data` is not read."""
    cfg = RunConfig.from_flower(values, methods=method_names())
    from fedprune_app.core.privacy import check_private

    check_private(cfg)  # a method that cannot run with the dp-* keys says so before Flower starts
    if num_supernodes is not None:
        check_federation(cfg, num_supernodes)
    check_model(cfg.model_name, offline)
    if client_data:
        check_sources(cfg, "client-data")
    check_sources(cfg, "server-eval-data")
    if cfg.resume_from:
        check_resume(cfg)
    return cfg


def advice(cfg: RunConfig) -> list[str]:
    """The warnings of the run's method's config sections (`ConfigSection.advice`): settings known to end in a
    broken model."""
    from fedprune_app.core import registry

    return [line for section in registry.get(cfg.method).configs for line in cfg.section(section).advice(cfg)]
