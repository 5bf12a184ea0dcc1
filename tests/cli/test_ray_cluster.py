"""`fedprune run --ray-address` on a two-node Ray cluster on loopback (a head and a worker, 1 CPU
each, in a private temp dir): the smoke preset on the tiny model gives the summary.json of the same
seed's ordinary run (its own local Ray), its ClientApps run as actors of both nodes' raylets, the
launcher stops only what it started, and the test stops the cluster by the PIDs it started (never
`ray stop`, which would stop every Ray on the machine). A client larger than every node is refused
before Flower starts, and so is an address where no Ray head answers.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedprune_app.core.config import ConfigError
from fedprune_app.core.runtime import OFFLINE_ENV
from fedprune_cli import launch, preflight
from fedprune_cli.main import main
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
SMALL = (
    "num-server-rounds=1 local-steps=2 batch-size=2 test-examples=6 val-examples=2 "
    "max-train-examples=16 eval-ppl-tokens=128 ppl-window=64 ppl-stride=64 seq-len=64 lora-rank=4 "
    "torch-threads=1"
)
FEDERATION = "num-supernodes=2 client-resources-num-cpus=1"


class Cluster:
    """A Ray head and one worker node started with `ray start --block` in their own sessions; every
    Ray process they start inherits the marker `FEDPRUNE_RAY_TEST=<temp dir>`, which `stop` also
    kills by."""

    def __init__(self) -> None:
        self.temp_dir = tempfile.mkdtemp(
            prefix="fpray-", dir="/tmp"
        )  # short: Ray's unix socket paths
        self.marker = f"FEDPRUNE_RAY_TEST={self.temp_dir}"
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {
            **{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
            **OFFLINE_ENV,
            "OMP_NUM_THREADS": "1",
            "PATH": str(BIN) + os.pathsep + os.environ.get("PATH", ""),
            "FEDPRUNE_RAY_TEST": self.temp_dir,
        }
        self.nodes: list[subprocess.Popen] = []

    def _start(self, *args: str) -> subprocess.Popen:
        ports = [
            "--node-manager-port",
            "--object-manager-port",
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--metrics-export-port",
            "--runtime-env-agent-port",
        ]
        cmd = [
            str(BIN / "ray"),
            "start",
            "--block",
            *args,
            "--node-ip-address",
            "127.0.0.1",
            "--num-cpus",
            "1",
            "--num-gpus",
            "0",
            "--object-store-memory",
            str(128 * 2**20),
            "--temp-dir",
            self.temp_dir,
            "--disable-usage-stats",
            *[x for flag in ports for x in (flag, str(free_port()))],
        ]
        # the node owns it
        log = open(Path(self.temp_dir) / f"node-{len(self.nodes)}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.nodes.append(proc)
        return proc

    def start(self) -> None:
        head = self._start(
            "--head",
            "--port",
            str(self.port),
            "--include-dashboard",
            "false",
            "--dashboard-port",
            str(free_port()),
            "--ray-client-server-port",
            str(free_port()),
        )
        wait_for_port(self.port, head, timeout=120)
        self._start("--address", self.address)
        self.wait_for_nodes(2)

    def wait_for_nodes(self, count: int, timeout: float = 180.0) -> None:
        """Until the GCS lists `count` alive nodes (a short-lived driver asks it)."""
        probe = (
            "import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR', "
            "log_to_driver=False); print(sum(n['Alive'] for n in ray.nodes()))"
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert all(p.poll() is None for p in self.nodes), (
                f"a Ray node exited; logs in {self.temp_dir}"
            )
            done = subprocess.run(
                [sys.executable, "-c", probe, self.address],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            if done.stdout.strip().splitlines()[-1:] == [str(count)]:
                return
            time.sleep(2)
        raise TimeoutError(
            f"the cluster at {self.address} did not reach {count} nodes in {timeout:.0f} s"
        )

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
        self.cluster, self.seen, self.done = (
            cluster,
            [False] * len(cluster.nodes),
            threading.Event(),
        )

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
        assert not [pid for pid in stopped if alive(pid)], (
            "a process of the test's cluster outlived its stop"
        )


@pytest.mark.slow
def test_a_run_on_a_two_node_ray_cluster_equals_the_local_run(
    tiny_model_dir: Path, tmp_path: Path, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
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
        joined = launch.launch(
            run_config("cluster"), FEDERATION, timeout=900, quiet=True, ray_address=cluster.address
        )
    finally:
        watch.done.set()
        watch.join()
    assert joined.code == 0 and joined.status == "finished:completed" and joined.run_dir is not None
    assert watch.seen == [True, True], (
        "each node (1 CPU) must have hosted one of the two ClientApp actors"
    )
    assert all(node.poll() is None for node in cluster.nodes), (
        "the launcher must leave the cluster running"
    )
    assert not superlink_family(joined.port), "the SuperLink and what it started must be stopped"

    summaries = [
        json.loads((d / "summary.json").read_text()) for d in (local.run_dir, joined.run_dir)
    ]
    assert summaries[1]["status"] == "completed" and len(summaries[1]["clients"]) == 2
    assert comparable(summaries[0]) == comparable(summaries[1])


@pytest.mark.slow
def test_a_client_larger_than_every_node_is_refused_before_flower_starts(
    cluster: Cluster,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two nodes of 1 CPU: 2 CPUs in all, but a ClientApp actor that needs 2 fits on neither.
    `fedprune run --ray-address` exits 2 with one line naming the key, its value and what the
    largest node has; only the short-lived driver that reads the nodes ran (no flwr, no SuperLink,
    no new process on the nodes: no ClientApp actor, no worker). A client of 1 CPU passes."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cluster.start()
    ran: list[list[str]] = []
    real_run = subprocess.run

    def only_the_driver(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        ran.append(cmd)
        assert cmd[:3] == [sys.executable, "-c", preflight.RAY_PROBE], f"{cmd[0]} may not start"
        return real_run(cmd, **kwargs)

    monkeypatch.setattr(launch.subprocess, "run", only_the_driver)
    offered = preflight.ray_nodes(cluster.address)
    assert sorted(n["Resources"]["CPU"] for n in offered if n["Alive"]) == [1.0, 1.0]
    assert launch.ray_cluster_env(cluster.address, {"client-resources-num-cpus": 1}) == {
        "RAY_ADDRESS": cluster.address
    }

    ran.clear()
    capsys.readouterr()
    before = set().union(*cluster.families())
    code = main(
        [
            "run",
            "--run-config",
            str(ROOT / "conf" / "smoke.toml"),
            "--run-config",
            f"output-dir='{tmp_path}'",
            "--ray-address",
            cluster.address,
            "--federation-config",
            "num-supernodes=2 client-resources-num-cpus=2",
        ]
    )
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and err == [
        "error: --federation-config key 'client-resources-num-cpus' is 2 but the largest node of "
        f"the Ray cluster at {cluster.address} has 1 CPUs (2 alive nodes, 2 in all): a client's "
        "actor runs on one node; use a value <= 1"
    ]
    assert len(ran) == 1  # the driver alone
    assert not set().union(*cluster.families()) - before, "no Ray process may start on the nodes"
    assert not list(tmp_path.iterdir()), "no run directory: nothing started"


@pytest.mark.slow
def test_an_address_where_no_ray_cluster_answers_is_one_line_in_seconds() -> None:
    """Something accepts TCP there but is no Ray head: the driver gives up (two tries of 5 s), or
    is killed at RAY_PROBE_SECONDS; the one line names --ray-address and the address."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        start = time.perf_counter()
        with pytest.raises(ConfigError) as err:
            launch.ray_cluster_env(address, {"num-supernodes": 2})
        seconds = time.perf_counter() - start
    assert str(err.value).startswith(f"--ray-address {address}: ") and "\n" not in str(err.value)
    assert seconds < preflight.RAY_PROBE_SECONDS + 5, seconds
