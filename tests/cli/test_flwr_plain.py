"""`flwr run .` typed as a Flower user types it, without the Makefile's environment: Flower's
runtime dependency installation installs nothing (pyproject's `[tool.uv]`), the app's processes
default to offline Hugging Face access, and the ServerApp names what it cannot set."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from fedprune_cli.processes import free_port, process_family

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;@]", requirement, maxsplit=1)[0]


def test_every_dependency_is_excluded_from_flowers_uv_sync() -> None:
    project = PYPROJECT["project"]
    optional = project["optional-dependencies"].values()
    every = [*project["dependencies"], *(d for group in optional for d in group)]
    assert sorted(PYPROJECT["tool"]["uv"]["exclude-dependencies"]) == sorted(map(_name, every))


def test_flowers_uv_sync_of_the_app_installs_nothing_offline(tmp_path: Path) -> None:
    """The command Flower's runtime installer runs in the installed app (flwr 1.42,
    `install_app_dependencies`), with the network off: done in seconds, an empty environment."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    env = {**os.environ, "UV_OFFLINE": "1", "UV_PROJECT_ENVIRONMENT": str(tmp_path / "env")}
    start = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "uv",
            "sync",
            "--python",
            sys.executable,
            "--no-install-project",
            "--no-install-package",
            "flwr",
            "--inexact",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert time.perf_counter() - start < 10
    site = next((tmp_path / "env").glob("lib/python*/site-packages"))
    assert {p.name for p in site.iterdir()} <= {"_virtualenv.py", "_virtualenv.pth"}


def test_the_app_defaults_its_processes_to_offline_and_keeps_what_the_user_set() -> None:
    code = (
        "import os, fedprune_app; print(os.environ['HF_HUB_OFFLINE'], "
        "os.environ['TRANSFORMERS_OFFLINE'])"
    )
    env = {k: v for k, v in os.environ.items() if "OFFLINE" not in k}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["1", "1"], out.stderr
    env["HF_HUB_OFFLINE"] = "0"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["0", "1"], out.stderr


def test_the_server_names_the_usage_reports_it_cannot_turn_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fedprune_app.server_app import environment_warning

    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    assert environment_warning() is None
    monkeypatch.delenv("RAY_USAGE_STATS_ENABLED")
    assert environment_warning() == (
        "[fedprune] RAY_USAGE_STATS_ENABLED not set to 0 where the SuperLink started: Flower and "
        "Ray may report usage over the network; `export RAY_USAGE_STATS_ENABLED=0` before "
        "`flwr run` (fedprune run sets them)"
    )


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (a network namespace)")
def test_plain_flwr_run_completes_without_network_or_the_makefiles_variables(
    tmp_path: Path,
) -> None:
    """`flwr run . --run-config conf/smoke.toml --federation-config "num-supernodes=2" --stream`
    in a network namespace with only loopback, from an environment holding PATH, HOME, a
    FLWR_HOME and the local SuperLink's ports (so as not to meet another SuperLink): the run
    completes, writes its run directory, and nothing it started is left after its SuperLink is
    stopped."""
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("no permission for a network namespace")
    venv_bin = str(Path(sys.executable).parent)
    http, control = free_port(), free_port()
    marker = f"FEDPRUNE_TEST_MARKER={time.time_ns()}"
    env = {
        "PATH": venv_bin + os.pathsep + "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "FLWR_HOME": str(tmp_path / "flwr"),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control),
        "FEDPRUNE_OUTPUT_DIR": str(tmp_path),
        marker.split("=")[0]: marker.split("=")[1],
    }
    script = (
        "ip link set lo up && flwr run . --stream --run-config conf/smoke.toml "
        "--federation-config 'num-supernodes=2' && "
        'flwr list --format json > "$FLWR_HOME/list.json"'
    )
    try:
        done = subprocess.run(
            ["unshare", "-n", "sh", "-c", script],
            cwd=ROOT,
            env=env,
            text=True,
            capture_output=True,
            timeout=1500,
        )
    finally:
        family = process_family([], marker)
        from fedprune_cli.processes import terminate

        terminate(family)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = json.loads((tmp_path / "flwr" / "list.json").read_text())["runs"]
    assert [r["status"] for r in runs] == ["finished:completed"], runs
    run_dir = next((tmp_path / "outputs").iterdir())
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert "uv sync" not in done.stdout or "Installed:" not in done.stdout
