"""`python -m tools.launch`: one `flwr run` simulation, checked and cleaned up.

`flwr run . --stream` exits 0 even when the run fails, and the local SuperLink it starts keeps running.
This wrapper, used by `make run`, the end-to-end test and the overhead benchmark:

1. merges pyproject's defaults with the `--run-config` files/strings and validates them (a bad key fails
   here, in a second, before Ray starts);
2. gives the run its own FLWR_HOME and free SuperLink ports, and the offline environment;
3. runs `flwr run <app> --stream`, then reads the run's status with `flwr list --format json`;
4. stops the SuperLink it started (by its PID, with its process group) and prints results.md;
5. exits non-zero unless the run finished `completed` and left a completed summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedprune_app.core.config import ConfigError, RunConfig
from fedprune_app.core.rundir import resolve_output_dir
from fedprune_app.core.runtime import OFFLINE_ENV

APP_DIR = Path(__file__).resolve().parent.parent


def parse_overrides(text: str) -> dict[str, Any]:
    """'k=v k2="s"' -> dict, with TOML value syntax (the same pattern `flwr run --run-config` uses)."""
    pairs = re.findall(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)", text)
    if not pairs and text.strip():
        raise ConfigError(f"--run-config {text!r} is neither a .toml file nor 'key=value ...' pairs")
    try:
        return tomllib.loads("\n".join(f'"{k}" = {v}' for k, v in pairs))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"--run-config {text!r}: values must be TOML (strings quoted): {err}") from err


def merged_config(app_dir: Path, run_configs: list[str]) -> dict[str, Any]:
    """pyproject defaults, then each --run-config (a TOML file path or 'k=v ...'), later ones winning."""
    merged = dict(_flatten(tomllib.loads((app_dir / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]))
    for item in run_configs:
        path = Path(item)
        merged.update(_flatten(tomllib.loads(path.read_text())) if path.suffix == ".toml" and path.is_file()
                      else parse_overrides(item))
    return merged


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in table.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _toml_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else json.dumps(value)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_table() -> dict[int, tuple[int, int, list[bytes]]]:
    """pid -> (parent pid, session id, argv) for every process we can read in /proc."""
    table = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        table[int(proc.name)] = (int(fields[1]), int(fields[3]), argv)
    return table


def superlink_pids(port: int) -> list[int]:
    """PIDs of `flower-superlink` processes serving `port`."""
    return [pid for pid, (_, _, argv) in _proc_table().items()
            if any(a.endswith(b"flower-superlink") for a in argv) and str(port).encode() in argv]


def superlink_family(port: int) -> set[int]:
    """The SuperLink on `port`, its descendants, and every process in their sessions (SuperExec,
    the simulation, Ray's daemons and actors start their own sessions under it)."""
    table = _proc_table()
    family = set(superlink_pids(port))
    frontier = set(family)
    while frontier:
        frontier = {pid for pid, (ppid, _, _) in table.items() if ppid in frontier} - family
        family |= frontier
    sessions = {table[pid][1] for pid in family if pid in table}
    return family | {pid for pid, (_, sid, _) in table.items() if sid in sessions and sid != os.getsid(0)}


def stop_superlink(port: int) -> None:
    """Terminate the SuperLink on `port` and everything it started (TERM, then KILL after 10 s)."""
    terminate(superlink_family(port))


def terminate(pids: set[int], grace: float = 10.0, alive: Callable[[int], bool] | None = None,
              tick: Callable[[], None] | None = None) -> None:
    """TERM every pid, then KILL what is still `alive` after `grace` s (`tick` runs while waiting, e.g. to reap
    children)."""
    alive = alive or (lambda p: Path(f"/proc/{p}").exists())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.time() + grace
        while time.time() < deadline and any(alive(p) for p in pids):
            if tick is not None:
                tick()
            time.sleep(0.2)
        pids = {p for p in pids if alive(p)}
        if not pids:
            return


def run_status(env: dict[str, str], flwr: str) -> str:
    """Status of the newest run on the SuperLink ('finished:completed', 'finished:failed', ...)."""
    done = subprocess.run([flwr, "list", "--format", "json"], env=env, capture_output=True, text=True, timeout=120)
    try:
        runs = json.loads(done.stdout).get("runs", [])
    except json.JSONDecodeError:
        return f"unknown ({done.stdout[-300:]}{done.stderr[-300:]})"
    if not runs:
        return "unknown (no runs listed)"
    newest = max(runs, key=lambda r: int(r.get("run-id", r.get("run_id", 0))))
    return str(newest.get("status", newest.get("status-text", "unknown")))


@dataclass
class Launched:
    """What one launch did: its exit code, the run directory, the SuperLink port it used, the run status."""

    code: int
    run_dir: Path | None
    port: int
    status: str


def launch(run_configs: list[str], federation_config: str, app_dir: Path = APP_DIR, timeout: float = 7200,
           quiet: bool = False) -> Launched:
    """Run one simulation and clean up after it."""
    values = merged_config(app_dir, run_configs)
    cfg = RunConfig.from_flower(values, methods=_methods())
    out_root = resolve_output_dir(cfg.output_dir)
    before = set(out_root.iterdir()) if out_root.is_dir() else set()
    flwr = shutil.which("flwr", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    if flwr is None:
        raise FileNotFoundError("the `flwr` command is not installed in this environment (run `make setup`)")
    http_port, control_port = free_port(), free_port()
    flwr_home = Path(tempfile.mkdtemp(prefix="fedprune-flwr-"))
    env = {**os.environ, **OFFLINE_ENV, "FLWR_HOME": str(flwr_home),
           "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port), "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    resolved = flwr_home / "run-config.toml"  # the merged, validated config, output-dir made absolute
    resolved.write_text("".join(f"{json.dumps(k)} = {_toml_value(v)}\n"
                                for k, v in {**values, "output-dir": str(out_root)}.items()))
    cmd = [flwr, "run", str(app_dir), "--stream", "--run-config", str(resolved)]
    if federation_config:
        cmd += ["--federation-config", federation_config]
    try:
        stream = subprocess.DEVNULL if quiet else None
        done = subprocess.run(cmd, env=env, cwd=app_dir, timeout=timeout, stdout=stream, stderr=stream)
        status = run_status(env, flwr)
    finally:
        stop_superlink(http_port)
        shutil.rmtree(flwr_home, ignore_errors=True)
    # the run's directory: new since the start and a directory (a grid writes tables.md into the same root)
    new_dirs = sorted(p for p in set(out_root.iterdir()) - before if p.is_dir()) if out_root.is_dir() else []
    run_dir = new_dirs[-1] if new_dirs else None
    summary_ok = run_dir is not None and (run_dir / "summary.json").is_file() and json.loads(
        (run_dir / "summary.json").read_text()).get("status") == "completed"
    ok = done.returncode == 0 and status.endswith("completed") and summary_ok
    print(f"\n[fedprune] flwr run status: {status}; run directory: {run_dir}", flush=True)
    if run_dir is not None and (run_dir / "results.md").is_file():
        print((run_dir / "results.md").read_text(), flush=True)
    return Launched(0 if ok else 1, run_dir, http_port, status)


def _methods() -> tuple[str, ...]:
    from fedprune_app.core import registry

    return registry.names()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-config", action="append", default=[],
                        help="a TOML preset (conf/X.toml) or 'key=value ...' overrides; repeatable, later wins")
    parser.add_argument("--federation-config", default="num-supernodes=4 client-resources-num-cpus=1")
    parser.add_argument("--timeout", type=float, default=7200)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-up in `launch` on TERM too
    try:
        return launch(args.run_config, args.federation_config, timeout=args.timeout).code
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
