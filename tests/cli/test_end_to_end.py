"""One real `flwr run` (Ray simulation) on the tiny model, through the launcher that `make run`
uses.

Client 1's data file is broken, so its ClientApp raises every time: the run must still complete, on
client 0's updates alone, and leave the run directory behind. The SuperLink and everything it
started must be gone afterwards. (The launcher's preflight refuses such a file before Flower
starts, see test_preflight.py; this test turns that check off to see a real ClientApp fail inside
the run.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from fedprune_cli import launch
from fedprune_cli.processes import process_family, superlink_family
from tests.cli.fault_cases import questions, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def flwr_env(monkeypatch: pytest.MonkeyPatch) -> None:
    venv_bin = str(Path(os.sys.executable).parent)
    monkeypatch.setenv("PATH", venv_bin + os.pathsep + os.environ["PATH"])


def test_flwr_run_completes_despite_a_failing_client(
    tiny_model_dir: Path, tmp_path: Path, flwr_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text(
        "".join(
            json.dumps({"question": f"Is {i} even?", "choices": ["yes", "no"], "label": i % 2})
            + "\n"
            for i in range(40)
        )
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({"unexpected": i}) + "\n" for i in range(40)))
    overrides = (
        f"model-name='{tiny_model_dir}' client-data='{good},{bad}' num-server-rounds=2 "
        "local-steps=2 batch-size=2 test-examples=6 val-examples=2 max-train-examples=16 "
        "eval-ppl-tokens=128 ppl-window=64 ppl-stride=64 seq-len=64 lora-rank=4 eval-every=1 "
        f"output-dir='{tmp_path / 'out'}'"
    )
    launched = launch.launch(
        [str(Path(__file__).resolve().parents[2] / "conf" / "fedit.toml"), overrides],
        "num-supernodes=2 client-resources-num-cpus=1",
        timeout=600,
        quiet=True,
        check_data=False,
    )
    run_dir = launched.run_dir
    assert launched.code == 0 and launched.status == "finished:completed" and run_dir is not None
    for name in (
        "config.json",
        "metrics.jsonl",
        "summary.json",
        "results.md",
        "adapter/adapter_config.json",
        "adapter/adapter_model.safetensors",
    ):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "plots").glob("*.png"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["artefacts"] == {"adapter": "adapter"}
    assert summary["num-partitions"] == 2  # from client 0's node config: client 1 never answers
    assert json.loads((run_dir / "config.json").read_text())["lora-rank"] == 4
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["phase"] == "train"]
    assert {r["round"] for r in train} == {1, 2}
    assert {r["status"] for r in train if r["client"] == 0} == {"accepted"}
    assert {r["status"] for r in train if r["client"] == 1} == {"rejected"}  # the broken client
    assert all(
        "matches no known schema" in r["problem"] for r in train if r["status"] == "rejected"
    )
    evaluated = {
        (r["round"], r["client"]) for r in rows if r["phase"] == "evaluate" and r["status"] == "ok"
    }
    assert evaluated == {(0, 0), (1, 0), (2, 0)}
    assert [r["round"] for r in rows if r["phase"] == "server-evaluate"] == [0, 1, 2]
    results = (run_dir / "results.md").read_text()
    assert "| 0 | `" in results
    assert "| 1 ⚠ stale: never scored, failed in round 0, 1, 2 |" in results
    assert [row["status"] for row in summary["clients"]] == ["ok", "failed"]
    assert capsys.readouterr().err.splitlines()[-1] == (
        "[fedprune] the run completed, but 5 client replies were left out (failed or rejected): "
        "client 1 (failed); see results.md and summary.json's dropped-replies"
    )
    assert not superlink_family(launched.port), "the SuperLink and what it started must be stopped"


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig, code, reason", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C (SIGINT)")]
)
def test_a_signalled_launcher_stops_everything_and_says_how_to_resume(
    tiny_model_dir: Path, tmp_path: Path, flwr_env: None, sig: int, code: int, reason: str
) -> None:
    """`fedprune run` signalled after its first checkpoint: it exits 143 (SIGTERM) or 130 (SIGINT)
    within 60 s, its last line names the run directory and the resume command, summary.json says
    "interrupted", and no process that the launch started is left (SuperLink, SuperExec, the
    simulation, Ray: found by an environment marker they all inherit)."""
    data = write_jsonl(tmp_path / "d.jsonl", questions(40))
    overrides = (
        f"model-name='{tiny_model_dir}' client-data='{data},{data}' num-server-rounds=20 "
        "local-steps=2 batch-size=2 test-examples=6 val-examples=2 max-train-examples=16 "
        "eval-ppl-tokens=0 seq-len=64 lora-rank=4 server-eval-data='' "
        f"output-dir='{tmp_path / 'out'}'"
    )
    name, value = "FEDPRUNE_TEST_MARKER", uuid.uuid4().hex
    federation = "num-supernodes=2 client-resources-num-cpus=1"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fedprune_cli.main",
            "run",
            "--run-config",
            overrides,
            "--federation-config",
            federation,
        ],
        cwd=tmp_path,
        text=True,
        env={**os.environ, name: value, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.time() + 300
        while not list((tmp_path / "out").glob("*/checkpoint/state.safetensors")):
            assert proc.poll() is None and time.time() < deadline, "no checkpoint came"
            time.sleep(1)
        sent = time.time()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        seconds = time.time() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    run_dir = next((tmp_path / "out").iterdir())
    resume = (
        f'fedprune run --run-config "{overrides}" --run-config "resume-from=\'{run_dir}\'" '
        f'--federation-config "{federation}"'
    )
    assert proc.returncode == code, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"[fedprune] stopped by {reason}; run directory {run_dir}; continue it with: {resume}"
    )
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    assert not process_family([], f"{name}={value}"), "every process of the run must be stopped"
    assert seconds < 60


@pytest.mark.slow
def test_a_killed_ray_worker_is_reported_and_fails_a_strict_launch(
    tiny_model_dir: Path,
    tmp_path: Path,
    flwr_env: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """SIGKILL one ClientApp actor after round 1's checkpoint: Flower 1.42 never replaces it, so the
    messages it gets fail; the run completes on the other client, results.md marks the failed
    rows, the last line counts them, and `--strict` makes the launch exit 1."""
    data = write_jsonl(tmp_path / "d.jsonl", questions(40))
    overrides = (
        f"model-name='{tiny_model_dir}' client-data='{data},{data}' num-server-rounds=3 "
        "local-steps=2 batch-size=2 test-examples=6 val-examples=2 max-train-examples=16 "
        "eval-ppl-tokens=0 seq-len=64 lora-rank=4 server-eval-data='' eval-every=1 "
        f"output-dir='{tmp_path / 'out'}'"
    )
    name, value = "FEDPRUNE_TEST_MARKER", uuid.uuid4().hex
    monkeypatch.setenv(name, value)
    killed: list[int] = []

    def kill_one_actor() -> None:
        deadline = time.time() + 600
        while time.time() < deadline and not killed:
            if list((tmp_path / "out").glob("*/checkpoint/state.safetensors")):
                actors = [
                    pid
                    for pid in process_family([], f"{name}={value}")
                    if b"ClientAppActor" in Path(f"/proc/{pid}/cmdline").read_bytes()
                ]
                if actors:
                    os.kill(actors[0], signal.SIGKILL)
                    killed.append(actors[0])
            time.sleep(0.5)

    import threading

    killer = threading.Thread(target=kill_one_actor, daemon=True)
    killer.start()
    launched = launch.launch(
        [overrides],
        "num-supernodes=2 client-resources-num-cpus=1",
        timeout=900,
        quiet=True,
        strict=True,
    )
    killer.join(timeout=5)
    assert killed, "no ClientApp actor was found to kill"
    summary = json.loads((launched.run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["failures"] >= 1
    assert launched.code == 1
    assert "⚠" in (launched.run_dir / "results.md").read_text()
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .startswith("[fedprune] the run fails with --strict")
    )
    assert not process_family([], f"{name}={value}")
