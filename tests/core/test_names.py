"""Names from outside never become paths: a run tag, a run key from a checkpoint or a message, a
client's state directory; run keys are unique; keys whose zero means nothing is learned are
refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedprune_app.core.checkpoint import checkpoint_problem, client_state_dir, new_run_key
from fedprune_app.core.config import ConfigError, RunConfig, safe_name


@pytest.mark.parametrize("tag", ["../x", "a/b", "..", ".", "a b", "x" * 65, "ä"])
def test_a_run_tag_that_is_not_a_plain_name_is_refused_naming_the_key(tag: str) -> None:
    with pytest.raises(ConfigError, match=r"^run-config key 'run-tag' must be letters, digits"):
        RunConfig.from_flower({"run-tag": tag})


@pytest.mark.parametrize("tag", ["", "dp", "seed-1", "v1.2_b"])
def test_plain_run_tags_pass(tag: str) -> None:
    assert RunConfig.from_flower({"run-tag": tag}).run_tag == tag


@pytest.mark.parametrize("key", ["../../victim", "a/../../b", "..", "/abs", "", "x\x00y", 5])
def test_a_run_key_that_could_leave_the_state_directory_is_refused(
    key: object, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="run-key"):
        client_state_dir(str(tmp_path / "state"), key, 0)  # type: ignore[arg-type]
    assert checkpoint_problem({"round": 1, "run-key": key, "arrays": {}, "strategy": {}})
    assert not (tmp_path / "victim").exists()


def test_a_plain_run_key_stays_under_the_state_directory(tmp_path: Path) -> None:
    got = client_state_dir(str(tmp_path / "state"), "20261206-fedit-a1b2c3d4", 3)
    assert got == (tmp_path / "state" / "20261206-fedit-a1b2c3d4" / "partition-3").resolve()
    assert checkpoint_problem({"round": 1, "run-key": "k-1", "arrays": {}, "strategy": {}}) == ""


def test_run_keys_of_runs_started_in_the_same_second_differ() -> None:
    keys = {new_run_key("20261206-090000-fedit") for _ in range(200)}
    assert len(keys) == 200 and all(safe_name(k) for k in keys)


@pytest.mark.parametrize("name", ["lora-alpha", "learning-rate"])
def test_a_zero_that_would_learn_nothing_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=rf"'{name}' must be a float in \(0, inf\], got 0.0"):
        RunConfig.from_flower({name: 0.0})
