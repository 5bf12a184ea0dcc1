"""The typed run config: defaults in step with pyproject, clear errors naming the key and allowed
values."""

from __future__ import annotations

import re
import time
import tomllib
from pathlib import Path

import pytest

from fedprune_app.core import registry
from fedprune_app.core.config import (
    ConfigError,
    RunConfig,
    SharedConfig,
    all_keys,
    defaults,
    per_client,
)
from fedprune_app.methods.flexlora.config import FlexLoRAConfig
from fedprune_app.methods.sftp.config import SFTPConfig
from fedprune_cli import keys as config_keys
from fedprune_cli import launch
from fedprune_cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_defaults_match_the_typed_config() -> None:
    flwr_config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"][
        "config"
    ]
    assert flwr_config == defaults()


def test_defaults_validate_and_read_as_attributes() -> None:
    cfg = RunConfig.from_flower({}, methods=registry.names())
    assert cfg.method == "fedit" and cfg.lora_rank == 16 and cfg["lora-alpha"] == 32.0


def test_unknown_key_names_it_and_suggests_the_close_one() -> None:
    with pytest.raises(
        ConfigError, match=r"'lora-rnak' \(did you mean 'lora-rank'\?\).*Allowed keys: method"
    ):
        RunConfig.from_flower({"lora-rnak": 8})


@pytest.mark.parametrize(
    ("key", "value", "pattern"),
    [
        ("num-server-rounds", "3", r"'num-server-rounds' must be an int in \[1, inf\], got '3'"),
        ("num-server-rounds", 0, r"'num-server-rounds' must be an int in \[1, inf\], got 0"),
        ("fraction-train", 1.5, r"'fraction-train' must be a float in \[0, 1\]"),
        (
            "model-quantization",
            "3bit",
            r"'model-quantization' must be one of 'none', '4bit', '8bit', got '3bit'",
        ),
        ("partitioner", "random", r"'partitioner' must be one of 'by-source', 'iid', 'dirichlet'"),
        ("seed", True, r"'seed' must be an int"),
        ("ppl-stride", 512, r"'ppl-stride' must be <= ppl-window \(256\)"),
    ],
)
def test_bad_values_name_the_key_and_what_it_accepts(key: str, value: object, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        RunConfig.from_flower({key: value})


def test_unknown_method_lists_the_registry() -> None:
    names = registry.names()
    assert {"fedflap", "fedit", "fedspallm", "fedtpa", "flexlora", "sftp"} <= set(names)
    listed = ", ".join(repr(n) for n in sorted(names))
    with pytest.raises(
        ConfigError, match=re.escape(f"'method' must be one of {listed}, got 'fedprox'")
    ):
        RunConfig.from_flower({"method": "fedprox"}, methods=names)


def test_ints_are_accepted_for_float_keys() -> None:
    assert RunConfig.from_flower({"learning-rate": 1}).learning_rate == 1.0


def test_per_client_lists() -> None:
    assert per_client("0.2,0.2,0.5,0.5", 4, float, "k") == [0.2, 0.2, 0.5, 0.5]
    assert per_client("8", 3, int, "k") == [8, 8, 8]
    with pytest.raises(ConfigError, match="'budgets' needs 1 or 4 comma-separated values, got 2"):
        per_client("0.2,0.5", 4, float, "budgets")
    with pytest.raises(ConfigError, match="'ranks': cannot parse"):
        per_client("8,x", 2, int, "ranks")


def test_every_key_has_a_meaning() -> None:
    keys = all_keys()
    assert all(k.help for k in keys) and len({k.name for k in keys}) == len(keys)


def test_launcher_rejects_a_bad_key_before_starting_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    start = time.perf_counter()
    code = main(["run", "--run-config", "lora-rank=0"])
    assert code == 2 and time.perf_counter() - start < 10
    assert "'lora-rank' must be an int in [1, inf], got 0" in capsys.readouterr().err


def test_launcher_merges_presets_and_overrides_in_order(tmp_path: Path) -> None:
    preset = tmp_path / "p.toml"
    preset.write_text('lora-rank = 4\nrun-tag = "x"\n')
    merged = launch.merged_config(ROOT, [str(preset), "lora-rank=2 model-name='a b'"])
    assert merged["lora-rank"] == 2 and merged["run-tag"] == "x" and merged["model-name"] == "a b"
    assert merged["method"] == "fedit"


def test_presets_are_valid() -> None:
    """Every preset validates and says which method it runs; every registered method has a
    preset."""
    presets = sorted((ROOT / "conf").glob("*.toml"))
    methods = {RunConfig.from_flower(launch.merged_config(ROOT, [str(p)])).method for p in presets}
    assert methods == set(registry.names()), (
        f"presets run {sorted(methods)}, registry has {registry.names()}"
    )
    for name in registry.names():
        assert (ROOT / "conf" / f"{name}.toml").is_file(), (
            f"method {name!r} has no conf/{name}.toml"
        )


def test_key_reference_and_pyproject_are_generated_from_the_typed_configs() -> None:
    """`fedprune keys --write` output is what is committed; a changed default is caught."""
    assert config_keys.drift() == []
    text = (ROOT / "pyproject.toml").read_text()
    assert config_keys.with_block(text) == text
    assert config_keys.with_block(text.replace("lora-rank = 16", "lora-rank = 8")) == text
    page = (ROOT / "docs" / "config.md").read_text()
    for key in all_keys():
        assert f"| `{key.name}` | `{config_keys.toml_value(key.default)}` |" in page, (
            f"docs/config.md lacks {key.name}"
        )


def test_every_key_belongs_to_exactly_one_section() -> None:
    names = [k.name for k in all_keys()]
    assert len(names) == len(set(names))
    cfg = RunConfig.from_flower({"sftp-lambda": 4, "flexlora-ranks": "2,4"})
    assert cfg.section(SFTPConfig).sftp_lambda == 4.0 and isinstance(
        cfg.section(SFTPConfig).sftp_lambda, float
    )
    assert cfg.section(FlexLoRAConfig).flexlora_ranks == "2,4" and cfg["sftp-lambda"] == 4.0
    assert not hasattr(cfg, "sftp_lambda")  # method keys are read through their typed section


def test_the_default_method_is_the_one_a_method_package_registers_as_default() -> None:
    """The shared config names no method: `method`'s default is what the registry says."""
    assert registry.default_name() == "fedit"
    assert RunConfig.from_flower({}).method == "fedit"
    assert next(k for k in SharedConfig.keys() if k.name == "method").default == "fedit"
    registry._METHODS["fedit"].default = False
    try:
        with pytest.raises(RuntimeError, match="exactly one method must register as the default"):
            registry.default_name()
    finally:
        registry._METHODS["fedit"].default = True
