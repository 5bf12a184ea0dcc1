"""Model loading from a local path (the code path of any HF name), bitsandbytes 4-bit, LoRA state
round trips."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedprune_app.llm.models import (
    add_lora,
    get_adapter_state,
    load_base_model,
    load_run,
    load_tokenizer,
    set_adapter_state,
)
from tests.conftest import small_config


def test_local_directory_loads_like_a_hub_name(tiny_model_dir: Path) -> None:
    model = load_base_model(str(tiny_model_dir), "bfloat16")
    assert model.config.num_hidden_layers == 2 and next(model.parameters()).dtype == torch.bfloat16
    tok = load_tokenizer(str(tiny_model_dir))
    assert tok.pad_token is not None


def test_fresh_lora_leaves_the_output_unchanged_and_state_round_trips(tiny_model_dir: Path) -> None:
    cfg = small_config(tiny_model_dir)
    base = load_base_model(str(tiny_model_dir))
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        before = base(input_ids=ids).logits.clone()
    model = add_lora(base, cfg, seed=0)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, before)
    state = get_adapter_state(model)
    assert (
        all(("lora_A" in k or "lora_B" in k) for k in state) and len(state) == 2 * 2 * 2
    )  # 2 layers, q+v, A+B
    changed = {k: v + 0.01 for k, v in state.items()}
    set_adapter_state(model, changed)
    for k, v in get_adapter_state(model).items():
        torch.testing.assert_close(v, changed[k])
    with pytest.raises(ValueError, match="has shape"):
        set_adapter_state(model, {**changed, next(iter(changed)): torch.zeros(1, 1)})


def test_lora_on_missing_modules_names_the_key(tiny_model_dir: Path) -> None:
    cfg = small_config(tiny_model_dir, lora_target_modules="nope_proj")
    with pytest.raises(ValueError, match="'lora-target-modules'"):
        add_lora(load_base_model(str(tiny_model_dir)), cfg, seed=0)


def test_4bit_loading_and_a_qlora_step(tiny_model_dir: Path) -> None:
    model = load_base_model(str(tiny_model_dir), "float32", "4bit")
    assert getattr(model, "is_loaded_in_4bit", False)
    peft = add_lora(model, small_config(tiny_model_dir), seed=0)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    loss = peft(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = [p.grad for n, p in peft.named_parameters() if "lora_A" in n]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


def test_saved_adapter_reloads_through_peft_and_load_run(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    cfg = small_config(tiny_model_dir)
    model = add_lora(load_base_model(str(tiny_model_dir)), cfg, seed=0)
    set_adapter_state(model, {k: v + 0.05 for k, v in get_adapter_state(model).items()})
    model.save_pretrained(tmp_path / "adapter")
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    reloaded, _ = load_run(tmp_path)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_the_library_loads_a_model_from_its_own_settings(tiny_model_dir: Path) -> None:
    """Any object with the settings' attributes will do, and no run config is built on the way to
    `from_pretrained`: the cache is keyed by the LoRA settings' value (`Lora`), not a JSON round
    trip."""
    from types import SimpleNamespace

    from fedprune_app.core.config import RunConfig
    from fedprune_app.llm.models import Lora, cached_peft_model, peft_model_for

    settings = SimpleNamespace(
        model_name=str(tiny_model_dir),
        model_dtype="float32",
        model_quantization="none",
        device="cpu",
        lora_rank=4,
        lora_alpha=8,
        lora_dropout=0.0,
        lora_target_modules="q_proj,v_proj",
        seed=3,
    )
    cached_peft_model.cache_clear()
    built = RunConfig.from_flower
    try:
        RunConfig.from_flower = None  # type: ignore[assignment]  # building a run config fails
        model, tokenizer = peft_model_for(settings)
        again, _ = peft_model_for(SimpleNamespace(**{**vars(settings), "lora_alpha": 8.0}))
    finally:
        RunConfig.from_flower = built  # type: ignore[method-assign]
    assert model.peft_config["default"].r == 4 and model.peft_config["default"].lora_alpha == 8.0
    assert model.peft_config["default"].target_modules == {"q_proj", "v_proj"}
    assert tokenizer.pad_token is not None
    assert again is model and Lora.of(settings) == Lora(4, 8.0, 0.0, "q_proj,v_proj", 3)
    cached_peft_model.cache_clear()


def loading_path(load: Any) -> list[str]:
    """The app's functions on the stack when `load()` reaches `from_pretrained`, outermost first."""
    import traceback

    import transformers

    seen: list[list[str]] = []
    original = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def spy(cls: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(
            [
                frame.name
                for frame in traceback.extract_stack()
                if "/fedprune_app/" in frame.filename
            ]
        )
        return original(cls, *args, **kwargs)

    transformers.AutoModelForCausalLM.from_pretrained = classmethod(spy)
    try:
        load()
    finally:
        transformers.AutoModelForCausalLM.from_pretrained = classmethod(original)
    assert seen, "nothing was loaded (a cached model?)"
    return seen[0]


def test_model_loading_is_a_few_calls_deep(tiny_model_dir: Path) -> None:
    """From what a client or strategy calls to `from_pretrained`: three of the app's calls."""
    from fedprune_app.llm.layers import _cached_model, dense_model
    from fedprune_app.llm.models import cached_peft_model, peft_model_for
    from fedprune_app.methods.llmpruner.models import pruned_model_for

    cfg = small_config(tiny_model_dir)
    cached_peft_model.cache_clear()
    _cached_model.cache_clear()
    assert loading_path(lambda: peft_model_for(cfg, rank=2)) == [
        "peft_model_for",
        "cached_peft_model",
        "load_base_model",
    ]
    assert loading_path(lambda: dense_model(cfg)) == [
        "dense_model",
        "_cached_model",
        "load_base_model",
    ]
    keep = {"heads": np.ones((2, 2), bool), "channels": np.ones((2, 128), bool)}
    assert loading_path(lambda: pruned_model_for(cfg, keep)) == [
        "pruned_model_for",
        "_pruned",
        "load_base_model",
    ]
    cached_peft_model.cache_clear()
