"""Processes and ports of the local Flower components that `fedprune run` and `fedprune_cli.deploy`
start and stop.

Flower's components start their own sessions (SuperExec, the ServerApp, the simulation, Ray's
daemons and actors, ClientApps), so killing one PID leaves the rest running: a component is stopped
with its *family* (its descendants, every process in their sessions, and optionally every process
whose environment holds a marker), TERM first, then KILL. Everything here reads /proc (Linux).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ignore Ctrl-C and SIGTERM while the block runs, then restore the handlers: a clean-up (stop
    the SuperLink's family TERM then KILL, delete FLWR_HOME or key material) runs to its end even
    when a second signal arrives. Off the main thread, where handlers cannot change, a no-op."""
    saved = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError):
            saved[sig] = signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Block until `proc` (still running) serves `port` on 127.0.0.1."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"the SuperLink exited with code {proc.returncode} (port {port} taken?)"
            )
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                time.sleep(
                    0.5
                )  # a port another process held would show up as our SuperLink exiting
                if proc.poll() is None:
                    return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


def proc_table() -> dict[int, tuple[int, int, list[bytes]]]:
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
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        table[int(proc.name)] = (int(fields[1]), int(fields[3]), argv)
    return table


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def process_family(pids: Iterable[int], marker: str = "") -> set[int]:
    """`pids`, their descendants, every process in their sessions or their descendants' (SuperExec
    and the apps it starts run in sessions of their own; a SuperExec outlives a SuperNode that
    exits; a pid started with a session of its own is that session's id), and every process whose
    environment holds `marker` ("KEY=value"). Our own session is never included."""
    pids = list(pids)
    table = proc_table()
    family = {p for p in pids if p in table}
    frontier = set(family)
    while frontier:
        frontier = {pid for pid, (ppid, _, _) in table.items() if ppid in frontier} - family
        family |= frontier
    sessions = ({table[pid][1] for pid in family} | set(pids)) - {os.getsid(0)}
    family |= {pid for pid, (_, sid, _) in table.items() if sid in sessions}
    if marker:
        for pid in set(table) - family - {os.getpid()}:
            try:
                if marker.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    family.add(pid)
            except OSError:
                pass
    return family


def terminate(
    pids: set[int],
    grace: float = 10.0,
    is_alive: Callable[[int], bool] = alive,
    tick: Callable[[], None] | None = None,
) -> None:
    """TERM every pid, then KILL what is still alive after `grace` s (`tick` runs while waiting,
    e.g. to reap children)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.time() + grace
        while time.time() < deadline and any(is_alive(p) for p in pids):
            if tick is not None:
                tick()
            time.sleep(0.2)
        pids = {p for p in pids if is_alive(p)}
        if not pids:
            return


def stop_processes(
    procs: Sequence[subprocess.Popen], marker: str = "", grace: float = 10.0
) -> set[int]:
    """TERM, then KILL after `grace` s, the family of every started process; returns the PIDs it
    stopped."""
    family = process_family([p.pid for p in procs], marker)
    terminate(
        set(family), grace, tick=lambda: [proc.poll() for proc in procs]
    )  # poll reaps our children
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    return family


def superlink_pids(port: int) -> list[int]:
    """PIDs of `flower-superlink` processes serving `port` (the local SuperLink `flwr run` starts
    detached)."""
    return [
        pid
        for pid, (_, _, argv) in proc_table().items()
        if any(a.endswith(b"flower-superlink") for a in argv) and str(port).encode() in argv
    ]


def superlink_family(port: int) -> set[int]:
    """The SuperLink on `port` and everything it started (SuperExec, the simulation, Ray's daemons
    and actors)."""
    return process_family(superlink_pids(port))


def stop_superlink(port: int, grace: float = 10.0) -> set[int]:
    """Terminate the SuperLink on `port` and everything it started; returns the PIDs it stopped."""
    family = superlink_family(port)
    terminate(family, grace)
    return family
