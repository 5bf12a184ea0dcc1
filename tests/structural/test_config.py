"""The masked bus's keys in the library's own words: `keep-ratios`, `hold-open`, `massive-factor`
(until 2026-12-06 `sftp-*`). An old name in a run config is refused in one line naming the new one;
what a run directory recorded under the old names still reads (rescoring, comparing, resuming)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from fedprune_app.core.checkpoint import load_checkpoint, save_checkpoint
from fedprune_app.core.config import ConfigError, RunConfig, renamed_keys
from fedprune_app.structural.config import BusConfig
from fedprune_cli.runfiles import read_config

OLD = {"sftp-keep-ratios": "keep-ratios", "sftp-hold-open": "hold-open"}
OLD |= {"sftp-massive-factor": "massive-factor"}


def test_the_renames_are_the_bus_sections_and_name_keys_that_exist() -> None:
    assert renamed_keys() == OLD == BusConfig.renamed
    assert set(OLD.values()) <= {k.name for k in BusConfig.keys()}


@pytest.mark.parametrize("old", sorted(OLD))
def test_an_old_name_is_refused_in_one_line_naming_the_new_one(old: str) -> None:
    value = {"sftp-keep-ratios": "0.8", "sftp-hold-open": "none", "sftp-massive-factor": 5.0}[old]
    with pytest.raises(ConfigError) as err:
        RunConfig.from_flower({"method": "fedflap", old: value})
    assert str(err.value) == f"run-config key '{old}' is now '{OLD[old]}' (renamed; same values)"


def _recorded_with_old_names(run: Path, **values: object) -> dict[str, object]:
    """A run directory's config.json as a run before the rename wrote it."""
    new = RunConfig.from_flower({"method": "sftp", "seed": 3, **values}).to_dict()
    old = {next((o for o, n in OLD.items() if n == k), k): v for k, v in new.items()}
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.json").write_text(json.dumps(old))
    return new


def test_a_run_recorded_under_the_old_names_still_reads(tmp_path: Path) -> None:
    run = tmp_path / "20261201-000000-sftp"
    new = _recorded_with_old_names(run, **{"keep-ratios": "0.8,0.5", "hold-open": "none"})
    recorded = json.loads((run / "config.json").read_text())
    assert "sftp-keep-ratios" in recorded and "keep-ratios" not in recorded
    assert read_config(run) == new
    cfg = RunConfig.from_record(recorded)
    bus = cfg.section(BusConfig)
    assert (bus.keep_ratios, bus.hold_open, cfg.seed) == ("0.8,0.5", "none", 3)
    with pytest.raises(ConfigError, match="run-config key 'sftp-hold-open' is now 'hold-open'"):
        RunConfig.from_flower(recorded)


def test_a_resume_compares_an_old_run_by_the_new_names(tmp_path: Path) -> None:
    run = tmp_path / "20261201-000000-sftp"
    _recorded_with_old_names(run, **{"keep-ratios": "0.8", "num-server-rounds": 3})
    save_checkpoint(run, 1, run.name, {"w": np.zeros(2, np.float32)}, {})
    same = {"method": "sftp", "seed": 3, "keep-ratios": "0.8", "num-server-rounds": 3}
    assert load_checkpoint(RunConfig.from_flower({**same, "resume-from": str(run)})).round == 1
    other = {**same, "keep-ratios": "0.5", "resume-from": str(run)}
    with pytest.raises(ConfigError, match=r"'keep-ratios' \('0.8' -> '0.5'\)"):
        load_checkpoint(RunConfig.from_flower(other))


def test_no_sftp_key_is_read_outside_sftps_files() -> None:
    """The structural library, the core and every other method read no `sftp-` key (the renames'
    table of old names aside)."""
    root = Path(__file__).resolve().parents[2]
    files = [*(root / "fedprune_app").rglob("*.py"), *(root / "strategies").glob("*.py")]
    files += (root / "clients").glob("*.py")
    own = {root / "strategies" / "sftp.py", root / "clients" / "sftp.py"}
    found = [
        f"{path.relative_to(root)}:{n}"
        for path in files
        if path not in own and "methods/sftp" not in path.as_posix()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"(?<![-\w/.])sftp[-_][a-z]", line)
        and not re.search(r'"sftp-[\w-]+": "', line)
        and "until the library" not in line
    ]
    assert found == [], found
