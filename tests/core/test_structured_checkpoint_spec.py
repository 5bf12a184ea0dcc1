"""What a checkpoint of the one-shot structural baselines (fedflap, llmpruner, slicegpt) must hold
to resume: round 1 is run on the tiny model from hand-built statistics, its checkpoint written and
read back; the spec derived from config.json and the structure the checkpoint records (what the
launcher compares, no torch) equals what the strategy holds, and the ServerApp's comparison uses
the same. A checkpoint that does not fit is refused in the one line of the other methods, by the
launcher and by the ServerApp alike."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from fedprune_app.core import registry
from fedprune_app.core.checkpoint import (
    Checkpoint,
    check_fits,
    load_checkpoint,
    resume_spec,
    save_checkpoint,
)
from fedprune_app.core.config import ConfigError, RunConfig
from fedprune_app.core.protocol import numpy_state, spec_of, to_record
from fedprune_app.structural import routing
from fedprune_app.structural.shapes import MASK_NAMES
from fedprune_cli.preflight import check_checkpoint_fits
from tests.conformance import conformance_of
from tests.conftest import small_config

STRUCTURAL = ("fedflap", "llmpruner", "slicegpt")
ALL_PROJECTIONS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
LORA = "base_model.model.model.layers.{}.{}.lora_{}.weight"  # peft's names: layer, module, A|B
Arrays = dict[str, np.ndarray]


def config_of(model_dir: Path, method: str, **overrides: Any) -> RunConfig:
    """The method's conformance settings on the tiny model (every layer pruned), CPU."""
    settings = {k.replace("-", "_"): v for k, v in conformance_of(method).settings.items()}
    return small_config(model_dir, method=method, device="cpu", **settings | overrides)


def statistics_reply(shapes: Mapping[str, tuple[tuple[int, ...], str]], seed: int) -> RecordDict:
    """A round-1 reply of the right shapes: non-negative scores, symmetric positive
    semi-definite d × d sums, a count of examples and tokens."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, (shape, dtype) in shapes.items():
        a = rng.random(shape)
        arrays[name] = (a @ a.T if len(shape) == 2 and shape[0] == shape[1] else a).astype(dtype)
    metrics = MetricRecord({"num-examples": 4 + seed, "calibration-tokens": 100 + seed})
    return RecordDict({"arrays": to_record(arrays), "metrics": metrics})


def after_round_one(cfg: RunConfig) -> tuple[Any, ArrayRecord, Arrays]:
    """(the strategy after round 1, its `initial_arrays()`, the global arrays round 1 gave)."""
    strategy = registry.strategy_class(cfg.method)(cfg)
    initial = strategy.initial_arrays()
    strategy.configure_round(1, initial, [])
    replies = [statistics_reply(strategy.statistics_shapes(), seed) for seed in range(2)]
    return strategy, initial, numpy_state(strategy.aggregate(1, replies))


def written(tmp_path: Path, cfg: RunConfig, arrays: Arrays, state: dict[str, Any]) -> Checkpoint:
    """The checkpoint after round 1 of a run of `cfg` holding `arrays` and `state`, as a resumed
    run reads it."""
    run = tmp_path / "20260101-000000-run"
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    save_checkpoint(run, 1, run.name, arrays, state)
    return load_checkpoint(cfg.replace(resume_from=str(run)))


def held(checkpoint: Checkpoint) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every array the checkpoint holds: its global arrays and its state tables' (`t/<name>`)."""
    tables = {
        f"{t}/{k}": a
        for t, v in checkpoint.strategy.items()
        if isinstance(v, Mapping)
        for k, a in v.items()
        if isinstance(a, np.ndarray)
    }
    return spec_of(checkpoint.arrays | tables)


def launcher_spec(cfg: RunConfig, checkpoint: Checkpoint) -> dict | None:
    """What the method registered, for the tiny model's config.json."""
    config = json.loads((Path(cfg.model_name) / "config.json").read_text())
    method = registry.get(cfg.method)
    if method.spec_from_checkpoint is not None:
        return method.spec_from_checkpoint(cfg, config, checkpoint.arrays)
    return method.checkpoint_spec(cfg, config)


@pytest.fixture(scope="module")
def rounds(tiny_model_dir: Path) -> Callable[..., tuple[Any, ArrayRecord, Arrays]]:
    """Round 1 of a method on the tiny model, once per configuration."""
    done: dict[str, tuple[Any, ArrayRecord, Arrays]] = {}

    def run(method: str, **overrides: Any) -> tuple[Any, ArrayRecord, Arrays]:
        key = json.dumps([method, overrides], sort_keys=True)
        if key not in done:
            done[key] = after_round_one(config_of(tiny_model_dir, method, **overrides))
        return done[key]

    return run


CONFIGS = [(m, {}) for m in STRUCTURAL] + [
    (m, {"lora_rank": 3, "lora_target_modules": ALL_PROJECTIONS}) for m in STRUCTURAL
]


@pytest.mark.parametrize(("method", "overrides"), CONFIGS)
def test_the_derived_spec_is_what_the_strategy_holds_after_round_one(
    method: str, overrides: dict, rounds: Callable, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The structure, the state's tables and the LoRA of the structured model: names, shapes and
    dtypes equal what round 1 left, through a written checkpoint; the ServerApp's spec is the
    same; the launcher and the ServerApp let it resume."""
    cfg = config_of(tiny_model_dir, method, **overrides)
    strategy, initial, arrays = rounds(method, **overrides)
    checkpoint = written(tmp_path, cfg, arrays, strategy.state_dict())
    derived = launcher_spec(cfg, checkpoint)
    assert derived == held(checkpoint)
    assert resume_spec(cfg, numpy_state(initial), checkpoint.arrays) == derived
    check_fits(checkpoint, cfg, derived)
    check_checkpoint_fits(cfg, checkpoint)


def test_the_structure_is_what_shapes_the_lora(rounds: Callable) -> None:
    """The round-1 cuts the parity test checks do slice the LoRA (not the dense shapes): llmpruner
    keeps fewer kv groups and channels, slicegpt reads fewer coordinates; fedflap routes the bus
    and keeps every dense shape."""
    everything = {"lora_rank": 3, "lora_target_modules": ALL_PROJECTIONS}
    routed, pruned, sliced = (rounds(m, **everything)[2] for m in STRUCTURAL)
    assert routed[LORA.format(0, "mlp.down_proj", "A")].shape == (3, 128)
    assert pruned[LORA.format(0, "self_attn.q_proj", "B")].shape == (32, 3)  # 1 kv group of 2
    assert pruned[LORA.format(0, "mlp.down_proj", "A")].shape[1] < 128
    assert sliced[LORA.format(0, "self_attn.q_proj", "B")].shape == (64, 3)
    assert sliced[LORA.format(0, "self_attn.q_proj", "A")].shape == (3, 29)  # 29 of 64 read


def refusals(
    cfg: RunConfig, strategy: Any, initial: ArrayRecord, checkpoint: Checkpoint
) -> tuple[str, str]:
    """(the launcher's line, the ServerApp's line) for `checkpoint`."""
    lines = []
    for check in (
        lambda: check_checkpoint_fits(cfg, checkpoint),
        lambda: check_fits(
            checkpoint, cfg, resume_spec(cfg, numpy_state(initial), checkpoint.arrays)
        ),
    ):
        with pytest.raises(ConfigError) as err:
            check()
        lines.append(str(err.value))
    return lines[0], lines[1]


def other_rank(arrays: Arrays) -> Arrays:
    """The LoRA at rank 5 instead of 4, the structure unchanged."""
    return {
        k: np.zeros((5, v.shape[1]) if "lora_A" in k else (v.shape[0], 5), v.dtype)
        if ".lora_" in k
        else v
        for k, v in arrays.items()
    }


def flipped(
    table: str,
    name: str,
    change: Callable[[np.ndarray], np.ndarray],
    arrays: Arrays,
    state: dict[str, Any],
) -> tuple[Arrays, dict[str, Any]]:
    """`arrays[name]` and the state table's copy `state[table][key]` changed alike."""
    key = name if table == "bases" else name.split(".", 1)[1]
    state = state | {table: dict(state[table]) | {key: change(state[table][key])}}
    return arrays | {name: change(arrays[name])}, state


CASES = [
    (
        "fedflap",
        "another rank",
        lambda a, s: (other_rank(a), s),
        f"array {LORA.format(0, 'self_attn.q_proj', 'A')} has shape (5, 64), expected (4, 64)",
    ),
    (
        "fedflap",
        "masks of another hidden size",
        lambda a, s: flipped(
            "masks", "fedflap-mask.ffn-in", lambda m: np.ones((2, 65), bool), a, s
        ),
        "array fedflap-mask.ffn-in has shape (2, 65), expected (2, 64)",
    ),
    (
        "llmpruner",
        "another rank",
        lambda a, s: (other_rank(a), s),
        f"array {LORA.format(0, 'self_attn.q_proj', 'A')} has shape (5, 64), expected (4, 64)",
    ),
    (
        "llmpruner",
        "a structure that keeps both kv groups: LoRA of one does not fit it",
        lambda a, s: flipped("keep", "llmpruner-keep.heads", lambda k: np.ones_like(k), a, s),
        f"array {LORA.format(0, 'self_attn.q_proj', 'B')} has shape (32, 4), expected (64, 4)",
    ),
    (
        "llmpruner",
        "channels of another intermediate size",
        lambda a, s: flipped("keep", "llmpruner-keep.channels", lambda k: k[:, 1:], a, s),
        "array llmpruner-keep.channels has shape (2, 127), expected (2, 128)",
    ),
    (
        "slicegpt",
        "another rank",
        lambda a, s: (other_rank(a), s),
        f"array {LORA.format(0, 'self_attn.q_proj', 'A')} has shape (5, 29), expected (4, 29)",
    ),
    (
        "slicegpt",
        "a narrower first basis: LoRA of the old width does not fit it",
        lambda a, s: flipped("bases", "slicegpt-basis.0", lambda b: b[:, :-1], a, s),
        f"array {LORA.format(0, 'self_attn.q_proj', 'A')} has shape (4, 29), expected (4, 28)",
    ),
    (
        "slicegpt",
        "a basis missing",
        lambda a, s: ({k: v for k, v in a.items() if k != "slicegpt-basis.4"}, s),
        "missing 1 arrays, e.g. slicegpt-basis.4 (expected (64, 29) float32)",
    ),
    (
        "slicegpt",
        "a basis of another hidden size",
        lambda a, s: flipped("bases", "slicegpt-basis.2", lambda b: b[1:], a, s),
        "array slicegpt-basis.2 has shape (63, 29), expected (64, 29)",
    ),
]


@pytest.mark.parametrize(
    ("method", "what", "tamper", "problem"), CASES, ids=[f"{m}: {w}" for m, w, _, _ in CASES]
)
def test_a_checkpoint_that_does_not_fit_is_refused_in_one_line(
    method: str,
    what: str,
    tamper: Callable,
    problem: str,
    rounds: Callable,
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    """The launcher and the ServerApp refuse it with the same line, naming the file and the
    first array that differs."""
    cfg = config_of(tiny_model_dir, method)
    strategy, initial, arrays = rounds(method)
    checkpoint = written(tmp_path, cfg, *tamper(arrays, strategy.state_dict()))
    launcher, server = refusals(cfg, strategy, initial, checkpoint)
    assert (
        launcher
        == server
        == (
            f"run-config key 'resume-from': {checkpoint.path} does not fit what method {method!r} "
            f"builds for model {str(tiny_model_dir)!r} with this run config: {problem}"
        )
    )


def test_the_bus_mask_names_are_the_routed_models() -> None:
    assert MASK_NAMES == routing.MASK_NAMES


def test_the_launcher_derives_the_specs_without_torch(tiny_model_dir: Path) -> None:
    """The registered functions import neither torch nor transformers (milliseconds)."""
    code = (
        "import json, sys, numpy as np\n"
        "from fedprune_app.core import registry\n"
        "from fedprune_app.core.config import RunConfig\n"
        f"config = json.loads(open({str(tiny_model_dir / 'config.json')!r}).read())\n"
        "for m in ('fedflap', 'llmpruner', 'slicegpt'):\n"
        "    cfg = RunConfig.from_flower({'method': m})\n"
        "    e = registry.get(m)\n"
        "    spec = (e.spec_from_checkpoint(cfg, config, {}) if e.spec_from_checkpoint\n"
        "            else e.checkpoint_spec(cfg, config))\n"
        "    assert spec, m\n"
        "print(sorted({'torch', 'transformers'} & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
