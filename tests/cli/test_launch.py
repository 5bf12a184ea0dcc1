"""What the launcher prints when a run fails: the run's own error, from summary.json (no Ray: the
ServerApp runs on the in-process grid of tests/local_grid.py); what `--ray-address` checks and hands
to `flwr run` (no Ray either)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fedprune_app.core.config import ConfigError
from fedprune_app.core.strategy import RoundFailed
from fedprune_cli import launch as launch_module
from fedprune_cli import preflight
from fedprune_cli.launch import ray_cluster_env, run_error
from fedprune_cli.main import main
from fedprune_cli.processes import free_port
from tests.conftest import small_config
from tests.local_grid import LocalGrid, run_server


def test_a_run_in_which_every_client_fails_ends_with_their_error_on_the_screen(
    tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    """Every ClientApp raises the same ConfigError: the run stops after the round's retries with
    that error, and it is summary.json's `error-message`, the line the launcher prints last."""
    cfg = small_config(
        tiny_model_dir,
        output_dir=str(tmp_path / "runs"),
        client_data=str(tmp_path / "gone.jsonl"),
        server_eval_data="",
        num_server_rounds=2,
        round_retries=1,
    )
    run, err = run_server(cfg, LocalGrid(cfg, 2, seed=0))
    assert isinstance(err, RoundFailed)
    client_error = (
        f"run-config key 'client-data': JSONL file {tmp_path / 'gone.jsonl'} does not exist"
    )
    assert str(err).startswith(
        "round 1: every client failed with the same error (4 train replies in 2 attempt(s))"
    )
    assert client_error in str(err)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error-message"] == f"RoundFailed: {err}"
    assert run_error(run) == f"RoundFailed: {err}"


def test_run_error_without_a_summary_or_an_error_message(tmp_path: Path) -> None:
    assert run_error(None).startswith("the run left no summary.json")
    (tmp_path / "summary.json").write_text(
        json.dumps({"status": "failed", "error": "Traceback ...\n  File x\nValueError: boom\n"})
    )
    assert (
        run_error(tmp_path) == "ValueError: boom"
    )  # a run directory of an older version: the traceback's end


# --- --ray-address: joining an existing Ray cluster -----------------------------------------------
# (the run itself: tests/cli/test_ray_cluster.py, slow)


@pytest.fixture()
def listening() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts TCP connections (stands in for a Ray head's GCS)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def nodes(
    *offered: tuple[float, float], dead: tuple[float, float] | None = None
) -> list[dict[str, Any]]:
    """`ray.nodes()` as `preflight.ray_nodes` returns it: one alive node per (CPUs, GPUs)."""
    rows = [
        {
            "Alive": True,
            "Resources": {"CPU": c, "memory": 1e9, "node:10.0.0.1": 1.0}
            | ({"GPU": g} if g else {}),
        }
        for c, g in offered
    ]
    gone = [{"Alive": False, "Resources": {"CPU": dead[0], "GPU": dead[1]}}] if dead else []
    return rows + gone


@pytest.fixture()
def cluster_of(monkeypatch: pytest.MonkeyPatch) -> Callable[..., list[str]]:
    """Makes `preflight.ray_nodes` answer with these nodes; returns the addresses it was asked."""
    asked: list[str] = []

    def answer(*offered: tuple[float, float]) -> list[str]:
        def ray_nodes(address: str) -> list[dict[str, Any]]:
            asked.append(address)
            return nodes(*offered)

        monkeypatch.setattr(preflight, "ray_nodes", ray_nodes)
        return asked

    return answer


def test_ray_cluster_env_is_the_address_for_the_superlink(
    listening: int, cluster_of: Callable
) -> None:
    asked = cluster_of((4, 1))
    assert ray_cluster_env(
        f"127.0.0.1:{listening}",
        {"num-supernodes": 2, "client-resources-num-gpus": 0.5, "init-args-logging-level": "INFO"},
    ) == {"RAY_ADDRESS": f"127.0.0.1:{listening}"}
    assert asked == [f"127.0.0.1:{listening}"]  # the cluster's nodes were read


def test_ray_cluster_env_refuses_a_client_larger_than_every_node(
    listening: int, cluster_of: Callable
) -> None:
    """2 + 2 CPUs in all, but a client needs 3 on one node: refused before anything starts."""
    cluster_of((2, 0), (2, 0))
    with pytest.raises(ConfigError) as err:
        ray_cluster_env(f"127.0.0.1:{listening}", {"client-resources-num-cpus": 3})
    assert str(err.value) == (
        "--federation-config key 'client-resources-num-cpus' is 3 but the largest node of the Ray "
        f"cluster at 127.0.0.1:{listening} has 2 CPUs (2 alive nodes, 4 in all): a client's actor "
        "runs on one node; use a value <= 2"
    )


def cluster_refusal(federation: dict[str, Any], offered: list[dict[str, Any]]) -> str:
    with pytest.raises(ConfigError) as err:
        preflight.check_cluster_resources(federation, offered, "10.0.0.1:6379")
    return str(err.value)


def test_a_client_must_fit_on_one_alive_node_of_the_cluster() -> None:
    """The pure comparison, on hand-built `ray.nodes()` rows."""
    check = preflight.check_cluster_resources
    cpus, gpus = "client-resources-num-cpus", "client-resources-num-gpus"
    check({cpus: 1}, nodes((1, 0), (1, 0)), "a:1")
    check({cpus: 2, gpus: 0.5}, nodes((1, 0), (4, 1)), "a:1")
    check({}, nodes((2, 0)), "a:1")  # Flower's default: 2 CPUs, no GPU
    assert cluster_refusal({cpus: 2}, nodes((1, 0), (1, 0), dead=(8, 0))) == (
        "--federation-config key 'client-resources-num-cpus' is 2 but the largest node of the Ray "
        "cluster at 10.0.0.1:6379 has 1 CPUs (2 alive nodes, 2 in all): a client's actor runs on "
        "one node; use a value <= 1"
    )
    assert cluster_refusal({}, nodes((1, 0))).startswith(
        "--federation-config key 'client-resources-num-cpus' is 2 (Flower's default) but the"
    )
    assert cluster_refusal({cpus: 1, gpus: 0.5}, nodes((4, 0), (2, 0))).startswith(
        "--federation-config key 'client-resources-num-gpus' is 0.5 but the largest node of the "
        "Ray cluster at 10.0.0.1:6379 has 0 GPUs (2 alive nodes, 0 in all)"
    )
    both = cluster_refusal({cpus: 4, gpus: 1}, nodes((4, 0), (1, 1)))
    assert both.startswith(
        "--federation-config keys 'client-resources-num-cpus' = 4 and "
        "'client-resources-num-gpus' = 1: no node of the Ray cluster at "
        "10.0.0.1:6379 has both"
    )
    assert "\n" not in both
    assert cluster_refusal({cpus: 1}, []).endswith(
        "has 0 CPUs (0 alive nodes, 0 in all): a client's actor runs on one node; use a value <= 0"
    )


def test_a_cluster_that_does_not_answer_is_one_line_naming_the_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The driver that reads the nodes is killed at its timeout, or its last error line shows."""

    def hangs(cmd: list[str], **kwargs: Any) -> None:
        assert kwargs["timeout"] == preflight.RAY_PROBE_SECONDS
        assert kwargs["env"]["RAY_NUM_REDIS_GET_RETRIES"] == "2"
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])

    monkeypatch.setattr(preflight.subprocess, "run", hangs)
    with pytest.raises(
        ConfigError,
        match=r"^--ray-address 10.0.0.1:6379: no Ray cluster answered "
        r"there within 30 s; give the address `ray start --head` "
        r"printed$",
    ):
        preflight.ray_nodes("10.0.0.1:6379")
    failed = subprocess.CompletedProcess(
        [],
        1,
        stdout="",
        stderr=(
            "Traceback ...\nConnectionError: Failed to connect to Ray cluster at 10.0.0.1:6379\n"
        ),
    )
    monkeypatch.setattr(preflight.subprocess, "run", lambda cmd, **kwargs: failed)
    with pytest.raises(ConfigError) as err:
        preflight.ray_nodes("10.0.0.1:6379")
    assert str(err.value) == (
        "--ray-address 10.0.0.1:6379: cannot join a Ray cluster there from this machine "
        "(ConnectionError: Failed to connect to Ray cluster at 10.0.0.1:6379); give the address "
        "`ray start --head` printed, from one of its nodes"
    )


@pytest.mark.parametrize("key", ["init-args-num-cpus", "init-args-num-gpus"])
def test_ray_cluster_env_refuses_the_init_args_ray_rejects_on_a_cluster(
    listening: int, key: str
) -> None:
    with pytest.raises(
        ConfigError, match=f"--federation-config key '{key}' cannot be used with --ray-address"
    ):
        ray_cluster_env(f"127.0.0.1:{listening}", {"num-supernodes": 2, key: 2})


@pytest.mark.parametrize(
    "address", ["127.0.0.1", "ray://127.0.0.1:10001", ":6379", "head:port", "head:70000"]
)
def test_ray_cluster_env_refuses_what_is_not_host_port(address: str) -> None:
    with pytest.raises(ConfigError, match=r"--ray-address must be HOST:PORT"):
        ray_cluster_env(address, {})


def test_ray_cluster_env_refuses_an_address_nothing_listens_on() -> None:
    port = free_port()
    with pytest.raises(
        ConfigError, match=rf"--ray-address 127.0.0.1:{port}: nothing accepts connections there"
    ):
        ray_cluster_env(f"127.0.0.1:{port}", {}, timeout=2)


def test_main_with_ray_address_and_init_args_fails_before_anything_starts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        launch_module.subprocess, "run", lambda *a, **k: pytest.fail("nothing may run")
    )
    code = main(
        [
            "run",
            "--ray-address",
            "127.0.0.1:6379",
            "--federation-config",
            "num-supernodes=2 init-args-num-cpus=2",
        ]
    )
    assert code == 2
    assert capsys.readouterr().err.startswith(
        "error: --federation-config key 'init-args-num-cpus' cannot be used"
    )


def test_launch_with_ray_address_gives_the_flwr_run_its_address(
    tiny_model_dir: Path, tmp_path: Path, listening: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `flwr run` (which starts the SuperLink, whose simulation calls `ray.init()`) is given:
    RAY_ADDRESS in its environment, the federation config unchanged; without --ray-address, an
    inherited RAY_ADDRESS stays as it is (Ray's own discovery)."""
    calls: list[tuple[list[str], dict[str, str]]] = []

    def fake_run(cmd: list[str], env: dict[str, str], **_: Any) -> subprocess.CompletedProcess:
        calls.append((cmd, env))
        return subprocess.CompletedProcess(cmd, 0, stdout='{"runs": []}', stderr="")

    monkeypatch.setattr(launch_module.subprocess, "run", fake_run)
    monkeypatch.setattr(preflight, "ray_nodes", lambda address: nodes((2, 0)))  # a client fits
    monkeypatch.setenv("RAY_ADDRESS", "10.9.9.9:6379")
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"q{i}", "choices": ["a", "b"], "label": i % 2}) + "\n"
            for i in range(20)
        )
    )
    run_config = [
        f"model-name='{tiny_model_dir}' client-data='{data},{data}' server-eval-data='' "
        "test-examples=6 val-examples=2 "
        f"output-dir='{tmp_path / 'out'}'"
    ]
    federation = "num-supernodes=2 client-resources-num-cpus=1"
    assert (
        launch_module.launch(
            run_config, federation, quiet=True, ray_address=f"127.0.0.1:{listening}"
        ).code
        == 1
    )
    (cmd, env), (status_cmd, status_env) = calls
    assert cmd[1:3] == ["run", str(launch_module.APP_DIR)] and cmd[-2:] == [
        "--federation-config",
        federation,
    ]
    assert env["RAY_ADDRESS"] == status_env["RAY_ADDRESS"] == f"127.0.0.1:{listening}"
    calls.clear()
    launch_module.launch(run_config, federation, quiet=True)
    assert calls[0][1]["RAY_ADDRESS"] == "10.9.9.9:6379"


def test_the_run_directory_is_the_one_with_this_launchs_config(tmp_path: Path) -> None:
    """Two launches writing into one output root at once: each finds its own run by its
    config.json."""
    old = tmp_path / "20261125-010000-fedit"
    old.mkdir()
    before = {old}
    for name, seed in (("20261125-020000-fedit", 1), ("20261125-020001-fedit", 2)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"method": "fedit", "seed": seed}))
    (tmp_path / "tables.md").write_text("")
    assert (
        launch_module.own_run_dir(tmp_path, before, {"method": "fedit", "seed": 1}).name
        == "20261125-020000-fedit"
    )
    assert (
        launch_module.own_run_dir(tmp_path, before, {"method": "fedit", "seed": 2}).name
        == "20261125-020001-fedit"
    )
    # none matches: the newest new directory
    assert launch_module.own_run_dir(tmp_path, before, {"seed": 3}).name == "20261125-020001-fedit"
    assert launch_module.own_run_dir(tmp_path / "missing", set(), {}) is None


def test_a_completed_run_with_broken_models_says_so_last(
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The launcher ends with the run's broken-model warnings (summary.json `warnings`), on stderr,
    after the status line; results.md is printed by the launcher only when the stream (where the
    ServerApp prints it) was hidden; a run without warnings ends with the status line alone."""
    out = tmp_path / "out"
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"q{i}", "choices": ["a", "b"], "label": i % 2}) + "\n"
            for i in range(20)
        )
    )
    run_config = [
        f"model-name='{tiny_model_dir}' client-data='{data},{data}' server-eval-data='' "
        f"test-examples=6 val-examples=2 output-dir='{out}'"
    ]
    flags: list[str] = []

    def fake_run(cmd: list[str], env: dict[str, str], **_: Any) -> subprocess.CompletedProcess:
        if cmd[1] == "run":  # each run writes a directory of its own
            run_dir = out / f"20261201-00000{len(flags)}-fedit"
            run_dir.mkdir(parents=True)
            (run_dir / "config.json").write_text("{}")
            (run_dir / "summary.json").write_text(
                json.dumps({"status": "completed", "warnings": flags})
            )
            (run_dir / "results.md").write_text("# the results table\n")
        return subprocess.CompletedProcess(
            cmd, 0, stdout='{"runs": [{"status": "finished:completed"}]}', stderr=""
        )

    monkeypatch.setattr(launch_module.subprocess, "run", fake_run)
    monkeypatch.setattr(
        launch_module, "run_identity", lambda env, flwr: (None, "finished:completed")
    )
    monkeypatch.setattr(launch_module, "stop_superlink", lambda port: None)
    federation = "num-supernodes=2 client-resources-num-cpus=1"
    assert launch_module.launch(run_config, federation, quiet=False).code == 0
    printed = capsys.readouterr()
    assert "the results table" not in printed.out and "status: finished:completed" in printed.out
    assert printed.err == ""
    flags.append(
        "⚠ client 0 (task): test perplexity 9e9 is 4e7× the untouched model's 235 — this model "
        "is broken"
    )
    assert launch_module.launch(run_config, federation, quiet=True).code == 0
    printed = capsys.readouterr()
    assert "the results table" in printed.out
    assert printed.err.splitlines()[-2:] == [
        (
            "[fedprune] the run completed, but 1 model(s) it produced are broken: a bug report, "
            "not a result"
        ),
        f"[fedprune] {flags[0]}",
    ]
    flags.append(flags[0])  # a reference meant to be broken (the floor) says nothing of it
    assert launch_module.launch(run_config, federation, quiet=True, advise=False).code == 0
    assert "broken" not in capsys.readouterr().err


# --- runs that say what happened: their own directory, left-out replies, interruptions ---------


def test_the_run_directory_is_found_by_the_flower_run_id(tmp_path: Path) -> None:
    """Two identical launches into one root: each takes the directory holding its own run id, never
    the other's (None when its run wrote none)."""
    for name, run_id in (("20261125-020000-fedit", 11), ("20261125-020000-fedit-2", 22)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"method": "fedit"}))
        (tmp_path / name / "flower-run.json").write_text(json.dumps({"run-id": run_id}))
    same = {"method": "fedit"}
    assert launch_module.own_run_dir(tmp_path, set(), same, 11).name == "20261125-020000-fedit"
    assert launch_module.own_run_dir(tmp_path, set(), same, 22).name == "20261125-020000-fedit-2"
    assert launch_module.own_run_dir(tmp_path, set(), same, 33) is None


def test_run_directories_created_at_once_are_all_distinct(tmp_path: Path) -> None:
    """Forty run directories of one config created at the same time by threads: forty names."""
    from concurrent.futures import ThreadPoolExecutor

    from fedprune_app.core.config import RunConfig
    from fedprune_app.core.rundir import RunDirectory

    cfg = RunConfig.from_flower({"output-dir": str(tmp_path)})
    with ThreadPoolExecutor(8) as pool:
        paths = list(pool.map(lambda i: RunDirectory.create(cfg, i).path, range(40)))
    assert len(set(paths)) == 40
    assert sorted(json.loads((p / "flower-run.json").read_text())["run-id"] for p in paths) == list(
        range(40)
    )


@pytest.fixture()
def fake_flwr(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], dict[str, Any]]:
    """A run config for the launcher, and a fake `flwr run` that writes a run directory from
    `behaviour` ('summary': the summary.json it writes, 'raise': what it raises after writing it,
    'checkpoint': whether it writes one) and records the SuperLinks stopped."""
    out = tmp_path / "out"
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"q{i}", "choices": ["a", "b"], "label": i % 2}) + "\n"
            for i in range(20)
        )
    )
    run_config = [
        f"model-name='{tiny_model_dir}' client-data='{data},{data}' server-eval-data='' "
        f"test-examples=6 val-examples=2 output-dir='{out}'"
    ]
    behaviour: dict[str, Any] = {
        "summary": {"status": "completed"},
        "raise": None,
        "checkpoint": True,
        "stopped": [],
        "runs": 0,
    }

    def fake_run(cmd: list[str], env: dict[str, str], **_: Any) -> subprocess.CompletedProcess:
        if cmd[1] == "run":
            behaviour["runs"] += 1
            run_dir = out / f"20261201-00000{behaviour['runs']}-fedit"
            (run_dir / "checkpoint").mkdir(parents=True, exist_ok=True)
            (run_dir / "flower-run.json").write_text(json.dumps({"run-id": 7}))
            if behaviour["checkpoint"]:
                (run_dir / "checkpoint" / "state.safetensors").write_bytes(b"")
            if behaviour["summary"]:
                (run_dir / "summary.json").write_text(json.dumps(behaviour["summary"]))
            if behaviour["raise"]:
                raise behaviour["raise"]
        listing = {"runs": [{"run-id": "7", "status": "finished:completed"}]}
        return subprocess.CompletedProcess(cmd, 0, stdout=json.dumps(listing), stderr="")

    monkeypatch.setattr(launch_module.subprocess, "run", fake_run)
    monkeypatch.setattr(launch_module, "stop_superlink", behaviour["stopped"].append)
    return run_config, behaviour


FEDERATION = "num-supernodes=2 client-resources-num-cpus=1"


def test_left_out_replies_are_the_last_line_and_fail_the_launch_with_strict(
    fake_flwr: tuple[list[str], dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    run_config, behaviour = fake_flwr
    behaviour["summary"] = {
        "status": "completed",
        "failures": 2,
        "clients": [{"client": 0, "status": "ok"}, {"client": 1, "status": "stale"}],
    }
    assert launch_module.launch(run_config, FEDERATION, quiet=True).code == 0
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == (
        "[fedprune] the run completed, but 2 client replies were left out (failed or "
        "rejected): client 1 (stale); see results.md and summary.json's "
        "dropped-replies"
    )
    assert launch_module.launch(run_config, FEDERATION, quiet=True, strict=True).code == 1
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .startswith("[fedprune] the run fails with --strict, but 2 client replies were left out")
    )
    behaviour["summary"] = {"status": "completed", "failures": 0}
    assert launch_module.launch(run_config, FEDERATION, quiet=True, strict=True).code == 0


@pytest.mark.parametrize(
    "stop, code, reason",
    [
        (KeyboardInterrupt(), 130, "Ctrl-C (SIGINT)"),
        (launch_module.Terminated(), 143, "SIGTERM"),
        (subprocess.TimeoutExpired("flwr", 5), 124, "its --timeout"),
    ],
)
def test_an_interrupted_run_stops_its_superlink_and_says_how_to_resume(
    fake_flwr: tuple[list[str], dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    stop: BaseException,
    code: int,
    reason: str,
) -> None:
    run_config, behaviour = fake_flwr
    behaviour.update(summary=None, **{"raise": stop})
    done = launch_module.launch(run_config, FEDERATION, quiet=True)
    assert done.code == code and len(behaviour["stopped"]) == 1 and done.run_dir is not None
    summary = json.loads((done.run_dir / "summary.json").read_text())
    resume = (
        f'fedprune run --run-config "{run_config[0]}" --run-config '
        f'"resume-from=\'{done.run_dir}\'" --federation-config "{FEDERATION}"'
    )
    assert summary == {"status": "interrupted", "interrupted-by": reason, "resume": resume}
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"[fedprune] stopped by {reason}; run directory {done.run_dir}; continue it with: {resume}"
    ]


def test_an_interruption_before_the_first_checkpoint_says_to_start_again(
    fake_flwr: tuple[list[str], dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    run_config, behaviour = fake_flwr
    behaviour.update(
        summary={"status": "failed", "error-message": "SystemExit"},
        checkpoint=False,
        **{"raise": KeyboardInterrupt()},
    )
    done = launch_module.launch(run_config, FEDERATION, quiet=True)
    summary = json.loads((done.run_dir / "summary.json").read_text())
    assert done.code == 130 and summary["status"] == "interrupted" and summary["resume"] == ""
    assert capsys.readouterr().err.strip().endswith("holds no checkpoint; start the run again")


def test_a_launcher_whose_parent_exits_stops_as_on_sigterm(tmp_path: Path) -> None:
    """A process that called `stop_when_orphaned` gets SIGTERM within seconds of its parent's exit
    (here it writes a file from its SIGTERM handler)."""
    import sys
    import time

    flag = tmp_path / "terminated"
    child = (
        "import signal, sys, time\n"
        "from fedprune_cli.launch import stop_when_orphaned\n"
        f"signal.signal(signal.SIGTERM, lambda *_: (open({str(flag)!r}, 'w').close(), "
        "sys.exit(0)))\n"
        "stop_when_orphaned(poll=0.1)\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    parent = (
        "import subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.PIPE, "
        "text=True)\n"
        "p.stdout.readline()\n"
    )  # the parent exits once the child watches it
    root = Path(__file__).resolve().parents[2]
    subprocess.run(
        [sys.executable, "-c", parent],
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=60,
        check=True,
    )
    deadline = time.time() + 10
    while not flag.exists() and time.time() < deadline:
        time.sleep(0.1)
    assert flag.exists()


def test_a_signal_during_the_clean_up_does_not_cut_it_short(
    fake_flwr: tuple[list[str], dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM arrives while the SuperLink is being stopped (the launcher's SIGTERM handler raises):
    the stop still reaches its end and FLWR_HOME is still deleted."""
    import os
    import signal

    run_config, behaviour = fake_flwr
    homes: list[str] = []
    real_run = launch_module.subprocess.run

    def record_home(cmd: list[str], env: dict[str, str], **kw: Any) -> Any:
        homes.append(env["FLWR_HOME"])
        return real_run(cmd, env=env, **kw)

    def stop(port: int) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # would raise Terminated here, mid-clean-up
        behaviour["stopped"].append(port)  # the KILL stage: reached

    monkeypatch.setattr(launch_module.subprocess, "run", record_home)
    monkeypatch.setattr(launch_module, "stop_superlink", stop)
    previous = signal.signal(signal.SIGTERM, launch_module.raise_terminated)
    try:
        done = launch_module.launch(run_config, FEDERATION, quiet=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert done.code == 0 and len(behaviour["stopped"]) == 1
    assert homes and not Path(homes[0]).exists()
