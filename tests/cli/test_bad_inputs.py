"""Every bad input of `tests/cli/fault_cases.py` is refused by `fedprune run` in seconds, with one
line naming the key or file and what it accepts, before anything starts; docs/reliability.md's table
is that list."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from fedprune_cli import launch
from fedprune_cli.main import main
from fedprune_cli.processes import process_family
from tests.cli import fault_cases
from tests.cli.fault_cases import BAD_INPUTS, BadInput, questions, write_jsonl

SMOKE = str(fault_cases.ROOT / "conf" / "smoke.toml")


def _arguments(case: BadInput, tmp: Path) -> tuple[list[str], str]:
    """The `fedprune run` arguments of a case and its expected line, in the test's directory."""
    data = write_jsonl(tmp / "d.jsonl", questions(40))
    case.setup(tmp)
    fill = {"tmp": str(tmp), "data": str(data)}
    args = ["run", "--run-config", SMOKE, "--run-config", fault_cases.BASE.format(**fill)]
    if case.run_config:
        args += ["--run-config", case.run_config.format(**fill)]
    return [*args, "--federation-config", case.federation], "error: " + case.expected.format(**fill)


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c.what for c in BAD_INPUTS])
def test_a_bad_input_is_refused_in_one_line_before_anything_starts(
    case: BadInput,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    never = lambda *a, **k: pytest.fail("nothing may start")  # noqa: E731
    monkeypatch.setattr(launch.subprocess, "run", never)
    monkeypatch.setattr(launch.subprocess, "Popen", never)
    monkeypatch.setattr("fedprune_cli.preflight.visible_gpus", lambda: 0)  # the GPU case anywhere
    args, expected = _arguments(case, tmp_path)
    capsys.readouterr()
    start = time.perf_counter()
    code = main(args)
    seconds = time.perf_counter() - start
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(expected), f"\n{err[0]}\n{expected}"
    assert seconds < fault_cases.REFUSAL_SECONDS


def test_the_command_line_refuses_in_seconds_and_starts_no_process(tmp_path: Path) -> None:
    """A fresh `python -m fedprune_cli.main run` (its imports included) with a NaN learning rate,
    with more CPUs than the machine has and with a checkpoint of another LoRA rank: exit 2, the one
    line, and no process left or started with its environment (no SuperLink, no Ray)."""
    picked = [
        BAD_INPUTS[0],
        *(c for c in BAD_INPUTS if "more CPUs" in c.what or "LoRA rank" in c.what),
    ]
    assert len(picked) == 3
    for case in picked:
        for leftover in tmp_path.iterdir():  # each case writes its own files
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        args, expected = _arguments(case, tmp_path)
        marker = f"FEDPRUNE_TEST_MARKER={uuid.uuid4().hex}"
        name, value = marker.split("=")
        env = {**os.environ, "PYTHONPATH": str(fault_cases.ROOT), name: value}
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "fedprune_cli.main", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        seconds = time.perf_counter() - start
        assert done.returncode == 2 and done.stderr.splitlines() == [done.stderr.strip()]
        assert done.stderr.startswith(expected), done.stderr
        assert not process_family([], marker)
        assert seconds < fault_cases.REFUSAL_SECONDS, seconds  # imports included


def test_reliability_doc_table_is_generated_from_the_cases() -> None:
    """docs/reliability.md holds exactly `render_table()` (python -m tests.cli.fault_cases
    --write regenerates it)."""
    assert fault_cases.doc_table(fault_cases.DOC.read_text()) == fault_cases.render_table()
