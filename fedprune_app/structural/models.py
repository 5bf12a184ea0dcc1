"""The process's routed models: one small cache object, `ROUTED_MODELS`.

A Ray worker runs many rounds of one configuration, so the routed backbone (frozen,
`install_routing`, with LoRA when asked) is loaded once and reused; its masks are never part of it
(they are scoped: `routing.masked`), and its adapters are loaded by whoever uses it. The cache also
keeps the massive-activation coordinates per model, which take a forward pass to find.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from torch import nn

from fedprune_app.core.config import RunConfig
from fedprune_app.llm.models import add_lora, load_base_model, load_tokenizer
from fedprune_app.structural.routing import install_routing

LORA_KEYS = ("lora-rank", "lora-alpha", "lora-dropout", "lora-target-modules", "seed")


class RoutedModels:
    """At most `size` (routed model, tokenizer) pairs, the least recently used dropped first, keyed
    by the model, its dtype, quantization, device and LoRA settings; and the massive coordinates per
    (model name, factor, d)."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._models: OrderedDict[tuple[str, ...], tuple[nn.Module, Any]] = OrderedDict()
        self._massive: dict[Hashable, list[int]] = {}

    def routed(self, cfg: RunConfig, adapters: bool) -> tuple[nn.Module, Any]:
        """The (routed backbone [+ fresh LoRA of the `lora-*` keys when `adapters`], tokenizer) of
        `cfg`'s model; the backbone is frozen, and callers load the adapter state they need."""
        lora = json.dumps({k: cfg[k] for k in LORA_KEYS}, sort_keys=True) if adapters else ""
        key = (cfg.model_name, cfg.model_dtype, cfg.model_quantization, lora, cfg.device)
        if key in self._models:
            self._models.move_to_end(key)
            return self._models[key]
        self._models[key] = _load(*key)
        while len(self._models) > self.size:
            self._models.popitem(last=False)
        return self._models[key]

    def massive(self, key: Hashable, find: Callable[[], list[int]]) -> list[int]:
        """The massive coordinates stored under `key`, found by `find()` the first time."""
        if key not in self._massive:
            self._massive[key] = find()
        return self._massive[key]

    def clear(self) -> None:
        """Forget every model and coordinate list."""
        self._models.clear()
        self._massive.clear()


def _load(
    model_name: str, dtype: str, quantization: str, lora: str, device: str
) -> tuple[nn.Module, Any]:

    model = load_base_model(model_name, dtype, quantization, device)
    for p in model.parameters():
        p.requires_grad_(False)
    if lora:
        settings = json.loads(lora)
        model = add_lora(model, RunConfig.from_flower(settings), seed=int(settings["seed"]))
    install_routing(model)
    return model, load_tokenizer(model_name)


ROUTED_MODELS = RoutedModels()
