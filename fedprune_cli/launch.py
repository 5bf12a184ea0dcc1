"""`fedprune run`: one `flwr run` simulation, checked and cleaned up.

`flwr run . --stream` exits 0 even when the run fails, and the local SuperLink it starts keeps
running. This wrapper, used by `make run`, the end-to-end test and the benchmarks:

1. merges pyproject's defaults with the `--run-config` files/strings and runs the preflight checks
   (`fedprune_cli/preflight.py`: every key's value, the keys against the federation's
   `num-supernodes`, the data files, the checkpoint and the model): a bad config fails here, with
   one line naming the key, before Ray starts;
2. gives the run its own FLWR_HOME and free SuperLink ports, and the offline environment;
3. runs `flwr run <app> --stream`, then reads the run's status with `flwr list --format json`;
4. stops the SuperLink it started (by its PID, with everything it started) and prints results.md;
5. exits non-zero unless the run finished `completed` and left a completed summary.json; a failed
   run's error (summary.json) is the last line it prints.

`--ray-address HOST:PORT` runs the simulation on an existing Ray cluster (docs/scale.md): Flower
(1.41, 1.42) has no federation-config key for it; its Ray backend calls `ray.init()` only when Ray
is not initialised, so Ray's own discovery decides. The launcher checks that the head answers on
that address and that a client's resources fit on one of the cluster's nodes, refuses
`init-args-num-cpus/gpus` (Ray rejects them when joining a cluster) and puts `RAY_ADDRESS` in the
environment of the SuperLink it starts, which SuperExec and the simulation process inherit. The
cluster is left running; only the SuperLink's processes (the Ray driver among them) are stopped, and
Ray ends the run's actors with its driver.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedprune_app.core.config import ConfigError
from fedprune_app.core.rundir import resolve_output_dir
from fedprune_app.core.statefile import write_text_atomically
from fedprune_cli import preflight
from fedprune_cli.processes import free_port, signals_held, stop_superlink

APP_DIR = Path(__file__).resolve().parent.parent
DEFAULT_FEDERATION = "num-supernodes=4 client-resources-num-cpus=1"
FEDERATION_LINE = "# federation:"  # a preset's line naming the simulation it is built for


def parse_overrides(text: str, flag: str = "--run-config") -> dict[str, Any]:
    """'k=v k2="s"' -> dict, with TOML value syntax (the same pattern `flwr run --run-config`
    uses)."""
    pairs = re.findall(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)", text)
    if not pairs and text.strip():
        raise ConfigError(f"{flag} {text!r} is neither a .toml file nor 'key=value ...' pairs")
    try:
        return tomllib.loads("\n".join(f'"{k}" = {v}' for k, v in pairs))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{flag} {text!r}: values must be TOML (strings quoted): {err}") from None


def merged_config(app_dir: Path, run_configs: list[str]) -> dict[str, Any]:
    """pyproject defaults, then each --run-config (a TOML file path or 'k=v ...'), later ones
    winning."""
    merged = dict(
        _flatten(
            tomllib.loads((app_dir / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
        )
    )
    for item in run_configs:
        path = Path(item)
        if path.suffix == ".toml" and path.is_file():
            try:
                merged.update(_flatten(tomllib.loads(path.read_text())))
            except tomllib.TOMLDecodeError as err:
                raise ConfigError(f"--run-config {item}: not valid TOML ({err})") from None
        else:
            merged.update(parse_overrides(item))
    return merged


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in table.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def write_run_config(path: Path, values: dict[str, Any]) -> Path:
    """The flat run config as a TOML file that `flwr run --run-config <file>` reads."""
    path.write_text(
        "".join(
            f"{json.dumps(k)} = {str(v).lower() if isinstance(v, bool) else json.dumps(v)}\n"
            for k, v in values.items()
        )
    )
    return path


def run_status(env: dict[str, str], flwr: str) -> str:
    """Status of the newest run on the SuperLink ('finished:completed', 'finished:failed', ...)."""
    return run_identity(env, flwr)[1]


def run_identity(env: dict[str, str], flwr: str, timeout: float = 120) -> tuple[int | None, str]:
    """The id and status of the run on the launch's own SuperLink (its newest, though it holds only
    the one)."""
    done = subprocess.run(
        [flwr, "list", "--format", "json"], env=env, capture_output=True, text=True, timeout=timeout
    )
    try:
        runs = json.loads(done.stdout).get("runs", [])
    except json.JSONDecodeError:
        return None, f"unknown ({done.stdout[-300:]}{done.stderr[-300:]})"
    if not runs:
        return None, "unknown (no runs listed)"
    newest = max(runs, key=lambda r: int(r.get("run-id", r.get("run_id", 0))))
    run_id = newest.get("run-id", newest.get("run_id"))
    status = str(newest.get("status", newest.get("status-text", "unknown")))
    return (int(run_id) if str(run_id).isdigit() else None), status


def run_env(
    flwr_home: Path, http_port: int, control_port: int, cluster_env: dict[str, str]
) -> dict[str, str]:
    """The environment of `flwr run`: offline and without telemetry where the user has not set
    those variables (their HF_HUB_OFFLINE=0 lets a Hub model download), a private FLWR_HOME and
    ports, every `layer i/N` line (RAY_DEDUP_LOGS), and Ray on 127.0.0.1 only unless the run joins a
    cluster."""
    from fedprune_app.core.runtime import LOOPBACK_RAY_ENV, OFFLINE_ENV  # imports torch: late

    return {
        **OFFLINE_ENV,
        **os.environ,
        "FLWR_HOME": str(flwr_home),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        "RAY_DEDUP_LOGS": os.environ.get("RAY_DEDUP_LOGS", "0"),
        **(cluster_env or LOOPBACK_RAY_ENV),
    }


def read_summary(run_dir: Path | None) -> dict[str, Any] | None:
    """The run's summary.json as a table, or None where there is none or it is not a JSON table (a
    torn or hand-edited file): what the launcher reports on, never a traceback."""
    path = None if run_dir is None else run_dir / "summary.json"
    try:
        record = json.loads(path.read_text()) if path is not None and path.is_file() else None
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def run_error(run_dir: Path | None) -> str:
    """One line saying why a run failed: summary.json's `error-message` (the exception the ServerApp
    raised), else the last line of its `error` traceback; what is missing when there is no
    summary."""
    record = read_summary(run_dir)
    if record is None:
        if run_dir is not None and (run_dir / "summary.json").is_file():
            return f"{run_dir}/summary.json cannot be read (not a JSON table); see the log above"
        return (
            "the run left no summary.json (it failed before its run directory was written; see the "
            "log above)"
        )
    message = record.get("error-message") or next(
        (line for line in reversed(str(record.get("error", "")).splitlines()) if line.strip()), ""
    )
    return message.strip() or f"status {record.get('status')!r} without an error message"


INIT_ARGS_REFUSED = (
    "init-args-num-cpus",
    "init-args-num-gpus",
)  # ray.init(num_cpus=..) on a cluster: refused


def ray_cluster_env(
    address: str, federation: dict[str, Any], timeout: float = 5.0
) -> dict[str, str]:
    """The environment that makes the run's simulation join the Ray cluster at `address`
    ('HOST:PORT', the GCS address `ray start --head` prints), after checking the federation config,
    that the head accepts TCP connections there (in `timeout` s) and that a client's resources fit
    on one of the cluster's nodes (a short-lived driver reads them: `preflight.ray_nodes`);
    ConfigError naming the option or key otherwise."""
    refused = [k for k in INIT_ARGS_REFUSED if k in federation]
    if refused:
        raise ConfigError(
            f"--federation-config key '{refused[0]}' cannot be used with --ray-address: Ray "
            "refuses num_cpus/num_gpus when connecting to an existing cluster (its resources are "
            "what each node offered with `ray start --num-cpus/--num-gpus`); remove it"
        )
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or "/" in host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"--ray-address must be HOST:PORT, the address `ray start --head` prints (e.g. "
            f"10.0.0.1:6379), got {address!r}"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as err:
        raise ConfigError(
            f"--ray-address {address}: nothing accepts connections there ({err}); start the head "
            f"first (`ray start --head --port {port}`)"
        ) from None
    preflight.check_cluster_resources(federation, preflight.ray_nodes(address), address)
    return {"RAY_ADDRESS": f"{host}:{port}"}


@dataclass
class Launched:
    """What one launch did: its exit code, the run directory, the SuperLink port it used, the run
    status."""

    code: int
    run_dir: Path | None
    port: int
    status: str


def checked_config(
    app_dir: Path,
    run_configs: list[str],
    federation_config: str,
    check_data: bool = True,
    advise: bool = True,
    cluster: bool = False,
) -> dict[str, Any]:
    """The merged run config after the preflight checks (ConfigError naming the key otherwise), as
    the run gets it: `output-dir` and `resume-from` made absolute (the ServerApp resolves them from
    another directory). `check_data` False leaves `client-data`'s files unchecked; `advise` prints
    the method's warnings (`preflight.advice`), off for a run that is meant to be what they warn of
    (the references' floor)."""
    values = merged_config(app_dir, run_configs)
    federation = parse_overrides(federation_config, "--federation-config")
    preflight.check_federation_config(federation, cluster)
    cfg = preflight.preflight(
        values,
        preflight.federation_size(federation),
        client_data=check_data,
        offline=preflight.hub_offline(),
    )
    for line in preflight.advice(cfg) if advise else []:
        print(f"[fedprune] warning: {line}", file=sys.stderr, flush=True)
    values["output-dir"] = str(resolve_output_dir(cfg.output_dir))
    if cfg.resume_from:
        values["resume-from"] = str(resolve_output_dir(cfg.resume_from))
    return values


def own_run_dir(
    out_root: Path, before: set[Path], values: dict[str, Any], run_id: int | None = None
) -> Path | None:
    """The run's directory: new since the start, a directory (a grid writes tables.md into the same
    root). With the Flower `run_id`, the one whose `flower-run.json` holds it (None if none does:
    another launch's directory is never taken for this one's). Without it (an older app), the newest
    whose `config.json` holds the values this launch passed, else the newest new directory."""
    new = (
        sorted(p for p in set(out_root.iterdir()) - before if p.is_dir())
        if out_root.is_dir()
        else []
    )
    if run_id is not None:

        def run_of(path: Path) -> int | None:
            try:
                return json.loads((path / "flower-run.json").read_text()).get("run-id")
            except (OSError, ValueError, AttributeError):
                return None

        return next((p for p in reversed(new) if run_of(p) == run_id), None)

    def ours(path: Path) -> bool:
        try:
            written = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            return True  # a run that failed before writing its config: still a candidate
        return all(written[k] == v for k, v in values.items() if k in written)

    matching = [p for p in new if ours(p)] or new
    return matching[-1] if matching else None


class Terminated(Exception):
    """SIGTERM reached the launcher (`timeout`, a CI runner, a job scheduler, `docker stop`)."""


def raise_terminated(*_: Any) -> None:
    """A SIGTERM handler: stop the launch where it is, as Ctrl-C does, so that it cleans up."""
    raise Terminated


STOPS = {
    KeyboardInterrupt: ("Ctrl-C (SIGINT)", 130),
    Terminated: ("SIGTERM", 143),
    subprocess.TimeoutExpired: ("its --timeout", 124),
}


def resume_command(run_configs: list[str], federation_config: str, run_dir: Path) -> str:
    """The `fedprune run` command that continues `run_dir` from its last checkpoint."""
    args = ["fedprune", "run"]
    for item in [*run_configs, f"resume-from='{run_dir}'"]:
        args += ["--run-config", item]
    return " ".join(_quoted(arg) for arg in [*args, "--federation-config", federation_config])


def _quoted(arg: str) -> str:
    """`arg` as a POSIX shell word: bare, in double quotes when it holds single quotes (the run
    config's TOML strings) and nothing double quotes expand, else `shlex.quote`."""
    if re.fullmatch(r"[\w@%+=:,./-]+", arg):
        return arg
    if not any(c in arg for c in '"$`\\!'):
        return f'"{arg}"'
    return shlex.quote(arg)


def record_interruption(run_dir: Path | None, reason: str, resume: str) -> str:
    """Mark the run directory's summary.json `"status": "interrupted"` (a completed one stays as it
    is) and return the line that says what happened and how to continue."""
    if run_dir is None:
        return f"stopped by {reason} before the run wrote its directory; nothing to resume"
    path = run_dir / "summary.json"
    record = read_summary(run_dir) or {}
    if record.get("status") == "completed":
        return f"stopped by {reason} after the run completed; run directory: {run_dir}"
    checkpoint = (run_dir / "checkpoint" / "state.safetensors").is_file()
    record.update(
        {"status": "interrupted", "interrupted-by": reason, "resume": resume if checkpoint else ""}
    )
    write_text_atomically(path, json.dumps(record, indent=2) + "\n")
    if not checkpoint:
        return (
            f"stopped by {reason} before the first checkpoint: {run_dir} holds no checkpoint; "
            "start the run again"
        )
    return f"stopped by {reason}; run directory {run_dir}; continue it with: {resume}"


def failure_line(run_dir: Path | None) -> str:
    """'' when every reply counted, else one line: how many replies were left out and which clients'
    rows results.md marks."""
    from fedprune_app.report.tables import left_out_line

    record = read_summary(run_dir)
    return left_out_line(record) if record is not None else ""


def launch(
    run_configs: list[str],
    federation_config: str,
    app_dir: Path = APP_DIR,
    timeout: float = 7200,
    quiet: bool = False,
    check_data: bool = True,
    ray_address: str | None = None,
    advise: bool = True,
    strict: bool = False,
) -> Launched:
    """Run one simulation and clean up after it. `check_data` False leaves `client-data`'s files to
    the clients (a test that needs a client to fail inside the run). `ray_address` ('HOST:PORT'):
    run on that Ray cluster instead of a Ray started for this run. `advise`: print the method's
    warnings before the run (`checked_config`) and its broken-model lines after it; off for a
    reference meant to be broken. `strict`: a left-out reply fails the launch. Ctrl-C, SIGTERM (with
    `raise_terminated` installed) and the timeout stop everything the run started and mark its
    directory interrupted (exit 130, 143, 124)."""
    cluster_env = (
        ray_cluster_env(ray_address, parse_overrides(federation_config, "--federation-config"))
        if ray_address
        else {}
    )
    values = checked_config(
        app_dir, run_configs, federation_config, check_data, advise, cluster=bool(ray_address)
    )

    out_root = Path(values["output-dir"])
    before = set(out_root.iterdir()) if out_root.is_dir() else set()
    flwr = shutil.which(
        "flwr", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    )
    if flwr is None:
        raise FileNotFoundError(
            "the `flwr` command is not installed in this environment (run `make setup`)"
        )
    http_port, control_port = free_port(), free_port()
    flwr_home = Path(tempfile.mkdtemp(prefix="fedprune-flwr-"))
    env = run_env(flwr_home, http_port, control_port, cluster_env)
    resolved = write_run_config(
        flwr_home / "run-config.toml", values
    )  # merged, checked, paths absolute
    cmd = [flwr, "run", str(app_dir), "--stream", "--run-config", str(resolved)]
    if federation_config:
        cmd += ["--federation-config", federation_config]
    if cluster_env:
        print(
            f"[fedprune] the simulation joins the Ray cluster at {cluster_env['RAY_ADDRESS']}",
            flush=True,
        )
    stopped_by: tuple[str, int] | None = None
    run_id, status, returncode = None, "unknown", 1
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        stream = subprocess.DEVNULL if quiet else None
        returncode = subprocess.run(
            cmd, env=env, cwd=app_dir, timeout=timeout, stdout=stream, stderr=stream
        ).returncode
        run_id, status = run_identity(env, flwr)
    except tuple(STOPS) as stop:
        stopped_by = STOPS[type(stop)]
        for sig in handlers:  # a second Ctrl-C must not cut the clean-up short
            with contextlib.suppress(ValueError):  # not the main thread: no handlers to change
                signal.signal(sig, signal.SIG_IGN)
        with contextlib.suppress(Exception):
            run_id, _ = run_identity(env, flwr, timeout=5)
        status = "interrupted"
    finally:
        with signals_held():  # a signal now must not cut the clean-up short
            stop_superlink(http_port)
            shutil.rmtree(flwr_home, ignore_errors=True)
        for sig, handler in handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)
    run_dir = own_run_dir(out_root, before, values, run_id)
    if stopped_by is not None:
        resume = resume_command(run_configs, federation_config, run_dir or out_root)
        line = record_interruption(run_dir, stopped_by[0], resume)
        print(f"\n[fedprune] {line}", file=sys.stderr, flush=True)
        return Launched(stopped_by[1], run_dir, http_port, status)
    summary_ok = (read_summary(run_dir) or {}).get("status") == "completed"
    ok = returncode == 0 and status.endswith("completed") and summary_ok
    if quiet and run_dir is not None and (run_dir / "results.md").is_file():
        print(
            (run_dir / "results.md").read_text(), flush=True
        )  # the ServerApp printed it in the stream
    print(f"\n[fedprune] flwr run status: {status}; run directory: {run_dir}", flush=True)
    for line in broken_model_lines(run_dir) if advise else []:
        print(f"[fedprune] {line}", file=sys.stderr, flush=True)
    if not ok:
        print(f"[fedprune] the run failed: {run_error(run_dir)}", file=sys.stderr, flush=True)
    elif failed := failure_line(run_dir):
        verdict = "fails with --strict" if strict else "completed"
        print(f"[fedprune] the run {verdict}, but {failed}", file=sys.stderr, flush=True)
        ok = not strict
    return Launched(0 if ok else 1, run_dir, http_port, status)


def broken_model_lines(run_dir: Path | None) -> list[str]:
    """The run's broken-model warnings (summary.json `warnings`: models whose perplexity is above
    twice the untouched model's, or whose accuracy is below chance by its 95% interval) under a line
    saying what they mean."""
    flags = (read_summary(run_dir) or {}).get("warnings", [])
    if not isinstance(flags, list) or not flags:
        return []
    return [
        (
            f"the run completed, but {len(flags)} model(s) it produced are broken: a bug report, "
            "not a result"
        ),
        *flags,
    ]


def stop_when_orphaned(poll: float = 1.0) -> None:
    """SIGTERM this process when its parent exits: a `make run` stopped by `timeout` (which signals
    make alone) would otherwise leave the launcher and its federation running."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        os.kill(os.getpid(), signal.SIGTERM)

    watching = any(t.name == "fedprune-parent-watch" for t in threading.enumerate())
    if parent != 1 and not watching:
        threading.Thread(target=watch, name="fedprune-parent-watch", daemon=True).start()


def preset_federation(run_configs: list[str]) -> str | None:
    """The federation a preset is built for: its `# federation: <Flower's sizing>` line (the last
    preset's that has one), or None."""
    found = None
    for item in run_configs:
        path = Path(item)
        if path.suffix == ".toml" and path.is_file():
            for line in path.read_text().splitlines():
                if line.startswith(FEDERATION_LINE):
                    found = line[len(FEDERATION_LINE) :].split("#")[0].strip()
    return found
