"""The method registry: method name -> its typed config, its server strategy and its client.

The registry imports no method. Each method registers itself, in the files that define it:

- `fedprune_app/methods/<m>/__init__.py`: `register_method("<m>", config=<M>Config)` (its typed
  run-config keys; with `checkpoint_spec=`, the shapes a checkpoint of a run holds, from the config
  alone, or with `spec_from_checkpoint=`, from the config and the structure the checkpoint records);
- `strategies/<m>.py`: `@register_strategy("<m>")` on its strategy class;
- `clients/<m>.py`: `@register_client("<m>")` on its client class.

Discovery imports every module of a package (`load`): the method packages whenever the registry is
asked what exists (the config validation needs their keys), `strategies` by the ServerApp, `clients`
by the ClientApp. So adding a method adds files and edits none: see the README's "Adding a method".
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fedprune_app.llm.assets import model_config

METHODS_PACKAGE = "fedprune_app.methods"
# (run config, the model's config.json) -> {name: (shape, dtype)} or None: `register_method`
SpecFromConfig = Callable[[Any, Mapping[str, Any]], dict[str, Any] | None]
# (run config, config.json, the checkpoint's global arrays) -> the same: `register_method`
SpecFromCheckpoint = Callable[[Any, Mapping[str, Any], Mapping[str, Any]], dict[str, Any] | None]


@dataclass
class Method:
    """What one method registered: its config section(s), strategy class and client class."""

    name: str
    configs: tuple[type, ...] = ()
    package: bool = False  # its package under fedprune_app/methods called register_method
    default: bool = False  # the run-config key `method`'s default
    # (run config, the model's config.json) -> {name: (shape, dtype)} a checkpoint holds, without
    # building the model (None for a model it cannot tell); absent: the config does not fix them
    checkpoint_spec: SpecFromConfig | None = None
    # (run config, config.json, the checkpoint's global arrays) -> the same, for a method whose
    # shapes follow a structure that its first round recorded in the checkpoint
    spec_from_checkpoint: SpecFromCheckpoint | None = None
    # the transformers `model_type`s it runs on (each checked on a tiny config by
    # tests/llm/test_architectures.py); None: any causal LM with the LoRA target modules
    architectures: tuple[str, ...] | None = None
    strategy: type | None = None
    client: type | None = None


_METHODS: dict[str, Method] = {}
_LOADED: set[str] = set()


def load(package: str) -> None:
    """Import every module and subpackage of `package` once (each registers what it defines)."""
    if package in _LOADED:
        return
    _LOADED.add(package)
    pkg = importlib.import_module(package)
    for info in pkgutil.iter_modules(pkg.__path__, prefix=f"{package}."):
        importlib.import_module(info.name)


def _entry(name: str) -> Method:
    return _METHODS.setdefault(name, Method(name))


def register_method(
    name: str,
    config: type | tuple[type, ...] = (),
    default: bool = False,
    checkpoint_spec: SpecFromConfig | None = None,
    spec_from_checkpoint: SpecFromCheckpoint | None = None,
    architectures: tuple[str, ...] | None = None,
) -> None:
    """Called by `fedprune_app/methods/<name>/__init__.py`: the method exists.

    Args:
        name: the method's name (the run-config value of `method`).
        config: the config section(s) whose keys it reads.
        default: it is what `method` is when a run does not say (one method says so).
        checkpoint_spec: (run config, the model's config.json) -> the `checkpoint_spec` its
            strategy gives, computed without torch or the model (the launcher's check of
            `resume-from`), or None for a model it does not know; omitted where the config does
            not fix the checkpoint's shapes.
        spec_from_checkpoint: instead of `checkpoint_spec`, where the shapes follow a structure
            that the run's first round cut from the clients' data: (run config, config.json, the
            checkpoint's global arrays, which record that structure) -> the same, also without
            torch, and the strategy's `checkpoint_spec` when given those arrays.
        architectures: the transformers `model_type`s the method runs on (a structural method
            rewrites the decoder layers of these); None for any causal LM.
    """
    entry = _entry(name)
    entry.configs, entry.package = (config if isinstance(config, tuple) else (config,)), True
    entry.default = default
    entry.checkpoint_spec = checkpoint_spec
    entry.spec_from_checkpoint = spec_from_checkpoint
    entry.architectures = architectures


def register_strategy(name: str) -> Any:
    """Class decorator for `strategies/<name>.py`."""

    def add(cls: type) -> type:
        _entry(name).strategy = cls
        return cls

    return add


def register_client(name: str) -> Any:
    """Class decorator for `clients/<name>.py`."""

    def add(cls: type) -> type:
        _entry(name).client = cls
        return cls

    return add


def names() -> tuple[str, ...]:
    """Every method whose package registered it, sorted."""
    load(METHODS_PACKAGE)
    return tuple(sorted(n for n, m in _METHODS.items() if m.package))


def default_name() -> str:
    """The method registered with `register_method(..., default=True)`; exactly one is."""
    load(METHODS_PACKAGE)
    found = [n for n, m in sorted(_METHODS.items()) if m.package and m.default]
    if len(found) != 1:
        raise RuntimeError(
            f"exactly one method must register as the default, found {found or 'none'}"
        )
    return found[0]


def config_sections() -> list[type]:
    """Every registered config section, each once, in method-name order."""
    load(METHODS_PACKAGE)
    out: list[type] = []
    for name in sorted(_METHODS):
        for section in _METHODS[name].configs:
            if section not in out:
                out.append(section)
    return out


def get(name: str) -> Method:
    """The method `name`, or a KeyError naming the allowed values."""
    load(METHODS_PACKAGE)
    if name not in _METHODS or not _METHODS[name].package:
        raise KeyError(
            f"run-config key 'method' must be one of {', '.join(map(repr, names()))}, got {name!r}"
        )
    return _METHODS[name]


def _side(name: str, package: str, attr: str, decorator: str) -> type:
    load(package)
    cls = getattr(get(name), attr)
    if cls is None:
        raise KeyError(
            f"method {name!r} registered no {attr} ({package}/{name}.py with @{decorator})"
        )
    return cls


def strategy_class(name: str) -> type:
    """The server strategy of method `name` (strategies/<name>.py)."""
    return _side(name, "strategies", "strategy", "register_strategy")


def client_class(name: str) -> type:
    """The client of method `name` (clients/<name>.py)."""
    return _side(name, "clients", "client", "register_client")


def architecture_problem(method: str, model_name: str) -> str | None:
    """Why `method` cannot run on `model_name`'s architecture (its `model_type` is not one the
    method declares, `Method.architectures`), or None (also where the model cannot be
    read here: the model check says why)."""

    supported = get(method).architectures
    if supported is None:
        return None
    try:
        model_type = model_config(model_name).get("model_type")
    except (OSError, ValueError):
        return None
    if model_type in supported:
        return None
    return (
        f"run-config key 'model-name': method {method!r} rewrites the decoder layers of "
        f"{', '.join(supported)} models; {model_name!r} is a {model_type!r} model (methods "
        f"for any causal LM: {', '.join(n for n in names() if get(n).architectures is None)})"
    )
