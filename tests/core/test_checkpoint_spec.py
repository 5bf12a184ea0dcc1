"""What a checkpoint must hold to continue a run: the comparison (`replies.spec_problem`,
`checkpoint.check_fits`) and the specs each method registers for the launcher, computed from the
model's config.json alone, which must equal what its strategy really builds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedprune_app.core import registry
from fedprune_app.core.checkpoint import Checkpoint, check_fits
from fedprune_app.core.config import ConfigError, RunConfig
from fedprune_app.core.protocol import numpy_state, spec_of
from fedprune_app.core.replies import spec_problem
from fedprune_app.llm.shapes import linear_shapes
from tests.conftest import small_config
from tests.core.test_structured_checkpoint_spec import STRUCTURAL

SPEC = {"a": ((2, 3), "float32"), "mask": ((4,), "bool")}


def test_spec_problem_names_the_first_difference() -> None:
    assert spec_problem(dict(SPEC), SPEC) is None
    assert (
        spec_problem({"a": SPEC["a"]}, SPEC) == "missing 1 arrays, e.g. mask (expected (4,) bool)"
    )
    assert (
        spec_problem({**SPEC, "b": ((1,), "int64"), "c": ((2,), "int64")}, SPEC)
        == "2 unexpected arrays, e.g. b (1,)"
    )
    assert (
        spec_problem({**SPEC, "a": ((3, 2), "float32")}, SPEC)
        == "array a has shape (3, 2), expected (2, 3)"
    )
    wider = {**SPEC, "a": ((2, 3), "float64")}
    assert spec_problem(wider, SPEC) == "array a is float64, expected float32"
    assert spec_problem(wider, {**SPEC, "a": ((2, 3), "")}) is None  # '' is any dtype
    # shapes are compared before dtypes, in the expected order
    assert (
        spec_problem({"a": ((2, 3), "int8"), "mask": ((5,), "bool")}, SPEC)
        == "array mask has shape (5,), expected (4,)"
    )


def checkpoint_of(
    tmp_path: Path, arrays: dict[str, np.ndarray], state: dict | None = None
) -> Checkpoint:
    return Checkpoint(tmp_path / "20260101-000000-fedit", 1, "key", arrays, state or {})


def test_check_fits_compares_arrays_and_state_tables_and_names_the_file(tmp_path: Path) -> None:
    cfg = RunConfig.from_flower({})
    good = {"a": np.zeros((2, 3), np.float32), "mask": np.ones(4, bool)}
    check_fits(checkpoint_of(tmp_path, good), cfg, SPEC)
    check_fits(checkpoint_of(tmp_path, {"anything": np.zeros(1)}), cfg, None)  # not checked
    with pytest.raises(ConfigError) as err:
        check_fits(checkpoint_of(tmp_path, {**good, "a": np.zeros((2, 4), np.float32)}), cfg, SPEC)
    assert str(err.value) == (
        f"run-config key 'resume-from': {tmp_path}/20260101-000000-fedit/checkpoint/"
        "state.safetensors does not fit what method 'fedit' builds for model 'embedded' with "
        "this run config: array a has shape (2, 4), expected (2, 3)"
    )
    table = {**SPEC, "weights/w": ((2, 2), "float32")}
    weights = {"w": np.zeros((2, 2), np.float32)}
    check_fits(checkpoint_of(tmp_path, good, {"weights": weights}), cfg, table)
    for state in ({}, {"weights": "not a table"}, {"weights": {"w": np.zeros((3, 2), np.float32)}}):
        with pytest.raises(ConfigError, match="weights/w"):
            check_fits(checkpoint_of(tmp_path, good, state), cfg, table)


def test_linear_shapes_of_the_llama_family_and_none_for_another_layout() -> None:
    config = {
        "model_type": "llama",
        "hidden_size": 8,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "vocab_size": 10,
    }
    assert linear_shapes(config) == {
        "model.layers.0.self_attn.q_proj": (8, 8),
        "model.layers.0.self_attn.k_proj": (4, 8),
        "model.layers.0.self_attn.v_proj": (4, 8),
        "model.layers.0.self_attn.o_proj": (8, 8),
        "model.layers.0.mlp.gate_proj": (16, 8),
        "model.layers.0.mlp.up_proj": (16, 8),
        "model.layers.0.mlp.down_proj": (8, 16),
        "lm_head": (10, 8),
    }
    assert linear_shapes({**config, "head_dim": 2})["model.layers.0.self_attn.q_proj"] == (4, 8)
    assert linear_shapes({**config, "model_type": "opt"}) is None
    assert linear_shapes({k: v for k, v in config.items() if k != "hidden_size"}) is None


def built(cfg: RunConfig) -> dict | None:
    """What a checkpoint of the strategy really holds before its first round: the spec of its
    `initial_arrays()` and of the array tables of its `state_dict()` (`t/<name>`)."""
    strategy = registry.strategy_class(cfg.method)(cfg)
    initial = numpy_state(strategy.initial_arrays())
    tables = {
        f"{table}/{name}": array
        for table, entries in strategy.state_dict().items()
        if isinstance(entries, dict)
        for name, array in entries.items()
        if isinstance(array, np.ndarray)
    }
    return spec_of(initial | tables)


def model_config(cfg: RunConfig) -> dict:
    from fedprune_cli.preflight import model_config_dir

    directory = model_config_dir(cfg.model_name)
    assert directory is not None
    return json.loads((directory / "config.json").read_text())


def registered(cfg: RunConfig) -> dict | None:
    derive = registry.get(cfg.method).checkpoint_spec
    return None if derive is None else derive(cfg, model_config(cfg))


@pytest.mark.parametrize("method", registry.names())
def test_every_method_registers_the_spec_its_strategy_builds(
    method: str, tiny_model_dir: Path
) -> None:
    """A method whose checkpoint shapes the config fixes registers them, equal (names, order of no
    matter, shapes, dtypes) to what its strategy builds; the structural ones (what round 1 cuts
    shapes their checkpoints) are compared after round 1 in test_structured_checkpoint_spec.py."""
    cfg = small_config(
        tiny_model_dir, method=method, device="cpu", flexlora_ranks="2,3", fedtpa_warmup_steps=1
    )
    if method in STRUCTURAL:  # a structure cut in round 1: test_structured_checkpoint_spec.py
        entry = registry.get(method)
        assert (entry.checkpoint_spec is None) != (entry.spec_from_checkpoint is None)
        return
    assert registered(cfg) == built(cfg)


ALL_PROJECTIONS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


@pytest.mark.parametrize(
    ("method", "overrides"),
    [
        ("fedit", {"lora_rank": 3, "lora_target_modules": ALL_PROJECTIONS}),
        ("fedit", {"lora_target_modules": "self_attn.o_proj,mlp.up_proj"}),
        ("fedit", {"lora_target_modules": "all-linear"}),
        ("sftp", {"sftp_adapters": False, "sftp_embed_dim": 5, "sftp_generator_hidden": 7}),
        (
            "sftp",
            {"sftp_adapters": True, "lora_target_modules": "down_proj", "sftp_conditioning": False},
        ),
        ("flexlora", {"flexlora_ranks": "5"}),
    ],
)
def test_the_registered_spec_follows_the_keys_that_shape_the_arrays(
    method: str, overrides: dict, tiny_model_dir: Path
) -> None:
    cfg = small_config(tiny_model_dir, method=method, device="cpu", **overrides)
    spec = built(cfg)
    assert spec and registered(cfg) == spec


def test_lora_on_the_output_layer_is_left_to_the_built_arrays(tiny_model_dir: Path) -> None:
    """peft then also saves lm_head's base weight: the config-only spec does not guess it."""
    cfg = small_config(tiny_model_dir, method="fedit", lora_target_modules="q_proj,lm_head")
    assert registered(cfg) is None


@pytest.mark.slow
@pytest.mark.embedded
@pytest.mark.parametrize("method", ["fedit", "sftp"])
def test_the_registered_spec_of_the_embedded_model_is_what_its_strategy_builds(method: str) -> None:
    """The default 135M model (the presets' and the refusal table's): the same equality."""
    cfg = RunConfig.from_flower({"method": method, "device": "cpu"})
    assert registered(cfg) == built(cfg)
