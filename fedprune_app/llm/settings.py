"""The settings the LLM library reads, as its own small typed interfaces.

Each function of `llm/` takes the plain values it needs or one of the settings below: a `Protocol`
that names the attributes it reads. Any object with them will do (a dataclass, a `SimpleNamespace`);
the app's validated run config has every one, under the same names as its keys (`model_name` is
`model-name`). So the library imports nothing of the app, and the app passes its run config as it
is.

Also here: the error a bad setting raises (`ConfigError`) and the parsers of the values that travel
as strings (`split_list`, `per_client`, `parse_partition_id`, `DEVICE_PATTERN`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from numbers import Integral
from typing import Any, Protocol

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")  # a `device`: a torch.device at model load
DEVICE_TEXT = "'auto', 'cpu', 'cuda' or 'cuda:<index>'"  # what DEVICE_PATTERN accepts, in words


class ConfigError(ValueError):
    """A setting is unknown, of the wrong type or out of range (the message names its key)."""


def split_list(value: str) -> list[str]:
    """Split a comma-separated string into its non-empty, stripped items."""
    return [v.strip() for v in value.split(",") if v.strip()]


ALL_LINEAR = "all-linear"  # peft's shorthand target: every linear layer but the output layer


def lora_targets(value: str) -> str | list[str]:
    """`lora-target-modules` as peft's `LoraConfig` takes it: the names, or peft's shorthand
    `ALL_LINEAR` as the string itself (in a list peft would look for a module of that name)."""
    names = split_list(value)
    return ALL_LINEAR if names == [ALL_LINEAR] else names


def per_client(value: str, n: int, cast: Callable[[str], Any], key: str) -> list[Any]:
    """Parse a per-client list string ("0.2,0.2,0.5,0.5"): one value for all clients, or exactly n.

    Raises:
        ConfigError: naming `key`, when the count is neither 1 nor n or an item does not parse.
    """
    items = [v.strip() for v in str(value).split(",") if v.strip()]
    if len(items) not in (1, n):
        raise ConfigError(
            f"run-config key '{key}' needs 1 or {n} comma-separated values, "
            f"got {len(items)}: {value!r}"
        )
    try:
        parsed = [cast(v) for v in items]
    except ValueError as err:
        raise ConfigError(f"run-config key '{key}': cannot parse {value!r} ({err})") from err
    return parsed * n if len(parsed) == 1 else parsed


MAX_PARTITIONS = 1_000_000  # a partition id's bound where num-partitions is not known


def parse_partition_id(value: Any, num_partitions: int | None = None, *, text: bool = False) -> int:
    """A partition id, validated: an int, not a bool (with `text`, also an int written as a string,
    as Flower's Ray proxy passes node-config values), in [0, num_partitions), or in [0,
    MAX_PARTITIONS) where the number of partitions is not known (a reply's `partition-id` metric,
    checked by the server).

    Raises:
        ValueError: saying what it accepts and what it got.
    """
    limit = MAX_PARTITIONS if num_partitions is None else num_partitions
    allowed = f"an int in [0, {limit})"
    problem = ValueError(f"'partition-id' must be {allowed}, got {value!r}")
    if isinstance(value, Integral) and not isinstance(value, bool):
        pid = int(value)
    elif text and isinstance(value, str):
        try:
            pid = int(value.strip())
        except ValueError:
            raise problem from None
    else:
        raise problem
    if not 0 <= pid < limit:
        raise problem
    return pid


class ModelSettings(Protocol):
    """Which model to load and where (`models.load_base_model`'s arguments)."""

    @property
    def model_name(self) -> str: ...  # 'embedded', a Hugging Face name or a local directory
    @property
    def model_dtype(self) -> str: ...  # 'float32', 'bfloat16' or 'float16'
    @property
    def model_quantization(self) -> str: ...  # 'none', '4bit' or '8bit'
    @property
    def device(self) -> str: ...  # DEVICE_PATTERN


class LoraSettings(Protocol):
    """The LoRA adapters `models.add_lora` wraps a model with."""

    @property
    def lora_rank(self) -> int: ...
    @property
    def lora_alpha(self) -> float: ...
    @property
    def lora_dropout(self) -> float: ...
    @property
    def lora_target_modules(self) -> str: ...  # comma-separated module names
    @property
    def seed(self) -> int: ...  # seeds A's initialisation


class PeftSettings(ModelSettings, LoraSettings, Protocol):
    """A model and its LoRA adapters (`models.peft_model_for`)."""


class DataSettings(Protocol):
    """Where a client's examples come from and how they are split (`data.client_data`)."""

    @property
    def client_data(self) -> str: ...  # comma-separated sources
    @property
    def partitioner(self) -> str: ...  # 'by-source', 'iid' or 'dirichlet'
    @property
    def dirichlet_alpha(self) -> float: ...
    @property
    def max_train_examples(self) -> int: ...  # per source; 0 = all
    @property
    def val_examples(self) -> int: ...
    @property
    def test_examples(self) -> int: ...
    @property
    def local_val_fraction(self) -> float: ...  # 0 = the source's val split
    @property
    def seed(self) -> int: ...


class TrainSettings(Protocol):
    """The local AdamW loop (`training.train_steps`)."""

    @property
    def local_steps(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def seq_len(self) -> int: ...
    @property
    def pack_sequences(self) -> bool: ...
    @property
    def learning_rate(self) -> float: ...
    @property
    def weight_decay(self) -> float: ...
    @property
    def max_grad_norm(self) -> float: ...  # 0 = no clipping
    @property
    def mixed_precision(self) -> str: ...  # 'no', 'auto', 'bf16', 'fp16' (`mixed_precision`)


class EvalSettings(Protocol):
    """What a client or the server scores, and how (`evaluation.evaluate_client`,
    `held_out_text`)."""

    @property
    def eval_tasks(self) -> str: ...  # lm-eval task names, one or one per client; empty = own split
    @property
    def eval_include_path(self) -> str: ...
    @property
    def eval_batch_size(self) -> int: ...
    @property
    def eval_ppl_tokens(self) -> int: ...
    @property
    def ppl_window(self) -> int: ...
    @property
    def ppl_stride(self) -> int: ...
    @property
    def ppl_bootstrap_iters(self) -> int: ...  # 0 = no interval
    @property
    def gen_max_new_tokens(self) -> int: ...
    @property
    def seq_len(self) -> int: ...
    @property
    def test_examples(self) -> int: ...
    @property
    def val_examples(self) -> int: ...
    @property
    def max_train_examples(self) -> int: ...
    @property
    def seed(self) -> int: ...
