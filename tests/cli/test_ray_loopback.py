"""A local simulation's Ray listens on the loopback address only: the launcher's environment says
so (`LOOPBACK_RAY_ENV`), and Ray started under it (as `flwr run`'s simulation starts it) opens no
port on another address; joining a cluster leaves Ray's own addressing alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fedprune_app.core.runtime import LOOPBACK_RAY_ENV
from fedprune_cli.launch import run_env

PROBE = """
import json, time, psutil, ray
ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
time.sleep(2)
names = ("raylet", "gcs_server", "ray::", "ray/_private", "default_worker")
pids = {p.pid for p in psutil.process_iter()
        if any(n in " ".join(p.cmdline() or []) for n in names)}
listening = sorted({c.laddr.ip for c in psutil.net_connections(kind="inet")
                    if c.status == psutil.CONN_LISTEN and c.pid in pids})
ray.shutdown()
print(json.dumps(listening))
"""


def test_the_launchers_environment_keeps_ray_on_loopback_unless_on_a_cluster(
    tmp_path: Path,
) -> None:
    local = run_env(tmp_path, 1, 2, {})
    assert all(local[k] == v for k, v in LOOPBACK_RAY_ENV.items())
    cluster = run_env(tmp_path, 1, 2, {"RAY_ADDRESS": "10.0.0.5:6379"})
    assert cluster.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == os.environ.get(
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    )


def test_ray_started_in_that_environment_listens_on_loopback_only(tmp_path: Path) -> None:
    env = run_env(tmp_path, 1, 2, {})
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    listening = json.loads(done.stdout.strip().splitlines()[-1])
    assert listening, "no Ray process was found listening"
    assert all(ip in ("127.0.0.1", "::1", "::ffff:127.0.0.1") for ip in listening), listening
