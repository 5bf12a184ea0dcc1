"""`fedprune run --ray-address` on a two-node Ray cluster on loopback (a head and a worker, 1 CPU each, in a private
temp dir): the smoke preset on the tiny model gives the summary.json of the same seed's ordinary run (its own
local Ray), its ClientApps run as actors of both nodes' raylets, the launcher stops only what it started, and the
test stops the cluster by the PIDs it started (never `ray stop`, which would stop every Ray on the machine).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedprune_app.core.runtime import OFFLINE_ENV
from fedprune_cli import launch
from fedprune_cli.processes import (
    alive,
    free_port,
    proc_table,
    process_family,
    stop_processes,
    superlink_family,
    wait_for_port,
)
from tests.conformance.test_reliability import comparable

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ACTOR = b"ray::ClientAppActor"  # the process title of a Flower ClientApp actor
SMALL = ("num-server-rounds=1 local-steps=2 batch-size=2 test-examples=6 val-examples=2 max-train-examples=16 "
         "eval-ppl-tokens=128 ppl-window=64 ppl-stride=64 seq-len=64 lora-rank=4 torch-threads=1")
FEDERATION = "num-supernodes=2 client-resources-num-cpus=1"


class Cluster:
    """A Ray head and one worker node started with `ray start --block` in their own sessions; every Ray process
    they start inherits the marker `FEDPRUNE_RAY_TEST=<temp dir>`, which `stop` also kills by."""

    def __init__(self) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="fpray-", dir="/tmp")  # short: Ray's unix socket paths
        self.marker = f"FEDPRUNE_RAY_TEST={self.temp_dir}"
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, **OFFLINE_ENV,
                    "OMP_NUM_THREADS": "1", "PATH": str(BIN) + os.pathsep + os.environ.get("PATH", ""),
                    "FEDPRUNE_RAY_TEST": self.temp_dir}
        self.nodes: list[subprocess.Popen] = []

    def _start(self, *args: str) -> subprocess.Popen:
        ports = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                 "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port"]
        cmd = [str(BIN / "ray"), "start", "--block", *args, "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
               "--num-gpus", "0", "--object-store-memory", str(128 * 2**20), "--temp-dir", self.temp_dir,
               "--disable-usage-stats", *[x for flag in ports for x in (flag, str(free_port()))]]
        log = open(Path(self.temp_dir) / f"node-{len(self.nodes)}.log", "w")  # noqa: SIM115 (the node owns it)
        proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.nodes.append(proc)
        return proc

    def start(self) -> None:
        head = self._start("--head", "--port", str(self.port), "--include-dashboard", "false",
                           "--dashboard-port", str(free_port()), "--ray-client-server-port", str(free_port()))
        wait_for_port(self.port, head, timeout=120)
        self._start("--address", self.address)
        self.wait_for_nodes(2)

    def wait_for_nodes(self, count: int, timeout: float = 180.0) -> None:
        """Until the GCS lists `count` alive nodes (a short-lived driver asks it)."""
        probe = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
                 "print(sum(n['Alive'] for n in ray.nodes()))")
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert all(p.poll() is None for p in self.nodes), f"a Ray node exited; logs in {self.temp_dir}"
            done = subprocess.run([sys.executable, "-c", probe, self.address], env=self.env, capture_output=True,
                                  text=True, timeout=120)
            if done.stdout.strip().splitlines()[-1:] == [str(count)]:
                return
            time.sleep(2)
        raise TimeoutError(f"the cluster at {self.address} did not reach {count} nodes in {timeout:.0f} s")

    def families(self) -> list[set[int]]:
        """Each node's processes (its raylet, daemons and workers)."""
        return [process_family([p.pid]) for p in self.nodes]

    def stop(self) -> set[int]:
        stopped = stop_processes(self.nodes, marker=self.marker)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return stopped


class ActorWatch(threading.Thread):
    """Samples, every 0.5 s, which node of the cluster hosts a ClientApp actor."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True)
        self.cluster, self.seen, self.done = cluster, [False] * len(cluster.nodes), threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            table = proc_table()
            for i, family in enumerate(self.cluster.families()):
                if any(table.get(pid, (0, 0, [b""]))[2][0].startswith(ACTOR) for pid in family):
                    self.seen[i] = True


@pytest.fixture()
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        yield c
    finally:
        stopped = c.stop()
        assert not [pid for pid in stopped if alive(pid)], "a process of the test's cluster outlived its stop"


@pytest.mark.slow
def test_a_run_on_a_two_node_ray_cluster_equals_the_local_run(tiny_model_dir: Path, tmp_path: Path,
                                                              cluster: Cluster,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("PATH", str(BIN) + os.pathsep + os.environ["PATH"])
    preset = str(ROOT / "conf" / "smoke.toml")

    def run_config(name: str) -> list[str]:
        return [preset, f"model-name='{tiny_model_dir}' output-dir='{tmp_path / name}' {SMALL}"]

    local = launch.launch(run_config("local"), FEDERATION, timeout=900, quiet=True)
    assert local.code == 0 and local.run_dir is not None, local.status

    cluster.start()
    watch = ActorWatch(cluster)
    watch.start()
    try:
        joined = launch.launch(run_config("cluster"), FEDERATION, timeout=900, quiet=True,
                               ray_address=cluster.address)
    finally:
        watch.done.set()
        watch.join()
    assert joined.code == 0 and joined.status == "finished:completed" and joined.run_dir is not None
    assert watch.seen == [True, True], "each node (1 CPU) must have hosted one of the two ClientApp actors"
    assert all(node.poll() is None for node in cluster.nodes), "the launcher must leave the cluster running"
    assert not superlink_family(joined.port), "the SuperLink and what it started must be stopped"

    summaries = [json.loads((d / "summary.json").read_text()) for d in (local.run_dir, joined.run_dir)]
    assert summaries[1]["status"] == "completed" and len(summaries[1]["clients"]) == 2
    assert comparable(summaries[0]) == comparable(summaries[1])
