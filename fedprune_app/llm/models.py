"""Model loading (embedded default, Hugging Face name, local path; dtype; device; bitsandbytes) and
LoRA over peft.

State moves through two functions, as in peft: `get_adapter_state` / `set_adapter_state`. Placement:
the `device` key is resolved where a model is loaded (`resolve_device`); everything that feeds a
model moves its tensors to `model_device(model)`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedprune_app.llm.assets import model_config as model_config  # re-exported
from fedprune_app.llm.assets import resolve_model_path as resolve_model_path  # re-exported
from fedprune_app.llm.settings import (
    DEVICE_PATTERN,
    DEVICE_TEXT,
    ConfigError,
    LoraSettings,
    ModelSettings,
    PeftSettings,
    lora_targets,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(cfg: ModelSettings | str) -> torch.device:
    """The torch.device of the `device` setting (settings with a `device`, or the value itself) in
    this process: 'auto' = cuda when torch.cuda.is_available() else cpu. Asking for CUDA where none
    is visible raises ConfigError."""
    value = str(cfg if isinstance(cfg, str) else cfg.device)
    if not DEVICE_PATTERN.fullmatch(value):
        raise ConfigError(f"run-config key 'device' must be {DEVICE_TEXT}, got {value!r}")
    if value == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if value == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"run-config key 'device' is {value!r} but this process sees no CUDA device "
            f"(torch {torch.__version__}: torch.cuda.is_available() is False); use 'auto' (cuda "
            "where available, else cpu) or 'cpu', or give the process a GPU (a simulation's "
            "client-resources-num-gpus)"
        )
    device = torch.device(value)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(
            f"run-config key 'device' is {value!r} but this process sees "
            f"{torch.cuda.device_count()} CUDA device(s) (indices start at 0)"
        )
    return device


def model_device(model: nn.Module) -> torch.device:
    """Where a model's inputs go: the device of its input embeddings (the first layer, also under a
    bitsandbytes device map), else of its first parameter."""
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    weight = getattr(emb, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight.device
    return next(model.parameters()).device


def quantization_config(mode: str, compute_dtype: torch.dtype):  # -> BitsAndBytesConfig | None
    """bitsandbytes config for `model-quantization` ('none', '4bit' NF4, '8bit')."""
    if mode == "none":
        return None
    from transformers import BitsAndBytesConfig

    if mode == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype
        )
    if mode == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    raise ValueError(f"model-quantization must be one of 'none', '4bit', '8bit', got {mode!r}")


def base_config_values(base: Any, *own: str) -> dict[str, Any]:
    """The values of a HF config `base` that a config derived from it (a compiled, pruned or sliced
    model's) takes over: every one but transformers' bookkeeping (`model_type`, `architectures`,
    `auto_map`, `transformers_version`), `base_model_type` and the derived config's `own` keys."""
    skip = {"model_type", "architectures", "auto_map", "transformers_version", "base_model_type"}
    return {k: v for k, v in base.to_dict().items() if k not in skip | set(own)}


def qkv_bias(config: Any) -> bool:
    """Whether a decoder's q/k/v projections carry biases: a derived config's `qkv_bias` where it
    is set, True for Qwen2 (its config has no key: the biases are always there), else LLaMA's
    `attention_bias`."""
    if getattr(config, "qkv_bias", None) is not None:
        return bool(config.qkv_bias)
    if str(getattr(config, "base_model_type", config.model_type)) == "qwen2":
        return True
    return bool(getattr(config, "attention_bias", False))


def load_tokenizer(model_name: str):  # -> PreTrainedTokenizerBase
    """The model's tokenizer with a pad token (eos when the model has none)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model_path(model_name))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_base_model(
    model_name: str, dtype: str = "float32", quantization: str = "none", device: str = "auto"
) -> nn.Module:
    """A causal LM in eval mode on `device` (the run-config value, see `resolve_device`). Quantized:
    the device map bitsandbytes picks ('auto' over the visible GPUs for 'auto'/'cuda', else the one
    device)."""
    from transformers import AutoModelForCausalLM

    torch_dtype = DTYPES[dtype]
    target = resolve_device(device)
    kwargs: dict = {"dtype": torch_dtype}
    qconfig = quantization_config(quantization, torch_dtype)
    if qconfig is not None:
        kwargs["quantization_config"] = qconfig
        kwargs["device_map"] = (
            "auto" if target.type == "cuda" and target.index is None else {"": str(target)}
        )
    elif target.type != "cpu":
        kwargs["device_map"] = {
            "": str(target)
        }  # weights load straight onto the GPU, not via CPU RAM
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(model_name), **kwargs)
    model.eval()
    return model


def lora_config(cfg: LoraSettings, rank: int | None = None):  # -> peft.LoraConfig
    """peft LoraConfig from the LoRA settings (`lora-*` keys); `rank` overrides `lora-rank`."""
    from peft import LoraConfig

    return LoraConfig(
        r=int(rank or cfg.lora_rank),
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=lora_targets(cfg.lora_target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def add_lora(model: nn.Module, cfg: LoraSettings, seed: int, rank: int | None = None) -> nn.Module:
    """Wrap `model` with fresh LoRA adapters (A ~ Kaiming with `seed`, B = 0: the output is
    unchanged)."""
    from peft import get_peft_model, prepare_model_for_kbit_training

    if getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False):
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        try:
            peft_model = get_peft_model(model, lora_config(cfg, rank))
        except ValueError as err:  # peft names the missing modules; add the key that controls them
            raise ValueError(f"run-config key 'lora-target-modules': {err}") from err
    peft_model.eval()  # dropout off until a training loop switches it on
    peft_model.fedprune_initial_adapters = get_adapter_state(
        peft_model
    )  # cached models get trained in place
    return peft_model


def initial_adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters as `add_lora` made them (A seeded, B = 0), whatever was loaded into the cached
    model since: a run's initial state must not depend on what an earlier run in the same process
    left in the cache."""
    return {k: v.clone() for k, v in model.fedprune_initial_adapters.items()}


def get_adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The LoRA tensors (float32, detached, CPU) keyed by peft's adapter-state names."""
    from peft import get_peft_model_state_dict

    return {
        k: v.detach().to("cpu", torch.float32).clone()
        for k, v in get_peft_model_state_dict(model).items()
    }


def set_adapter_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load LoRA tensors into `model`; every adapter tensor must be present with the right shape."""
    from peft import set_peft_model_state_dict

    own = get_adapter_state(model)
    missing = sorted(set(own) - set(state))
    if missing:
        raise KeyError(f"adapter state lacks {len(missing)} tensors, e.g. {missing[:3]}")
    for k, v in state.items():
        if k in own and tuple(own[k].shape) != tuple(v.shape):
            raise ValueError(
                f"adapter tensor {k} has shape {tuple(v.shape)}, expected {tuple(own[k].shape)}"
            )
    set_peft_model_state_dict(model, state)


@dataclass(frozen=True)
class Lora:
    """LoRA settings as a value (`LoraSettings`): hashable, so a cached model can be keyed by it."""

    lora_rank: int
    lora_alpha: float
    lora_dropout: float
    lora_target_modules: str
    seed: int

    @classmethod
    def of(cls, settings: LoraSettings) -> Lora:
        """The LoRA settings of any object that has them (e.g. a run config)."""
        return cls(
            int(settings.lora_rank),
            float(settings.lora_alpha),
            float(settings.lora_dropout),
            str(settings.lora_target_modules),
            int(settings.seed),
        )


@lru_cache(maxsize=2)
def cached_peft_model(
    model_name: str, dtype: str, quantization: str, lora: Lora, device: str = "auto"
) -> tuple[nn.Module, object]:
    """One (LoRA-wrapped model, tokenizer) per process and configuration: Ray workers reuse it
    across rounds. Callers always load fresh adapter state before use."""
    model = add_lora(load_base_model(model_name, dtype, quantization, device), lora, seed=lora.seed)
    return model, load_tokenizer(model_name)


def peft_model_for(cfg: PeftSettings, rank: int | None = None) -> tuple[nn.Module, object]:
    """The cached LoRA model + tokenizer for these settings; `rank` overrides `lora_rank`."""
    lora = Lora.of(cfg)
    if rank is not None:
        lora = dataclasses.replace(lora, lora_rank=int(rank))
    return cached_peft_model(
        cfg.model_name, cfg.model_dtype, cfg.model_quantization, lora, cfg.device
    )


def load_run(run_dir: str | Path, device: str | None = None) -> tuple[nn.Module, object]:
    """Load a finished run's final model: base model + its saved adapter, ready to evaluate or
    generate.

    `model, tokenizer = fedprune_app.llm.models.load_run("outputs/<run>")`; `device` overrides the
    run's `device`.
    """
    from peft import PeftModel

    run_dir = Path(run_dir)
    cfg = json.loads((run_dir / "config.json").read_text())
    base = load_base_model(
        cfg["model-name"],
        cfg["model-dtype"],
        cfg["model-quantization"],
        device or cfg.get("device", "auto"),
    )
    model = PeftModel.from_pretrained(base, run_dir / "adapter")
    model.eval()
    return model, load_tokenizer(cfg["model-name"])


def save_adapter(
    model: nn.Module, out_dir: Path, merged_dir: Path | None = None, tokenizer: object = None
) -> None:
    """A standard PEFT adapter directory (peft's `save_pretrained`: `adapter_config.json` with the
    rank and α the adapter was trained with, `adapter_model.safetensors`), loadable with
    `PeftModel.from_pretrained(base, out_dir)`. With `merged_dir` (run-config `save-merged`), also
    the full model with the adapter merged (W + (α/r)·B·A, `merge_and_unload` on a copy) and the
    tokenizer, loadable with plain `AutoModelForCausalLM.from_pretrained`. `model` (a peft model,
    e.g. the cached one) is left as it was."""
    import copy

    model.save_pretrained(out_dir)
    if merged_dir is None:
        return
    merged = copy.deepcopy(model).merge_and_unload()
    merged.save_pretrained(merged_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(merged_dir)
